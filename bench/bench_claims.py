"""Claims against the script's own clock: does the speed-up ``autotune tune`` claims hold when the
script measures it, outside autotune?

For each case (a script and the placeholders a user would write: its shape, `bench.shapes`):

1. ``autotune tune --budget B --json``, as a user runs it (a subprocess, no ``--seconds``: probes
   fitted to the script). Its claim: the speed-up and its 95% interval, and the recipe.
2. Rounds, interleaved: the script as the user runs it (its own defaults), then
   ``autotune run --recipe`` with the same arguments, each for ``--run-seconds`` (then SIGINT).
   Each run's figure is the mean of the script's own printed ``samples/s`` lines after the first
   (the first holds start-up and warm-up).
3. The measured speed-up: the mean of the per-round ratios (recipe / default) with a 95%
   t-interval over the rounds. The claim holds when it lies inside that interval, and the two
   intervals overlap.

Exits 1 when a claim falls outside the measured interval, a case could not be measured (the
tune failed, or fewer than two rounds gave the script's own figure for both runs: no interval),
and 2 for ``--rounds`` below 2, which could only pass on an infinite interval.

Prints a table per case and writes JSON (``--out``). Not a test: minutes per case.

    .venv/bin/python bench/bench_claims.py --budget 4m --rounds 4 --run-seconds 45
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.hardware import fingerprint  # noqa: E402
from bench.common import interval, say, tune_as_user  # noqa: E402
from bench.shapes import named, own_rate, timed_run  # noqa: E402

# the shapes (`bench.shapes`) under the names this bench has always given them
CASES = ("word_lm", "slow_steps", "lightning_ddp")


def run_case(name: str, args, work: Path) -> dict:
    shape = named(name)
    script, placeholders = list(shape.script), list(shape.placeholders)
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(work / "runs"))
    tuned = tune_as_user(
        [*shape.tune_args(), *(["--foreign-limit", str(args.foreign_limit)]
                               if args.foreign_limit is not None else [])],
        script=[*script, *placeholders], budget=args.budget, work=work, env=env, label=name)
    if tuned.summary is None:
        return {"case": name, "error": tuned.error}
    s, tune_s = tuned.summary, tuned.wall_s
    low, high = s.get("speedup_interval", [math.nan, math.nan])
    say(f"# {name}: tune {tune_s:.0f} s, {s['trials']} probes, stopped: {s['stop_reason']}")
    say(f"# {name}: best {s['best']['knobs']}; claim {s['speedup']:.3f}x "
        f"(95% interval {low:.3f}x-{high:.3f}x){' (kept the defaults)' if s['kept_baseline'] else ''}")
    plain = [sys.executable, *script, *shape.plain_args]
    run = [sys.executable, "-m", "autotune", "run", "--plain", "--recipe", s["recipe"], "--",
           *script, *placeholders]
    rates: dict[str, list[float | None]] = {"default": [], "recipe": []}
    for rnd in range(1, args.rounds + 1):
        for label, argv in (("default", plain), ("recipe", run)):
            r = own_rate(timed_run(argv, work, args.run_seconds, env), shape.rate)
            rates[label].append(r)
            say(f"{name} round {rnd} {label:8s} "
                + (f"{r:8.2f} samples/s (the script's own)" if r else "no rate printed"))
    ratios = [r / d for r, d in zip(rates["recipe"], rates["default"]) if r and d]
    m, half = interval(ratios)
    claim = 1.0 if s["kept_baseline"] else s["speedup"]
    if len(ratios) < 2:  # no interval: nothing was measured that a claim could be held to
        say(f"{name}: only {len(ratios)} round(s) gave the script's own figure for both runs; "
            f"not measured")
        return {"case": name, "error": "fewer than two measured rounds", "summary": s,
                "rates": rates, "ratios": ratios}
    inside = m - half <= claim <= m + half
    overlap = not s["kept_baseline"] and low <= m + half and m - half <= high
    say(f"{name}: measured {m:.3f}x ± {half:.3f} over {len(ratios)} round(s); claim "
        f"{claim:.3f}x {'inside' if inside else 'OUTSIDE'} the measured interval"
        + (f"; intervals {'overlap' if overlap else 'DO NOT overlap'}"
           if not s["kept_baseline"] else ""))
    return {"case": name, "tune_s": tune_s, "summary": s, "claim": claim,
            "claim_interval": [low, high], "rates": rates, "ratios": ratios,
            "measured": [m, half], "inside": inside, "overlap": overlap}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--budget", default="4m", help="tune's --budget for each case")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds outside autotune")
    p.add_argument("--run-seconds", type=float, default=45.0, help="one run outside autotune")
    p.add_argument("--foreign-limit", type=float, default=None,
                   help="tune's --foreign-limit (default: autotune's); a higher one lets a "
                        "case whose steps wait (slow_steps) be tuned beside other work")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 for an interval, but got {args.rounds}")
    work = Path(tempfile.mkdtemp(prefix="bench_claims-"))
    fp = fingerprint.current([sys.executable])
    say(f"# bench_claims {datetime.datetime.now():%Y-%m-%d %H:%M} on "
        f"{platform.node() or 'host'}: {fp.cores} cores ({fp.cpu_model}), Python "
        f"{platform.python_version()}, torch {fp.torch_version}; tune --budget {args.budget}, "
        f"{args.rounds} rounds of {args.run_seconds:.0f} s runs"
        + (f", --foreign-limit {args.foreign_limit:g}" if args.foreign_limit is not None else "")
        + f"; work dir {work}")
    results = [run_case(name, args, work) for name in args.cases]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    missed = [r["case"] for r in results if not r.get("inside")]
    if missed:
        say(f"FAILED: {', '.join(missed)}: the claim is outside what the script's clock shows, "
            f"or nothing could be measured")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
