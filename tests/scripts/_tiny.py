"""Shared bits of the tiny fault scripts: a small real model, data and a training step."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parser(**defaults):
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--steps", type=int, default=defaults.get("steps", 10**9))
    p.add_argument("--after", type=int, default=defaults.get("after", 30))
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--step-sleep-ms", type=float, default=0.0)
    return p


def data(n=4096, dim=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, dim, generator=g), torch.randint(0, 10, (n,), generator=g))


def model(dim=256):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(),
                         nn.Linear(dim, 10))


def loader(args, dataset=None, **kw):
    return DataLoader(dataset if dataset is not None else data(), batch_size=args.batch_size,
                      shuffle=True, num_workers=args.workers, **kw)


def train(args, dl, *, on_step=None):
    """Train until args.steps; prints `step K samples/s X` every log interval."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    step, seen, t0 = 0, 0, time.perf_counter()
    while True:
        for x, y in dl:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000)
            step += 1
            seen += len(x)
            if step % args.log_interval == 0:
                now = time.perf_counter()
                print(f"step {step} samples/s {seen / (now - t0):.1f}", flush=True)
                seen, t0 = 0, now
            if on_step is not None:
                on_step(step)
            if step >= args.steps:
                return step
