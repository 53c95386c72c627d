"""The meter's cost per step inside a real training loop: the hooks on and off in turns.

`bench/meter_cost.py` times each hook alone in a tight loop, where everything it touches stays
in the caches. Inside a training step every call costs several times that. This bench trains the
`short` parity config's model (the compute-bound example at 64 features, 128 hidden, batch 16,
one thread) in one process and switches autotune's hooks on and off between blocks of one epoch
each. Every way meets the same machine at nearly the same time, so the per-step difference is
read to a few microseconds where separate runs move by a tenth.

The ways: ``off`` (torch as it comes), ``on`` (the loader, backward and optimizer hooks of a
full run), ``on`` with the step clock left out (``no-clock``: it times no step), and
``pass-through``: wrappers in the same places that only call torch's own, the least any hook
there costs.

    .venv/bin/python bench/hook_cost.py [--blocks 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WAYS = ("off", "on", "no-clock", "pass-through")


class _NoClock:
    """A step clock that times no step: every step is one between sampled steps, counted down
    by the hooks (`skip`), with the hooks that step aside there out (`Meter.fast`)."""

    timed = False

    def __init__(self):
        self.skip = 1 << 62

    def optimizer_end(self) -> None:
        return None


def _pass_through(plain: dict) -> dict:
    """Patches in the places of ours that only call torch's own: a loader ``__next__``, a
    ``torch.autograd.backward`` and an optimizer pre- and post-hook that do nothing else."""
    next_, backward = plain["next"], plain["backward"]

    def __next__(it):
        return next_(it)

    def autograd_backward(*args, **kwargs):
        return backward(*args, **kwargs)

    def hook(optimizer, args, kwargs):
        return None

    return {**plain, "next": __next__, "backward": autograd_backward,
            "pre": {**plain["pre"], -1: hook}, "post": {**plain["post"], -1: hook}}


class Hooks:
    """autotune's hooks on torch in this process, switched on and off as a whole."""

    def __init__(self):
        import torch
        from torch.optim import optimizer as topt
        from torch.utils.data import DataLoader
        from torch.utils.data import dataloader as dl

        from probes.intercept import Interceptor
        from probes.meter import Meter

        self.torch, self.topt = torch, topt
        self.loader_cls, self.iter_cls = DataLoader, dl._BaseDataLoaderIter
        self.plain = self._patched()
        self.meter = Meter({})
        # all of a full run's patches; the loop calls no set_num_threads and no DDP, so only
        # the loader's and the steps' are switched
        self.interceptor = Interceptor(self.meter, {})
        self.interceptor.install()
        self.ours = self._patched()
        self.through = _pass_through(self.plain)
        self.clock = self.meter.clock

    def _patched(self) -> dict:
        return {"init": self.loader_cls.__init__, "iter": self.loader_cls.__iter__,
                "next": self.iter_cls.__next__,
                "backward": self.torch.autograd.backward,
                "pre": dict(self.topt._global_optimizer_pre_hooks),
                "post": dict(self.topt._global_optimizer_post_hooks)}

    def use(self, way: str) -> None:
        patches = {"off": self.plain, "pass-through": self.through}.get(way, self.ours)
        self.loader_cls.__init__ = patches["init"]
        self.loader_cls.__iter__ = patches["iter"]
        self.iter_cls.__next__ = patches["next"]
        self.torch.autograd.backward = patches["backward"]
        for name in ("pre", "post"):
            hooks = getattr(self.topt, f"_global_optimizer_{name}_hooks")
            hooks.clear()
            hooks.update(patches[name])
        self.meter.clock = _NoClock() if way == "no-clock" else self.clock
        if patches is self.ours:  # a real clock chooses at its next step's end; with none,
            self.meter.fast = way == "no-clock"  # every step is one between sampled steps
            self.interceptor._place_hooks()


EXAMPLE = ROOT / "examples" / "compute_bound" / "train.py"


def training():
    """The `short` config's model, data, loader and optimizer, made by the example's own
    functions with `bench_parity`'s sizes and the example's defaults."""
    import importlib.util

    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    spec = importlib.util.spec_from_file_location("compute_bound_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.make_model(64, 128)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = DataLoader(example.make_data(4096, 64), batch_size=16, shuffle=True, num_workers=0)
    return model, optimizer, loader, nn.CrossEntropyLoss()


def epoch_us_per_step(model, optimizer, loader, loss_fn) -> float:
    """One epoch of the example's step; microseconds of CPU a step (this thread's)."""
    t0, steps = time.thread_time(), 0
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
        steps += 1
    return (time.thread_time() - t0) / steps * 1e6


def hook_cost_us(blocks: int = 60, ways=WAYS) -> dict:
    """Per way: the median microseconds a step, and the median over blocks of its difference
    from the ``off`` block of the same turn; ``samples``: what the meter counted (the hooks
    ran in the ``on`` blocks and only there)."""
    import torch

    torch.set_num_threads(1)
    hooks = Hooks()
    parts = training()
    hooks.use("off")
    for _ in range(2):  # warm: the allocator, the first steps' one-time work
        epoch_us_per_step(*parts)
    per_way: dict[str, list[float]] = {w: [] for w in ways}
    counted: dict[str, int] = {w: 0 for w in ways}
    try:
        for _ in range(blocks):
            for way in ways:
                hooks.use(way)
                before = hooks.meter.samples
                per_way[way].append(epoch_us_per_step(*parts))
                counted[way] += hooks.meter.samples - before
    finally:
        hooks.use("off")
    out = {"blocks": blocks, "steps_per_block": len(parts[2])}
    for way in ways:
        diff = [a - b for a, b in zip(per_way[way], per_way["off"])]
        out[way] = {"us_per_step": round(statistics.median(per_way[way]), 1),
                    "over_off_us": round(statistics.median(diff), 1), "samples": counted[way]}
    return out


def in_own_process(blocks: int, timeout_s: float = 600.0) -> dict:
    """`hook_cost_us` in a fresh interpreter on one thread (the hooks patch torch where they
    run); its error as ``{"error": ...}``."""
    import os
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--blocks",
                               str(blocks)], capture_output=True, text=True, env=env,
                              timeout=timeout_s)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return {"error": f"bench/hook_cost.py gave no figure ({exc})"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=60, help="turns of every way (60)")
    args = p.parse_args(argv)
    if args.blocks < 1:
        p.error(f"--blocks must be >= 1, but got {args.blocks}")
    print(json.dumps(hook_cost_us(args.blocks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
