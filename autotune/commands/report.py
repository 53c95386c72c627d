"""``autotune report [RUN_DIR] [-o FILE]``: one self-contained HTML file that opens offline."""

from __future__ import annotations

from autotune.commands.monitor import add_run_dir_args, resolve_run_dir
from autotune import UsageError
from autotune.store.journal import EVENTS


def add_parser(sub):
    p = sub.add_parser("report", help="write an offline HTML report of a run",
                       description="Write one HTML file (no network needed to open it): "
                                   "optimisation history, throughput against each knob, "
                                   "parameter importance, probe modes, the recipe, the trials.")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write the report (default: RUN_DIR/report.html)")
    add_run_dir_args(p)
    return p


def run(args) -> int:
    from autotune.report.html import write_report

    run_dir = resolve_run_dir(args)
    if not (run_dir / EVENTS).is_file():
        raise UsageError(f"{run_dir} has no {EVENTS}: not an autotune run directory")
    try:
        out = write_report(run_dir, args.output)
    except OSError as exc:
        raise UsageError(f"cannot write the report to {args.output or run_dir}: {exc}") from None
    print(out)
    return 0
