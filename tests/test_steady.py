"""Steady-state estimation: warm-up, pauses, mean and interval, on synthetic counters."""

import math
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
    # one 32-sample batch exactly every 0.25 s: every 1 s window holds four batches
    pts = [(0.0, 0.0)]
    for k in range(1, 81):
        pts.append((k * 0.25, 32.0 * k))
    est = steady.estimate(pts, batches=80, dt=1.0)
    assert est.samples_per_s == pytest.approx(128.0)
    assert est.ci_half >= 32.0 / est.measured_s > 0


def test_identical_steps_still_have_the_steps_resolution():
    # one batch exactly every 0.5 s (a staircase: counted from jump to jump, exact): the
    # interval is the steps' own, never zero
    pts = [(0.0, 0.0)]
    for k in range(1, 41):
        pts.append((k * 0.5, 32.0 * k))
    est = steady.estimate(pts, batches=40, dt=1.0)
    assert est.samples_per_s == pytest.approx(64.0)
    assert est.ci_half >= steady.MIN_STEP_REL_HALF * 64.0 > 0


def staircase(step_s, batch, n, phase=0.0, jitter=0.0, seed=0):
    """The meter's series of a script with long steps: one batch per tick, so each batch is a
    jump at its own time (the count before it and after it, at the same instant)."""
    rng = random.Random(seed)
    pts, t, c = [(0.0, 0.0)], phase, 0.0
    for _ in range(n):
        t += step_s * (1 + rng.uniform(-jitter, jitter))
        pts += [(t, c), (t, c + batch)]
        c += batch
    return pts


@pytest.mark.parametrize("phase", [0.0, 0.7, 1.9, 3.3, 4.4])
def test_long_steps_are_measured_between_batches_not_in_whole_batches_per_window(phase):
    # 256 samples every 4.53 s (minGPT at a large batch): 56.5 samples/s; 5 s windows hold one
    # batch or two, and whole-window counts read 51.2 or 61.4 depending on where they fall
    pts = staircase(4.53, 256, 9, phase=phase)
    est = steady.estimate(pts, batches=9)
    assert est.samples_per_s == pytest.approx(256 / 4.53, rel=0.01)
    window_mean = sum(steady.resample(pts, 0.0, 5.0)[-5:]) / 5
    assert est.ci_half > 0 and window_mean != pytest.approx(est.samples_per_s, rel=0.001)


def test_the_aligned_mean_leaves_pauses_out():
    # 1 s steps of 32, a 20 s evaluation after the tenth, then on: 32 samples/s while training
    pts, t, c = [(0.0, 0.0)], 0.0, 0.0
    for k in range(40):
        t += 1.0 + (20.0 if k == 10 else 0.0)
        pts += [(t, c), (t, c + 32)]
        c += 32
    est = steady.estimate(pts, batches=40, dt=2.0)
    assert est.samples_per_s == pytest.approx(32.0, rel=0.02)
    assert est.paused_s >= 16.0


def test_long_steps_get_their_interval_from_the_steps_not_from_the_windows():
    # 4.5 s steps with ±4% jitter (slow_steps.py at batch 256): the windows' spread (one batch
    # or two in each) made a ±60% interval; the steps' own spread gives a few per cent
    pts = staircase(4.5, 256, 12, phase=1.1, jitter=0.04, seed=3)
    est = steady.estimate(pts, batches=12)
    assert est.samples_per_s == pytest.approx(256 / 4.5, rel=0.03)
    assert 0 < est.rel_half < 0.06
    assert abs(est.samples_per_s - 256 / 4.5) <= est.ci_half * 1.5


@pytest.mark.parametrize("seed", range(4))
def test_second_long_steps_get_their_interval_and_warm_up_from_the_steps(seed):
    """slow_steps.py at its own batch (minGPT's shape): 1 s steps of ±4%, the first 3 s
    longer. In 2 s windows of one batch, two or three the windows' interval read ±17% after
    20 s and MSER on them cut up to 23 s of steady steps as warm-up (a baseline probe ran 58 s
    to be tight at 5%); the steps' own spread is about ±1.5% after 12 s."""
    pts = staircase(1.0, 32, 20, jitter=0.04, seed=seed)
    pts = [(0.0, 0.0)] + [(t + 3.0, c) for t, c in pts[1:]]  # the slow first step
    est = steady.estimate(pts, batches=20)
    assert est.samples_per_s == pytest.approx(32.0, rel=0.03)
    assert 0 < est.rel_half < 0.05
    assert abs(est.samples_per_s - 32.0) <= est.ci_half * 1.5
    assert est.warmup_s < 6.0  # the first window and the slow step, not the steady ones


def test_a_staircase_has_no_interval_on_fewer_windows_than_a_probe_may_end_on():
    # minGPT's shape, live: 1.3 s steps of ±1% (2.6 s windows), a few steps in. The steps'
    # spread alone would read ±0.5-3% there; a probe stopped as tight, or pruned, on two or
    # three windows ended with no figure (a baseline, and a search probe, read no-signal)
    for n in (6, 8):
        est = steady.estimate(staircase(1.3, 32, n, phase=0.7, jitter=0.01, seed=1), batches=n)
        assert est.windows < steady.MIN_TIGHT_WINDOWS and est.ci_half == math.inf, est
        assert not est.tight(target_rel=0.05, min_measure_s=0.0)
    longer = steady.estimate(staircase(1.3, 32, 12, jitter=0.01, seed=1), batches=12)
    assert longer.windows >= steady.MIN_TIGHT_WINDOWS and longer.tight(0.05, 5.0)


def test_a_staircase_with_slow_first_steps_cuts_them_as_warm_up():
    # ten steps of 2 s, then 1 s steps: MSER on the steps cuts the slow ones, and the rate
    # read is the steady one
    pts, t, c = [(0.0, 0.0)], 0.0, 0.0
    rng = random.Random(7)
    for k in range(60):
        t += (2.0 if k < 10 else 1.0) * (1 + rng.uniform(-0.03, 0.03))
        pts += [(t, c), (t, c + 32)]
        c += 32
    est = steady.estimate(pts, batches=60)
    assert est.samples_per_s == pytest.approx(32.0, rel=0.03)
    assert est.warmup_s >= 15.0


@pytest.mark.parametrize("phase", [0.1, 0.45, 0.8])
def test_second_long_steps_are_counted_from_jump_to_jump_too(phase):
    # minGPT at its own batch: 32 samples a second, 2 s windows holding two batches or three
    pts = staircase(1.0, 32, 40, phase=phase, jitter=0.03, seed=5)
    est = steady.estimate(pts, batches=40)
    assert est.samples_per_s == pytest.approx(32.0, rel=0.015)


def test_a_level_shift_inside_the_window_is_not_tight():
    """nanoGPT's shape: the step time falls by a quarter two thirds into the window, past what
    warm-up truncation may cut (half the series). The whole window's interval may read narrow;
    its halves disagree, so the probe is not done."""
    rng = random.Random(3)
    rates = [100.0 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(200)] + \
        [130.0 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(100)]
    est = steady.estimate(counter(rates), batches=300 * 4)
    assert est is not None and est.shift is not None
    (a, _), (b, _) = est.shift
    assert a < 115 < b
    assert not est.tight(target_rel=1.0, min_measure_s=0.0)
    assert "then" in est.shift_note() and "moved" in est.shift_note()


def test_a_steady_noisy_window_has_no_level_shift():
    rng = random.Random(4)
    rates = [100.0 * (1 + rng.gauss(0, 0.05)) for _ in range(300)]
    est = steady.estimate(counter(rates), batches=300 * 4)
    assert est is not None and est.shift is None and est.shift_note() == ""
    assert est.tight(target_rel=0.05, min_measure_s=1.0)


def test_identical_windows_are_steady_whatever_a_batch_rounds():
    est = steady.estimate(counter([100.0] * 200), batches=200 * 4)
    assert est.shift is None
    assert steady.level_shift([10.0] * 4 + [10.5] * 4, quantum=4.0) is None  # within a batch
    assert steady.level_shift([10.0] * 4 + [10.5] * 4) is not None  # no batch to round by


def _slices_series(rate=100.0, batch=10, slices=((0, 2), (5, 7), (10, 12), (15, 17)),
                   pause=None):
    """Batch ends of a process that runs only in ``slices`` (held between them), ``batch``
    samples every ``batch / rate`` s; ``pause`` (t0, t1): no batch ends inside it."""
    pts, count, step = [(-1.0, 0.0)], 0, batch / rate
    for a, b in slices:
        t = a + 0.05  # the batch in flight at the hold ends just after the release
        while t <= b:
            if pause is None or not pause[0] < t < pause[1]:
                # as the meter's ticks give them: the batch's start at the count before it
                pts += [(t - step + 0.001, float(count)), (t, float(count + batch))]
                count += batch
                t += step
            else:
                t = pause[1] + step
    return pts, [tuple(s) for s in slices]


def test_slices_are_read_batch_to_batch_and_the_time_held_between_them_never_counts():
    pts, slices = _slices_series()
    est = steady.slices_estimate(pts, slices)
    assert est.samples_per_s == pytest.approx(100.0, rel=1e-6)
    assert est.windows == 4 and est.measured_s == pytest.approx(4 * 1.9, rel=0.06)
    assert est.paused_s > 3 * 3.0  # the holds: beside the slices, never in the figure


def test_a_pause_inside_a_slice_is_left_out_as_the_whole_window_estimate_leaves_it():
    pts, slices = _slices_series(pause=(5.6, 6.4))
    est = steady.slices_estimate(pts, slices)
    assert est.samples_per_s == pytest.approx(100.0, rel=0.02)


def test_a_step_that_ends_early_after_a_hold_is_left_out_of_its_slice():
    """A script that paces its 1 s steps by the clock (it waits out what is left of each step,
    as one waiting on a device would): held inside a step, it finds the held time gone, and
    after the step in flight the next one ends 0.3 s later, its compute alone. Read from the
    first batch end, its four slices read 1.2 steps a second; from the second, one."""
    batch, pts, count = 80, [(-1.0, 0.0)], 0
    slices = [(0.0, 3.5), (6.0, 9.5), (12.0, 15.5), (18.0, 21.5)]
    for a, b in slices:
        ends = [a + 0.05, a + 0.35] + [a + 0.35 + k for k in range(1, 4)]
        for t in (e for e in ends if e <= b):
            pts += [(t - 0.001, float(count)), (t, float(count + batch))]
            count += batch
    est = steady.slices_estimate(pts, slices)
    assert est.samples_per_s == pytest.approx(batch / 1.0, rel=1e-6)
    # 0.4 s steps (word_lm's batch 20) are read so too; 20 ms steps, many to a tick, are not
    assert steady.SLICE_SKIP_MIN_STEP_S <= 0.4


def test_slices_that_saw_too_few_batches_give_no_figure():
    pts, slices = _slices_series(slices=((0, 2), (5, 7), (10, 10.05), (15, 15.05)))
    assert steady.slice_parts(pts, slices)[2:] == [None, None]
    assert steady.slices_estimate(pts, slices) is None
