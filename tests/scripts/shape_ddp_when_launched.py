"""The commonest DDP shape (pytorch/examples imagenet, the bundled image example): data-parallel
only when launched with ``WORLD_SIZE > 1`` (torchrun), one process otherwise. A DataLoader with
a DistributedSampler, ``-b``/``-j`` flags. With ``--env-out DIR`` each process writes the
launcher variables it found to ``DIR/env-PID.json`` first.

    python shape_ddp_when_launched.py -b 32 -j 0
    torchrun --nproc_per_node 2 shape_ddp_when_launched.py -b 32 -j 0
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", "--batch-size", type=int, default=32)
    parser.add_argument("-j", "--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=10_000)
    parser.add_argument("--dist-backend", default="gloo")
    parser.add_argument("--env-out", default="")
    args = parser.parse_args()
    if args.env_out:
        with open(os.path.join(args.env_out, f"env-{os.getpid()}.json"), "w") as f:
            json.dump({k: os.environ.get(k) for k in LAUNCHER_VARS}, f)

    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        dist.init_process_group(backend=args.dist_backend)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 128, generator=g)
    data = TensorDataset(x, (x[:, :4].sum(dim=1) > 0).long())
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=sampler is None,
                        sampler=sampler, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 2))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    world = dist.get_world_size() if distributed else 1
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        t0, seen = time.perf_counter(), 0
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(inputs) * world
        if not distributed or dist.get_rank() == 0:
            print(f"epoch {epoch} samples/s {seen / (time.perf_counter() - t0):.1f}", flush=True)
    if distributed:  # as pytorch/examples' DDP scripts end: a gloo group left to the exit
        dist.destroy_process_group()  # aborts one exit in ten (SIGABRT), launcher or not


if __name__ == "__main__":
    main()
