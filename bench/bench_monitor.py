"""How much CPU does the monitor itself take during a run? Target: under 2% of one core.

While a real training process runs (a small torch model fed by a DataLoader with 2 workers, a
child of this process like a rank is), a replayer thread writes a tuning run's journal at
realistic rates (a trial every ~10 s with one progress event a second, a best event every few
trials, then full-run progress once a second), and `autotune.monitor.watch` shows it: the live
rich view (rendered for a 120x50 terminal) or plain lines, plus the device sampler. The CPU
time of the monitor's two threads (``time.thread_time`` inside each) over the wall time is the
share of one core it used. The replayer and the training process are not counted.

    python bench/bench_monitor.py [--seconds 60] [--modes live,plain]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
from rich.console import Console

from autotune.store.journal import Journal
from autotune.monitor import Monitor, sampler
from autotune.monitor.sampler import Sampler

TRAIN = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
ds = TensorDataset(torch.randn(8192, 64), torch.randint(0, 10, (8192,)))
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
while True:
    for x, y in DataLoader(ds, batch_size=64, num_workers=2):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
"""


def replay(journal: Journal, stop: threading.Event, *, trial_s: float = 10.0) -> int:
    """Write a tuning run's events at realistic rates until ``stop``; returns events written."""
    n = 0

    def emit(name, **f):
        nonlocal n
        journal.emit(name, **f)
        n += 1

    emit("run_started", kind="tune", command=["train.py", "--epochs", "90"], cwd=".",
         budget_s=1800, trials=40, hardware={"cores": os.cpu_count()})
    number = 0
    while not stop.is_set():
        name = f"trial-{number}"
        knobs = {"batch_size": 32 * (1 + number % 8), "workers": number % 4,
                 "thread_pct": 25 * (1 + number % 4)}
        emit("trial_started", trial=name, number=number, knobs=knobs, mode="full")
        t0 = time.monotonic()
        while time.monotonic() - t0 < trial_s and not stop.wait(1.0):
            emit("trial_progress", trial=name, samples_per_s=200.0 + number, ci_half=8.0,
                 measured_s=time.monotonic() - t0)
        outcome = "ok" if number % 5 else "oom"
        emit("trial_finished", trial=name, number=number, mode="full",
             result={"outcome": outcome, "reason": "" if outcome == "ok" else "out of memory",
                     "samples_per_s": 200.0 + number if outcome == "ok" else 0.0,
                     "ci_half": 6.0, "duration_s": trial_s, "knobs": knobs})
        if number % 4 == 3:
            emit("best", knobs=knobs, samples_per_s=200.0 + number, ci_half=5.0,
                 baseline_samples_per_s=200.0, speedup=1 + number / 200, kept_baseline=False,
                 reason="", speedup_low=None, speedup_high=None, objective="throughput",
                 score=None, baseline_score=None)
        if number % 10 == 9:  # a stretch of full run between searches
            t0 = time.monotonic()
            emit("fullrun_started", command=["train.py"], knobs=knobs, instances=1,
                 launcher="local")
            while time.monotonic() - t0 < trial_s and not stop.wait(1.0):
                emit("fullrun_progress", samples_per_s=250.0, steps=number, samples=64 * number)
        number += 1
    return n


def measure(mode: str, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        journal = Journal(run_dir)
        if mode == "live":
            console = Console(file=io.StringIO(), force_terminal=True, width=120, height=50)
            monitor = Monitor(run_dir, console=console)
        else:
            monitor = Monitor(run_dir, plain=True, stream=io.StringIO())
        samp = Sampler(run_dir, interval_s=sampler.INTERVAL_S)
        stop = threading.Event()
        counted = {}
        rep = threading.Thread(target=lambda: counted.update(n=replay(journal, stop)))
        wall0 = time.monotonic()
        monitor.start_live()
        monitor.start_thread()
        samp.start()
        rep.start()
        time.sleep(seconds)
        stop.set()
        rep.join()
        samp.stop()
        monitor.stop()
        wall = time.monotonic() - wall0
        return {"mode": mode, "wall_s": wall, "monitor_cpu_s": monitor.cpu_s,
                "sampler_cpu_s": samp.cpu_s, "events": counted.get("n", 0),
                "share": (monitor.cpu_s + samp.cpu_s) / wall, "failed": monitor.failed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--modes", default="live,plain")
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(TRAIN)
    train = subprocess.Popen([sys.executable, f.name], stdout=subprocess.DEVNULL)
    try:
        print(f"# bench_monitor {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()}: "
              f"{psutil.cpu_count()} cores, {platform.processor() or platform.machine()}, "
              f"Python {platform.python_version()}, torch {torch.__version__}")
        print(f"# real training child running (pid {train.pid}, 2 DataLoader workers); "
              f"{args.seconds:.0f} s per mode; sampler every {sampler.INTERVAL_S:.0f} s")
        print(f"{'mode':<6} {'wall s':>7} {'events':>7} {'monitor cpu s':>14} "
              f"{'sampler cpu s':>14} {'share of 1 core':>16}")
        worst = 0.0
        for mode in args.modes.split(","):
            r = measure(mode.strip(), args.seconds)
            worst = max(worst, r["share"])
            print(f"{r['mode']:<6} {r['wall_s']:7.1f} {r['events']:7d} {r['monitor_cpu_s']:14.3f} "
                  f"{r['sampler_cpu_s']:14.3f} {r['share']:15.2%}"
                  + (f"  (live view failed: {r['failed']})" if r["failed"] else ""))
        print(f"worst: {worst:.2%} of one core (target < 2%): {'OK' if worst < 0.02 else 'OVER'}")
        return 0 if worst < 0.02 else 1
    finally:
        for child in psutil.Process(train.pid).children(recursive=True):
            child.kill()
        train.kill()
        train.wait()
        os.unlink(f.name)


if __name__ == "__main__":
    sys.exit(main())
