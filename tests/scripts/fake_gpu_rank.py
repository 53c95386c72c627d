"""A rank for fake-GPU tests: joins MPS as a (fake) CUDA client, records where it landed, trains.

Writes ``$FAKE_RANK_OUT/rank-<RANK>.json`` (its environment as placed, the device it would use,
the torch.distributed backend it got), then iterates a DataLoader. The script asks for NCCL,
as a GPU script would; autotune must turn that into gloo for ranks sharing a GPU.

    fake_gpu_rank.py [--batches N] [--crash-rank R] [--crash-after K] [--forever]
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

import fake_cuda  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "AUTOTUNE_HOST_LOCAL_RANK",
        "CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_LOG_DIRECTORY", "OMP_NUM_THREADS", "AUTOTUNE_THREADS",
        "AUTOTUNE_BACKEND_OVERRIDE", "AUTOTUNE_CPUS", "HOROVOD_FUSION_THRESHOLD", "MASTER_ADDR")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=100000)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-after", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.02)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    client = fake_cuda.connect()  # what cuInit does under MPS; None: running without MPS
    dist.init_process_group(backend="nccl")  # a GPU script's choice; co-located ranks need gloo
    record = {k: os.environ.get(k) for k in KEYS}
    record.update(pid=os.getpid(), mps_client=client is not None,
                  backend=str(dist.get_backend()), torch_threads=torch.get_num_threads())
    out = os.path.join(os.environ["FAKE_RANK_OUT"], f"rank-{rank}.json")
    with open(out + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(out + ".tmp", out)
    data = TensorDataset(torch.randn(64, 4), torch.zeros(64))
    seen = 0
    while seen < args.batches:
        for x, _ in DataLoader(data, batch_size=8):
            seen += 1
            if rank == args.crash_rank and seen >= args.crash_after:
                raise RuntimeError(f"rank {rank} crashed on purpose")
            time.sleep(args.sleep)
            if seen >= args.batches:
                break
    dist.barrier()  # leave together: gloo's teardown can abort a rank its peer left behind
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
