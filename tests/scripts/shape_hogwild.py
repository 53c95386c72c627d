"""Hogwild: the script forks its own training processes with ``torch.multiprocessing``; they
share the model's memory and each trains on its own DataLoader, printing its own throughput:

    worker 1 samples/s 702.3 train_samples 1280 train_s 1.823 at 5123.456

(``at``: the system's monotonic clock, which a probe's window is read on). The main process
only waits for them.
"""

import argparse
import sys
import time

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train(rank, model, batch_size):
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples, logged = 0, 0
    start = last = time.perf_counter()
    while True:
        for x, y in loader:
            time.sleep(0.02)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += len(x)
            now = time.perf_counter()
            if now - last >= 0.5:
                print(f"worker {rank} samples/s {(samples - logged) / (now - last):.1f}"
                      f" train_samples {samples} train_s {now - start:.3f}"
                      f" at {time.monotonic():.3f}", flush=True)
                last, logged = now, samples


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    model.share_memory()
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=train, args=(r, model, args.batch_size))
               for r in range(args.procs)]
    for w in workers:
        w.start()
    print(f"started {len(workers)} workers: {' '.join(str(w.pid) for w in workers)}", flush=True)
    for w in workers:
        w.join()
    sys.exit(max(w.exitcode for w in workers))
