"""A training loop on Hugging Face accelerate, as its docs write it: ``Accelerator()``,
``prepare`` on model, optimizer and DataLoader, ``accelerator.backward``. Launched by torchrun
(or ``accelerate launch``) it runs data-parallel; with ``python`` on one process.

    python fw_accelerate.py --batch-size 64 --workers 0
"""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1000)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8192, 64, generator=g)
    data = TensorDataset(x, (x[:, :8].sum(dim=1) > 0).long())
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    seen, t0 = 0, time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            seen += len(inputs) * accelerator.num_processes
        if accelerator.is_main_process:
            print(f"epoch {epoch} samples/s {seen / (time.perf_counter() - t0):.1f}", flush=True)


if __name__ == "__main__":
    main()
