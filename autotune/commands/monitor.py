"""``autotune monitor [RUN]``: attach the live monitor to a running or finished run."""

from __future__ import annotations

import sys
from pathlib import Path

from autotune.monitor import console
from autotune.store import rundir
from autotune import UsageError
from autotune.store.journal import EVENTS


def add_parser(sub):
    p = sub.add_parser("monitor", help="attach the live monitor to a running or finished run",
                       description="Show a run's trials, best config and devices, live, from its "
                                   "journal. Exits when the run ends, or on Ctrl-C (the run "
                                   "itself goes on).")
    add_run_dir_args(p)
    p.add_argument("--plain", action="store_true",
                   help="one log line per event, no live display (also when piped or NO_COLOR)")
    return p


def add_run_dir_args(p) -> None:
    """``[RUN]`` and ``--runs-dir``: which run a command reads (default: the latest)."""
    p.add_argument("run_dir", nargs="?", metavar="RUN",
                   help="the run: its id (a unique prefix is enough; 'autotune ps' lists them) "
                        "or its directory (default: the latest run under --runs-dir)")
    add_runs_dir_arg(p)


def add_runs_dir_arg(p) -> None:
    p.add_argument("--runs-dir", metavar="DIR",
                   help="where run directories are (default: $AUTOTUNE_RUNS_DIR or "
                        "~/.autotune/runs)")


def runs_root(args) -> Path | None:
    return Path(args.runs_dir).expanduser() if getattr(args, "runs_dir", None) else None


def resolve_run_dir(args) -> Path:
    """RUN as given (an id, its unique prefix, or a directory), else the latest run; a usage
    error when there is none."""
    root = runs_root(args)
    if args.run_dir:
        return rundir.resolve(args.run_dir, root)
    latest = rundir.latest_run_dir(root)
    if latest is None:
        where = root or rundir.runs_root()
        raise UsageError(f"no runs under {where}; start one (autotune probe/tune/wrap) or "
                         f"give RUN")
    return latest


def run(args) -> int:
    from autotune.monitor import follow, text  # rich is imported only when a view is needed
    from autotune.monitor.live import STALE_S

    run_dir = resolve_run_dir(args)
    if not (run_dir / EVENTS).exists():
        print(f"autotune: waiting for {run_dir / EVENTS} ...", file=sys.stderr, flush=True)
    try:
        monitor = follow(run_dir, plain=args.plain, stream=sys.stdout)
    except KeyboardInterrupt:
        print(f"autotune: detached from {run_dir} (the run is not affected)", file=sys.stderr,
              flush=True)
        return 0
    state = monitor.state
    if lost := text.unreadable_line(state.unreadable):
        console.warning(lost)
    if monitor.gone():
        console.warning(f"{run_dir} has had no news for over {STALE_S:.0f} s and never said it "
                        f"ended: its autotune process was most likely killed")
        console.hint("'autotune tune --resume RUN_DIR' continues an interrupted tuning run")
    elif state.exit_code:
        print(f"autotune: the run ended with exit code {state.exit_code}", file=sys.stderr,
              flush=True)
    return 0
