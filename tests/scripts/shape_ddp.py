"""Data-parallel with DDP (gloo, torchrun-style environment) where every rank prints the same
progress line, with the job's throughput (this rank's samples times the world size) and the
monotonic clock's time of the line:

    step 40 samples/s 1404.6 train_samples 2560 train_s 1.823 at 5123.456
"""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

epoch, step, samples, logged = 0, 0, 0, 0
start = last = time.perf_counter()
while True:
    sampler.set_epoch(epoch)
    for x, y in loader:
        time.sleep(0.02)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        samples += len(x) * world
        now = time.perf_counter()
        if now - last >= 0.5:
            print(f"step {step} samples/s {(samples - logged) / (now - last):.1f}"
                  f" train_samples {samples} train_s {now - start:.3f} at {time.monotonic():.3f}")
            last, logged = now, samples
    epoch += 1
