"""The gradient noise scale from data-parallel steps, against the exact one computed from
per-sample gradients; Pollux's efficiency and goodput."""

import pytest
import torch

from autotune.tuning import goodput


def problem(n=20_000, d=16, seed=0):
    """Linear regression at a fixed weight away from the optimum: every per-sample gradient
    x_i (x_i . w - y_i) is exact, so the true noise scale is known."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w_true = torch.randn(d, generator=g, dtype=torch.float64)
    y = x @ w_true + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    w = w_true + 0.3 * torch.randn(d, generator=g, dtype=torch.float64)
    per_sample = x * (x @ w - y)[:, None]
    G = per_sample.mean(0)
    trace_cov = ((per_sample - G) ** 2).sum(1).mean()
    return per_sample, float(trace_cov / (G @ G))


def ddp_estimate(per_sample, b, ranks, steps, seed=1):
    """What the comm hook sees: each rank's local gradient over b samples, and their average."""
    g = torch.Generator().manual_seed(seed)
    est = goodput.NoiseScale()
    for _ in range(steps):
        idx = torch.randint(0, len(per_sample), (ranks, b), generator=g)
        local = per_sample[idx].mean(1)  # (ranks, d)
        avg = local.mean(0)
        est.add(float((local ** 2).sum(1).mean()), float(avg @ avg), b, b * ranks)
    return est


@pytest.mark.parametrize("b, ranks", [(8, 2), (8, 4), (32, 2)])
def test_the_estimate_is_within_a_factor_of_1_5_of_the_exact_noise_scale(b, ranks):
    per_sample, truth = problem()
    est = ddp_estimate(per_sample, b, ranks, steps=3000)
    assert est.value is not None
    assert truth / 1.5 <= est.value <= truth * 1.5, (est.value, truth)


def test_pollux_efficiency_and_goodput():
    assert goodput.efficiency(32, 32, 100.0) == 1.0
    assert goodput.efficiency(256, 32, 100.0) == pytest.approx(132 / 356)
    assert goodput.efficiency(256, 32, 1e9) == pytest.approx(1.0)  # far below the noise scale
    assert goodput.goodput(1000.0, 256, 32, 100.0) == pytest.approx(1000 * 132 / 356)


def test_no_estimate_before_a_step_or_from_nonsense():
    est = goodput.NoiseScale()
    assert est.value is None
    est.add(1.0, 2.0, 8, 16)  # the average's norm above the parts': |G|^2 > 0 but S < 0
    assert est.value is None
    with pytest.raises(ValueError):
        est.add(1.0, 0.5, 16, 16)
