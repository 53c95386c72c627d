"""Start the ranks of one launch (a probe or the full run) on this host.

Each rank is `autotune.launch.rank_argv` with `autotune.launch.rank_env`, started through
`autotune.proc` (its own session, marked for clean-up). Launchers for other engines (mpirun,
srun) and device placement (MPS) plug in here, so trials and full runs share one path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune import launch, proc


@dataclass(frozen=True)
class RanksSpec:
    """What to start: the user's command (placeholders allowed) and how many ranks."""

    command: tuple[str, ...]
    knobs: Mapping[str, float] = field(default_factory=dict)
    instances: int = 1
    mode: str = "full"
    cwd: str = "."
    log_dir: Path = Path(".")
    name: str = "run"
    marker: str = "autotune"
    env: Mapping[str, str] | None = None  # base environment (default: ours)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_path(spec: RanksSpec, rank: int) -> Path:
    name = spec.name if rank == 0 else f"{spec.name}.rank{rank}"
    return Path(spec.log_dir) / f"{name}.log"


def start_ranks(spec: RanksSpec, *, channel: Mapping[str, str], extra_env: Mapping[str, str] = (),
                pipe_output: bool = False,
                on_output: Callable[[int, str], None] | None = None) -> list[proc.Launched]:
    """Start every rank; on a failure to start, the ones already started are stopped."""
    args = launch.substitute(spec.command[1:], spec.knobs)
    argv = launch.rank_argv([spec.command[0], *args])
    skip = launch.placeholders(spec.command[1:])
    base = dict(os.environ if spec.env is None else spec.env)
    base.update(dict(extra_env))
    port = free_port()
    started: list[proc.Launched] = []
    try:
        for rank in range(spec.instances):
            env = launch.rank_env(base, knobs=spec.knobs, skip=skip, rank=rank,
                                  world_size=spec.instances, local_rank=rank,
                                  local_world_size=spec.instances, master_addr="127.0.0.1",
                                  master_port=port, mode=spec.mode, channel=channel)
            path = log_path(spec, rank)
            callback = None
            if on_output is not None:
                callback = (lambda r: (lambda line: on_output(r, line)))(rank)
            started.append(proc.start(proc.LaunchSpec(
                argv=tuple(argv), env=env, cwd=spec.cwd, marker=f"{spec.marker}-r{rank}",
                stdout_path=path, stderr_path=path, pipe_output=pipe_output,
                label=f"rank {rank}"), on_output=callback))
    except BaseException:
        for lp in started:
            proc.stop(lp, grace_s=1.0)
        raise
    return started
