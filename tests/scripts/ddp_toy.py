"""A small DDP trainer (gloo) that says who started it: every rank prints

    ddp_toy: rank 1 of 2, started by mpirun

("mpirun" when the MPI launcher's own variables are there: PMI_RANK for MPICH's Hydra,
OMPI_COMM_WORLD_RANK for Open MPI; "srun" with Slurm's SLURM_PROCID). Runs until stopped
unless --run-seconds is given; then rank --fail-rank (default: every rank) exits with
--exit-code, and the other ranks wait --linger seconds before they leave (a launcher that
stops the rest when one rank fails has to stop them).
"""

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def say(line: str) -> None:
    """One write per line: ranks share the launcher's stdout, and print() writes the text and
    its newline separately, so two ranks' lines could run into each other."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def time_is_up(t_first: float, run_seconds: float) -> bool:
    """Whether any rank's time is up: every rank must leave after the same epoch, or the one that
    trains on waits in an allreduce for peers that are gone."""
    up = torch.tensor([float(time.monotonic() - t_first >= run_seconds)])
    dist.all_reduce(up, op=dist.ReduceOp.MAX)
    return bool(up.item())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--run-seconds", type=float, default=0.0)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--linger", type=float, default=0.0)
    p.add_argument("--comm-hook", choices=["none", "fp16", "builtin", "fp16-late"],
                   default="none", help="register DDP's fp16 compression hook (before the first "
                   "step, or after it), or the built-in (C++) allreduce")
    p.add_argument("--print-env", nargs="*", default=[], metavar="NAME",
                   help="print these environment variables at start")
    args = p.parse_args()
    by = ("mpirun" if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
          else "srun" if "SLURM_PROCID" in os.environ else "autotune")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    say(f"ddp_toy: rank {rank} of {world}, started by {by}")
    for name in args.print_env:
        say(f"ddp_toy: rank {rank} {name}={os.environ.get(name)}")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(2048, 32), torch.randint(0, 4, (2048,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    if args.comm_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "builtin":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t_first, steps, epoch = None, 0, 0
    if args.comm_hook == "fp16-late":  # one step first, as a script warming up would
        x, y = next(iter(loader))
        nn.functional.cross_entropy(model(x), y).backward()
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    while True:
        sampler.set_epoch(epoch)
        for x, y in loader:
            t_first = t_first or time.monotonic()
            time.sleep(0.01)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
        epoch += 1
        if args.run_seconds and time_is_up(t_first, args.run_seconds):
            break
    hook = model._get_ddp_logging_data().get("comm_hook") or "none"  # what DDP's reducer ran
    say(f"ddp_toy: rank {rank} done after {steps} steps, comm hook {hook}")
    code = args.exit_code if args.fail_rank in (-1, rank) else 0
    if code == 0 and args.linger:
        time.sleep(args.linger)
    if code == 0:
        del model, opt  # DDP's cycles would keep the process group until the interpreter's
        gc.collect()  # shutdown, where gloo's teardown can abort the process
        dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
