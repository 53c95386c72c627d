"""The gradient noise scale: the meters' norms in DDP's hook (`probes.noise`), their fold over a
probe's span (`autotune.measuring.noise`), and a real two-rank probe against the exact noise
scale from every per-sample gradient."""

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from autotune.measuring import noise
from autotune.monitor.text import noise_text
from conftest import SCRIPTS
from probes import intercept
from probes import noise as probes_noise
from probes.noise import GradNorms
from test_goodput import problem
from probes.protocol import Mode

# -- the fold (controller) ---------------------------------------------------------------------


def ticks(per_sample, *, b, ranks, steps, t0=0.0, step_s=0.01, tick_every=25, seed=1,
          start=None):
    """What each rank's meter sends: cumulative sums of its local and the averaged squared norm,
    a tick every ``tick_every`` steps; also the sums added step by step, for comparison."""
    g = torch.Generator().manual_seed(seed)
    zero = dict.fromkeys(("local_sq", "avg_sq", "steps", "samples", "skipped"), 0.0)
    sums = [dict(start[r] if start else zero) for r in range(ranks)]
    points = [[] for _ in range(ranks)]
    direct = noise.NoiseScale()
    for k in range(steps):
        idx = torch.randint(0, len(per_sample), (ranks, b), generator=g)
        local = per_sample[idx].mean(1)
        avg = local.mean(0)
        direct.add(float((local ** 2).sum(1).mean()), float(avg @ avg), b, b * ranks)
        for r in range(ranks):
            s = sums[r]
            s["local_sq"] += float(local[r] @ local[r])
            s["avg_sq"] += float(avg @ avg)
            s["steps"] += 1
            s["samples"] += b
            if (k + 1) % tick_every == 0:
                points[r].append((t0 + (k + 1) * step_s + 0.001 * r, dict(s)))
    return points, direct


def test_the_fold_over_the_span_is_the_ratio_of_means_of_its_steps_and_near_the_truth():
    per_sample, truth = problem()
    points, direct = ticks(per_sample, b=8, ranks=2, steps=2000)
    est = noise.fold(points, 0.0, 20.1, world_size=2)
    assert est.noise_scale == pytest.approx(direct.value, rel=1e-6)
    assert (est.steps, est.b_small, est.b_big, est.ranks) == (2000, 8, 16, 2)
    assert truth / 1.5 <= est.noise_scale <= truth * 1.5, (est.noise_scale, truth)
    d = est.to_dict()
    assert set(d) >= {"noise_scale", "steps", "b_small", "b_big"} and "reason" not in d


def test_only_the_measured_span_counts():
    """Warm-up steps of another noise scale before the span are left out."""
    per_sample, truth = problem()
    warm, _ = ticks(per_sample + 1.0, b=8, ranks=2, steps=500, tick_every=500)
    points, direct = ticks(per_sample, b=8, ranks=2, steps=1000, t0=6.0,
                           start=[w[-1][1] for w in warm])
    per_rank = [w + p for w, p in zip(warm, points)]
    est = noise.fold(per_rank, 5.5, 16.1, world_size=2)
    assert est.steps == 1000
    assert est.noise_scale == pytest.approx(direct.value, rel=1e-6)


def test_without_a_dataloader_the_batch_is_the_known_samples_per_step():
    per_sample, _ = problem()
    points, direct = ticks(per_sample, b=8, ranks=2, steps=500)
    for pts in points:
        for _, s in pts:
            s["samples"] = 0
    assert noise.fold(points, 0.0, 5.1, world_size=2, samples_per_step=8).noise_scale == \
        pytest.approx(direct.value, rel=1e-6)
    unknown = noise.fold(points, 0.0, 5.1, world_size=2)
    assert unknown.noise_scale is None and "batch size is unknown" in unknown.reason


@pytest.mark.parametrize("case, said", [
    ("one rank", "one rank: no second batch"),
    ("synthetic", "synthetic mode"),
    ("no norms", "no rank sent gradient norms"),
    ("one of two", "only 1 of 2 ranks"),
    ("no step in span", "no rank counted a step"),
])
def test_what_cannot_be_measured_says_why(case, said):
    per_sample, _ = problem()
    points, _ = ticks(per_sample, b=8, ranks=2, steps=500)
    est = {"one rank": lambda: noise.fold(points[:1], 0.0, 5.1, world_size=1),
           "synthetic": lambda: noise.fold(points, 0.0, 5.1, world_size=2,
                                            mode=Mode.SYNTHETIC),
           "no norms": lambda: noise.fold([[], []], 0.0, 5.1, world_size=2),
           "one of two": lambda: noise.fold(points[:1], 0.0, 5.1, world_size=2),
           "no step in span": lambda: noise.fold(points, 0.0, 0.1, world_size=2)}[case]()
    assert est.noise_scale is None
    assert said in est.reason
    assert est.to_dict()["reason"] == est.reason
    assert said in noise_text(est.to_dict()) and said in est.describe()
    assert noise.NoiseEstimate.from_dict(est.to_dict()) == est


def test_the_probe_prints_the_noise_scale_and_what_it_stands_on():
    text = noise_text({"noise_scale": 137.2, "steps": 900, "b_small": 16, "b_big": 32,
                       "ranks": 2, "skipped": 0})
    assert text == "B_noise 137 samples (from 900 steps, 2 ranks x 16 = 32 per step)"
    assert noise_text(None) == "not measured"


# -- the norms (probes) ------------------------------------------------------------------------


def bucket_step(norms, local: list[torch.Tensor], avg: list[torch.Tensor]):
    for t in local:
        norms.before(t)
    for t in avg:
        norms.after(t)


def test_a_step_is_the_sum_of_its_buckets_squares_and_its_batch_the_samples_since_the_last():
    norms = GradNorms()
    bucket_step(norms, [torch.tensor([3.0, 4.0]), torch.tensor([1.0])],
                [torch.tensor([1.0, 2.0]), torch.tensor([2.0])])
    norms.close(samples=16, steps=0)
    bucket_step(norms, [torch.tensor([2.0])], [torch.tensor([1.0])])
    norms.close(samples=32, steps=1)
    assert norms.snapshot() == {"local_sq": 26.0 + 4.0, "avg_sq": 9.0 + 1.0, "steps": 2,
                                "samples": 32, "skipped": 0}


def test_accumulation_under_no_sync_is_one_larger_batch_and_with_allreduce_each_time_skipped():
    norms = GradNorms()
    bucket_step(norms, [torch.tensor([1.0])], [torch.tensor([1.0])])
    norms.close(samples=16, steps=0)  # the first step: one batch
    norms.close(samples=32, steps=1)  # no_sync: no bucket, nothing counted...
    bucket_step(norms, [torch.tensor([1.0])], [torch.tensor([1.0])])
    norms.close(samples=48, steps=1)  # ...and the synchronised pass holds both batches
    bucket_step(norms, [torch.tensor([1.0])], [torch.tensor([1.0])])
    norms.close(samples=64, steps=2)  # accumulation with an allreduce each time: the first...
    bucket_step(norms, [torch.tensor([5.0])], [torch.tensor([5.0])])
    norms.close(samples=80, steps=2)  # ...counts, the next adds to its average: skipped
    got = norms.snapshot()
    assert (got["steps"], got["samples"], got["skipped"]) == (3, 16 + 32 + 16, 1)
    assert got["local_sq"] == 3.0


def test_a_step_missing_an_averaged_bucket_is_skipped():
    norms = GradNorms()
    bucket_step(norms, [torch.tensor([1.0]), torch.tensor([1.0])], [torch.tensor([1.0])])
    norms.close(samples=16, steps=0)
    assert norms.snapshot()["steps"] == 0 and norms.snapshot()["skipped"] == 1


def taken_step(norms, now: float, steps: int, samples: int, sq: float = 1.0) -> bool:
    """One synchronised backward pass of one bucket, its norms taken if `takes` says so."""
    taken = norms.takes(steps, now)
    if taken:
        bucket_step(norms, [torch.tensor([sq])], [torch.tensor([sq])])
    norms.close(samples=samples, steps=steps)
    return taken


def test_norms_are_taken_on_one_step_per_gap_and_a_counted_batch_is_still_one_steps():
    """Steps of a fifth of the gap (and a little): one in five is taken; each counts its own
    16 samples, not those of the steps left out before it."""
    norms = GradNorms()
    step_s = probes_noise.SAMPLE_GAP_S * 0.22
    taken = [taken_step(norms, k * step_s, k, 16 * (k + 1)) for k in range(50)]
    assert taken == [k % 5 == 0 for k in range(50)]
    got = norms.snapshot()
    assert (got["steps"], got["samples"], got["skipped"]) == (sum(taken), 16 * sum(taken), 0)


def test_steps_longer_than_the_gap_are_all_taken():
    norms = GradNorms()
    step_s = probes_noise.SAMPLE_GAP_S * 1.5
    assert all(taken_step(norms, k * step_s, k, 16 * (k + 1)) for k in range(10))
    assert norms.snapshot()["steps"] == 10


def test_a_later_pass_of_a_step_is_never_the_one_taken_and_counts_skipped_only_after_a_taken():
    """Accumulation with an allreduce each time, two passes per step of 10 ms each: only a
    step's first pass is ever taken, its second is skipped; the second passes of steps left
    out are not counted at all."""
    norms = GradNorms()
    taken = []
    for k in range(1, 41):  # (at 0 optimizer steps every pass counts: weights set by hand)
        taken.append(taken_step(norms, k * 0.02, k, 32 * k - 16))  # the step's first pass
        assert not taken_step(norms, k * 0.02 + 0.01, k, 32 * k)  # its second
    got = norms.snapshot()
    assert got["steps"] == sum(taken) > 0 and got["skipped"] == got["steps"]
    assert got["samples"] == 16 * got["steps"]


def test_under_no_sync_the_batch_taken_is_every_sample_since_the_last_synchronised_pass():
    norms = GradNorms()
    samples = 0
    for k in range(30):
        samples += 16
        norms.close(samples=samples, steps=k)  # no_sync: no bucket, no `takes`
        samples += 16
        taken_step(norms, k * 0.02, k, samples)
    got = norms.snapshot()
    assert got["steps"] > 0 and got["samples"] == 32 * got["steps"]


def test_the_hooks_future_passes_its_value_on_after_the_norm_and_its_error_too():
    norms = GradNorms()
    fut = torch.futures.Future()
    chained = fut.then(lambda f: intercept._after(norms, f))
    value = torch.tensor([0.6, 0.8])
    fut.set_result(value)
    assert chained.wait() is value
    assert norms._after and float(norms._after[0]) == pytest.approx(1.0)
    failed = torch.futures.Future()
    chained = failed.then(lambda f: intercept._after(norms, f))
    failed.set_exception(RuntimeError("allreduce failed"))
    with pytest.raises(RuntimeError, match="allreduce failed"):
        chained.wait()


# -- a real probe ------------------------------------------------------------------------------


def exact_noise_scale() -> float:
    """B_noise = tr(Sigma) / |G|^2 of noise_toy's model at its starting weights, from every
    per-sample gradient of its data set."""
    from torch.func import functional_call, grad, vmap

    spec = importlib.util.spec_from_file_location("noise_toy", SCRIPTS / "noise_toy.py")
    toy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy)
    x, y = toy.make_data()
    model = toy.make_model()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    g = torch.cat([v.reshape(len(x), -1) for v in g.values()], 1).double()
    G = g.mean(0)
    return float(((g - G) ** 2).sum(1).mean() / (G @ G))


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", ["", "no_sync", "allreduce each time"])
def test_a_two_rank_probe_estimates_the_noise_scale_within_a_factor_of_2(tmp_path, accumulate):
    """Two DDP ranks of an MLP held at its starting weights (lr 0), its gradient cut into
    several buckets: the probe's noise scale is within 2x of the exact one. Accumulating two
    batches per step under ``no_sync`` makes each step one batch of twice the size; with an
    allreduce each time, only the first pass after a step counts."""
    extra = {"": [], "no_sync": ["--accumulate", "2", "--no-sync"],
             "allreduce each time": ["--accumulate", "2"]}[accumulate]
    r = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json", "--modes", "full",
                        "--instances", "2", "--seconds", "15", "--runs-dir", str(tmp_path),
                        str(SCRIPTS / "noise_toy.py"), "--batch-size", "16", *extra],
                       capture_output=True, text=True, timeout=120)
    full = json.loads(r.stdout)["modes"]["full"]
    assert full["outcome"] in ("ok", "foreign-load"), full["reason"]
    got = full["noise"]
    b = 32 if accumulate == "no_sync" else 16
    assert (got["b_small"], got["b_big"], got["ranks"]) == (b, 2 * b, 2), got
    # many steps, not a handful, and never more than the gap allows: the norms are taken on one
    # step per SAMPLE_GAP_S at most (50 ms), so a span of 5 s holds 100 at most. Alone the three
    # cases folded 84-98 of 100; on a loaded CI worker one folded 32, its ranks' threads held off
    # the cores between steps, so the floor is a quarter of the span's most, not a count
    span_s = full["window_end_t"] - full["window_start_t"]
    most = span_s / probes_noise.SAMPLE_GAP_S
    assert most / 4 <= got["steps"] <= most + 2, (got, span_s)
    if accumulate == "allreduce each time":
        assert abs(got["skipped"] - got["steps"]) <= 0.05 * got["steps"], got
    else:
        assert got["skipped"] == 0, got
    truth = exact_noise_scale()
    assert got["noise_scale"] is not None, got
    assert truth / 2 <= got["noise_scale"] <= truth * 2, (got, truth)


def test_passes_closed_before_any_bucket_change_nothing():
    """Closed twice a step with no DDP bucket yet (one rank, or before the first allreduce): no
    step counted, and the first synchronised step's batch still starts where the last left."""
    norms, fresh = GradNorms(), GradNorms()
    for steps in range(3):
        norms.close(samples=16 * steps, steps=steps)
    assert not norms.seen and norms.snapshot() == fresh.snapshot()
    bucket_step(norms, [torch.tensor([3.0, 4.0])], [torch.tensor([1.0])])
    norms.close(samples=64, steps=3)
    bucket_step(norms, [torch.tensor([2.0])], [torch.tensor([1.0])])
    norms.close(samples=80, steps=4)
    assert norms.snapshot() == {"local_sq": 25.0 + 4.0, "avg_sq": 1.0 + 1.0, "steps": 2,
                                "samples": 64 + 16, "skipped": 0}


NORMS_ASKED = r"""
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def rank(r, env, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    from probes.intercept import Interceptor
    from probes.meter import Meter

    torch.set_num_threads(1)
    meter = Meter(env)
    Interceptor(meter, {}).install()
    dist.init_process_group("gloo", rank=r, world_size=2)
    model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(60):  # 50 ms between norms taken: some steps' worth even on a fast machine
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        torch.distributed.barrier()
    hook = model._get_ddp_logging_data().get("comm_hook") or ""  # what DDP's reducer ran
    out.put((r, meter.noise.seen, meter.noise.snapshot()["steps"], meter.steps, hook,
             meter.ddp_comm.read()))
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    env = json.loads(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ps = [ctx.Process(target=rank, args=(r, env, port, out)) for r in range(2)]
    for p in ps:
        p.start()
    got = sorted(out.get(timeout=120) for _ in ps)
    for p in ps:
        p.join()
    print(json.dumps(got))
"""


@pytest.mark.parametrize("asked", [False, True])
def test_a_ddp_rank_takes_the_norms_only_when_asked(asked, tmp_path):
    """Two real DDP ranks through the real hooks: the noise scale's norms cost a short step at
    two ranks some 3% even sampled, so a rank takes them only with `AUTOTUNE_NOISE` (a goodput
    tune, `autotune probe`); every step is counted either way. Only then does a hook of ours
    run on the CPU, where DDP's own timers time the communication either way."""
    import os

    env = {"AUTOTUNE_NOISE": "1"} if asked else {}
    script = tmp_path / "norms.py"  # a file: spawned ranks import its functions from it
    script.write_text(NORMS_ASKED)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, str(script), json.dumps(env)], capture_output=True,
                          text=True, timeout=180, cwd=root,
                          env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-2000:]
    for _, seen, taken, steps, hook, comm_s in json.loads(done.stdout.strip().splitlines()[-1]):
        assert steps == 60
        assert seen is asked and (taken > 0) is asked, (seen, taken)
        assert ("autotune_dispatch" in hook) is asked, hook  # else DDP's C++ allreduce
        assert comm_s > 0.0
