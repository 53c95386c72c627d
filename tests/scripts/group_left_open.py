"""A DDP script that leaves its gloo process group to the interpreter's exit, as many do: no
``destroy_process_group()`` at its end. At exit it prints whether the group was still open then,
and ends it itself if so (left open, torch aborts about one such exit in ten, SIGABRT, which
would make the plain run this script is compared with flaky).

    torchrun --nproc_per_node 2 group_left_open.py --steps 20
"""

import argparse
import atexit
import os

import torch
import torch.distributed as dist
from torch import nn


def at_exit():
    still = dist.is_initialized()
    print(f"rank {os.environ.get('RANK', '0')} group open at exit: {still}", flush=True)
    if still:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    atexit.register(at_exit)
    model = nn.parallel.DistributedDataParallel(nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = torch.randn(16, 32)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"rank {dist.get_rank()} trained {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
