"""Pauses inside the run, as the meter reports them: exact idle stretches, not straddled windows."""

import pytest

from autotune.measuring import steady


def meter_points(batch_times, tick_s=0.25, batch=16):
    """Cumulative points as the trial builds them from ticks: per tick with new batches, the
    first new batch (count before it) and the last one (count after it)."""
    points, count, i = [], 0, 0
    t_tick = tick_s
    while i < len(batch_times):
        new = []
        while i < len(batch_times) and batch_times[i] <= t_tick:
            new.append(batch_times[i])
            i += 1
        if new:
            points.append((new[0], count))
            count += batch * len(new)
            points.append((new[-1], count))
        t_tick += tick_s
    return points


def steady_batches(t0, t1, step_s):
    n = int(round((t1 - t0) / step_s))
    return [t0 + k * step_s for k in range(n)]


def with_pauses(total_s, step_s, every_s, pause_s):
    """Batches every ``step_s`` with a ``pause_s`` pause after each ``every_s`` of training."""
    times, t = [], 0.0
    while t < total_s:
        chunk = steady_batches(t, t + every_s, step_s)
        times += chunk
        t = chunk[-1] + step_s + pause_s
    return times


def test_idle_spans_bound_a_pause_to_the_batch():
    times = steady_batches(0.0, 3.0, 0.02) + steady_batches(3.3, 6.0, 0.02)
    spans = steady.idle_spans(meter_points(times), batches=len(times))
    assert len(spans) == 1
    (a, b), = spans
    assert a == pytest.approx(2.98) and b == pytest.approx(3.3)


def test_short_periodic_pauses_do_not_lower_the_estimate():
    times = with_pauses(30.0, 0.02, every_s=2.0, pause_s=0.6)
    points = meter_points(times)
    est = steady.estimate(points, batches=len(times))
    assert est.samples_per_s == pytest.approx(16 / 0.02, rel=0.01)
    assert est.paused_s >= 0.6 * 10
    # The same run seen only at each tick's last batch straddles the pauses: biased low.
    coarse = [p for k, p in enumerate(points) if k % 2 == 1]
    biased = steady.estimate(coarse, batches=len(times))
    assert biased.samples_per_s < 0.9 * est.samples_per_s


def test_sampling_right_after_the_first_batch_is_warm_up():
    times = [0.0] + steady_batches(8.0, 20.0, 0.02)  # step 0, then 8 s of text sampling
    est = steady.estimate(meter_points(times), batches=len(times))
    assert est.samples_per_s == pytest.approx(800.0, rel=0.01)
    assert est.warmup_s >= 8.0


def test_a_stall_shorter_than_a_pause_stays_in():
    times = []
    for k in range(10):  # every second, one step stalls 0.18 s (a busy machine, not a pause)
        times += steady_batches(k * 1.0, k * 1.0 + 0.84, 0.02)
    assert steady.idle_spans(meter_points(times), batches=len(times)) == []
    est = steady.estimate(meter_points(times), batches=len(times))
    assert est.samples_per_s == pytest.approx(16 * 42 / 1.0, rel=0.02)


def test_slow_steps_are_not_idle():
    times = [k * 1.2 for k in range(30)]  # one batch per 1.2 s: ticks in between see nothing
    assert steady.idle_spans(meter_points(times), batches=len(times)) == []
    est = steady.estimate(meter_points(times), batches=len(times))
    assert est.samples_per_s == pytest.approx(16 / 1.2, rel=0.05)

