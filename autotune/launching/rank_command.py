"""Pure command and environment building for ranks: no processes are started here.

A Python script runs as ``python -m probes.boot SCRIPT ARGS`` (the script runner); any other
command (``python -m pkg.train``, ``./run.sh``) runs as given, and the Python processes it starts
are metered by the ``sitecustomize`` in `SITE_DIR` (`probes.autostart`). Knobs reach the script
through the environment (`probes.protocol.KNOB_ENV`) or through placeholders like ``{batch_size}``
in its own arguments.

A job of one rank gets the environment ``python train.py`` gets: no torchrun variables, so a
script that goes data-parallel only when ``RANK``/``WORLD_SIZE`` are set (nanoGPT, the HF Trainer,
Lightning's own launcher) runs as its user runs it. A job of N ranks gets what
``torchrun --nproc_per_node N`` gives (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``).
Either way a rank with a thread knob gets an explicit thread count (torchrun sets
``OMP_NUM_THREADS=1`` and MKL drops to one thread under mpirun otherwise).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.hardware.host import host_cores
from autotune.launching.placement import DDP_DEFAULT_BUCKET_MB
from probes import protocol

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SITE_DIR = PROJECT_ROOT / "probes" / "site"
KNOB_PLACEHOLDERS = ("batch_size", "workers", "threads", "bucket_mb", "instances")
PLACEHOLDER = re.compile(r"\{(" + "|".join(KNOB_PLACEHOLDERS) + r")\}")
# A placeholder whose knob a probe leaves out gets the value the script would have had:
# bucket_mb without effect on one rank (DDP's default), threads without a thread knob (all cores).
PLACEHOLDER_DEFAULTS = {"bucket_mb": DDP_DEFAULT_BUCKET_MB, "instances": 1,
                        "threads": len(host_cores())}
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def placeholders(args: Sequence[str]) -> set[str]:
    """Knob names that appear as ``{name}`` in the script's arguments."""
    return {m.group(1) for arg in args for m in PLACEHOLDER.finditer(arg)}


def substitute(args: Sequence[str], knobs: Mapping[str, float]) -> list[str]:
    """The script's arguments with ``{knob}`` replaced by the knob's value."""
    def value(m: re.Match) -> str:
        name = m.group(1)
        v = knobs.get(name, PLACEHOLDER_DEFAULTS.get(name))
        if v is None:  # batch_size, workers: always in a probe's knobs once in the arguments
            raise ValueError(f"placeholder {{{name}}} has no value in this probe")
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


BOOT_MODULE = "probes.boot"  # the runner a Python rank starts under (`rank_argv`)


def rank_argv(command: Sequence[str], *, python: str | None = None) -> list[str]:
    """argv of one rank: a Python script under the boot runner, anything else as given."""
    python = python or sys.executable
    if command and is_python_script(command[0]):
        return [python, "-m", BOOT_MODULE, *command]
    return list(command)


def user_command(argv: Sequence[str]) -> list[str]:
    """Pure: the user's own command in a rank's argv (`rank_argv`'s), the interpreter and the
    boot runner left out; any other argv as it is."""
    argv = list(argv)
    return argv[argv.index(BOOT_MODULE) + 1:] if BOOT_MODULE in argv else argv


def rank_env(base: Mapping[str, str], *, knobs: Mapping[str, float], skip: set[str],
             rank: int, world_size: int, local_rank: int, local_world_size: int,
             master_addr: str, master_port: int, mode: protocol.Mode,
             channel: Mapping[str, str], run_id: str = "autotune") -> dict[str, str]:
    """The environment of one rank: the caller's, plus torchrun's variables (none in a job of
    one rank: `torchrun_env`), knobs and channel.

    ``skip`` holds knobs the script receives through placeholders; those are not intercepted.
    """
    env = dict(base)
    env.update(channel)
    env.update(torchrun_env(rank=rank, world_size=world_size, local_rank=local_rank,
                            local_world_size=local_world_size, master_addr=master_addr,
                            master_port=master_port, run_id=run_id))
    env[protocol.ENV_MODE] = protocol.Mode(mode).value
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


def torchrun_env(*, rank: int, world_size: int, local_rank: int, local_world_size: int,
                 master_addr: str, master_port: int, run_id: str) -> dict[str, str]:
    """What ``torchrun`` gives each of its workers, for a job of ``world_size`` ranks; nothing
    for a job of one: ``python train.py`` has none of it, and a script that tests ``RANK`` or
    ``LOCAL_RANK`` (or Lightning, which then waits for members nobody starts) would take itself
    for one rank of a bigger job. ``TORCHELASTIC_RUN_ID`` is how torch (and Lightning) tell a
    torchrun worker."""
    if world_size <= 1:
        return {}
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(local_world_size), "GROUP_RANK": "0",
            "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": run_id}


def python_path(user: str) -> str:
    """``PYTHONPATH`` of a rank: the metering ``sitecustomize`` (`SITE_DIR`, which meters Python
    processes not run through `probes.boot` and then runs any other ``sitecustomize``), the
    user's entries in their order, then the project root (for ``probes``). The root comes last:
    installed, it is site-packages, and ahead of the user's entries it would shadow their own
    copies of installed packages."""
    rest = [p for p in user.split(os.pathsep) if p not in (str(SITE_DIR), str(PROJECT_ROOT))] \
        if user else []
    return os.pathsep.join([str(SITE_DIR), *rest, str(PROJECT_ROOT)])
