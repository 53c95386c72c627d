"""A real CUDA rank (real-GPU tests only): lands on cuda:LOCAL_RANK, asks for NCCL, trains.

Writes ``$CUDA_RANK_OUT/rank-<RANK>.json``: the device it got (its UUID), the backend it got, and
its environment as placed."""

import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
dist.init_process_group(backend="nccl")
x = torch.ones(1024, device=device)
dist.all_reduce(x)
props = torch.cuda.get_device_properties(device)
record = {"rank": dist.get_rank(), "backend": str(dist.get_backend()),
          "uuid": str(getattr(props, "uuid", "")), "sum": float(x[0].item()),
          "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
path = os.path.join(os.environ["CUDA_RANK_OUT"], f"rank-{record['rank']}.json")
with open(path, "w") as f:
    json.dump(record, f)
model = torch.nn.Linear(64, 8).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(512, 64), torch.zeros(512))
for _ in range(int(os.environ.get("CUDA_RANK_EPOCHS", "20"))):
    for xb, _ in DataLoader(data, batch_size=32):
        opt.zero_grad()
        model(xb.to(device)).sum().backward()
        opt.step()
dist.destroy_process_group()
