"""A training loop whose time split is known: a Dataset that waits ``--item-ms`` per sample in
``__getitem__`` (read from a slow disk, say), loaded in the main process, and a step that
computes for ``--compute-ms`` (a real forward and backward, repeated until then).

It keeps its own clock of where the time goes and prints it every ``--log-every`` steps:
``share data 0.48 compute 0.50 steps N t T cpu C`` (T: ``time.monotonic()``; C: the cores the
process used since the last line, its CPU time over the wall time), the truth a breakdown is
checked against.
"""

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowItems(Dataset):
    def __init__(self, n, item_ms):
        self.x = torch.randn(n, 64)
        self.y = torch.randint(0, 10, (n,))
        self.item_s = item_ms / 1000

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.item_s:
            time.sleep(self.item_s)
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--item-ms", type=float, default=2.0)
    p.add_argument("--compute-ms", type=float, default=30.0)
    p.add_argument("--spin", action="store_true",
                   help="compute in a pure-Python loop (one core exactly) instead of torch")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowItems(4096, args.item_ms), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.workers)
    t_start = time.perf_counter()
    steps, waited, computed, t0 = 0, 0.0, 0.0, time.perf_counter()
    cpu0 = time.process_time()
    while True:
        it = iter(loader)
        while True:
            t_ask = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t_got = time.perf_counter()
            waited += t_got - t_ask
            deadline = t_got + args.compute_ms / 1000
            h = x
            while args.spin and time.perf_counter() < deadline:
                sum(i * i for i in range(2000))
            while time.perf_counter() < deadline:  # real compute, for as long as asked
                with torch.no_grad():
                    h = torch.tanh(model[0](x)) @ model[0].weight
            opt.zero_grad()
            nn.functional.cross_entropy(model(x + 0 * h), y).backward()
            opt.step()
            computed += time.perf_counter() - t_got
            steps += 1
            if steps % args.log_every == 0:
                now, cpu = time.perf_counter(), time.process_time()
                print(f"share data {waited / (now - t0):.3f} compute {computed / (now - t0):.3f} "
                      f"steps {steps} t {time.monotonic():.3f} cpu {(cpu - cpu0) / (now - t0):.3f}",
                      flush=True)
                waited, computed, t0, cpu0 = 0.0, 0.0, now, cpu
            if args.max_seconds is not None and time.perf_counter() - t_start > args.max_seconds:
                return 0


if __name__ == "__main__":
    sys.exit(main())
