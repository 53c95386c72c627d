"""Probes fitted to the script: how long each one runs, when its silence is a hang, what a budget
holds, and how long the confirmation measures.

The baseline probe runs until its interval is tight (or its cap) and tells how the script moves
(`ScriptTiming`): how long until its first batch (imports, data, sampling before the first step),
how much after that is warm-up, one rank's time per batch, and how noisy its throughput is. From
those, with a noise target, every later probe gets its limits (`limits`):

- its length: start-up, warm-up, and the measuring time the target needs (the baseline's own,
  scaled by how far its interval was from the target), stretched for a config whose steps are
  longer (a larger per-rank batch, fewer threads per rank) and for ranks that start together;
- its hang thresholds: no progress for many of its own steps while its ranks idle is a hang,
  however long the probe (`autotune.measuring.trial`).

What a budget holds for the confirmation is `autotune.tuning.confirm_plan`'s. Pure: numbers in,
numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from autotune.measuring import steady
from autotune.measuring.outcome import STALL_STEPS, Outcome

TARGET_REL = 0.05  # a search probe ends once its 95% half-width is this share of its mean
MIN_WINDOWS = 6  # estimate windows a probe's limit makes room for (steady.batch_means_ci needs 4)
# ...while a probe that ends once tight may end on `steady.MIN_TIGHT_WINDOWS`: what it is
# expected to take counts those (minGPT's chargpt, 2.5 s steps in 5 s windows, was expected to
# need 30 s of measuring where 20 s were enough, and a 5-minute budget held one search probe)
END_S = 2.0  # a script that ends on its own: its exit, after its last batch
MARGIN = 1.3  # a probe's limit over what it is expected to need
MIN_PROBE_S = 8.0
MAX_PROBE_S = 240.0
PROBE_BUDGET_SHARE = 0.2  # under a --budget, no probe's limit above this share of it
MAX_STEP_FACTOR = 16.0  # steps stretched at most this much for a config's limits
RANKS_START_FACTOR = 1.3  # several ranks on one host start slower than one (imports, a group)
HANG_MIN_S = 10.0  # never a hang sooner than this
# Before the baseline timed the script: no progress this long while its ranks use the CPU is a
# hang (a pause of its own at step 0: minGPT's chargpt samples 500 characters of text after its
# first step, 20-35 s on this project's 2 cores, and was once judged hung at 30 s), and this
# long while they idle (blocked on a peer, a lock, a socket).
UNTIMED_BUSY_HANG_S = 60.0
UNTIMED_IDLE_HANG_S = 30.0
BASELINE_MAX_S = 90.0  # the baseline's limit when --seconds is not given: it ends once tight
BASELINE_BUDGET_SHARE = 0.25  # ... and at most this share of a --budget
# A confirmation probe's length over the config's fitted search probe: that already reaches the
# noise target inside one process, and the spread between processes is what more rounds measure.
CONFIRM_PROBE_FACTOR = 1.0
# What fitted search probes really took over what they were expected to take (they end once
# tight, or pruned, often sooner): the budget plan counts that, from this many probes on, as
# the most any of the last `COST_WINDOW` took (a probe started on less would be cut before it
# is tight) with `COST_HEADROOM` over it, within `COST_FACTOR_RANGE`.
COST_MIN_PROBES = 2
COST_HEADROOM = 1.2
COST_WINDOW = 8
COST_FACTOR_RANGE = (0.25, 1.5)


@dataclass(frozen=True)
class ScriptTiming:
    """How the script moved in its baseline probe (seconds)."""

    first_s: float  # launch to the first batch (or step)
    warmup_s: float  # after it, left out of the estimate as warm-up
    step_s: float  # one rank's time per batch (or step), steady
    measured_s: float  # what the estimate stood on
    rel_half: float  # its 95% half-width over its mean
    paused_s: float = 0.0  # standstills left out (evaluation, checkpoints)
    batch_size: int = 0  # per-rank batch it ran with (0: unknown)
    threads: int = 0  # compute threads per rank (0: unknown)
    # launch to the script's own end when its data ran out before autotune stopped it (a
    # finite loader, one epoch); 0 when autotune ended it. Such a script's probes last no
    # longer than its run does, however little that measured.
    ended_s: float = 0.0
    # measuring after which its estimate was tight and ended it (`TrialResult.tight_s`); 0 when
    # it ran to its limit. Its final estimate, over all it measured until its ranks stopped,
    # may read wider: word_language_model's was tight after 4 s and read ±21% after 6.
    tight_s: float = 0.0

    @classmethod
    def of(cls, result, knobs: Mapping[str, float]) -> ScriptTiming | None:
        """From a probe's `TrialResult` and the knobs it ran with; None when it never
        progressed steadily (nothing to fit)."""
        if result.step_s <= 0 or result.measured_s <= 0 or result.samples_per_s <= 0:
            return None
        return cls(first_s=result.first_s, warmup_s=result.warmup_s, step_s=result.step_s,
                   measured_s=result.measured_s,
                   rel_half=result.ci_half / result.samples_per_s,
                   paused_s=result.paused_s, batch_size=int(knobs.get("batch_size") or 0),
                   threads=int(knobs.get("threads") or 0),
                   ended_s=result.duration_s if result.outcome == Outcome.ENDED else 0.0,
                   tight_s=result.tight_s)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> ScriptTiming:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self) -> str:
        return (f"first batch after {self.first_s:.1f} s, {_secs(self.step_s)} per step, "
                f"±{self.rel_half:.0%} after {self.measured_s:.0f} s of measuring" +
                (f" (within ±{TARGET_REL:.0%} after {self.tight_s:.0f} s, where it ended)"
                 if self.tight_s else "") +
                (f"; its data ran out {self.ended_s:.0f} s after launch" if self.ended_s else ""))


@dataclass(frozen=True)
class Cost:
    """A fitted search probe's expected time (`Limits.expected_s`, within the budget's cap)
    and the time it really took, start to end (seconds)."""

    expected_s: float
    actual_s: float


def cost_factor(costs: Sequence[Cost]) -> float:
    """How much of their expected time fitted probes really take: the largest share of the
    last `COST_WINDOW` (the plan makes room for the longest, not the typical) with
    `COST_HEADROOM`, within `COST_FACTOR_RANGE`; 1.0 before `COST_MIN_PROBES` were timed."""
    ratios = [c.actual_s / c.expected_s for c in costs[-COST_WINDOW:] if c.expected_s > 0]
    if len(ratios) < COST_MIN_PROBES:
        return 1.0
    low, high = COST_FACTOR_RANGE
    return min(high, max(low, COST_HEADROOM * max(ratios)))


@dataclass(frozen=True)
class Limits:
    """A probe's limits (`autotune.measuring.probe_state.TrialSpec` fields) and what it should take."""

    max_s: float
    min_measure_s: float
    hang_s: float
    idle_hang_s: float
    startup_s: float
    expect_first_s: float  # when its first batch should come
    expected_s: float  # what it should take, ending once tight
    least_s: float = 0.0  # the least it measures anything in: first batch, warm-up, MIN_WINDOWS

    def spec_fields(self) -> dict:
        return {"max_s": self.max_s, "min_measure_s": self.min_measure_s, "hang_s": self.hang_s,
                "idle_hang_s": self.idle_hang_s, "startup_s": self.startup_s,
                "expect_first_s": self.expect_first_s}


@dataclass(frozen=True)
class Pace:
    """One rank's time per step seen in a probe, its launch to first batch (0: not known) and
    the warm-up its estimate left out (None: not known), with the knobs that gave them."""

    batch_size: int
    threads: int
    step_s: float
    first_s: float = 0.0
    warmup_s: float | None = None


def step_factor(t: ScriptTiming, knobs: Mapping[str, float], instances: int = 1,
                seen: Sequence[Pace] = ()) -> float:
    """How much longer one rank's step is expected to take under ``knobs`` than in the
    baseline. From the nearest pace seen (the baseline's, or a later probe's of the nearest
    batch size), scaled in proportion to a larger batch and to fewer compute threads: a step
    that is part overhead grows less, so the nearer the anchor, the closer the guess. Never
    below 1 (a probe is not shortened on a guess) nor above `MAX_STEP_FACTOR`."""
    b, th = float(knobs.get("batch_size") or 0), float(knobs.get("threads") or 0)
    best = _nearest(t, knobs, seen)
    step = best.step_s
    if b and best.batch_size:
        step *= max(1.0, b / best.batch_size)
    if th and best.threads:
        step *= max(1.0, best.threads / th)
    return min(MAX_STEP_FACTOR, max(1.0, step / t.step_s))


def _nearest(t: ScriptTiming, knobs: Mapping[str, float], seen: Sequence[Pace]) -> Pace:
    """The pace seen nearest ``knobs`` (the baseline's among them), by batch and threads on a
    log scale; the first seen of equals."""
    b, th = float(knobs.get("batch_size") or 0), float(knobs.get("threads") or 0)

    def distance(p: Pace) -> float:
        return (abs(math.log(b / p.batch_size)) if b and p.batch_size else 0.0) + \
            (abs(math.log(th / p.threads)) if th and p.threads else 0.0)

    return min([Pace(t.batch_size, t.threads, t.step_s, t.first_s, t.warmup_s), *seen],
               key=distance)


def warmup_steps(t: ScriptTiming, knobs: Mapping[str, float], seen: Sequence[Pace] = ()) -> float:
    """How many steps a probe of ``knobs`` should leave out as warm-up: as many as the nearest
    probe seen whose warm-up is known (the baseline's among them) left out of its own.
    A baseline's warm-up may hold a change of the machine's pace rather than the script's:
    word_lm's shape left out 15 s (35 steps) of its baseline and 1-1.3 s of every later probe,
    and a batch of 128, fitted to the baseline's, was left out as needing 134 s."""
    p = _nearest(t, knobs, [q for q in seen if q.warmup_s is not None])
    return (p.warmup_s or 0.0) / p.step_s if p.step_s > 0 else 0.0


def first_batch_s(t: ScriptTiming, knobs: Mapping[str, float],
                  seen: Sequence[Pace] = ()) -> float:
    """When the first batch of a probe of ``knobs`` should come: as in the nearest probe seen
    whose first batch is known, never sooner than the baseline's. A script that evaluates, or
    samples, before its first step does so at the batch it trains with (nanoGPT's shape: 5.7 s
    at batch 12, 7.3 at 32, 10.6 at 64, 16.5 at 96), which the baseline's alone does not show."""
    known = [p for p in seen if p.first_s > 0]
    return max(t.first_s, _nearest(t, knobs, known).first_s)


def measure_s(t: ScriptTiming, target_rel: float, windows: int = MIN_WINDOWS) -> float:
    """Measuring time the baseline's pace needs to reach ``target_rel``: its own, scaled by the
    square of how far its interval was from the target (an interval narrows as 1/sqrt(time)),
    and at least ``windows`` estimate windows (`MIN_WINDOWS`, what a limit makes room for)."""
    need = min(t.measured_s * (t.rel_half / target_rel) ** 2, 4 * t.measured_s) \
        if math.isfinite(t.rel_half) else 4 * t.measured_s
    return max(need, windows * _window_s(t.step_s))


def expected_measure_s(t: ScriptTiming, target_rel: float) -> float:
    """Measuring time a probe ending once tight is expected to take at the baseline's pace:
    `measure_s` on `steady.MIN_TIGHT_WINDOWS` windows, and for a target no tighter than the
    baseline's own (`TARGET_REL`) no more than the baseline took to be tight
    (`ScriptTiming.tight_s`): a final interval made wide by the measuring after that says
    little about how soon a probe gets tight (word_language_model's baseline, tight after 4 s,
    read ±21% after 6, and its first plan expected probes of 42 s that then took 10-13 s).
    A probe's limit is not shortened by it (`limits` takes `measure_s`)."""
    need = measure_s(t, target_rel, steady.MIN_TIGHT_WINDOWS)
    if t.tight_s > 0 and target_rel >= TARGET_REL:
        need = min(need, max(t.tight_s, steady.MIN_TIGHT_WINDOWS * _window_s(t.step_s)))
    return need


def own_run_s(t: ScriptTiming, knobs: Mapping[str, float], factor: float) -> float | None:
    """After its first batch, how long the script runs before it ends on its own under
    ``knobs`` (its steps ``factor`` times the baseline's), for a script whose data ran out in
    the baseline (`ScriptTiming.ended_s`): the same samples in fewer, longer steps at a larger
    batch, but never less than the baseline's own run (a script that stops on its clock, not
    its data, runs as long at any batch). None for a script autotune had to stop."""
    if t.ended_s <= 0:
        return None
    b = float(knobs.get("batch_size") or 0)
    per_batch = t.batch_size / b if b and t.batch_size else 1.0
    return max(0.0, t.ended_s - t.first_s) * max(1.0, factor * per_batch)


def limits(t: ScriptTiming, knobs: Mapping[str, float], instances: int = 1, *,
           seen: Sequence[Pace] = (), target_rel: float = TARGET_REL) -> Limits:
    """A probe of ``knobs`` on ``instances`` ranks, fitted to the script's timing and the paces
    ``seen`` since (`step_factor`, `first_batch_s`)."""
    f = step_factor(t, knobs, instances, seen)
    start = first_batch_s(t, knobs, seen) * (RANKS_START_FACTOR if instances > 1 else 1.0)
    step = t.step_s * f
    # The limit makes room for every step taking f times the baseline's, warm-up (as many
    # steps as the nearest probe's: `warmup_steps`) and measuring alike: a probe cut before
    # it is tight measured nothing.
    warm_steps = warmup_steps(t, knobs, seen)
    warm = warm_steps * step
    bound = start + warm + max(measure_s(t, target_rel) * f, MIN_WINDOWS * _window_s(step))
    max_s = min(MAX_PROBE_S, max(MIN_PROBE_S, MARGIN * bound + 2 * _window_s(step)))
    # What it should take: it ends once tight, and its interval narrows with the number of
    # estimate windows it holds, not of steps, so warm-up and measuring stretch with the
    # window (`_window_s`: the same 0.5 s for steps up to a quarter second, two steps beyond),
    # not with the step: a larger batch of 50 ms steps is measured as fast as the baseline.
    # It ends on `steady.MIN_TIGHT_WINDOWS` windows when the baseline's interval says so; a
    # script whose data runs out ends sooner still (`own_run_s`).
    stretch = _window_s(step) / _window_s(t.step_s)
    tight = steady.MIN_TIGHT_WINDOWS
    expected = start + warm_steps * t.step_s * stretch + \
        max(expected_measure_s(t, target_rel) * stretch, tight * _window_s(step))
    run_s = own_run_s(t, knobs, f)
    if run_s is not None:
        expected = min(expected, start + run_s + END_S)
    # The least it measures anything in: its first batch, warm-up at the stretched step and
    # the windows an estimate needs; a limit under it ends with no signal.
    least = start + warm + MIN_WINDOWS * _window_s(step)
    idle_hang = max(HANG_MIN_S, STALL_STEPS * step, 2 * t.paused_s)
    return Limits(max_s=max_s, min_measure_s=max(min(5.0, 0.4 * max_s), 4 * _window_s(step)),
                  hang_s=max(30.0, idle_hang, 2 * t.warmup_s * f), idle_hang_s=idle_hang,
                  startup_s=max(30.0, 4 * start), expect_first_s=start,
                  expected_s=min(expected, max_s), least_s=least)


def _window_s(step_s: float) -> float:
    """The estimate's window for steps this long (`autotune.measuring.steady.window_s`)."""
    return min(steady.MAX_WINDOW_S, max(steady.MIN_WINDOW_S, steady.BATCHES_PER_WINDOW * step_s))


def _secs(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"
