"""A data-parallel trainer for the fake GPU host, as a user's GPU script would be, minus CUDA.

Connects to MPS the way the CUDA driver does (`fake_cuda.connect`), initialises torch.distributed
(gloo: the CPU wheel has no NCCL) and trains on a DataLoader whose batches take a fixed time, as
if the GPU were the bottleneck. Each rank records where it ran in
``$FAKE_RANK_OUT/<AUTOTUNE_TRIAL>.json``. Runs until stopped, or --run-seconds after its first batch.
"""

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

import fake_cuda  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "AUTOTUNE_TRIAL")


def time_is_up(t_first: float, run_seconds: float) -> bool:
    """Whether any rank's time is up: every rank must leave after the same epoch, or the one that
    trains on waits in an allreduce for peers that are gone."""
    up = torch.tensor([float(time.monotonic() - t_first >= run_seconds)])
    dist.all_reduce(up, op=dist.ReduceOp.MAX)
    return bool(up.item())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run-seconds", type=float, default=0.0)
    p.add_argument("--step-s", type=float, default=0.02)
    args = p.parse_args()
    client = fake_cuda.connect()
    dist.init_process_group("gloo")
    record = {k: os.environ.get(k) for k in KEYS}
    record.update(pid=os.getpid(), mps_client=client is not None)
    out = os.path.join(os.environ["FAKE_RANK_OUT"], f"{os.environ.get('AUTOTUNE_TRIAL')}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(out + ".tmp", out)
    data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    sampler = DistributedSampler(data)
    model = DistributedDataParallel(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    t_first, epoch = None, 0
    while True:
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=8, sampler=sampler):
            t_first = t_first or time.monotonic()
            time.sleep(args.step_s)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        epoch += 1
        if args.run_seconds and time_is_up(t_first, args.run_seconds):
            break
    print(f"fake_gpu_train: rank {dist.get_rank()} done", flush=True)
    del model, opt  # DDP's cycles would keep the group until shutdown, where gloo's teardown
    gc.collect()  # can abort a rank (exit 134, seen once in CI); both leave together
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
