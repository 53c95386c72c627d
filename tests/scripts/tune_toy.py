"""A tiny trainer for the tuning tests: a DataLoader whose samples cost some CPU, a linear model.

Runs until stopped unless --steps or --run-seconds is given; then prints a line and exits with
--exit-code, so a test can make the full run fail where probes (stopped earlier) succeeded.
"""

import argparse
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, work: int):
        self.work = work

    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        x = torch.full((32,), float(index % 7))
        for _ in range(self.work):
            x = torch.tanh(x * 1.01)
        return x, index % 4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--work", type=int, default=10, help="CPU work per sample")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: never)")
    p.add_argument("--run-seconds", type=float, default=0.0,
                   help="stop this long after the first batch (0: never)")
    p.add_argument("--exit-code", type=int, default=0)
    args = p.parse_args()
    loader = DataLoader(Samples(args.work), batch_size=args.batch_size,
                        num_workers=args.workers)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    t_first = None
    for x, y in loader:
        t_first = t_first or time.monotonic()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if args.steps and steps >= args.steps:
            break
        if args.run_seconds and time.monotonic() - t_first >= args.run_seconds:
            break
    print(f"tune_toy: done after {steps} steps", flush=True)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
