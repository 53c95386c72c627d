"""Does a short probe tell what a long plain run gets? (not a test; prints a report)

For each round, interleaved in one run: a probe of the unmodified image example under autotune
(`run_trial`, mode full), then the same script run plainly with `python` for ten times the probe's
duration, its throughput read from its own log lines (first interval dropped as start-up; the
harmonic mean of the equal-sized intervals is its overall rate). The ratio probe / plain should
sit within the machine's between-process noise (~10-13% CV here). Foreign CPU load is recorded for
both sides, since a busy neighbour slows a config many times over.

    python bench/bench_probe_accuracy.py [--rounds 2] [--probe-seconds 30] [--images 1024]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.measuring.foreign_load import ForeignLoad  # noqa: E402
from autotune.measuring.trial import TrialSpec, run_trial  # noqa: E402

EXAMPLE = ROOT / "examples" / "image_classifier" / "train.py"
LINE = re.compile(r"samples/s ([0-9.]+)$")


def plain_run(args: list[str], steps: int, log: Path) -> tuple[float, float, float]:
    """(samples/s from the script's own lines, wall seconds, foreign cores)."""
    load = ForeignLoad()
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(EXAMPLE), *args, "--max-steps", str(steps),
                                 "--epochs", "1000"], stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            try:
                import psutil
                procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(True)]
                load.sample(procs)
            except Exception:  # noqa: BLE001 - it just ended
                pass
            time.sleep(0.5)
    wall = time.monotonic() - t0
    rates = [float(m.group(1)) for line in open(log) if (m := LINE.search(line.strip()))
             and line.startswith("epoch")]
    rates = rates[1:]  # the first interval holds start-up
    if not rates:
        raise SystemExit(f"no throughput lines in {log}")
    return statistics.harmonic_mean(rates), wall, load.cores()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--probe-seconds", type=float, default=30.0)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--factor", type=float, default=10.0, help="plain run length / probe length")
    opts = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-accuracy-"))
    data = work / "data"
    script_args = ["--num-images", str(opts.images), "--data-dir", str(data),
                   "--log-interval", "10"]
    # Generate the dataset once, outside any measurement.
    subprocess.run([sys.executable, str(EXAMPLE), *script_args, "--max-steps", "1"], check=True,
                   stdout=subprocess.DEVNULL)

    print(f"# bench_probe_accuracy {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()}: "
          f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print(f"# image example, {opts.images} images, batch 32, workers 0; probe <= "
          f"{opts.probe_seconds:.0f} s, plain run {opts.factor:.0f}x the probe's duration")
    print(f"{'round':>5} {'probe/s':>9} {'±CI':>7} {'probe_s':>8} {'foreign':>8} "
          f"{'plain/s':>9} {'plain_s':>8} {'foreign':>8} {'ratio':>6}")
    ratios = []
    for rnd in range(1, opts.rounds + 1):
        r = run_trial(TrialSpec.of(command=(str(EXAMPLE), *script_args, "--epochs", "1000"),
                                cwd=str(work), log_dir=work / "logs", name=f"probe{rnd}",
                                max_s=opts.probe_seconds, foreign_limit_cores=math.inf))
        if r.samples_per_s <= 0:
            print(f"{rnd:>5} probe failed: {r.outcome.value}: {r.reason}")
            continue
        steps = int(opts.factor * r.duration_s * r.samples_per_s / 32) + 20
        plain, wall, foreign = plain_run(script_args, steps, work / f"plain{rnd}.log")
        ratio = r.samples_per_s / plain
        ratios.append(ratio)
        print(f"{rnd:>5} {r.samples_per_s:>9.1f} {r.ci_half:>7.1f} {r.duration_s:>8.1f} "
              f"{r.foreign_cores:>8.2f} {plain:>9.1f} {wall:>8.1f} {foreign:>8.2f} "
              f"{ratio:>6.3f}", flush=True)
    if ratios:
        print(f"# probe / plain: mean {statistics.mean(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f} over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
