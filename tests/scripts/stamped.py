"""A loop of steps that each wait ``--step-ms`` (a device's work) after a tiny real optimizer
step, and print the system's monotonic clock as each ends: ``step N T``. Processes on one host
share that clock, so a test can tell when each process stepped. ``--crash-after N`` raises
after N steps. No DataLoader: a step is ``--batch`` samples."""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=8)
p.add_argument("--step-ms", type=float, default=20.0)
p.add_argument("--crash-after", type=int, default=None)
args = p.parse_args()

model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch, 16)
step = 0
while True:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(args.step_ms / 1000)
    step += 1
    print(f"step {step} {time.monotonic():.6f}", flush=True)
    if args.crash_after is not None and step >= args.crash_after:
        raise RuntimeError(f"crashed after {step} steps, as asked")
