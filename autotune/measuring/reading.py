"""Reading an ended probe: what it measured and how it ended, as one frozen `TrialResult`.

`result_of` takes the probe `autotune.measuring.trial.run_trial` drove, once its processes are
gone: the estimate over all it measured (in turns, from its own slices), how the script ended,
what the figure stands on and the load beside it, then `classify`'s outcome, the notes, the
breakdown, the noise scale and the cost per sample.
"""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from autotune import Note
from autotune.launching import engines
from autotune.measuring import alternate, breakdown, logs, noise, series, steady
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.foreign_load import ForeignLoad, Unowned
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Observed, Outcome, classify, idle, script_exit_code
from autotune.measuring.probe_state import ProbeState
from autotune.measuring.result import TrialResult
from probes import protocol
from probes.protocol import Mode

# The least share of the figure's span the CPU trail must cover for its core-seconds a sample
COST_COVER_SHARE = 0.5


def _idle_stall(probe: ProbeState, load: ForeignLoad) -> bool:
    """Whether the ranks sat idle through the stall the probe ended in, and for longer than
    the idle pauses a fitted probe allows (`TrialSpec.idle_hang_s`: the baseline's own)."""
    if probe.first_progress is None:
        return False
    still = (probe.stop_t or time.monotonic()) - probe.last_progress_t
    allowed = probe.spec.idle_hang_s
    return (allowed is None or still > allowed) and \
        idle(load.ours_s() - probe.ours_at_progress, still)


def _stall(probe: ProbeState) -> dict:
    """How long it had made no progress when the probe ended, and its own time per batch (or
    step) while it progressed (from its first progress; from the start when it came at once)."""
    if probe.first_progress is None:
        return {}
    first_t, first_n = probe.first_progress
    last_n = probe.last_progress[0] or probe.last_progress[1]
    since_t, n = (first_t, last_n - first_n) if last_n > first_n else (probe.t_begin, last_n)
    step_s = (probe.last_progress_t - since_t) / n if n > 0 else None
    return {"stalled_s": (probe.stop_t or time.monotonic()) - probe.last_progress_t,
            "step_s": step_s}


@dataclass(frozen=True)
class _Ending:
    """How the script ended: its exit code as the script's own (`script_exit_code`), whether
    autotune stopped it before it failed by itself, and the first error a rank reported."""

    exit_code: int | None
    stopped: bool
    error: dict | None

    @classmethod
    def of(cls, probe: ProbeState, exit_codes: list[int | None]) -> _Ending:
        error = next((r.error for r in probe.ranks.values() if r.error), None)
        ranks = probe.ranks.values()
        own = probe.failed if probe.failed is not None else probe.exited_first
        stopped = probe.stopped_by_us and own is None
        exit_code = script_exit_code(
            exit_codes, own=own, stopped_by_us=probe.stopped_by_us, error=error is not None,
            stopped_clean=bool(ranks) and (any(r.teardown for r in ranks)
                                           or all(r.bye and r.bye.get("stopped")
                                                  for r in ranks)))
        return cls(exit_code, stopped, error)


@dataclass(frozen=True)
class _Span:
    """What the probe's figure stands on: its last estimate (in turns, read from its own
    slices), whether that is a figure (three windows or more, some samples/s), each slice's
    (samples, seconds) in turns, how long the probe ran, and the other load over the figure's
    span (over the whole probe where there is no figure)."""

    est: steady.Estimate | None
    has_estimate: bool
    parts: list
    ran_s: float
    foreign_cores: float
    unowned: Unowned

    @classmethod
    def of(cls, probe: ProbeState, load: ForeignLoad, est: steady.Estimate | None,
           parts: list) -> _Span:
        ran_s = time.monotonic() - probe.t_begin
        has_estimate = est is not None and est.windows >= 3 and est.samples_per_s > 0
        # judged over the span the figure stands on; the whole probe when there is none
        foreign = load.cores_over(est.start_t, est.end_t) if has_estimate else load.cores()
        unowned = load.unowned_over(est.start_t, est.end_t) if has_estimate else \
            load.unowned_over(probe.t_begin, time.monotonic())
        return cls(est, has_estimate, parts, ran_s, foreign, unowned)


def _counted_rate(probe: ProbeState, est: steady.Estimate | None) -> float:
    """What autotune counted beside a --metric figure: over the metric's own window, so the two
    compare like with like; its own steady span where the count does not cover that window."""
    points, count, _ = probe.counted_series()
    if est is not None and est.windows >= 3:
        over = series.rate_over(points, est.start_t, est.end_t)
        if over > 0:
            return over
    return series.rate(points, count)


def result_of(probe: ProbeState, exit_codes: list[int | None], load: ForeignLoad,
            log_path: Path, turn: alternate.Turn | None = None) -> TrialResult:
    """What the ended probe measured (`TrialResult`), and how it ended (`classify`)."""
    est, parts = _final_estimate(probe, turn)
    ending = _Ending.of(probe, exit_codes)
    tail = logs.tail(log_path)
    for path in {Path(lp.spec.stdout_path) for lp in probe.launched if lp.spec.stdout_path}:
        logs.cap(path)  # read: the tail above and --metric; its processes are gone
    span = _Span.of(probe, load, est, parts)
    has_estimate = span.has_estimate
    outcome, reason = classify(_observed(probe, ending, span, load, tail, log_path))
    ticks = [r.tick for r in probe.ranks.values()]
    counted = _counted_rate(probe, est) if probe.source is series.Source.METRIC else 0.0
    spec = probe.spec
    return TrialResult(
        outcome=outcome, reason=reason,
        samples_per_s=est.samples_per_s if has_estimate else 0.0,
        ci_half=est.ci_half if has_estimate else 0.0,
        source=probe.source, steps_per_s=_steps_per_s(probe),
        measured_s=est.measured_s if est else 0.0, warmup_s=est.warmup_s if est else 0.0,
        paused_s=est.paused_s if est else 0.0, duration_s=span.ran_s,
        peak_rss_bytes=sum(t.get(protocol.TICK_RSS_PEAK_BYTES, 0) for t in ticks),
        cuda_peak_bytes=max((t.get(protocol.TICK_CUDA_PEAK_BYTES, 0) for t in ticks), default=0),
        foreign_cores=span.foreign_cores, exit_code=ending.exit_code, log_path=str(log_path),
        log_tail="" if outcome == Outcome.OK else tail, seen=probe.script.result(),
        notes=_notes(probe, span, load, counted), knobs=dict(spec.ranks.knobs),
        mode=spec.ranks.mode, stopped=ending.stopped,
        foreign_limit_cores=spec.foreign_limit_cores, counted_samples_per_s=counted,
        window_start_t=est.start_t if est else 0.0, window_end_t=est.end_t if est else 0.0,
        # in turns, a step in flight when its rank was held timed the hold as its own
        breakdown=_breakdown(probe, est) if has_estimate and turn is None else None,
        ranks_seen=len(ticks),
        hosts=tuple(sorted({str(r.hello["host"]) for r in probe.ranks.values()
                            if r.hello.get("host")})),
        energy=probe.energy.per_sample(est.start_t, est.end_t, est.samples_per_s *
                                       (est.end_t - est.start_t))
        if has_estimate and probe.energy is not None else None,
        noise=_noise(probe, est) if has_estimate and turn is None and probe.spec.noise
        else None,
        kernel_cores=span.unowned.kernel_cores, steal_cores=span.unowned.steal_cores,
        slice_rates=tuple(None if part is None else part[0] / part[1] for part in parts),
        tight_s=probe.tight_s,
        **(_cost(probe, est, turn) if has_estimate else {}), **_pace(probe))


def _final_estimate(probe: ProbeState, turn: alternate.Turn | None
                    ) -> tuple[steady.Estimate | None, list]:
    """The probe's estimate over all it measured (rank 0's log read to its end), and in turns
    what each slice ran, (samples, seconds) or None: there the figure is its slices', what lay
    between them being another's turn."""
    probe.read_log(final=True)
    probe.update_estimate()
    parts: list = []
    if turn is not None:
        points = probe.series()[0]
        parts = steady.slice_parts(points, turn.slices)
        probe.estimate = steady.slices_estimate(points, turn.slices, parts)
    return probe.estimate, parts


def _observed(probe: ProbeState, ending: _Ending, span: _Span, load: ForeignLoad, tail: str,
              log_path: Path) -> Observed:
    """What `classify` judges the ended probe on."""
    spec, est, error = probe.spec, span.est, ending.error
    batches, steps = probe.totals()
    pts = probe.series()[0] if not span.has_estimate else []
    return Observed(
        exit_code=ending.exit_code, stopped_by_us=ending.stopped,
        error_kind=error.get("kind") if error else None,
        error_text=f"{error.get('exc_type')}: {error.get('message')}" if error else "",
        batches=batches, steps=steps, has_estimate=span.has_estimate, hung_s=probe.hung_s,
        ran_s=span.ran_s, last_log_line=logs.last_line(tail),
        needs_batch_size=not probe.samples_per_step, **_stall(probe),
        stalled_idle=_idle_stall(probe, load),
        metric_reason=series.metric_reason(
            probe.metric, batch_known=bool(probe.samples_per_step or probe.script.loader_batch),
            ran_s=span.ran_s, log_path=log_path) if probe.metric is not None else "",
        counted_s=pts[-1][0] - pts[0][0] if len(pts) > 1 else 0.0,
        paused_s=est.paused_s if est is not None and not span.has_estimate else 0.0,
        first_s=_pace(probe).get("first_s"),
        io_without_loader=spec.ranks.mode is Mode.IO and probe.source is not series.Source.DATALOADER,
        mode=spec.ranks.mode,
        pruned=probe.pruned, foreign_cores=span.foreign_cores,
        foreign_limit_cores=spec.foreign_limit_cores,
        attempt=spec.attempt, last_attempt=spec.last_attempt)


def _steps_per_s(probe: ProbeState) -> float:
    """Optimizer steps per second over the ranks, 0 when no rank counted its steps."""
    step_points = [series.on_our_clock(r.step_points, r.offset)
                   for r in probe.ranks.values() if r.step_points]
    if not step_points:
        return 0.0
    step_est = steady.estimate(series.sum_series(step_points), batches=probe.totals()[1])
    return step_est.samples_per_s if step_est else 0.0


def _notes(probe: ProbeState, span: _Span, load: ForeignLoad,
           counted: float) -> tuple[Note, ...]:
    """What the result tells beside its figure: the probe's own notes; a rank that failed
    while stopping; time measured past the limit for an interval; a figure that shifted while
    it measured; where its ranks ran; load no program carries; other hosts' load, unread; and
    how its throughput was counted (`series.notes`)."""
    spec, est, has_estimate = probe.spec, span.est, span.has_estimate
    notes = list(probe.notes)
    late = next((r.teardown for r in probe.ranks.values() if r.teardown), None)
    if late is not None:
        notes.append(Note.info(
            f"a rank failed while stopping, after the measurement (peers leave at their own "
            f"next batch): {late.get('exc_type')}: {str(late.get('message'))[:200]}"))
    if probe.overtime_at is not None:
        past = (probe.stop_t or time.monotonic()) - probe.overtime_at
        notes.append(Note.info(
            f"measured {past:.0f} s past its {spec.max_s:.0f} s limit, its figure having no "
            f"interval yet (too few windows of its batches)" +
            ("" if has_estimate and math.isfinite(est.ci_half) else
             f"; it had none after the {spec.overtime_s:.0f} s allowed")))
    if has_estimate and est.shift is not None:  # not tight: it measured on to its limit
        notes.append(Note.warning(
            f"{est.shift_note()}; measured on to the probe's limit ({span.ran_s:.0f} s), and "
            f"the figure is the whole window's: a longer --seconds settles it"))
    if probe.group is not None:
        notes += probe.group.notes()
    if span.unowned.cores > spec.foreign_limit_cores:
        notes.append(Note.info(span.unowned.note()))
    launcher = spec.ranks.launcher
    if launcher.multi_host:
        here = socket.gethostname()
        others = [h.name for h in launcher.hosts if h.name.split(".")[0] != here.split(".")[0]]
        notes.append(Note.info(
            f"foreign load: read on this host ({here}) only, where the trial's processes used "
            f"{load.ours_cores():.2f} cores; the load on {', '.join(others) or 'the other hosts'} "
            f"cannot be read from here and was not read"))
    return tuple(notes) + tuple(series.notes(
        source=probe.source, step_note=probe.step_note, counted_rate=counted,
        metric_rate=est.samples_per_s if has_estimate and probe.source is series.Source.METRIC else 0.0,
        writes=probe.script.writes))


def _cost(probe: ProbeState, est: steady.Estimate, turn: alternate.Turn | None = None) -> dict:
    """``core_s_per_sample`` and ``gpu_s_per_sample`` of the result (see `TrialResult`)."""
    out = {}
    local = probe.spec.ranks.launcher.kind is engines.Kind.LOCAL
    if local:
        cost = core_s_per_sample(list(probe.cpu_trail), est.start_t, est.end_t,
                                 est.samples_per_s,
                                 turn.slices if turn is not None else None)
        if cost is not None:
            out["core_s_per_sample"] = cost
    plan = probe.group.plan if probe.group is not None else None
    gpus = {slot.gpu.uuid for slot in plan.slots if slot.gpu is not None} if plan else set()
    if gpus and local:
        out["gpu_s_per_sample"] = len(gpus) / est.samples_per_s
    return out


def core_s_per_sample(trail: list[tuple[float, float]], start_t: float, end_t: float,
                      samples_per_s: float,
                      slices: list[tuple[float, float]] | None = None) -> float | None:
    """The CPU seconds the trial's processes spent a sample, from ``trail`` ((when, CPU seconds
    so far) as the probe loop read it) over the figure's span (``start_t`` to ``end_t``, at
    ``samples_per_s``); in turns only the time within its ``slices`` counts (its CPU between
    them was nil). Taken over the part of the span the trail covers: on a loaded machine the
    loop's last poll can fall short of the figure's end (read after it, with the ranks' last
    ticks) by more than a poll, and a probe in CI once got no core-seconds at all for that.
    None where the trail covers under `COST_COVER_SHARE` of the span."""
    if len(trail) < 2 or end_t <= start_t or samples_per_s <= 0:
        return None
    lo, hi = max(start_t, trail[0][0]), min(end_t, trail[-1][0])
    if hi - lo < COST_COVER_SHARE * (end_t - start_t):
        return None
    span = hi - lo if slices is None else \
        sum(min(b, hi) - max(a, lo) for a, b in slices if b > lo and a < hi)
    if span <= 0:
        return None
    return (steady.interp(trail, hi) - steady.interp(trail, lo)) / (samples_per_s * span)


def _breakdown(probe: ProbeState, est: steady.Estimate) -> Breakdown | None:
    """The parts of a step over the estimate's own span, when the meters timed them."""
    return breakdown.from_trails([r.parts for r in probe.ranks.values()], est.start_t,
                                 est.end_t, windows=est.windows)


def _noise(probe: ProbeState, est: steady.Estimate) -> NoiseEstimate:
    """The gradient noise scale over the estimate's span (`autotune.measuring.noise`)."""
    return noise.fold([series.on_our_clock(r.noise_points, r.offset)
                       for r in probe.ranks.values()], est.start_t, est.end_t,
                      world_size=probe.world_size(), samples_per_step=probe.samples_per_step,
                      mode=probe.spec.ranks.mode)


def _pace(probe: ProbeState) -> dict:
    """``first_s`` and ``step_s`` of the result: when it first progressed, and one rank's
    time per batch (or step) from then on."""
    if probe.first_progress is None:
        return {}
    step = _stall(probe).get("step_s")
    return {"first_s": probe.first_progress[0] - probe.t_begin,
            "step_s": step * max(1, len(probe.ranks)) if step else 0.0}
