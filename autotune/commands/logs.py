"""``autotune logs [-f] RUN [--rank N]``: what the run's terminal would have shown, or one
rank's output."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from autotune import UsageError
from autotune.commands.monitor import add_runs_dir_arg, runs_root
from autotune.monitor.runs import info
from autotune.store import rundir

POLL_S = 0.5


def add_parser(sub):
    p = sub.add_parser("logs", help="print a run's output (-f: follow it)",
                       description="Print what the run's terminal would have shown (autotune's "
                                   "lines and the script's own), from the run directory's "
                                   "output.log, which a detached run writes; with --rank N, "
                                   "that rank's output of the full run. -f follows the output "
                                   "until the run ends (Ctrl-C stops following; the run goes "
                                   "on).")
    p.add_argument("run", metavar="RUN",
                   help="the run's id (a unique prefix is enough) or its directory")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output until the run ends")
    p.add_argument("--rank", type=int, metavar="N",
                   help="the full run's rank N output instead (0: the first rank)")
    add_runs_dir_arg(p)
    return p


def source(run_dir: Path, rank: int | None) -> Path:
    """The file ``logs`` prints: the run's output, or one rank's log of its full run."""
    if rank is None:
        path = run_dir / rundir.OUTPUT
        if path.is_file():
            return path
        if (run_dir / "logs" / "fullrun.log").is_file():
            return run_dir / "logs" / "fullrun.log"
        raise UsageError(f"run {run_dir.name} has no {rundir.OUTPUT} (only a run started with "
                         f"-d writes one) and no full run's output; 'autotune monitor "
                         f"{run_dir.name}' shows its journal")
    if rank < 0:
        raise UsageError(f"--rank must be >= 0, got {rank}")
    path = run_dir / "logs" / ("fullrun.log" if rank == 0 else f"fullrun.rank{rank}.log")
    if not path.is_file():
        have = sorted(p.name for p in (run_dir / "logs").glob("fullrun*.log"))
        raise UsageError(f"run {run_dir.name} has no output of rank {rank}'s full run"
                         + (f" (it has {', '.join(have)})" if have else
                            " (its full run has not started)"))
    return path


def _copy(f, out) -> int:
    data = f.read()
    if data:
        out.write(data)
        out.flush()
    return len(data)


def run(args) -> int:
    run_dir = rundir.resolve(args.run, runs_root(args))
    path = source(run_dir, args.rank)
    out = sys.stdout.buffer
    try:
        with open(path, "rb") as f:
            _copy(f, out)
            while args.follow:
                if _copy(f, out):
                    continue
                if not info(run_dir).status.live:  # looked at only when nothing came
                    _copy(f, out)  # what was written before it ended
                    break
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `autotune logs RUN | head`
        return 0
    return 0
