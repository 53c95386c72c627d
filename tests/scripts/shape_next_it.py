"""Pulls batches with ``next(it)`` from a finite, I/O-bound DataLoader until its data runs out.

No ``for`` loop and no ``except StopIteration``: the end of the data ends the script with the
traceback of an uncaught StopIteration (exit 1), as such real scripts do. Each sample costs
``--sample-ms`` of waiting (a slow disk), so the script is I/O-bound: synthetic mode (no I/O) is
far faster than full mode.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class SlowData(Dataset):
    def __init__(self, n: int, sample_ms: float):
        self.n, self.sample_s = n, sample_ms / 1000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sample_s)
        return torch.full((32,), float(i % 7)), i % 4


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--sample-ms", type=float, default=2.0)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(SlowData(args.samples, args.sample_ms), batch_size=args.batch_size,
                        shuffle=True, num_workers=0)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(loader)
    while True:
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
