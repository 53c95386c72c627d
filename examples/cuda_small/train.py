"""Train a small CNN on generated images on a GPU (or the CPU when there is none).

The kind of job AccDP found leaves an accelerator idle: a model of ~0.3M parameters, small
batches, and an input pipeline on the CPU (each image is generated, cropped, flipped, jittered
and normalised in the `Dataset`, so DataLoader workers matter). Written the usual way: one
process per rank, ``cuda:LOCAL_RANK`` (modulo the visible devices, so ranks sharing one GPU all
land on it), and a process group only when started with ``WORLD_SIZE > 1`` (torchrun's
environment): NCCL on CUDA, gloo on the CPU, or ``--backend`` (ranks sharing a GPU need gloo:
NCCL refuses two ranks on one device).

    python train.py                                   # one epoch
    python train.py --seconds 30                      # train for 30 s (every rank stops together)
    torchrun --nproc-per-node 2 train.py --seconds 30

Log lines (rank 0 only)::

    epoch 1 step 40 loss 2.2013 samples/s 512.4
    done: 80 steps, mean samples/s 498.2, steady samples/s 510.7 (after 20 warm-up steps) on cuda:0

samples/s is the whole job's (this rank's batch times WORLD_SIZE) over ``time.perf_counter``
time; the steady figure leaves out the first ``--warmup-steps`` steps (CUDA start-up, cuDNN
autotuning, workers starting).
"""

import argparse
import gc
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

NUM_CLASSES = 10
STORED = 72  # generated image side; random 64x64 crops are trained on
SIDE = 64
STOP_CHECK_EVERY = 10  # steps between the ranks' 'is time up?' allreduce


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-samples", type=int, default=16384, help="images per epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4, help="DataLoader num_workers")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="train for this long instead of --epochs (0: use --epochs)")
    parser.add_argument("--width", type=int, default=32, help="channels of the first block")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="process group backend when WORLD_SIZE > 1 (auto: nccl on CUDA)")
    parser.add_argument("--warmup-steps", type=int, default=20,
                        help="steps left out of the steady samples/s")
    parser.add_argument("--log-interval", type=int, default=20, help="steps between log lines")
    args = parser.parse_args(argv)
    for name in ("num_samples", "batch_size", "epochs", "width", "log_interval"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, but got {getattr(args, name)}")
    for name in ("workers", "seconds", "warmup_steps"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, but got {getattr(args, name)}")
    return args


class GeneratedImages(Dataset):
    """Seeded images made on the fly: smooth class-dependent patterns plus noise, then the
    usual augmentation. All of it runs in the loader's processes, on the CPU."""

    def __init__(self, num_samples, seed=0):
        self.num_samples = num_samples
        g = torch.Generator().manual_seed(seed)
        self.bases = nn.functional.interpolate(torch.randn(NUM_CLASSES, 3, 9, 9, generator=g),
                                               size=(STORED, STORED), mode="bilinear",
                                               align_corners=False)
        self.mean = torch.tensor([0.0, 0.0, 0.0]).view(3, 1, 1)
        self.std = torch.tensor([1.2, 1.2, 1.2]).view(3, 1, 1)

    def __len__(self):
        return self.num_samples

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(index)
        label = index % NUM_CLASSES
        image = self.bases[label] + 0.5 * torch.randn(3, STORED, STORED, generator=g)
        top, left = (int(v) for v in torch.randint(0, STORED - SIDE + 1, (2,), generator=g))
        image = image[:, top:top + SIDE, left:left + SIDE]
        if torch.rand(1, generator=g).item() < 0.5:
            image = image.flip(2)
        image = image * (0.8 + 0.4 * torch.rand(3, 1, 1, generator=g))  # colour jitter
        return (image - self.mean) / self.std, label


def make_model(width):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True), nn.MaxPool2d(2))

    return nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, NUM_CLASSES))


def pick_device():
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def init_distributed(device, backend):
    """Join the torchrun-style process group when WORLD_SIZE > 1; return (rank, world_size)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def time_is_up(started, seconds, world_size, device):
    """Whether this job's time is up; ranks agree (the first that says so stops all), else one
    would train on into an allreduce its peers have left."""
    up = time.perf_counter() - started >= seconds
    if world_size == 1:
        return up
    flag_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1.0 if up else 0.0], device=flag_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def train(args):
    device = pick_device()
    rank, world_size = init_distributed(device, args.backend)
    try:
        run_training(args, device, rank, world_size)
        if world_size > 1:
            # DDP's reference cycles would hold the process group until the interpreter's
            # shutdown, where gloo's teardown can abort a rank; collect them, then leave together.
            gc.collect()
            dist.barrier()
    finally:
        if world_size > 1:
            dist.destroy_process_group()


def run_training(args, device, rank, world_size):
    torch.manual_seed(0)
    dataset = GeneratedImages(args.num_samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0) if world_size > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=sampler is None,
                        sampler=sampler, num_workers=args.workers, drop_last=True,
                        pin_memory=device.type == "cuda",
                        persistent_workers=args.workers > 0)
    model = make_model(args.width).to(device)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    step = total_samples = interval_samples = steady_samples = 0
    epochs = math.inf if args.seconds else args.epochs
    t_start = t_last = time.perf_counter()
    t_steady = None
    epoch, done = 0, False
    while epoch < epochs and not done:
        epoch += 1
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

            step += 1
            samples = x.shape[0] * world_size
            total_samples += samples
            interval_samples += samples
            if step == args.warmup_steps:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t_steady = time.perf_counter()
            elif t_steady is not None:
                steady_samples += samples
            if step % args.log_interval == 0:
                interval_loss = loss.item()  # one sync per interval, not per step
                now = time.perf_counter()
                if rank == 0:
                    print(f"epoch {epoch} step {step} loss {interval_loss:.4f} "
                          f"samples/s {interval_samples / (now - t_last):.1f}", flush=True)
                t_last, interval_samples = now, 0
            # Ranks step in lockstep (DDP), so they all ask at the same steps.
            if args.seconds and (world_size == 1 or step % STOP_CHECK_EVERY == 0) and \
                    time_is_up(t_start, args.seconds, world_size, device):
                done = True
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_end = time.perf_counter()
    if rank == 0:
        steady = (f"{steady_samples / (t_end - t_steady):.1f}"
                  if t_steady is not None and t_end > t_steady and steady_samples else "n/a")
        print(f"done: {step} steps, mean samples/s {total_samples / max(t_end - t_start, 1e-9):.1f}"
              f", steady samples/s {steady} (after {args.warmup_steps} warm-up steps) on {device}",
              flush=True)


def main(argv=None):
    train(parse_args(argv))


if __name__ == "__main__":
    main()
