"""Steady-state estimation: warm-up, pauses, mean and interval, on synthetic counters."""

import random

import pytest

from autotune.measuring import steady


def counter(rates, dt=0.1, t0=0.0):
    """Cumulative (t, samples) points for piecewise-constant rates, one per dt."""
    pts, total, t = [(t0, 0.0)], 0.0, t0
    for r in rates:
        t += dt
        total += r * dt
        pts.append((t, total))
    return pts


def test_resample_constant_rate():
    pts = counter([100.0] * 50)
    rates = steady.resample(pts, 0.0, 0.5)
    assert len(rates) == 10
    assert all(r == pytest.approx(100.0) for r in rates)


def test_interp_between_points():
    pts = [(0.0, 0.0), (1.0, 10.0), (3.0, 30.0)]
    assert steady.interp(pts, 2.0) == pytest.approx(20.0)
    assert steady.interp(pts, -1.0) == 0.0
    assert steady.interp(pts, 9.0) == 30.0


def test_mser_drops_slow_start():
    xs = [10.0] * 10 + [100.0] * 40
    cut = steady.mser_truncation(xs)
    assert cut == 10


def test_mser_keeps_flat_series():
    rng = random.Random(1)
    xs = [100 + rng.gauss(0, 2) for _ in range(50)]
    assert steady.mser_truncation(xs) <= 5


def test_warmup_excluded_from_mean():
    rates = [20.0] * 30 + [200.0] * 170  # 3 s slow start then steady
    est = steady.estimate(counter(rates), batches=2000, dt=0.5)
    assert est.samples_per_s == pytest.approx(200.0, rel=0.02)
    assert est.warmup_s >= 2.5


def test_pause_excluded_and_reported():
    rates = [200.0] * 60 + [0.0] * 50 + [200.0] * 90  # a 5 s evaluation pause mid-run
    est = steady.estimate(counter(rates), batches=2000, dt=0.5)
    assert est.samples_per_s == pytest.approx(200.0, rel=0.02)
    assert est.paused_s >= 5.0
    naive = counter(rates)[-1][1] / 20.0
    assert naive < 0.8 * est.samples_per_s  # what an estimate across the pause would say


def test_pause_at_step_zero():
    rates = [5.0] + [0.0] * 150 + [300.0] * 150  # sampling text for 15 s before training
    est = steady.estimate(counter(rates), batches=3000, dt=0.5)
    assert est.samples_per_s == pytest.approx(300.0, rel=0.02)


def test_interval_covers_true_mean_and_shrinks():
    rng = random.Random(7)
    short = steady.estimate(counter([100 + rng.gauss(0, 15) for _ in range(60)]),
                            batches=600, dt=0.5)
    long = steady.estimate(counter([100 + rng.gauss(0, 15) for _ in range(600)]),
                           batches=6000, dt=0.5)
    assert abs(long.samples_per_s - 100) <= long.ci_half
    assert long.ci_half < short.ci_half
    assert long.tight(0.05, 5.0)


def test_too_few_points_gives_none():
    assert steady.estimate([(0.0, 0.0)], batches=0) is None
    assert steady.estimate(counter([100.0] * 3), batches=3, dt=0.5) is None


def test_window_sized_to_batches():
    pts = counter([10.0] * 100)  # 10 s, 10 batches: 1 s per batch
    assert steady.window_s(pts, 10) == pytest.approx(2.0, rel=0.05)
    assert steady.window_s(pts, 10_000) == steady.MIN_WINDOW_S


def test_t_quantiles():
    assert steady.t975(9) == pytest.approx(2.262)
    assert steady.t975(1000) == 1.96
    assert steady.t975(0) == float("inf")


def test_identical_windows_still_have_batch_resolution():
    # one 32-sample batch exactly every 0.5 s: every 1 s window holds two batches
    pts = [(0.0, 0.0)]
    for k in range(1, 41):
        pts.append((k * 0.5, 32.0 * k))
    est = steady.estimate(pts, batches=40, dt=1.0)
    assert est.samples_per_s == pytest.approx(64.0)
    assert est.ci_half >= 32.0 / est.measured_s > 0
