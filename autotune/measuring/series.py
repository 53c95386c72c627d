"""Where a probe's figure comes from, and what the user is told about it. Pure.

A probe counts DataLoader samples; without a DataLoader, steps times the samples in a step
(`samples_per_step`); with ``--metric``, the script's own lines (`autotune.measuring.metric`). The meters'
ticks become one cumulative series per rank (`tick_points`), summed over ranks (`sum_series`,
`counted_series`) and turned into a rate (`rate`). It also watches the user's tree for writes
(`watch_env`, read by `probes.writes`). The trial runner (`autotune.measuring.trial`) calls these and puts
their sentences in the result's reason and notes.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune import Note
from autotune.launching import script_flags
from autotune.measuring import steady
from autotune.launching.rank_command import placeholders
from autotune.measuring.metric import MetricLog
from probes import protocol

Points = list[tuple[float, float]]  # (time_s, cumulative count), in the controller's clock

DISAGREE_REL = 0.25  # --metric and autotune's own count further apart than this: said


class Source(str, enum.Enum):
    """How a probe's throughput was counted; the value is what results and journals hold."""

    DATALOADER = "dataloader"  # DataLoader samples
    STEPS = "steps"  # steps times the samples in a step
    METRIC = "metric"  # the script's own lines (--metric)
    NONE = "none"  # nothing counted

    def __str__(self) -> str:
        return self.value


def samples_per_step(command: Sequence[str], knobs: Mapping[str, float],
                     given: int | None) -> tuple[int | None, str]:
    """Samples in one step of one rank, for scripts without a DataLoader, and where it came from.

    ``--samples-per-step`` (``given``), else the value of the ``{batch_size}`` placeholder, else
    the user's own explicit batch-size flag (`autotune.launching.script_flags`); a ``given``
    equal to the args' value is named by them (the tuner resolves it once, the trial again).
    Scripts that accumulate gradients over several batches per optimizer step need
    ``--samples-per-step`` or ``--metric``.
    """
    args = list(command[1:])
    found, source = None, ""
    explicit = script_flags.explicit_knobs(args).get("batch_size")
    if "batch_size" in placeholders(args) and "batch_size" in knobs:
        found, source = int(knobs["batch_size"]), "the value of {batch_size}"
    elif explicit is not None and explicit.number and explicit.number > 0:
        found, source = explicit.number, f"from '{explicit.typed}'"
    if given and int(given) != found:
        found, source = int(given), "from --samples-per-step"
    return found, f"samples per step: {found}, {source}" if found else ""


def step_count(tick: Mapping) -> int:
    """A rank's steps in one meter tick: optimizer steps, else backward passes (a script with
    no optimizer the meter sees). For the trial, its series and the full run alike."""
    return int(tick.get(protocol.TICK_STEPS) or tick.get(protocol.TICK_BACKWARDS) or 0)


def watch_env(command: Sequence[str], cwd: str,
              watch_dirs: Sequence[str] | None) -> dict[str, str]:
    """Where writes are reported: the user's tree (default: ``cwd`` and the script's directory)
    minus the probe's own directory when it runs elsewhere (``--probe-cwd``)."""
    here = os.path.realpath(cwd)
    if watch_dirs is not None:
        watch = [os.path.realpath(d) for d in watch_dirs]
    else:
        watch = [here]
        script = os.path.join(cwd, command[0]) if command else ""
        if script and os.path.isfile(script):
            watch.append(os.path.realpath(os.path.dirname(script)))
    watch = list(dict.fromkeys(watch))
    return {protocol.ENV_WATCH_DIRS: os.pathsep.join(watch),
            protocol.ENV_SCRATCH_DIR: "" if here in watch else here}


def metric_reason(log: MetricLog, *, batch_known: bool, ran_s: float, log_path) -> str:
    """Why ``--metric`` gave no estimate."""
    if log.lines == 0:
        return (f"--metric matched no line of rank 0's output in {ran_s:.0f} s (log: "
                f"{log_path}); check the pattern against the log, or allow more --seconds")
    if log.metric.per_step and not batch_known:
        return (f"--metric gives {log.metric.group}, but the samples in one step are unknown: "
                f"put {{batch_size}} in the script's args or pass --samples-per-step N")
    return (f"only {log.lines} lines matched --metric in {ran_s:.0f} s: too few to measure; "
            f"print more often or allow more --seconds")


def notes(*, source: Source, step_note: str, metric_rate: float, counted_rate: float,
          writes: Mapping[str, dict]) -> list[Note]:
    """What the user should know about how a probe was measured and what it touched."""
    out = []
    if source is Source.STEPS and step_note:
        out.append(Note.info(step_note))
    if metric_rate > 0 and counted_rate > 0 \
            and abs(metric_rate - counted_rate) > DISAGREE_REL * counted_rate:
        out.append(Note.warning(
            f"--metric says {metric_rate:.1f} samples/s, autotune counted {counted_rate:.1f}; "
            f"check that the group means what its name says (samples_per_s is the whole job's "
            f"figure as rank 0 prints it; a per-rank figure is rank_samples_per_s)"))
    if writes:
        paths = sorted(writes)
        existed = sum(1 for p in paths if writes[p].get("existed"))
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        out.append(Note.warning(f"the probe wrote into your tree: {shown}"
                                + (f" ({existed} existed before)" if existed else "")
                                + "; run probes elsewhere with --probe-cwd DIR"))
    return out


def tick_points(prev: Mapping, msg: Mapping, offset: float) -> tuple[Points, Points]:
    """The points one meter tick adds to its rank's series: ``(batch_points, step_points)``.

    ``prev`` is the rank's previous tick (``{}`` before the first), ``offset`` the controller's
    clock minus the rank's. Each tick adds (first new batch, count before it) and (last batch,
    count): the count is flat in between ticks' batches, so an idle stretch (a pause) is exact
    in the series. Steps are optimizer steps, else backward passes when the script has none.
    """
    batch_points: Points = []
    step_points: Points = []
    samples = protocol.TICK_SAMPLES
    if msg.get(samples, 0) > prev.get(samples, 0):
        if msg.get(protocol.TICK_FIRST_BATCH_T):
            batch_points.append((msg[protocol.TICK_FIRST_BATCH_T] + offset, prev.get(samples, 0)))
        batch_points.append((msg[protocol.TICK_LAST_BATCH_T] + offset, msg[samples]))
    steps, prev_steps = step_count(msg), step_count(prev)
    if steps > prev_steps:
        if msg.get(protocol.TICK_FIRST_STEP_T) and (prev.get(protocol.TICK_STEPS) or not msg.get(protocol.TICK_STEPS)):
            step_points.append((msg[protocol.TICK_FIRST_STEP_T] + offset, prev_steps))
        step_points.append((msg[protocol.TICK_LAST_STEP_T] + offset, steps))
    return batch_points, step_points


@dataclass
class Counts:
    """One rank's cumulative counts from its meter's ticks (`tick_points`), kept on its own
    clock and brought to ours when read (`on_our_clock`), so that a span runs from a batch to
    a batch. A probe's ranks (`autotune.measuring.probe_state.RankState`) and a full run's
    keep them alike."""

    offset: float | None = None  # our clock minus the rank's
    tick: dict = field(default_factory=dict)
    batch_points: list = field(default_factory=list)  # (t, cumulative samples)
    step_points: list = field(default_factory=list)  # (t, cumulative steps)

    def add(self, msg: dict, t_recv: float) -> None:
        offset = t_recv - float(msg.get(protocol.TICK_T, t_recv))
        self.offset = offset if self.offset is None else min(self.offset, offset)
        batch_points, step_points = tick_points(self.tick, msg, 0.0)
        self.tick = msg
        self.batch_points.extend(batch_points)
        self.step_points.extend(step_points)

    def thin(self, keep_from: float, keep_after: float, apart_s: float) -> None:
        """Points between ``keep_from`` and ``keep_after`` kept ``apart_s`` apart: a long
        run's memory stays small, and its start (the warm-up) and latest stretch stay whole."""
        off = self.offset or 0.0
        for name in ("batch_points", "step_points"):
            kept: list[tuple[float, float]] = []
            for p in getattr(self, name):
                if p[0] + off < keep_from or p[0] + off >= keep_after or not kept or \
                        p[0] - kept[-1][0] >= apart_s:
                    kept.append(p)
            setattr(self, name, kept)


def on_our_clock(points: Sequence[tuple[float, object]], offset: float | None) -> list:
    """A rank's points, kept on its own clock, brought to ours by ``offset`` (our clock minus
    the rank's: the least delay a tick has had so far). Brought over tick by tick instead, each
    point carried its own tick's delay: on a loaded machine the first ticks' delays of tenths
    of a second put the first steps late, and a short probe of 1 s steps read 11% faster than
    its script could step (a confirmation's slices, up to twice)."""
    off = offset or 0.0
    return [(t + off, v) for t, v in points]


def sum_series(per_rank: Sequence[Points]) -> Points:
    """Sum cumulative series of several ranks at the union of their times."""
    if len(per_rank) == 1:
        return list(per_rank[0])
    start = max(pts[0][0] for pts in per_rank)  # all ranks running
    end = min(pts[-1][0] for pts in per_rank)
    times = sorted({t for pts in per_rank for t, _ in pts if start <= t <= end})
    return [(t, sum(steady.interp(pts, t) for pts in per_rank)) for t in times]


def counted_series(batch_points: Sequence[Points], step_points: Sequence[Points], *,
                   batches: int, steps: int,
                   samples_per_step: int | None) -> tuple[Points, int, Source]:
    """What the meters counted, summed over ranks: ``(points, count, source)``.

    DataLoader samples when any batch was seen, else steps times ``samples_per_step``, else
    nothing (`Source.NONE`). ``batch_points`` and ``step_points`` hold one series per rank.
    """
    if batches:
        return sum_series([pts for pts in batch_points if pts]), batches, Source.DATALOADER
    if steps and samples_per_step:
        k = samples_per_step
        per_rank = [[(t, n * k) for t, n in pts] for pts in step_points if pts]
        return sum_series(per_rank), steps, Source.STEPS
    return [], 0, Source.NONE


def rate(points: Points, count: int) -> float:
    """Steady samples/s of a cumulative series, or 0 when it spans fewer than three windows."""
    est = steady.estimate(points, batches=count) if points else None
    return est.samples_per_s if est is not None and est.windows >= 3 else 0.0


def span_rate(points: Points, start_t: float, end_t: float) -> float | None:
    """Samples/s of a cumulative series over ``[start_t, end_t]`` cut to the series: from its
    first point at the earliest to its last at the latest (None: no time between them)."""
    if len(points) < 2:
        return None
    lo, hi = max(start_t, points[0][0]), min(end_t, points[-1][0])
    if hi <= lo:
        return None
    return (steady.interp(points, hi) - steady.interp(points, lo)) / (hi - lo)


def rate_over(points: Points, start_t: float, end_t: float) -> float:
    """Samples/s of a cumulative series between two times on its clock, read where the series
    covers them; 0 when it does not cover the span or the span is empty."""
    if len(points) < 2 or end_t <= start_t or start_t < points[0][0] or end_t > points[-1][0]:
        return 0.0
    return span_rate(points, start_t, end_t) or 0.0

