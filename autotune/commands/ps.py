"""``autotune ps``: the runs under the runs directory, newest first, one line each."""

from __future__ import annotations

import time

from autotune.commands.monitor import add_runs_dir_arg, runs_root
from autotune.monitor.runs import RunInfo, info
from autotune.store import jsontext, rundir
from autotune.tuning.payback import minutes

RECENT = 10  # runs listed without --all, besides every live one


def add_parser(sub):
    p = sub.add_parser("ps", help="list runs: id, command, script, state, elapsed, speed-up",
                       description="The runs under the runs directory, newest first: id, "
                                   "command, script, state (starting, tuning, confirming, "
                                   "running, finished, failed(exit code), stopped, lost), "
                                   "elapsed time, and the best speed-up so far or the full "
                                   "run's samples/s against the recipe's. State comes from "
                                   "each run's journal and whether its controller is alive.")
    p.add_argument("-a", "--all", action="store_true",
                   help=f"every run (default: the live ones and the {RECENT} newest)")
    p.add_argument("--json", action="store_true",
                   help="a JSON list of objects (id, command, script, state, exit_code, pid, "
                        "started, ended, elapsed_s, figure, path, again_of, again_in)")
    add_runs_dir_arg(p)
    return p


def listed(runs: list[RunInfo], every: bool) -> list[RunInfo]:
    """Every run, or the live ones and the `RECENT` newest, newest first."""
    if every:
        return runs
    return [r for i, r in enumerate(runs) if i < RECENT or r.status.live]


def line(r: RunInfo, now: float) -> tuple[str, ...]:
    extra = f" (again as {r.again_in})" if r.again_in else ""
    return (r.id, r.command, r.script, r.state_text + extra, minutes(r.elapsed_s(now)),
            r.figure)


def table(rows: list[tuple[str, ...]]) -> list[str]:
    head = ("ID", "COMMAND", "SCRIPT", "STATE", "ELAPSED", "SPEED-UP / RATE")
    widths = [max(len(x[i]) for x in (head, *rows)) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
            for row in (head, *rows)]


def run(args) -> int:
    now = time.time()
    runs = listed([info(d, now) for d in rundir.run_dirs(runs_root(args))], args.all)
    if args.json:
        print(jsontext.dumps([r.to_dict(now) for r in runs]))
        return 0
    if not runs:
        print(f"no runs under {runs_root(args) or rundir.runs_root()}")
        return 0
    for text in table([line(r, now) for r in runs]):
        print(text)
    return 0
