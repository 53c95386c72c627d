"""A third-party script as it comes: ``autotune tune --budget`` on it, then a grid of its
per-rank batch by the script's own clock, and the tuned batch against the grid's best.

For scripts that are not bundled (minGPT's chargpt, pytorch/examples' word_language_model):
give the directory of a checkout and the command as its README runs it. Nothing in the script
is changed; the batch is set through its own flag.

1. Tune: ``autotune tune --json --plain --budget B --no-warm-start --baseline batch_size=N``
   in the script's directory (`bench.common.tune_as_user`), with the batch flag as a
   ``{batch_size}`` placeholder. Its
   search probes are counted from its journal: measured, no signal, pruned.
2. Grid: each of ``--batches`` (and the tuned batch) as a plain process for
   ``--grid-seconds``, then SIGINT (`bench.shapes.timed_run`), over ``--rounds`` rounds in
   alternating order (A B C, C B A, ...), so that the machine's drift falls on each alike. A
   run's figure is the mean of its own lines after the first: samples/s as printed, or from
   milliseconds per batch (``--rate-unit ms-per-batch``: batch x 1000 / ms, where a sample is
   one row of the batch, a sequence for a language model).
3. Verdict: the tuned batch's grid figure over the grid's best, with the rounds' 95% interval
   (`bench.common.ratio_interval`). Exits 1 below ``--target`` (0.95).

    .venv/bin/python bench/bench_asis.py --cwd ~/examples/word_language_model \\
        --batch-flag=--batch_size --default 20 --batches 10 20 40 80 160 \\
        --rate 'ms/batch +([0-9.]+)' --rate-unit ms-per-batch --budget 5m -- main.py

Not a test: it takes the budget plus batches x rounds x ``--grid-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import shapes  # noqa: E402
from bench.common import ratio_interval, say, tune_as_user  # noqa: E402

SEARCH_TRIALS = re.compile(r"^trial-\d+$")  # the search's own probes, as the journal names them


def probes_of(run_dir: Path) -> dict[str, int]:
    """The search's probes by outcome, from the tune's journal: a probe's ``trial_finished``,
    or its ``trial_pruned`` where it has none (a config not tried)."""
    outcomes: dict[str, str] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        label = str(e.get("trial"))
        if not SEARCH_TRIALS.match(label):
            continue
        if e.get("event") == "trial_finished":
            outcomes[label] = (e.get("result") or {}).get("outcome", "?")
        elif e.get("event") == "trial_pruned":
            outcomes.setdefault(label, "pruned")
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def rate_of(text: str, pattern: re.Pattern, unit: str, batch: int) -> float | None:
    """The script's own figure from its output: the mean of its lines after the first."""
    values = [float(m.group(1)) for m in pattern.finditer(text)][1:]
    if not values:
        return None
    if unit == "ms-per-batch":
        values = [batch * 1000.0 / v for v in values if v > 0]
    return sum(values) / len(values) if values else None


def batch_args(flag: str, value) -> list[str]:
    """The script's batch flag with ``value``: ``--batch_size 20``, or as one word for a flag
    given with its ``=`` (``--trainer.batch_size=`` -> ``--trainer.batch_size=20``)."""
    return [f"{flag}{value}"] if flag.endswith("=") else [flag, str(value)]


def grid(args, batches: list[int]) -> dict[int, list[float | None]]:
    """Each batch's own figure per round, the rounds in alternating order."""
    got: dict[int, list[float | None]] = {b: [] for b in batches}
    pattern = re.compile(args.rate, re.M)
    for r in range(args.rounds):
        for b in batches if r % 2 == 0 else batches[::-1]:
            argv = [sys.executable, *args.command, *args.grid_args,
                    *batch_args(args.batch_flag, b)]
            t0 = time.monotonic()
            out = shapes.timed_run(argv, args.cwd, args.grid_seconds, os.environ)
            rate = rate_of(out, pattern, args.rate_unit, b)
            got[b].append(rate)
            tail = out.strip().splitlines()[-1:] or [""]
            say(f"grid round {r + 1} batch {b}: "
                f"{'no figure: ' + tail[0][:200] if rate is None else f'{rate:.1f} samples/s'} "
                f"({time.monotonic() - t0:.0f} s)")
    return got


def mean(values) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cwd", type=Path, required=True, help="where the script runs")
    p.add_argument("--batch-flag", required=True,
                   help="the script's own batch flag, as --batch-flag=--batch_size (ending "
                        "in '=' for one word: --batch-flag=--trainer.batch_size=)")
    p.add_argument("--default", type=int, required=True, help="the script's own batch")
    p.add_argument("--batches", type=int, nargs="+", required=True)
    p.add_argument("--rate", required=True, help="regex of its throughput line; group 1")
    p.add_argument("--rate-unit", choices=("samples-per-s", "ms-per-batch"),
                   default="samples-per-s")
    p.add_argument("--budget", default="5m", help="tune's --budget ('' for the grid alone)")
    p.add_argument("--foreign-limit", type=float, default=None)
    p.add_argument("--grid-seconds", type=float, default=40.0)
    p.add_argument("--rounds", type=int, default=2, help="the grid's rounds (0: no grid)")
    p.add_argument("--grid-args", type=shlex.split, default=[],
                   help="more arguments for the grid's plain runs only, as one quoted string "
                        "(a shorter log interval, say: --grid-args='--log-interval 20'; the "
                        "tune runs the script as it comes)")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--out", type=Path, default=None, help="the JSON report")
    p.add_argument("command", nargs="+", help="the script and its fixed arguments")
    args = p.parse_args(argv)
    report: dict = {"command": args.command, "cwd": str(args.cwd), "budget": args.budget,
                    "default": args.default}
    tuned_batch = None
    if args.budget:
        work = Path(tempfile.mkdtemp(prefix="asis-"))
        report["work"] = str(work)
        say(f"tune {args.budget}: its runs, recipes and stderr under {work}")
        env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(work / "runs"))
        extra = ["--baseline", f"batch_size={args.default}"]
        if args.foreign_limit is not None:
            extra += ["--foreign-limit", str(args.foreign_limit)]
        script = [str(args.cwd / args.command[0]), *args.command[1:],
                  *batch_args(args.batch_flag, "{batch_size}")]
        tuned = tune_as_user(extra, script=script, budget=args.budget, work=work, env=env,
                             label=f"tune {args.budget}", cwd=args.cwd)
        s = tuned.summary
        if s is None:
            report["tune_error"] = tuned.error
        else:
            knobs = s["best"]["knobs"]
            tuned_batch = int(knobs.get("batch_size", args.default))
            report["tune"] = {"wall_s": tuned.wall_s, "best": knobs,
                              "kept_defaults": s["kept_baseline"], "speedup": s["speedup"],
                              "interval": s.get("speedup_interval"),
                              "stop_reason": s["stop_reason"],
                              "search_probes": probes_of(Path(s["run_dir"]))}
            say(f"tune {args.budget}: {tuned.wall_s:.0f} s, batch {tuned_batch}, search probes "
                f"{report['tune']['search_probes']}, stopped: {s['stop_reason']}")
    batches = sorted({*args.batches, args.default, *([tuned_batch] if tuned_batch else [])})
    got = grid(args, batches)
    means = {b: mean(v) for b, v in got.items()}
    best = max((b for b in batches if means[b] is not None), key=lambda b: means[b],
               default=None)
    report["grid"] = {str(b): {"rounds": got[b], "mean": means[b]} for b in batches}
    report["grid_best"] = best
    code = 1
    if best is not None and tuned_batch is not None and means.get(tuned_batch) is not None:
        pairs = [(t, g) for t, g in zip(got[tuned_batch], got[best])
                 if t is not None and g is not None]
        _, half = ratio_interval([t for t, _ in pairs], [g for _, g in pairs])
        ratio = means[tuned_batch] / means[best]
        lo, hi = ratio - half, ratio + half
        report["tuned_over_grid_best"] = {"ratio": ratio, "interval": [lo, hi]}
        code = 0 if ratio >= args.target else 1
        say(f"tuned batch {tuned_batch} / grid-best batch {best}: {ratio:.3f} "
            f"({lo:.3f}-{hi:.3f})")
    for b in batches:
        say(f"  batch {b:5d}: {means[b] or float('nan'):8.1f} samples/s  "
            f"{['-' if v is None else round(v, 1) for v in got[b]]}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
