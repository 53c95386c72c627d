"""A DDP trainer (gloo) whose gradient noise scale is known exactly: a two-layer MLP on a fixed
synthetic classification set, trained at ``--lr 0`` by default, so its weights, and with them
the noise scale, stay where they started. The test builds the same data and model
(`make_data`, `make_model`) and computes the noise scale from every per-sample gradient.

A small ``--bucket-mb`` cuts the model's gradient into several DDP buckets. ``--accumulate K``
steps the optimizer once every K batches, each backward pass under ``no_sync`` but the last
(``--no-sync``), or each one allreducing. Like most DDP scripts it trains data-parallel only
when launched with ``WORLD_SIZE > 1`` (torchrun), one process otherwise. Runs until stopped.
"""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n=4096, d=32, classes=10, seed=0):
    """Inputs from a fixed random teacher, a tenth of the labels flipped."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    teacher = torch.randn(d, classes, generator=g)
    y = (x @ teacher).argmax(1)
    flip = torch.rand(n, generator=g) < 0.1
    y[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=g)
    return x, y


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.0)
    p.add_argument("--bucket-mb", type=float, default=0.004)
    p.add_argument("--accumulate", type=int, default=1, metavar="K")
    p.add_argument("--no-sync", action="store_true")
    args = p.parse_args()
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    x, y = make_data()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        shuffle=sampler is None, drop_last=True)
    model = make_model()
    if distributed:
        model = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for k, (xb, yb) in enumerate(loader):
            last = (k + 1) % args.accumulate == 0
            hold = args.no_sync and distributed and not last
            quiet = model.no_sync() if hold else contextlib.nullcontext()
            with quiet:
                loss = nn.functional.cross_entropy(model(xb), yb) / args.accumulate
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad()
        epoch += 1


if __name__ == "__main__":
    main()
