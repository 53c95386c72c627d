"""The probe's DDP communication hook, priced inside a real two-rank step: on and off in turns.

A probe times DDP's bucket launches through a communication hook of ours (`probes.intercept`):
a Python dispatcher that runs DDP's default allreduce and marks the launch for the step clock.
The full run registers none, so DDP keeps its allreduce in C++. Separate runs of the two move
by a tenth on this machine; this bench trains two copies of the `short` parity config's model
in one two-rank gloo group, under all of autotune's hooks, and switches between them every
block of steps. One copy gets the dispatcher as a probe's model does (at its first forward
pass), the other is marked as a full run's is and keeps DDP's own allreduce. Both ranks run
the same blocks in the same order, so each block's difference is read on the same minute of
the machine.

    .venv/bin/python bench/comm_hook_cost.py [--blocks 40] [--steps 200]

Prints rank 0's figures as one JSON line: per way the median microseconds a step and the median
per-block difference from DDP's own allreduce, by the wall clock and by the rank's CPU time (all
its threads: the allreduce's callback runs on gloo's). The CPU time does not count the time
another program or the hypervisor held the core, which moves the wall clock's blocks by more
than the hook costs on a busy hour.
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

WAYS = ("ddp-own", "probe-hook")


def _rank(blocks: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    from probes.intercept import Interceptor
    from probes.meter import Meter

    from bench.hook_cost import training

    torch.set_num_threads(1)
    meter = Meter({})
    Interceptor(meter, {}).install()  # a probe's patches: DDP gets the dispatcher
    dist.init_process_group("gloo")

    def copy(way: str):
        # the short config's model, optimizer and loader, as `bench.hook_cost` makes them
        model, optimizer, loader, loss_fn = training()
        ddp = nn.parallel.DistributedDataParallel(model)
        if way == "ddp-own":
            ddp._autotune_comm = True  # as the full run leaves it: DDP's allreduce in C++
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
    hooked = getattr(models["probe-hook"][0], "_autotune_slot", None) is not None
    wall: dict[str, list[float]] = {w: [] for w in WAYS}
    cpu: dict[str, list[float]] = {w: [] for w in WAYS}
    for b in range(blocks):
        for way in (WAYS if b % 2 == 0 else WAYS[::-1]):
            w, c = block(way)
            wall[way].append(w)
            cpu[way].append(c)
    dist.destroy_process_group()
    out = {"blocks": blocks, "steps_per_block": steps, "dispatcher_registered": hooked}
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
        return 0
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
