"""Effect of the placement knobs on the DDP image example, side by side: instances (1 vs 2 ranks),
thread share per rank, and the DDP fusion bucket size (bucket_mb).

Each configuration is one `autotune.measuring.trial.run_trial` probe of
``examples/image_classifier/train.py`` (PNG decode + augment in the Dataset, DDP over gloo when
there are 2 ranks). Rounds are interleaved (A B C ... then again in a rotated order), because
variance on this kind of machine lives between processes more than within one; the table gives
the median over rounds and each round's value. A probe under foreign CPU load is re-run
(``--retries``); still flagged, it is marked ``*`` and left out of the median.

    python bench/bench_knobs.py [--rounds 3] [--seconds 35] [--num-images 1024]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from autotune.measuring.trial import TrialSpec, run_trial

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "image_classifier" / "train.py"

# name, instances, knobs (thread_pct: share of the cores per rank; bucket_mb: DDP bucket_cap_mb)
CONFIGS = [
    ("1 rank, torch default threads", 1, {}),
    ("1 rank, 50% of cores", 1, {"thread_pct": 50}),
    ("2 ranks, 50% each, bucket 25 MB", 2, {"thread_pct": 50, "bucket_mb": 25}),
    ("2 ranks, 100% each, bucket 25 MB", 2, {"thread_pct": 100, "bucket_mb": 25}),
    ("2 ranks, 50% each, bucket 0.05 MB", 2, {"thread_pct": 50, "bucket_mb": 0.05}),
    ("2 ranks, 50% each, pinned, bucket 25 MB", 2, {"thread_pct": 50, "pin": 1,
                                                     "bucket_mb": 25}),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=35.0, help="time limit of each probe")
    p.add_argument("--num-images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--retries", type=int, default=2,
                   help="re-runs of a probe flagged for foreign load (default 2)")
    args = p.parse_args()
    data_dir = args.data_dir or str(Path(tempfile.gettempdir()) /
                                    f"autotune-bench-images-{args.num_images}")
    command = (str(EXAMPLE), "--num-images", str(args.num_images), "--batch-size",
               str(args.batch_size), "--workers", "0", "--epochs", "1000", "--log-interval",
               "1000000", "--data-dir", data_dir)
    cores = len(os.sched_getaffinity(0))
    print(f"# bench_knobs {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()}: {cores} cores, "
          f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}")
    print(f"# {EXAMPLE.relative_to(ROOT)} --batch-size {args.batch_size} (per rank) --workers 0 "
          f"--num-images {args.num_images}; {args.rounds} interleaved rounds, probes of up to "
          f"{args.seconds:g} s", flush=True)
    _warm_dataset(command)
    runs: dict[str, list] = {name: [] for name, _, _ in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench-knobs-") as logs:
        for rnd in range(args.rounds):
            order = CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)]
            for name, instances, knobs in order:
                for attempt in range(1 + args.retries):  # a probe under foreign load is re-run
                    r = run_trial(TrialSpec.of(command=command, knobs=knobs, instances=instances,
                                            cwd=str(ROOT), log_dir=Path(logs), name="knobs",
                                            max_s=args.seconds, min_measure_s=10.0,
                                            target_rel=0.03))
                    if r.outcome.value != "foreign-load":
                        break
                    print(f"round {rnd + 1}: {name:42s} foreign load {r.foreign_cores:.2f} "
                          f"cores: again", flush=True)
                runs[name].append(r)
                flag = "*" if r.outcome.value == "foreign-load" else ""
                print(f"round {rnd + 1}: {name:42s} {r.samples_per_s:7.1f} samples/s "
                      f"+-{r.ci_half:5.1f} {r.outcome.value}{flag} "
                      f"foreign {r.foreign_cores:.2f} cores", flush=True)
    _table(runs, args.rounds)
    return 0


def _warm_dataset(command) -> None:
    """Generate the images once, outside any measurement."""
    r = run_trial(TrialSpec.of(command=command, cwd=str(ROOT), log_dir=Path(tempfile.gettempdir()),
                            name="bench-knobs-warm", max_s=300, min_measure_s=1.0,
                            target_rel=0.5))
    print(f"# dataset ready (warm-up probe: {r.outcome.value})", flush=True)


def _table(runs, rounds) -> None:
    print()
    header = " ".join(f"r{i + 1:<7d}" for i in range(rounds))
    print(f"{'configuration':42s} {'median':>8s} {'vs 1 rank':>9s}  {header}")
    base = None
    for name, _, _ in CONFIGS:
        results = runs[name]
        clean = [r.samples_per_s for r in results if r.ok]
        median = statistics.median(clean) if clean else 0.0
        if base is None:
            base = median
        ratio = f"{median / base:8.2f}x" if base and median else "       -"
        cells = " ".join(f"{r.samples_per_s:6.1f}{'*' if not r.ok else ' '} " for r in results)
        print(f"{name:42s} {median:8.1f} {ratio}  {cells}")
    print("(samples/s summed over ranks; * = not OK (foreign load or failed), left out of the "
          "median)")


if __name__ == "__main__":
    sys.exit(main())
