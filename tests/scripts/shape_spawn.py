"""DDP that starts its own ranks: ``torch.multiprocessing.spawn`` starts the ranks (gloo), each
builds its DataLoader and model in the child and prints what it got, then its own throughput
(with the monotonic clock's time of the line):

    rank 1 loader batch_size=16 num_workers=0 threads 1 bucket_mb 25.0 world 2
    rank 1 samples/s 702.3 train_samples 1280 train_s 1.823 at 5123.456

The main process only waits for them (under autotune it is the one process autotune started).
"""

import argparse
import itertools
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train(rank, world, batch_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    print(f"rank {rank} loader batch_size={loader.batch_size} num_workers={loader.num_workers} "
          f"threads {torch.get_num_threads()} "
          f"bucket_mb {model.bucket_bytes_cap / 2 ** 20:.1f} world {dist.get_world_size()}",
          flush=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples, logged = 0, 0
    start = last = time.perf_counter()
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for x, y in loader:
            time.sleep(0.02)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += len(x)
            now = time.perf_counter()
            if now - last >= 0.5:
                print(f"rank {rank} samples/s {(samples - logged) / (now - last):.1f}"
                      f" train_samples {samples} train_s {now - start:.3f}"
                      f" at {time.monotonic():.3f}", flush=True)
                last, logged = now, samples


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    print(f"spawning {args.procs} ranks", flush=True)
    mp.spawn(train, args=(args.procs, args.batch_size), nprocs=args.procs)
