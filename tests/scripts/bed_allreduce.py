"""One rank of a gloo all_reduce across the cluster bed's hosts, started by srun.

Rank and world size from Slurm (SLURM_PROCID, SLURM_NTASKS); the rendezvous at MASTER_ADDR /
MASTER_PORT; gloo's interface from GLOO_SOCKET_IFNAME. Prints one JSON line: rank, host, sum.
"""

import datetime
import json
import os
import socket

import torch
import torch.distributed as dist

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group(
    "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(json.dumps({"rank": rank, "host": socket.gethostname(), "sum": t.item()}), flush=True)
dist.destroy_process_group()
