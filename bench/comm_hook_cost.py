"""DDP's communication under a probe, priced inside a real two-rank step: ways in turns.

On the CPU a probe registers no communication hook: DDP's own timers, read in C++ on one
iteration in four (`probes.ddp_comm`), time what the backward pass waits for. A Python hook
(the probe's dispatcher where it must take the noise scale's norms or time a CUDA model, or a
script's own) routes every bucket through torch's Python allreduce path instead. Separate runs
move by a tenth on this machine, so this bench trains three copies of the `short` parity
config's model in one two-rank gloo group, under all of autotune's hooks, and switches between
them every block of steps:

- ``ddp-own``: DDP as the script builds it without autotune (its timers on their default
  sampling, one iteration in 100);
- ``probe``: as a probe's model trains on the CPU (timed by DDP on one iteration in four);
- ``python-hook``: DDP's default allreduce registered as a Python hook, as the dispatcher runs
  it.

Both ranks run the same blocks in the same order, so each block's difference is read on the
same minute of the machine.

    .venv/bin/python bench/comm_hook_cost.py [--blocks 40] [--steps 200]

Prints rank 0's figures as one JSON line: per way the median microseconds a step and the median
per-block difference from ``ddp-own``, by the wall clock and by the rank's CPU time (all its
threads: a Python hook's callback runs on gloo's). The CPU time does not count the time another
program or the hypervisor held the core, which moves the wall clock's blocks by more than a
hook costs on a busy hour.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WAYS = ("ddp-own", "probe", "python-hook")


def _rank(blocks: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from bench.hook_cost import training
    from probes.intercept import Interceptor
    from probes.meter import Meter

    torch.set_num_threads(1)
    meter = Meter({})
    Interceptor(meter, {}).install()  # a probe's patches
    dist.init_process_group("gloo")

    def copy(way: str):
        # the short config's model, optimizer and loader, as `bench.hook_cost` makes them
        model, optimizer, loader, loss_fn = training()
        ddp = nn.parallel.DistributedDataParallel(model)
        if way == "ddp-own":
            ddp._set_ddp_runtime_logging_sample_rate(100)  # torch's own sampling
        elif way == "python-hook":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp, optimizer, loader, loss_fn

    models = {w: copy(w) for w in WAYS}

    def block(way: str) -> tuple[float, float]:
        ddp, opt, loader, loss_fn = models[way]
        batches = iter(loader)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            loss.item()
        return ((time.perf_counter() - t0) / steps * 1e6,
                (time.process_time() - c0) / steps * 1e6)

    for way in WAYS:  # warm: buckets rebuilt after the first step, the allocator
        block(way)
    # what each copy's reducer runs, as DDP says it: no hook (its C++ allreduce) or the Python one
    hooks = {w: models[w][0]._get_ddp_logging_data().get("comm_hook") or "" for w in WAYS}
    timed_by_ddp = len(meter.ddp_comm._models)
    wall: dict[str, list[float]] = {w: [] for w in WAYS}
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    for b in range(blocks):
        for way in (WAYS if b % 2 == 0 else WAYS[::-1]):
            w, c = block(way)
            wall[way].append(w)
            cpu[way].append(c)
    dist.destroy_process_group()
    out = {"blocks": blocks, "steps_per_block": steps, "comm_hooks": hooks,
           "timed_by_ddp": timed_by_ddp, "exposed_comm_s": round(meter.ddp_comm.read(), 6)}
    for way in WAYS:
        out[way] = {"us_per_step": round(statistics.median(wall[way]), 1),
                    "over_ddp_own_us": round(statistics.median(
                        [a - b for a, b in zip(wall[way], wall["ddp-own"])]), 1),
                    "cpu_us_per_step": round(statistics.median(cpu[way]), 1),
                    "cpu_over_ddp_own_us": round(statistics.median(
                        [a - b for a, b in zip(cpu[way], cpu["ddp-own"])]), 1)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=40, help="turns of both ways (40)")
    p.add_argument("--steps", type=int, default=200, help="steps a block (200)")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.blocks < 1 or args.steps < 1:
        p.error("--blocks and --steps must be >= 1")
    if args.rank:
        out = _rank(args.blocks, args.steps)
        if os.environ.get("RANK") == "0":
            print(json.dumps(out), flush=True)
        # short of the interpreter's teardown, as a probe ends a script: a gloo rank's worker
        # thread can outlive the teardown and abort the exit (SIGABRT, 5 of 30 plain exits of
        # three DDP copies here), which torchrun reports as a failed rank after the work is done
        from probes.boot import exit_before_teardown

        exit_before_teardown(0)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("AUTOTUNE_")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(Path(__file__).resolve()), "--rank",
                           "--blocks", str(args.blocks), "--steps", str(args.steps)],
                          capture_output=True, text=True, env=env, timeout=1800)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode or not lines:
        print(f"comm_hook_cost: the ranks failed (exit {done.returncode}): "
              f"{done.stderr.strip()[-400:]}", file=sys.stderr)
        return 1
    print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
