"""Records where this rank landed: identity, thread settings, core affinity. Writes
``$PLACEMENT_OUT/rank-<RANK>.json`` and exits 0."""

import json
import os

import torch

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
        "MKL_NUM_THREADS", "AUTOTUNE_THREADS", "AUTOTUNE_CPUS", "AUTOTUNE_HOST_LOCAL_RANK",
        "HOROVOD_FUSION_THRESHOLD", "AUTOTUNE_LAUNCHER")
record = {k: os.environ.get(k) for k in KEYS}
record["affinity"] = sorted(os.sched_getaffinity(0))
record["torch_threads"] = torch.get_num_threads()
path = os.path.join(os.environ["PLACEMENT_OUT"], f"rank-{os.environ.get('RANK', '0')}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
