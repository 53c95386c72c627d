"""Train a wide MLP on in-memory data: a compute-bound job, where the input pipeline costs nothing.

The opposite of the image example: every sample is already a tensor in memory, and the model is
wide (2048-wide hidden layers), so throughput is set by the matrix multiplies, i.e. by threads,
batch size and the number of data-parallel ranks sharing the cores, not by DataLoader workers.

Runs plain with ``python train.py`` and data-parallel (gloo) under
``torchrun --nproc-per-node 2 train.py``.

Log lines (rank 0 only unless ``--log-all-ranks``)::

    epoch 1 step 40 loss 2.1034 samples/s 153.2
    done: 64 steps, mean samples/s 150.8

samples/s is measured by the script itself: samples trained on by the whole job (this rank's
batch size times WORLD_SIZE) over the ``time.perf_counter`` time since the previous log line.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NUM_CLASSES = 10


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=8192)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many optimizer steps (default: no limit)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--log-interval", type=int, default=20, help="steps between log lines")
    parser.add_argument("--log-all-ranks", action="store_true")
    args = parser.parse_args(argv)
    for name in ("num_samples", "features", "hidden", "batch_size", "epochs", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, but got {getattr(args, name)}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, but got {args.workers}")
    return args


def make_data(num_samples, features, seed=0):
    """Seeded samples whose label is a fixed random projection's argmax: learnable, in memory."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, features, generator=g)
    projection = torch.randn(features, NUM_CLASSES, generator=g)
    return TensorDataset(x, (x @ projection).argmax(dim=1))


def make_model(features, hidden):
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


def init_distributed():
    """Join the torchrun-style process group when WORLD_SIZE > 1; return (rank, world_size)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    dist.init_process_group(backend="gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def train(args):
    rank, world_size = init_distributed()
    try:
        run_training(args, rank, world_size)
    finally:
        if world_size > 1:
            dist.destroy_process_group()


def run_training(args, rank, world_size):
    torch.manual_seed(0)
    dataset = make_data(args.num_samples, args.features)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0) if world_size > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None,
                        sampler=sampler, num_workers=args.workers)
    model = make_model(args.features, args.hidden)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    should_log = rank == 0 or args.log_all_ranks
    prefix = f"[rank {rank}] " if args.log_all_ranks and world_size > 1 else ""
    step = total_samples = interval_samples = interval_steps = 0
    interval_loss = 0.0
    t_start = t_last = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

            step += 1
            samples = x.shape[0] * world_size
            total_samples += samples
            interval_samples += samples
            interval_steps += 1
            interval_loss += loss.item()
            if step % args.log_interval == 0:
                now = time.perf_counter()
                if should_log:
                    print(f"{prefix}epoch {epoch} step {step} "
                          f"loss {interval_loss / interval_steps:.4f} "
                          f"samples/s {interval_samples / (now - t_last):.1f}", flush=True)
                t_last, interval_samples, interval_steps, interval_loss = now, 0, 0, 0.0
            if args.max_steps is not None and step >= args.max_steps:
                break
        if args.max_steps is not None and step >= args.max_steps:
            break
    elapsed = time.perf_counter() - t_start
    if should_log:
        print(f"{prefix}done: {step} steps, mean samples/s "
              f"{total_samples / max(elapsed, 1e-9):.1f}", flush=True)


def main(argv=None):
    train(parse_args(argv))


if __name__ == "__main__":
    main()
