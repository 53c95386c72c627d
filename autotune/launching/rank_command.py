"""Pure command and environment building for ranks: no processes are started here.

A Python script runs as ``python -m probes.boot SCRIPT ARGS`` (the script runner); any other
command (``python -m pkg.train``, ``./run.sh``) runs as given, and the Python processes it starts
are metered by the ``sitecustomize`` in `SITE_DIR` (`probes.autostart`). Knobs reach the script
through the environment (`probes.protocol.KNOB_ENV`) or through placeholders like ``{batch_size}``
in its own arguments. Ranks get torchrun's environment, and always an explicit thread count
(torchrun sets ``OMP_NUM_THREADS=1`` and MKL drops to one thread under mpirun otherwise).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from probes import protocol

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SITE_DIR = PROJECT_ROOT / "probes" / "site"
PLACEHOLDER = re.compile(r"\{(batch_size|workers|threads|bucket_mb|instances)\}")
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def placeholders(args: Sequence[str]) -> set[str]:
    """Knob names that appear as ``{name}`` in the script's arguments."""
    return {m.group(1) for arg in args for m in PLACEHOLDER.finditer(arg)}


def substitute(args: Sequence[str], knobs: Mapping[str, float]) -> list[str]:
    """The script's arguments with ``{knob}`` replaced by the knob's value."""
    def value(m: re.Match) -> str:
        name = m.group(1)
        if name not in knobs:
            raise KeyError(f"placeholder {{{name}}} has no value in this trial")
        v = knobs[name]
        return str(int(v)) if float(v).is_integer() else str(v)

    return [PLACEHOLDER.sub(value, arg) for arg in args]


def is_python_script(path: str) -> bool:
    """A ``.py`` file, or a file whose first line names python."""
    if path.endswith(".py"):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def rank_argv(command: Sequence[str], *, python: str | None = None) -> list[str]:
    """argv of one rank: a Python script under the boot runner, anything else as given."""
    python = python or sys.executable
    if command and is_python_script(command[0]):
        return [python, "-m", "probes.boot", *command]
    return list(command)


def rank_env(base: Mapping[str, str], *, knobs: Mapping[str, float], skip: set[str],
             rank: int, world_size: int, local_rank: int, local_world_size: int,
             master_addr: str, master_port: int, mode: str,
             channel: Mapping[str, str]) -> dict[str, str]:
    """The environment of one rank: the caller's, plus torchrun's variables, knobs and channel.

    ``skip`` holds knobs the script receives through placeholders; those are not intercepted.
    """
    env = dict(base)
    env.update(channel)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size), "GROUP_RANK": "0",
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        protocol.ENV_MODE: mode,
    })
    for name, var in protocol.KNOB_ENV.items():
        env.pop(var, None)
        if name in knobs and name not in skip:
            v = knobs[name]
            env[var] = str(int(v)) if float(v).is_integer() else str(v)
    threads = knobs.get("threads")
    if threads:
        for var in THREAD_VARS:
            env[var] = str(int(threads))
    env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
    return env


def python_path(user: str) -> str:
    """``PYTHONPATH`` of a rank: the metering ``sitecustomize`` (`SITE_DIR`, which meters Python
    processes not run through `probes.boot` and then runs any other ``sitecustomize``), the
    user's entries in their order, then the project root (for ``probes``). The root comes last:
    installed, it is site-packages, and ahead of the user's entries it would shadow their own
    copies of installed packages."""
    rest = [p for p in user.split(os.pathsep) if p not in (str(SITE_DIR), str(PROJECT_ROOT))] \
        if user else []
    return os.pathsep.join([str(SITE_DIR), *rest, str(PROJECT_ROOT)])
