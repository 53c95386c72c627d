"""``python -m probes.allreduce``: allreduce latency and bandwidth by message size, on the ranks'
backend (gloo on CPU, NCCL on GPUs unless ranks share one), run as the ranks of a job.

Start it like a training script: local ranks with torchrun's variables, or under ``mpirun`` /
``srun`` (identity from `probes.ranks_env`). Every size (4 KB to 256 MB by default, x4 steps) is
timed on every rank; the slowest rank's time counts. Rank 0 prints one line per size and writes
the result as JSON (``--out``, atomically)::

    {"backend": "gloo", "world_size": 2, "device": "cpu",
     "points": [{"bytes": 4096, "latency_s": 5.1e-05, "algbw_gbps": 0.08, "busbw_gbps": 0.08,
                 "iters": 200}, ...]}

``algbw`` = bytes / time; ``busbw`` = algbw x 2(n-1)/n, the link bandwidth a ring allreduce
needs, comparable across world sizes (as nccl-tests report it). Standard library + torch only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from probes import protocol, ranks_env

DEFAULT_MIN_BYTES = 4 * 1024
DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def sizes(min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
          factor: int = 4) -> list[int]:
    """Message sizes from ``min_bytes`` to ``max_bytes`` (both included), x ``factor`` apart."""
    if not 4 <= min_bytes <= max_bytes or factor < 2:
        raise ValueError(f"4 <= min_bytes <= max_bytes and factor >= 2 must hold, but got "
                         f"{min_bytes}, {max_bytes}, {factor}")
    out, s = [], min_bytes
    while s < max_bytes:
        out.append(s)
        s *= factor
    out.append(max_bytes)
    return out


def bus_factor(world_size: int) -> float:
    return 2.0 * (world_size - 1) / world_size if world_size > 1 else 1.0


def _pick_backend(asked: str | None) -> str:
    import torch

    if asked:
        return asked
    override = os.environ.get(protocol.ENV_BACKEND_OVERRIDE)
    if override:
        return override
    return "nccl" if torch.cuda.is_available() else "gloo"


def run(args) -> dict:
    import torch
    import torch.distributed as dist

    backend = _pick_backend(args.backend)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    points = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # first call sets up the algorithm and its buffers
        # Every rank must make the same number of calls: the count comes from the slowest
        # rank's warm-up time, agreed on through an allreduce of its own.
        per_call = _timed(dist, buf, device, max(1, args.warmup))
        iters = max(args.min_iters, min(args.max_iters, int(args.seconds_per_size / per_call)))
        latency = _timed(dist, buf, device, iters)
        algbw = nbytes / latency / 1e9
        points.append({"bytes": nbytes, "latency_s": latency, "algbw_gbps": algbw,
                       "busbw_gbps": algbw * bus_factor(world), "iters": iters})
        if rank == 0:
            print(f"allreduce {nbytes:>11d} B  {latency * 1e6:12.1f} us  "
                  f"busbw {points[-1]['busbw_gbps']:8.3f} GB/s", flush=True)
        del buf
    result = {"backend": str(dist.get_backend()), "world_size": world, "device": str(device),
              "points": points}
    dist.destroy_process_group()
    return result


def _timed(dist, buf, device, iters: int) -> float:
    """Seconds per allreduce of ``buf`` over ``iters`` calls, as the slowest rank saw it."""
    import torch

    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return max(float(elapsed.item()), 1e-9)


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m probes.allreduce",
                                description="allreduce latency and bandwidth by message size")
    p.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES)
    p.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    p.add_argument("--seconds-per-size", type=float, default=0.5)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--backend", default=None, help="default: the run's (gloo on CPU)")
    p.add_argument("--out", default=None, help="JSON result file (written by rank 0)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    ranks_env.apply()
    args = parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        print("probes.allreduce: needs at least 2 ranks (WORLD_SIZE); start it under "
              "autotune, torchrun, mpirun or srun", file=sys.stderr)
        return 2
    result = run(args)
    if int(os.environ.get("RANK", "0")) == 0 and args.out:
        tmp = f"{args.out}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
