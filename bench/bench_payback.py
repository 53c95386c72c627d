"""Payback against the clock: is the full run as long as ``autotune tune`` projected it?

``tune`` projects the full run's length from the script's own arguments (``--epochs`` over the
dataset's length that its DataLoader knows) at the baseline's throughput and at the winner's, and
says what tuning cost against what the winner saves (`autotune.tuning.payback`). This bench
checks those projections against whole runs on the bundled examples:

1. ``autotune tune --budget B --json`` as a user runs it; its ``payback``: the run's samples,
   its projected length at the script's own settings and with the winner, tuning's cost.
2. Rounds, interleaved: the whole run as the user runs it (``python train.py ARGS``) and
   ``autotune run --recipe`` with the same arguments, each to its end. Two times for each:
   the process's wall time (start-up and dataset preparation included) and the training time
   by the script's own clock (its ``done: N steps, mean samples/s X`` line: the run's samples
   over X).
3. Per case: projected / actual for both, and the projected saving against the one measured.

Exits 1 when a projection misses the script's own clock by more than `TOLERANCE` (either run),
or a case could not be measured (the tune failed, projected nothing, or no run printed its
``done:`` line).

Prints a table per case and writes JSON (``--out``). Not a test: minutes per case.

    .venv/bin/python bench/bench_payback.py --budget 2m --rounds 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.hardware import fingerprint  # noqa: E402
from autotune.tuning.payback import duration  # noqa: E402
from bench.common import say, tune_as_user  # noqa: E402

EXAMPLES = ROOT / "examples"
DONE = re.compile(r"^(?:\[rank 0\] )?done: (\d+) steps, mean samples/s ([0-9.]+)", re.M)

# name -> (script, its arguments for the whole run; the data dir is added per work dir)
CASES = {
    "image_classifier": (EXAMPLES / "image_classifier" / "train.py",
                         ["--num-images", "1024", "--epochs", "16"]),
    "compute_bound": (EXAMPLES / "compute_bound" / "train.py",
                      ["--num-samples", "8192", "--epochs", "4"]),
}


def whole_run(argv: list[str], cwd: Path, env: dict, samples: float) -> dict:
    """One run to its end: wall time, and training time by the script's own clock."""
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    wall_s = time.monotonic() - t0
    m = DONE.search(p.stdout)
    own_s = samples / float(m.group(2)) if m and float(m.group(2)) > 0 else None
    return {"exit_code": p.returncode, "wall_s": wall_s, "own_s": own_s,
            "tail": p.stdout[-1500:] if p.returncode or own_s is None else ""}


TOLERANCE = 0.15  # |projected / own clock - 1| a projection may miss by


def off_the_clock(projected: dict, actual: dict) -> tuple[dict, dict]:
    """(projected / own clock for each run, those of them off by more than `TOLERANCE`); a run
    with no time of its own gives nan, which counts as off."""
    misses = {label: ratio(projected[label], actual[label]["own_s"]) for label in projected}
    return misses, {k: v for k, v in misses.items() if not abs(v - 1) <= TOLERANCE}


def dur(s: float) -> str:
    return duration(s) if s == s and s != float("inf") else "-"


def ratio(a: float, b: float) -> float:
    return a / b if b == b and b > 0 else float("nan")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def run_case(name: str, args, work: Path) -> dict:
    script, script_args = CASES[name]
    script_args = [*script_args, *(["--data-dir", str(work / "data")]
                                   if name == "image_classifier" else [])]
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(work / "runs"))
    plain = [sys.executable, str(script), *script_args]
    if name == "image_classifier":  # the images are made once, before anything is timed
        subprocess.run([*plain, "--max-steps", "1"], cwd=work, env=env, check=True,
                       capture_output=True)
    tuned = tune_as_user([], script=[str(script), *script_args], budget=args.budget, work=work,
                         env=env, label=name)
    if tuned.summary is None:
        return {"case": name, "error": tuned.error}
    s, tune_s = tuned.summary, tuned.wall_s
    pb = s.get("payback")
    if not pb:
        say(f"{name}: tune projected no run length (notes: {s.get('notes')})")
        return {"case": name, "error": "no projection", "summary": s}
    samples = float(pb["run"]["samples"])
    say(f"# {name}: tune {tune_s:.0f} s, {s['trials']} probes, best {s['best']['knobs']}"
        f"{' (kept the defaults)' if s['kept_baseline'] else ''}")
    say(f"# {name}: payback: {pb['text']}")
    run = [sys.executable, "-m", "autotune", "run", "--plain", "--recipe", s["recipe"], "--",
           str(script), *script_args]
    runs: dict[str, list[dict]] = {"default": [], "recipe": []}
    for rnd in range(1, args.rounds + 1):
        for label, argv in (("default", plain), ("recipe", run)):
            r = whole_run(argv, work, env, samples)
            runs[label].append(r)
            own = f"{r['own_s']:7.1f} s by its own clock" if r["own_s"] else "no 'done:' line"
            say(f"{name} round {rnd} {label:8s} wall {r['wall_s']:7.1f} s, {own}"
                f" (exit {r['exit_code']})" + (f"\n{r['tail']}" if r["tail"] else ""))
    actual = {label: {"wall_s": mean([r["wall_s"] for r in rs if r["exit_code"] == 0]),
                      "own_s": mean([r["own_s"] for r in rs if r["own_s"]])}
              for label, rs in runs.items()}
    projected = {"default": pb["baseline_run_s"], "recipe": pb["best_run_s"]}
    say(f"\n{'run':8s} {'projected':>10s} {'own clock':>10s} {'wall':>10s}  "
        f"{'projected/own':>13s} {'projected/wall':>14s}")
    for label in ("default", "recipe"):
        a = actual[label]
        say(f"{label:8s} {dur(projected[label]):>10s} {dur(a['own_s']):>10s} "
            f"{dur(a['wall_s']):>10s}  {ratio(projected[label], a['own_s']):13.3f} "
            f"{ratio(projected[label], a['wall_s']):14.3f}")
    saving_own = actual["default"]["own_s"] - actual["recipe"]["own_s"]
    saving_wall = actual["default"]["wall_s"] - actual["recipe"]["wall_s"]
    say(f"saving: projected {duration(max(0.0, pb['saving_s']))}, measured "
        f"{dur(max(0.0, saving_own))} by the script's clock "
        f"({saving_own:+.0f} s), {saving_wall:+.0f} s of wall time; tuning cost "
        f"{duration(pb['tuning_s'])}")
    misses, bad = off_the_clock(projected, actual)
    if bad:
        say(f"{name}: FAILED: projected / own clock "
            + ", ".join(f"{k} {v:.3f}" for k, v in bad.items())
            + f" (allowed 1 ± {TOLERANCE:.2f}; nan: no run printed its own time)")
    return {"case": name, "tune_s": tune_s, "summary": s, "payback": pb, "runs": runs,
            "projected_over_own": misses, **({"error": f"projection off: {bad}"} if bad else {}),
            "actual": actual, "projected": projected,
            "saving": {"projected_s": pb["saving_s"], "own_s": saving_own,
                       "wall_s": saving_wall}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--budget", default="2m", help="tune's --budget for each case")
    p.add_argument("--rounds", type=int, default=2, help="interleaved whole runs of each")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_payback-"))
    fp = fingerprint.current([sys.executable])
    say(f"# bench_payback {datetime.datetime.now():%Y-%m-%d %H:%M} on "
        f"{platform.node() or 'host'}: {fp.cores} cores ({fp.cpu_model}), Python "
        f"{platform.python_version()}, torch {fp.torch_version}; tune --budget {args.budget}, "
        f"{args.rounds} rounds of whole runs; work dir {work}")
    results = [run_case(name, args, work) for name in args.cases]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
