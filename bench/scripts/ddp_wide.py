"""A data-parallel MLP wide enough that its gradients are megabytes: the fusion bucket and the
link between nodes matter. Shaped like pytorch/examples imagenet: DDP (gloo) only when
launched with ``WORLD_SIZE > 1``; ``-b``/``-j`` flags; ``--bucket-cap-mb`` is the script's own
DDP setting (a user's grid sets it; autotune sets the bucket through its own knob).

Under a plain ``srun`` (no torchrun) ``--slurm`` takes the rank and world from Slurm's task
variables, as many cluster scripts do; ``MASTER_ADDR``/``MASTER_PORT`` come from the caller.

Rank 0 prints its own throughput every ``--log-every`` steps:
``step 40 samples/s 123.4`` (the whole job's samples over the wall time since the last line).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("-j", "--workers", type=int, default=0)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's (default: 25)")
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=10_000)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--slurm", action="store_true",
                   help="take RANK/WORLD_SIZE/LOCAL_RANK from SLURM_PROCID/NTASKS/LOCALID when "
                        "no launcher set them")
    args = p.parse_args()
    if args.slurm and "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
    distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    if distributed:
        dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    x = torch.randn(args.samples, args.width)
    data = TensorDataset(x, (x[:, :4].sum(dim=1) > 0).long())
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=sampler is None,
                        sampler=sampler, num_workers=args.workers)
    layers = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 2))
    if distributed:
        extra = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        model = nn.parallel.DistributedDataParallel(model, **extra)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    world = dist.get_world_size() if distributed else 1
    lead = not distributed or dist.get_rank() == 0
    step, seen, t0 = 0, 0, time.perf_counter()
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            seen += len(inputs) * world
            if lead and step % args.log_every == 0:
                now = time.perf_counter()
                print(f"step {step} samples/s {seen / (now - t0):.2f}", flush=True)
                seen, t0 = 0, now


if __name__ == "__main__":
    main()
