"""Steady-state throughput from a cumulative counter: warm-up, pauses, mean and interval.

Pure: takes ``(time_s, cumulative_samples)`` points, returns an `Estimate`. The method:

1. Resample the counter on a grid of windows a few batches wide and turn it into window rates.
2. Pauses (evaluation, checkpointing, sampling at step 0) are not the loop the user will run for
   hours; they are excluded and their time reported, never averaged in. Two signs: the counter
   stands still for longer than a few batches take (`idle_spans`; the meter's points bound such
   a stretch to the batch), and every window touching it goes, however short the pause. A window
   that is merely slow stays: slowness is what the user would get.
3. Warm-up: the first window after the first batch always goes (first-iteration sampling, worker
   start); then MSER-5 (White 1997) picks the truncation point that minimises the standard error
   of what is left, within the first half of the series.
4. Mean and a 95% interval by batch means over consecutive windows, which keeps the interval
   honest when neighbouring windows are correlated.
5. A level shift: the kept windows split in two at their likeliest change point, each part
   with its own interval, must agree (their intervals overlap). A script whose step time moves in the middle of the window (nanoGPT's
   fell by a quarter half a minute in) is not tight, however narrow the whole window's interval
   reads: the probe measures on, up to its limit, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

# Student t, two-sided 95%, by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
         16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}

IDLE_GAPS = 4.0  # a stretch without a batch this many usual gaps long is a pause...
MIN_IDLE_S = 0.25  # ...and at least this long (a stall of the machine is not a pause)
MIN_TIGHT_WINDOWS = 4  # what batch_means_ci needs: no interval, and no probe done, on fewer
MIN_WINDOW_S = 0.5
MAX_WINDOW_S = 5.0
BATCHES_PER_WINDOW = 2
# An interval from steps' own spread is never claimed narrower than this share of the rate:
# identical steps are a clock's rounding, not a certainty.
MIN_STEP_REL_HALF = 0.005
# Steps at least this long are one batch per meter tick (0.25 s): measured from jump to jump.
ALIGNED_MIN_STEP_S = 0.5
# steps longer than a meter tick (0.25 s): each batch end seen on its own, and a turn's slice
# read from its second (`slice_parts`)
SLICE_SKIP_MIN_STEP_S = 0.3
SHIFT_MIN_WINDOWS = 8  # fewer kept windows than this are not split in two
SHIFT_MIN_SEGMENT = 4  # windows each side of a change point, for an interval of its own


def t975(dof: int) -> float:
    """Two-sided 95% Student t quantile; 1.96 beyond the table."""
    if dof < 1:
        return math.inf
    if dof in _T975:
        return _T975[dof]
    if dof > 30:
        return 1.96
    lower = max(k for k in _T975 if k < dof)
    return _T975[lower]


@dataclass(frozen=True)
class Estimate:
    """Steady-state throughput with its 95% interval and what was left out."""

    samples_per_s: float
    ci_half: float  # half-width of the 95% interval, samples/s
    measured_s: float  # time the estimate stands on
    warmup_s: float  # time discarded after the first batch
    paused_s: float  # time excluded as pauses
    windows: int
    start_t: float = 0.0  # the span the estimate stands on, in the points' clock
    end_t: float = 0.0
    # the window's two parts (mean, 95% half-width) when they disagree: a level shift inside it
    shift: tuple[tuple[float, float], tuple[float, float]] | None = None

    @property
    def rel_half(self) -> float:
        if self.samples_per_s <= 0:
            return math.inf
        return self.ci_half / self.samples_per_s

    def tight(self, target_rel: float, min_measure_s: float) -> bool:
        """Narrow enough, long enough, and steady: no level shift inside the window. At least
        `MIN_TIGHT_WINDOWS` windows (`estimate` gives no finite interval on fewer): a probe
        stopped on fewer windows than a figure stands on (`autotune.measuring.trial`: three)
        measured nothing."""
        return self.rel_half <= target_rel and self.measured_s >= min_measure_s \
            and self.windows >= MIN_TIGHT_WINDOWS and self.shift is None

    def shift_note(self) -> str:
        """The level shift in words, or "" when the window is steady."""
        if self.shift is None:
            return ""
        (a, ha), (b, hb) = self.shift
        return (f"the rate moved inside the measured window: it read {a:.4g} ± {ha:.2g} "
                f"samples/s, then {b:.4g} ± {hb:.2g}")


def resample(points: list[tuple[float, float]], t0: float, dt: float) -> list[float]:
    """Window rates of a cumulative counter, linearly interpolated on ``t0 + k*dt``."""
    pts = sorted(points)
    if len(pts) < 2 or dt <= 0:
        return []
    t_end = pts[-1][0]
    grid = []
    t = t0
    while t <= t_end + 1e-9:
        grid.append(t)
        t += dt
    values = [interp(pts, g) for g in grid]
    return [(b - a) / dt for a, b in zip(values, values[1:])]


def interp(pts: list[tuple[float, float]], t: float) -> float:
    if t <= pts[0][0]:
        return pts[0][1]
    if t >= pts[-1][0]:
        return pts[-1][1]
    lo, hi = 0, len(pts) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pts[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, va), (tb, vb) = pts[lo], pts[hi]
    if tb == ta:
        return vb
    return va + (vb - va) * (t - ta) / (tb - ta)


def mser_truncation(xs: list[float], batch: int = 5) -> int:
    """MSER-5: how many leading values to drop (a multiple of ``batch``, at most half)."""
    means = [sum(xs[i:i + batch]) / batch for i in range(0, len(xs) - batch + 1, batch)]
    if len(means) < 4:
        return 0
    best_d, best_score = 0, math.inf
    for d in range(0, len(means) // 2 + 1):
        tail = means[d:]
        m = sum(tail) / len(tail)
        score = sum((x - m) ** 2 for x in tail) / len(tail) ** 2
        if score < best_score - 1e-12:
            best_d, best_score = d, score
    return best_d * batch


def batch_means_ci(xs: list[float]) -> float:
    """Half-width of the 95% interval of the mean of ``xs`` by non-overlapping batch means."""
    n = len(xs)
    if n < 4:
        return math.inf
    groups = 10 if n >= 20 else (5 if n >= 10 else n // 2)
    size = n // groups
    used = xs[n - groups * size:]  # drop the oldest remainder, keep the freshest data
    means = [sum(used[i * size:(i + 1) * size]) / size for i in range(groups)]
    m = sum(means) / groups
    var = sum((x - m) ** 2 for x in means) / (groups - 1)
    return t975(groups - 1) * math.sqrt(var / groups)


def idle_spans(points: list[tuple[float, float]], batches: int) -> list[tuple[float, float]]:
    """Stretches where the counter stood still much longer than between two batches.

    The usual gap is the median standstill between consecutive points (the meter reports the
    last batch of one tick and the first of the next), or the mean time per batch when that is
    shorter; a standstill over `IDLE_GAPS` usual gaps and over `MIN_IDLE_S` is idle.
    """
    pts = sorted(points)
    runs = []
    i = 0
    while i < len(pts) - 1:
        j = i
        while j + 1 < len(pts) and pts[j + 1][1] == pts[i][1]:
            j += 1
        if j > i and pts[j][0] > pts[i][0]:
            runs.append((pts[i][0], pts[j][0]))
        i = max(j, i + 1)
    if not runs:
        return []
    per_batch = (pts[-1][0] - pts[0][0]) / max(batches, 1)
    gap = min(median(b - a for a, b in runs), per_batch)
    limit = max(IDLE_GAPS * gap, MIN_IDLE_S)
    return [(a, b) for a, b in runs if b - a > limit]


def window_s(points: list[tuple[float, float]], batches: int) -> float:
    """A window wide enough to hold a couple of batches, within sane bounds."""
    if len(points) < 2 or batches <= 0:
        return MIN_WINDOW_S
    span = points[-1][0] - points[0][0]
    per_batch = span / max(batches, 1)
    return min(MAX_WINDOW_S, max(MIN_WINDOW_S, BATCHES_PER_WINDOW * per_batch))


@dataclass(frozen=True)
class _Aligned:
    """The kept windows measured from point to point (`_aligned`)."""

    samples: float
    span_s: float
    gaps: list[float]  # time between consecutive points at which the count rose

    @property
    def rate(self) -> float:
        return self.samples / self.span_s

    def ci_half(self) -> float:
        """From the spread of the gaps (the mean gap's relative interval is the rate's)."""
        mean_gap = sum(self.gaps) / len(self.gaps)
        return self.rate * max(batch_means_ci(self.gaps) / mean_gap, MIN_STEP_REL_HALF)


def _aligned(points: list[tuple[float, float]], index: list[int], t0: float,
             dt: float) -> _Aligned | None:
    """The kept windows' count from jump to jump, for a staircase series (steps longer than
    a tick, so each batch is a jump of its own): over each stretch of consecutive kept windows,
    the count after its first jump to the count after its last, over the time between them.

    Window rates of a staircase (a batch every few seconds) hold whole batches, so their mean
    is off by up to a batch over the measured time, depending on where the windows fall: 5 s
    steps over 25 s read 5 or 6 batches, ±10%. From jump to jump the count is exact. None when
    no stretch holds two points at different times."""
    pts = sorted(points)
    runs, start = [], index[0]
    for prev, i in zip(index, index[1:]):
        if i != prev + 1:
            runs.append((start, prev))
            start = i
    runs.append((start, index[-1]))
    samples = span = 0.0
    gaps: list[float] = []
    for first, last in runs:
        lo, hi = t0 + (first + 1) * dt, t0 + (last + 2) * dt  # rates[i] spans these
        at = _count_at(pts, lo, hi)
        times = sorted(at)
        if len(times) < 2:
            continue
        samples += at[times[-1]] - at[times[0]]
        span += times[-1] - times[0]
        rose = _rises(at)
        gaps += [b - a for a, b in zip([times[0], *rose], rose)]
    return _Aligned(samples, span, gaps) if span > 0 and samples > 0 else None


def _count_at(points: list[tuple[float, float]], lo: float, hi: float) -> dict[float, float]:
    """The count at each instant in [lo, hi] once that instant's points are in (a batch is a
    jump at one instant: the count before it and after it, at the same time)."""
    at: dict[float, float] = {}
    for t, v in points:
        if lo <= t <= hi:
            at[t] = max(v, at.get(t, v))
    return at


def _rises(at: dict[float, float]) -> list[float]:
    """The instants at which the count rose (`_count_at`), in order."""
    times = sorted(at)
    return [t for a, t in zip(times, times[1:]) if at[t] > at[a]]


def _staircase_cut(points: list[tuple[float, float]], index: list[int], t0: float,
                   dt: float) -> int:
    """Warm-up truncation of a staircase series (`_aligned`), in kept windows: MSER-5 on the
    times between batches over the first stretch of consecutive kept windows, every window that
    begins before the first step it keeps dropped. On the windows' own rates (whole batches
    each) MSER chases where the batches fell: it cut 23 s of a steady 1 s step."""
    last = index[0]
    for i in index[1:]:
        if i != last + 1:
            break
        last = i
    rose = _rises(_count_at(points, t0 + (index[0] + 1) * dt, t0 + (last + 2) * dt))
    gaps = [b - a for a, b in zip(rose, rose[1:])]
    drop = mser_truncation(gaps)
    if not drop:
        return 0
    keep_from = rose[drop]
    return sum(1 for i in index if t0 + (i + 1) * dt < keep_from)


def level_shift(kept: list[float], *, quantum: float = 0.0) \
        -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The window's two parts, before and after its likeliest change point, as (mean, 95%
    half-width) when their intervals do not overlap; None when they agree, or when there are
    too few windows to tell.

    The change point is where the split's difference of means, weighted by
    ``sqrt(k (n - k) / n)`` (CUSUM's statistic), is largest, with at least
    `SHIFT_MIN_SEGMENT` windows on each side; a cut in the middle of a stretch would mix the two
    levels inside one part and widen its interval until it hid the shift. ``quantum``: one batch
    in a window's rate; a part's interval is never narrower than one batch over its windows
    (counts come in whole batches, as in `estimate`)."""
    n = len(kept)
    if n < SHIFT_MIN_WINDOWS:
        return None
    prefix = [0.0]
    for x in kept:
        prefix.append(prefix[-1] + x)
    total = prefix[-1]

    def gap(k: int) -> float:
        a, b = prefix[k] / k, (total - prefix[k]) / (n - k)
        return abs(a - b) * math.sqrt(k * (n - k) / n)

    k = max(range(SHIFT_MIN_SEGMENT, n - SHIFT_MIN_SEGMENT + 1), key=gap)
    parts = []
    for xs in (kept[:k], kept[k:]):
        parts.append((sum(xs) / len(xs), max(batch_means_ci(xs), quantum / len(xs))))
    (a, ha), (b, hb) = parts
    return (parts[0], parts[1]) if abs(a - b) > ha + hb else None


def estimate(points: list[tuple[float, float]], *, batches: int,
             dt: float | None = None) -> Estimate | None:
    """Steady-state samples/s from cumulative ``(t, samples)`` points; None when too few.

    ``points`` should start at the first batch; ``batches`` is how many batches they span
    (used to size the windows).
    """
    if len(points) < 2:
        return None
    dt = dt or window_s(points, batches)
    t0 = points[0][0]
    rates = resample(points, t0, dt)
    if len(rates) < 3:
        return None
    rates = rates[1:]  # first window after the first batch: always warm-up
    warmup = 1
    spans = idle_spans(points, batches)
    idle = [any(a < t0 + (i + 2) * dt and b > t0 + (i + 1) * dt for a, b in spans)
            for i in range(len(rates))]
    if not any(r > 0 and not still for r, still in zip(rates, idle)):
        return Estimate(0.0, 0.0, 0.0, dt, len(rates) * dt, 0)
    # Only a standstill is a pause. A slow window is not: on a busy machine the script really
    # runs that slowly, and dropping it would flatter the estimate.
    out = idle
    lead = next((i for i, o in enumerate(out) if not o), len(out))  # slow start: warm-up
    index = [i for i in range(lead, len(rates)) if not out[i]]
    paused = len(rates) - lead - len(index)
    per_batch = (points[-1][0] - t0) / max(batches, 1)
    if per_batch >= ALIGNED_MIN_STEP_S:  # a staircase: warm-up read from the steps themselves
        cut = _staircase_cut(points, index, t0, dt)
    else:
        cut = mser_truncation([rates[i] for i in index])
    index = index[cut:]
    warmup += lead + cut
    if not index:
        return None
    kept = [rates[i] for i in index]
    mean = sum(kept) / len(kept)
    # Counts come in whole batches: over the measured time the rate is known to one batch at
    # best, however alike the windows look (identical windows would otherwise claim a zero CI).
    batch = (points[-1][1] - points[0][1]) / max(batches, 1)
    ci = max(batch_means_ci(kept), batch / (len(kept) * dt))
    step = batch / mean if mean > 0 else 0.0
    aligned = _aligned(points, index, t0, dt) if step >= ALIGNED_MIN_STEP_S else None
    if aligned is not None:
        # Steps longer than two ticks: each batch is a jump of its own in the series, so the
        # windows count whole batches and their mean depends on where they fall; measured from
        # jump to jump the count is exact. The interval too comes from the steps' own spread:
        # the windows' is where they fall (1 s steps of ±4% in 2 s windows holding one batch,
        # two or three read ±17% after 20 s; their steps, ±1%).
        # On fewer windows than a probe may end on the interval stays the windows' (infinite):
        # a probe pruned, or stopped as tight, on two windows of four steps measured nothing.
        mean = aligned.rate
        if len(aligned.gaps) >= 4 and len(kept) >= MIN_TIGHT_WINDOWS:
            ci = aligned.ci_half()
    # rates[i] is the window [t0 + (i+1) dt, t0 + (i+2) dt]: the first one was dropped above.
    return Estimate(samples_per_s=mean, ci_half=ci,
                    measured_s=len(kept) * dt, warmup_s=warmup * dt, paused_s=paused * dt,
                    windows=len(kept), start_t=t0 + (index[0] + 1) * dt,
                    end_t=t0 + (index[-1] + 2) * dt,
                    shift=level_shift(kept, quantum=batch / dt))


def slice_parts(points: list[tuple[float, float]],
                slices: list[tuple[float, float]]) -> list[tuple[float, float] | None]:
    """(samples, seconds) each slice ran, in order (`slices_estimate`): from its first batch
    end to its last, or for steps of `SLICE_SKIP_MIN_STEP_S` or more (each end a batch of its
    own), from its second; None for a slice with too few ends.

    Not from the first for long steps: a hold that lands inside a step lets a script that
    paces itself by the clock (waiting out a device's time, or a timer's) find the held time
    already gone, and its next step ends early. Steps paced so (1 s at batch 80) read up to
    twice their rate in a slice that counted that step; among a slice's dozens of short steps
    one early step is lost in the rest."""
    pts = sorted(points)
    ends = [p for prev, p in zip(pts, pts[1:]) if p[1] > prev[1]]  # where a batch ended
    pauses = idle_spans(pts, len(ends)) if len(pts) > 1 else []
    gaps = sorted(b[0] - a[0] for a, b in zip(ends, ends[1:]))
    skip = 1 if gaps and gaps[len(gaps) // 2] >= SLICE_SKIP_MIN_STEP_S else 0
    out: list[tuple[float, float] | None] = []
    for a, b in slices:
        inside = [p for p in ends if a <= p[0] <= b][skip:]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            out.append(None)
            continue
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        ran = (t1 - t0) - sum(max(0.0, min(y, t1) - max(x, t0)) for x, y in pauses)
        out.append((c1 - c0, ran) if ran > 0 else None)
    return out


def slices_estimate(points: list[tuple[float, float]], slices: list[tuple[float, float]],
                    parts: list[tuple[float, float] | None] | None = None) -> Estimate | None:
    """Samples/s over the time slices a process ran in (`autotune.measuring.alternate`: held
    with SIGSTOP between them), from batch to batch inside each slice; None without three
    slices that saw enough batches end.

    A slice is measured from the first batch that ended in it (the one in flight when the
    process was held ends just after it resumes; for long steps the second, as the next may
    end early: `slice_parts`) to the last, so the time held is never counted and each slice's
    rate is exact to the meter's clock. A pause inside a slice
    (`idle_spans`: evaluation) is left out, as `estimate` leaves it. The figure is all the
    samples over all the measured time; its interval is the t-interval of the slices' own
    rates, which lie seconds apart and are taken as independent. ``parts``: `slice_parts` of
    the same, when the caller has them.
    """
    parts = slice_parts(points, slices) if parts is None else parts
    used = [(sl, part) for sl, part in zip(slices, parts) if part is not None]
    if len(used) < 3:
        return None
    samples = sum(c for _, (c, _) in used)
    span = sum(t for _, (_, t) in used)
    rates = [c / t for _, (c, t) in used]
    mean = samples / span
    n = len(rates)
    m = sum(rates) / n
    sd = math.sqrt(sum((r - m) ** 2 for r in rates) / (n - 1))
    ci = max(t975(n - 1) * sd / math.sqrt(n), MIN_STEP_REL_HALF * mean)
    start, end = used[0][0][0], used[-1][0][1]
    first = min(p[0] for p in points)
    return Estimate(samples_per_s=mean, ci_half=ci, measured_s=span,
                    warmup_s=max(0.0, start - first), paused_s=max(0.0, (end - start) - span),
                    windows=n, start_t=start, end_t=end)
