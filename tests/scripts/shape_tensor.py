"""No DataLoader: batches sliced from a tensor or a numpy memmap, weights updated by an optimizer
or by hand (no optimizer at all). Trains a tiny MLP until stopped (or ``--steps``), printing its
own throughput about every ``--log-s`` seconds, timed around the training loop, with running
totals of samples trained on and seconds spent training, and the monotonic clock's time of the line:

    step 120 loss 2.2731 samples/s 1630.2 ms/step 9.82 train_samples 1920 train_s 1.178 at 5123.456
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--source", choices=("tensor", "memmap"), default="tensor")
parser.add_argument("--update", choices=("optimizer", "manual"), default="optimizer")
parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
parser.add_argument("--log-s", type=float, default=0.5)
parser.add_argument("--pace-ms", type=float, default=20.0, help="extra time per step (I/O)")
args = parser.parse_args()

torch.manual_seed(0)
N, D, C = 4096, 64, 10
features = torch.randn(N, D)
labels = torch.randint(0, C, (N,))
tmp = None
if args.source == "memmap":
    tmp = tempfile.mkdtemp(prefix="shape-memmap-")
    path = os.path.join(tmp, "features.f32")
    out = np.memmap(path, dtype=np.float32, mode="w+", shape=(N, D))
    out[:] = features.numpy()
    out.flush()
    del out
    features = np.memmap(path, dtype=np.float32, mode="r", shape=(N, D))


def batch(i):
    lo = (i * args.batch_size) % (N - args.batch_size)
    x = features[lo:lo + args.batch_size]
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x, labels[lo:lo + args.batch_size]


model = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, C))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05) if args.update == "optimizer" else None
step, t_log, n_log = 0, time.perf_counter(), 0
t_start = t_log
try:
    while not args.steps or step < args.steps:
        x, y = batch(step)
        time.sleep(args.pace_ms / 1000)
        loss = nn.functional.cross_entropy(model(x), y)
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
                    p.grad = None
        step += 1
        n_log += 1
        now = time.perf_counter()
        if now - t_log >= args.log_s:
            dt = now - t_log
            print(f"step {step} loss {loss.item():.4f} samples/s {n_log * args.batch_size / dt:.1f}"
                  f" ms/step {1000 * dt / n_log:.2f} train_samples {step * args.batch_size}"
                  f" train_s {now - t_start:.3f} at {time.monotonic():.3f}")
            t_log, n_log = now, 0
finally:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
print(f"done: {step} steps")
