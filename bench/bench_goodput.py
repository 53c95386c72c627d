"""Goodput bench: the gradient noise scale as autotune estimates it from data-parallel steps,
against the exact one from per-sample gradients, on a small real model.

A two-layer MLP classifies synthetic data (a fixed random teacher, label noise). At a few points
of its training (its weights after 0, 50, 200 SGD steps), the exact noise scale
``B_noise = tr(Sigma) / |G|^2`` is computed from every per-sample gradient of a 4,096-sample
dataset (``torch.func``: vmap over grad); then ``autotune.measuring.noise.NoiseScale`` estimates
it as a DDP job's communication hook would see it, from each of ``--ranks`` ranks' local
gradient over ``--batch`` samples and their average, over ``--steps`` steps of that same
weight. Prints the ratio estimate / exact for each point; the worst of them is held to the same
factor as the probe below (``PROBE_FACTOR``), and the bench exits 1 past it.

Then the path through the product (``--probe-seconds S``, 0 skips it): a real ``autotune probe
--instances 2 --json`` of ``tests/scripts/noise_toy.py``, the same MLP and data held at its
starting weights (``--lr 0``) on two DDP ranks over gloo, its gradient cut into several buckets;
the noise scale the probe measured through DDP's communication hook against the exact one of
that model, computed here from every per-sample gradient. The ratio is held to a factor of
``PROBE_FACTOR`` (what ``tests/test_noise.py`` asserts).

    .venv/bin/python bench/bench_goodput.py [--ranks 2] [--batch 16] [--steps 400]
                                            [--probe-seconds 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from autotune.measuring.noise import NoiseScale  # noqa: E402

TOY = ROOT / "tests" / "scripts" / "noise_toy.py"
PROBE_FACTOR = 2.0


def load_toy():
    """tests/scripts/noise_toy.py as a module: its data and model are the bench's too."""
    spec = importlib.util.spec_from_file_location("noise_toy", TOY)
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    return toy


def per_sample_grads(model, x, y) -> torch.Tensor:
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi[None],))
        return nn.functional.cross_entropy(out, yi[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([v.reshape(len(x), -1) for v in g.values()], 1)


def exact(g: torch.Tensor) -> float:
    """B_noise = tr(Sigma) / |G|^2 from every per-sample gradient ``g`` (samples x params)."""
    G = g.mean(0)
    return float(((g - G) ** 2).sum(1).mean() / (G @ G))


def through_the_probe(seconds: float, batch: int) -> bool:
    """A real two-rank ``autotune probe`` of noise_toy at lr 0 against its exact noise scale;
    True when the ratio is within ``PROBE_FACTOR``."""
    toy = load_toy()
    x, y = toy.make_data()
    truth = exact(per_sample_grads(toy.make_model(), x, y).double())
    with tempfile.TemporaryDirectory(prefix="bench_goodput-") as runs:
        cmd = [sys.executable, "-m", "autotune", "probe", "--json", "--modes", "full",
               "--instances", "2", "--seconds", f"{seconds:g}", "--runs-dir", runs,
               str(TOY), "--batch-size", str(batch)]
        print(f"# probe: autotune probe --json --modes full --instances 2 --seconds "
              f"{seconds:g} tests/scripts/noise_toy.py --batch-size {batch}")
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                           timeout=seconds + 120)
    try:
        full = json.loads(r.stdout)["modes"]["full"]
    except (ValueError, KeyError):
        print(f"probe failed (exit {r.returncode}): {r.stderr[-2000:]}")
        return False
    n = full.get("noise") or {}
    got = n.get("noise_scale")
    if got is None:
        why = n.get("reason") or full.get("reason")
        print(f"probe {full.get('outcome')}: no noise scale ({why})")
        return False
    ratio = got / truth
    ok = 1 / PROBE_FACTOR <= ratio <= PROBE_FACTOR
    print(f"probe {full['outcome']}: {full['samples_per_s']:.0f} samples/s; B_noise "
          f"{got:.1f} over {n['steps']} steps ({n['ranks']} ranks x {n['b_small']} = "
          f"{n['b_big']} per step, {n.get('skipped', 0)} skipped); exact {truth:.1f}: ratio "
          f"{ratio:.2f} ({'within' if ok else 'OUTSIDE'} the stated factor {PROBE_FACTOR:g})")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="per-rank batch")
    p.add_argument("--steps", type=int, default=400, help="DDP steps the estimate averages")
    p.add_argument("--probe-seconds", type=float, default=20.0,
                   help="length of the real two-rank probe of noise_toy (0: skip it)")
    args = p.parse_args()
    torch.manual_seed(0)
    x, y = load_toy().make_data()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print(f"# bench_goodput: MLP 32-64-10 on {len(x)} samples; {args.ranks} ranks x batch "
          f"{args.batch}, {args.steps} steps per estimate; torch {torch.__version__}")
    trained, worst = 0, 1.0
    gen = torch.Generator().manual_seed(1)
    for at in (0, 50, 200):
        for _ in range(at - trained):  # train on to the next point
            idx = torch.randint(0, len(x), (64,), generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        trained = at
        g = per_sample_grads(model, x, y).double()
        truth = exact(g)
        est = NoiseScale()
        for _ in range(args.steps):
            idx = torch.randint(0, len(x), (args.ranks, args.batch), generator=gen)
            local = g[idx].mean(1)
            avg = local.mean(0)
            est.add(float((local ** 2).sum(1).mean()), float(avg @ avg), args.batch,
                    args.batch * args.ranks)
        ratio = est.value / truth if est.value else float("nan")
        worst = max(worst, ratio, 1 / ratio if ratio else float("inf"))
        print(f"after {at:3d} steps: exact B_noise {truth:8.1f}, estimated "
              f"{est.value or float('nan'):8.1f}: ratio {ratio:.2f}")
    ok = worst <= PROBE_FACTOR  # inf or nan (no estimate) fails too
    print(f"worst factor {worst:.2f} ({'within' if ok else 'OUTSIDE'} the stated factor "
          f"{PROBE_FACTOR:g})")
    if args.probe_seconds > 0:
        ok = through_the_probe(args.probe_seconds, args.batch) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
