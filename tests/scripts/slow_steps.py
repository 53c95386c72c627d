"""A trainer with minGPT's timing shape: seconds of sampling before the first step, a slow first
step, then steps of about a second whose time grows with the batch.

Flags as minGPT's chargpt takes them (``--trainer.batch_size=N``, ``--trainer.num_workers=N``).
A step is a small real forward/backward and a wait standing for the rest of the device's work
(most of the step), so the step time follows ``--base-ms + --per-sample-ms x batch`` with a few
per cent of jitter, and the CPU stays mostly free. Prints its own throughput every few
iterations: ``iter N: dt X ms, Y samples/s``.
"""

import argparse
import os
import random
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Chars(Dataset):
    def __init__(self, n=100_000, block=32, vocab=65):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n + block + 1,), generator=g)
        self.block = block

    def __len__(self):
        return len(self.data) - self.block - 1

    def __getitem__(self, i):
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trainer.batch_size", dest="batch_size", type=int, default=32)
    p.add_argument("--trainer.num_workers", dest="num_workers", type=int, default=0)
    p.add_argument("--trainer.max_iters", dest="max_iters", type=int, default=10**9)
    p.add_argument("--sample-s", type=float, default=5.0, help="sampling before the first step")
    p.add_argument("--sample-busy", action="store_true", help="sample on the CPU, not waiting")
    p.add_argument("--first-step-s", type=float, default=3.0, help="extra time of step one")
    p.add_argument("--base-ms", type=float, default=500.0)
    p.add_argument("--per-sample-ms", type=float, default=15.6)
    p.add_argument("--jitter", type=float, default=0.04)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(65, 32), nn.Linear(32, 65))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    t_start = time.perf_counter()
    # "sampling from the untrained model" before training, as chargpt does
    with torch.no_grad():
        model(torch.zeros(1, 32, dtype=torch.long))
    end = time.perf_counter() + args.sample_s
    while args.sample_busy and time.perf_counter() < end:
        with torch.no_grad():
            model(torch.zeros(64, 32, dtype=torch.long))
    time.sleep(max(0.0, end - time.perf_counter()))
    rng = random.Random(os.getpid())
    loader = DataLoader(Chars(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers)
    it, seen, t0 = 0, 0, time.perf_counter()
    while True:
        for x, y in loader:
            t_step = time.perf_counter()
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 65), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            want = (args.base_ms + args.per_sample_ms * len(x)) / 1000
            want *= 1 + rng.uniform(-args.jitter, args.jitter)
            if it == 0:
                want += args.first_step_s
            time.sleep(max(0.0, want - (time.perf_counter() - t_step)))
            it += 1
            seen += len(x)
            if it % args.log_every == 0:
                now = time.perf_counter()
                print(f"iter {it}: dt {(now - t0) * 1000 / args.log_every:.0f} ms, "
                      f"{seen / (now - t0):.2f} samples/s", flush=True)
                seen, t0 = 0, now
            if it >= args.max_iters or (args.max_seconds is not None and
                                        time.perf_counter() - t_start > args.max_seconds):
                return 0


if __name__ == "__main__":
    sys.exit(main())
