"""Search benchmark: exhaustive grid vs ``autotune tune --budget``, on a bundled example or on a
third-party script's shape.

``--example image_classifier`` (the default: PNG decode and augmentation in the Dataset, a small
CNN) or ``compute_bound`` (an MLP on in-memory tensors: compute binds); the grid is measured with
autotune's own probes:

1. The baseline stage of ``autotune tune`` itself (`autotune.tuning.baseline.measure`: the
   example with its own settings, the two-rank probe that finds it data-parallel, the allreduce
   timing that bounds ``bucket_mb``) gives the space ``tune`` searches by default, or the one
   given with ``--space``.
2. Grid: every config of that space probed once, with the same probes the tuner uses
   (`run_trial` with the limits `tune` fits to the script from its baseline, or ``--seconds``);
   its best single measurement is "grid-best". Its wall time is what an exhaustive search costs.
3. Tune: ``autotune tune --budget`` (a subprocess, as a user runs it) with ``--budget-share`` of
   the grid's wall time, confirmation included.
4. Side by side: default, grid-best and tuned re-measured in one run, interleaved
   (A B C A B C ...), with longer probes; ratios with 95% intervals from the rounds.

``--shape word_lm|mingpt|nanogpt`` (`bench.shapes`: word_language_model without a DataLoader,
minGPT's chargpt with its 1 s steps, nanoGPT with ``--key=value`` flags and evaluation pauses):
the grid is measured by the script's own clock, not by autotune's meter.

1. The same baseline stage gives the space; every config must be one a user can set without
   autotune (`bench.shapes.plain_run`: flags through the placeholders, the thread share as the
   thread count autotune gives it, in ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``). A space with a
   knob a plain run cannot set (ranks, a DataLoader setting without a flag) is refused (exit 2):
   restrict it with ``--space``.
2. Grid: every config a plain process (``python script ARGS``) for ``--grid-seconds``, then
   SIGINT; its figure the mean of the script's own throughput lines after the first, over
   ``--grid-rounds`` interleaved rounds; grid-best the best mean. The grid's cost is the wall
   time of one round (a user trying each config once). ``--grid-from FILE`` reads it from an
   earlier run's ``--out`` instead (same shape and space, or exit 2); it only names
   grid-best, which step 4 measures afresh.
   Then the grid's ``--judge-top`` (3) best configs by those means are measured again in
   ``--rounds`` rounds that take turns (as step 4 does), and grid-best is the best of them:
   plain runs one after another rank configs 5-10% apart by when they ran. Its time is
   reported apart from the grid's cost. ``--grid-from`` reuses the file's judging too, where it
   judged the same configs.
3. Tune: ``autotune tune --budget B`` as a user runs it, for each of ``--budgets`` (default
   ``6m 5m``: 10% of a one-hour run, and a fixed five minutes), each in a fresh directory.
4. Side by side, plain processes by the script's own clock: default (the user's own run),
   grid-best and each budget's tuned config, over ``--rounds`` rounds; a config two entries
   share is run once per round and read for both. A round's runs take turns on the machine
   (`bench.turns`: all started, each held with SIGSTOP outside its slices, A B B A, until each
   ran ``--final-seconds``; its figure the mean of its own lines that fell inside a slice), so
   that the machine's drift falls on each alike; ``--side-by-side sequential`` runs them one
   after another instead.

Per budget: tuned/grid-best and tuned/default with 95% intervals, the tune's wall time over the
grid's cost, its stop reason, whether it kept the defaults, and the noise figures its summary
holds. Exits 1 when a budget's tuned/grid-best is below 0.95 or nothing was measured.

Prints the table and writes JSON (``--out``). Not a test: it takes tens of minutes (the default
space with ranks and buckets holds a few hundred configs; a shape's grid is its configs x
``--grid-seconds`` x ``--grid-rounds``, and each budget's tune its budget).

    .venv/bin/python bench/bench_search.py --rounds 3
    .venv/bin/python bench/bench_search.py --shape nanogpt --budgets 6m 5m --rounds 3

This file is the command line; ``bench/search_example.py`` and ``bench/search_shape.py`` hold the
two modes, ``bench/search_common.py`` the baseline stage, the target and the verdict they share.
"""


from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT  # noqa: E402
from autotune import AutotuneError, UsageError  # noqa: E402
from autotune.tuning import space  # noqa: E402
from bench import shapes, turns  # noqa: E402
from bench.common import say  # noqa: E402
from bench.search_example import example_mode  # noqa: E402
from bench.search_shape import shape_mode  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="one probe, grid and tune (default: fitted to the script, as tune does; "
                        "--example only)")
    p.add_argument("--final-seconds", type=float, default=None,
                   help="one side-by-side probe, or plain run with --shape (default 25; with "
                        "--shape, --grid-seconds: as long as every config of the grid needed "
                        "to print its rate, a slow first step included)")
    p.add_argument("--rounds", type=int, default=3, help="side-by-side rounds")
    p.add_argument("--side-by-side", choices=("turns", "sequential"), default="turns",
                   help="--shape: the side by side's plain runs of a round take turns on the "
                        "machine, each read from its own lines inside its slices (default), or "
                        "run one after another")
    p.add_argument("--budget-share", type=float, default=None,
                   help="tune budget as a share of the grid's wall time (default 0.25; "
                        "--example only)")
    p.add_argument("--confirm-rounds", type=int, default=None,
                   help="tune's confirmation rounds (default: tune's own)")
    p.add_argument("--space", nargs="*", default=[], help="as autotune tune --space")
    p.add_argument("--example", choices=("image_classifier", "compute_bound"), default=None,
                   help="a bundled example, its grid probed by autotune (default "
                        "image_classifier)")
    p.add_argument("--shape", choices=shapes.SEARCHED, default=None,
                   help="a third-party script's shape, its grid run as plain processes and "
                        "read from the script's own clock")
    p.add_argument("--grid-seconds", type=float, default=30.0,
                   help="one plain run of the grid (--shape)")
    p.add_argument("--grid-rounds", type=int, default=2,
                   help="interleaved rounds of the grid; grid-best is the best mean (--shape)")
    p.add_argument("--judge-top", type=int, default=3,
                   help="--shape: the grid's best N configs measured again in --rounds rounds "
                        "taking turns, grid-best the best of them (1: the grid's own best)")
    p.add_argument("--grid-from", type=Path, default=None,
                   help="the grid of an earlier --shape run of the same shape and space, from "
                        "its --out JSON, instead of measuring it again (--shape; the side by "
                        "side still measures grid-best afresh beside the tuned)")
    p.add_argument("--budgets", nargs="+", default=["6m", "5m"], type=budget,
                   help="tune's --budget, one tune each (--shape; default: 6m, 10%% of a "
                        "one-hour run, and a fixed 5m)")
    p.add_argument("--num-images", type=int, default=512, help="image_classifier's dataset")
    p.add_argument("--foreign-limit", type=float, default=FOREIGN_CORES_LIMIT,
                   help="foreign CPU load (cores) that spoils a probe, for grid, tune and the "
                        "side-by-side alike (default: autotune's)")
    p.add_argument("--foreign-retries", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 for an interval, but got {args.rounds}")
    if args.shape:
        given = [flag for flag, v in (("--example", args.example), ("--seconds", args.seconds),
                                      ("--budget-share", args.budget_share)) if v is not None]
        if given:
            p.error(f"--shape runs tune as a user does and grids by the script's own clock; "
                    f"drop {', '.join(given)}")
        if len(set(args.budgets)) != len(args.budgets):
            p.error(f"--budgets must differ, but got {' '.join(args.budgets)}")
        if args.grid_from is not None and not args.grid_from.is_file():
            p.error(f"--grid-from {args.grid_from}: no such file; give the --out JSON of an "
                    f"earlier --shape {args.shape} run")
        if args.judge_top < 1:
            p.error(f"--judge-top must be at least 1, but got {args.judge_top}")
        if args.grid_rounds < 1 or args.grid_seconds <= 0:
            p.error(f"--grid-rounds >= 1 and --grid-seconds > 0 must hold, but got "
                    f"{args.grid_rounds} and {args.grid_seconds:g}")
    elif args.grid_from is not None:
        p.error("--grid-from reuses a --shape run's grid; give --shape too")
    if args.final_seconds is None:
        args.final_seconds = args.grid_seconds if args.shape else 25.0
    try:
        space.parse_space(args.space)
    except UsageError as e:
        p.error(str(e))
    args.example = args.example or "image_classifier"
    args.budget_share = 0.25 if args.budget_share is None else args.budget_share
    args.work = Path(tempfile.mkdtemp(prefix="bench_search-"))
    try:
        return shape_mode(args) if args.shape else example_mode(args)
    except AutotuneError as e:  # the baseline stage's: nothing was measured
        say(f"FAILED: {e} (work dir {args.work})")
        return 2 if isinstance(e, UsageError) else 1


def budget(text: str) -> str:
    """A ``--budgets`` entry, checked as tune checks its ``--budget``, kept as typed."""
    try:
        space.parse_duration(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


if __name__ == "__main__":
    turns.end_on_sigterm()
    sys.exit(main())
