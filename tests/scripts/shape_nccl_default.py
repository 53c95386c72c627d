"""nanoGPT's shape of DDP: module-level config, data-parallel only when RANK is set (torchrun),
and the backend it asks for is NCCL whatever the host has. On a CPU host NCCL cannot serve, and
autotune must hand it gloo and say so, rather than crash where the plain run would not.

    step 40 samples/s 1404.6 train_samples 2560 train_s 1.823
"""

import os
import time

import torch
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
backend = 'nccl'  # 'nccl', 'gloo', etc.
batch_size = 16
device = 'cuda' if torch.cuda.is_available() else 'cpu'
# -----------------------------------------------------------------------------

ddp = int(os.environ.get('RANK', -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    if device == 'cuda':
        device = f'cuda:{ddp_local_rank}'
        torch.cuda.set_device(device)
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
torch.manual_seed(1337 + seed_offset)

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(device)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device != 'cpu' else None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def get_batch():
    x = torch.randn(batch_size, 64, device=device)
    return x, x.roll(1, dims=1)


iter_num, samples, logged = 0, 0, 0
t0 = last = time.perf_counter()
try:
    while True:
        x, y = get_batch()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        iter_num += 1
        samples += batch_size * ddp_world_size
        now = time.perf_counter()
        if master_process and now - last >= 0.5:
            print(f"step {iter_num} samples/s {(samples - logged) / (now - last):.1f}"
                  f" train_samples {samples} train_s {now - t0:.3f}", flush=True)
            last, logged = now, samples
finally:
    if ddp:
        destroy_process_group()
