"""Run one configuration of a script as a short probe and measure it.

`run_trial(spec)` starts the ranks, listens to their meters, ends the probe once the 95% interval
of samples/s is tight or the time is up, stops the script cleanly (then TERM, then KILL, then a
sweep for stragglers) and returns a frozen `TrialResult`. No process of the trial outlives it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune.launching import engines, script_flags

from autotune.hardware import proc
from autotune.measuring import alternate, breakdown, logs, noise, series, steady
from autotune.launching.collector import Collector, for_launcher
from autotune.measuring.script_facts import Seen
from autotune import Note
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.energy import EnergyMeter, EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT, ForeignLoad, Unowned, cpu_s
from autotune.measuring.metric import MetricLog, parse_metric
from autotune.measuring.outcome import Observed, Outcome, classify, script_exit_code
from autotune.launching.group import RanksSpec, start_group
from autotune.launching.group import log_path as log_path_of
from probes import protocol
from probes.protocol import Mode

POLL_S = 0.2
ESTIMATE_EVERY_S = 1.0
IDLE_CORES = 0.05  # the ranks' CPU, in cores, under which a standstill is a wait
MIN_IDLE_START_S = 10.0  # a probe ending with no batch after this long idle: hung


@dataclass(frozen=True)
class TrialSpec:
    """One configuration to probe: its ranks (`RanksSpec`: command, knobs, instances, mode,
    where) and how they are measured. Times in seconds.

    `TrialSpec.of` takes both as flat keywords.
    """

    ranks: RanksSpec
    max_s: float = 60.0  # whole probe, start-up included
    min_measure_s: float = 5.0
    target_rel: float = 0.05
    hang_s: float = 30.0  # no progress this long after the first batch: hung
    # ...or, when the ranks' CPU idled through it, this long (a silent wait, not a busy pause)
    idle_hang_s: float | None = None
    startup_s: float = 120.0  # no batch and no CPU use this long from the start: hung
    # When the script's first batch is expected (its baseline's): a probe ending with none after
    # three times that, its ranks idle, is hung whatever its length.
    expect_first_s: float | None = None
    grace_s: float = 5.0
    # Past max_s, measure on at most this long while the estimate has no interval yet (fewer
    # windows than `steady.MIN_TIGHT_WINDOWS`, its batches flowing): a figure without one
    # decides nothing. A confirmation round's probe sized to the search's probe of its config
    # (minGPT's shape: 7.5 s to the first batch, 1.3 s steps, 21 s in all) once ended on
    # three windows after a slow first step, and the round, +74% beyond any spread, decided
    # nothing.
    overtime_s: float = 0.0
    samples_per_step: int | None = None  # when the script has no DataLoader
    metric: str | None = None  # --metric REGEX: throughput from rank 0's output (autotune.measuring.metric)
    watch_dirs: tuple[str, ...] | None = None  # writes here are reported (default: cwd, script dir)
    tick_s: float = protocol.DEFAULT_TICK_S
    foreign_limit_cores: float = FOREIGN_CORES_LIMIT  # more foreign load than this: flagged
    # A probe asking whether ranks join a process group: it ends once this much is measured
    # with none seen (ranks that train alone), instead of measuring a config nobody will use.
    alone_after_s: float | None = None
    # Which attempt this is of a series the caller re-runs while foreign load spoils it (1 =
    # first; None: nobody re-runs it), and whether it is the last: the outcome says so
    # (`autotune.measuring.outcome.classify`).
    attempt: int | None = None
    last_attempt: bool = True

    @classmethod
    def of(cls, **fields) -> TrialSpec:
        """From flat keywords: `RanksSpec`'s (``command``, ``knobs``, ``instances``, ``mode``,
        ``cwd``, ``log_dir``, ``launcher``, ``device``, ``gpus``...; ``name`` "trial" unless
        given) and this class's own."""
        own = {f.name for f in dataclasses.fields(cls)} - {"ranks"}
        ranks = {"name": "trial", **{k: v for k, v in fields.items() if k not in own}}
        return cls(ranks=RanksSpec(**ranks), **{k: v for k, v in fields.items() if k in own})


@dataclass(frozen=True)
class TrialResult:
    """What one probe measured, and how it ended."""

    outcome: Outcome
    reason: str
    samples_per_s: float
    ci_half: float
    source: series.Source  # how throughput was counted
    steps_per_s: float
    measured_s: float
    warmup_s: float
    paused_s: float
    duration_s: float
    peak_rss_bytes: int
    cuda_peak_bytes: int
    foreign_cores: float  # other programs' CPU load while it measured (`foreign_load`)
    exit_code: int | None
    log_path: str
    log_tail: str
    seen: dict  # what the script asked for: {"batch_size": .., "workers": .., ...}
    notes: tuple[Note, ...] = ()
    knobs: Mapping[str, float] = field(default_factory=dict)
    mode: Mode = Mode.FULL
    # autotune ended it (its window ran out, or it was pruned or hung); False when the script
    # ended by itself or a rank failed first. A no-signal probe that was stopped may measure
    # given more time; one whose script ended will not.
    stopped: bool = False

    @property
    def ok(self) -> bool:
        """It measured a figure to use as is: OK, or ENDED (`Outcome.usable`)."""
        return self.outcome.usable

    foreign_limit_cores: float = FOREIGN_CORES_LIMIT
    counted_samples_per_s: float = 0.0  # with source "metric": autotune's own count, to compare
    # The span the estimate stands on, in time.monotonic() of this host (ranks on this host
    # share that clock, so a script's own timestamps can be compared).
    window_start_t: float = 0.0
    window_end_t: float = 0.0
    # How the script moves (`autotune.tuning.fitting`): launch to its first batch or step, and
    # one rank's time per batch (or step) while it progressed; 0 when never seen.
    first_s: float = 0.0
    step_s: float = 0.0
    # Where the time went over the measured span (`autotune.measuring.breakdown`); None when
    # it could not be told.
    breakdown: Breakdown | None = None
    # What a sample costs over the measured span: CPU seconds of the trial's processes on this
    # host (ranks, their DataLoader workers), and GPUs held x wall time; 0 when not known (ranks
    # on other hosts; no GPU).
    core_s_per_sample: float = 0.0
    gpu_s_per_sample: float = 0.0
    ranks_seen: int = 0  # training processes that reported (peak_rss_bytes is their sum)
    hosts: tuple[str, ...] = ()  # the host names they reported from, sorted
    # joules per sample over the measured span, and where they come from
    # (`autotune.measuring.energy`); None when no span was measured
    energy: EnergyPerSample | None = None
    # the gradient noise scale (`autotune.measuring.noise`), or why it could not be told; None
    # when no span was measured
    noise: NoiseEstimate | None = None
    # CPU time no program carries over the same span, in cores (`foreign_load.Unowned`): the
    # kernel's interrupt work and the hypervisor's steal; reported, not judged
    kernel_cores: float = 0.0
    steal_cores: float = 0.0
    # taking turns (`autotune.measuring.alternate`): each slice's samples/s in the order it
    # ran, None where too few batches ended in it; a confirmation pairs them across configs
    slice_rates: tuple[float | None, ...] = ()

    @property
    def foreign_flagged(self) -> bool:
        return self.foreign_cores > self.foreign_limit_cores

    def to_dict(self) -> dict:
        """As the journal's ``trial_finished`` and ``probe.json`` hold it."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["outcome"] = self.outcome.value
        d["mode"] = self.mode.value
        d["notes"] = [n.to_dict() for n in self.notes]
        d["knobs"] = dict(self.knobs)
        d["hosts"] = list(self.hosts)
        d["slice_rates"] = list(self.slice_rates)
        for name in ("breakdown", "energy", "noise"):
            d[name] = d[name].to_dict() if d[name] is not None else None
        d["foreign_flagged"] = self.foreign_flagged
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> TrialResult:
        """From `to_dict`'s shape. Notes of earlier journals were text: "WARNING: ..." is a
        warning, any other an info. A field a journal lacks (one of an older autotune, a
        partial record) reads as nothing measured (`UNMEASURED`)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**UNMEASURED, **{k: v for k, v in d.items() if k in names},
                      "outcome": Outcome(d["outcome"]), "mode": Mode(d.get("mode", "full")),
                      "source": series.Source(d.get("source") or "none"),
                      "notes": tuple(map(note_of, d.get("notes") or ())),
                      "knobs": dict(d.get("knobs") or {}),
                      "hosts": tuple(d.get("hosts") or ()),
                      "slice_rates": tuple(d.get("slice_rates") or ()),
                      "breakdown": Breakdown.from_dict(d.get("breakdown")),
                      "energy": EnergyPerSample.from_dict(d.get("energy")),
                      "noise": NoiseEstimate.from_dict(d.get("noise"))})


# What `TrialResult.from_dict` reads for a field without a default that a record lacks.
UNMEASURED = {"reason": "", "samples_per_s": 0.0, "ci_half": 0.0, "steps_per_s": 0.0,
              "measured_s": 0.0, "warmup_s": 0.0, "paused_s": 0.0, "duration_s": 0.0,
              "peak_rss_bytes": 0, "cuda_peak_bytes": 0, "foreign_cores": 0.0,
              "exit_code": None, "log_path": "", "log_tail": "", "seen": {}}


def note_of(raw: Mapping | str) -> Note:
    """A note as `Note.to_dict` wrote it, or as text (journals before typed notes)."""
    if isinstance(raw, str):
        prefix = "WARNING: "
        return Note.warning(raw[len(prefix):]) if raw.startswith(prefix) else Note.info(raw)
    return Note.from_dict(raw)


@dataclass
class _Rank:
    """What one connection has told us so far."""

    hello: dict
    offset: float | None = None  # controller clock minus rank clock
    tick: dict = field(default_factory=dict)
    # on the rank's clock (`series.on_our_clock` brings them to ours)
    batch_points: list = field(default_factory=list)  # (t, cumulative samples)
    step_points: list = field(default_factory=list)  # (t, cumulative steps)
    parts: breakdown.PartTrail = field(default_factory=breakdown.PartTrail)
    noise_points: list = field(default_factory=list)  # (t, cumulative gradient norms)
    error: dict | None = None
    teardown: dict | None = None  # an error after we asked it to stop (a peer left first)
    bye: dict | None = None


class _Probe:
    """The state of one running trial; `run_trial` drives it."""

    def __init__(self, spec: TrialSpec, on_progress):
        self.spec = spec
        self.on_progress = on_progress
        self.ranks: dict[int, _Rank] = {}
        self.script = Seen()  # what the ranks said about the script
        self.failed: int | None = None  # exit code of the first rank failing on its own
        self.exited_first: int | None = None  # a process's failing code, before any stop of ours
        self.notes: list[Note] = []
        self.launched: list[proc.Launched] = []
        self.group = None  # autotune.launching.group.RankGroup once started
        self.t_begin = time.monotonic()
        self.t_start = self.t_begin  # start of the current start-up allowance
        self.last_progress_t = self.t_start
        self.last_progress = (0, 0, 0)
        self.first_progress: tuple[float, int] | None = None  # (when, batches or steps)
        self.estimate: steady.Estimate | None = None
        self.source = series.Source.NONE
        self.hung_s: float | None = None
        self.stopped_by_us = False
        self.stop_t: float | None = None  # when we asked the ranks to stop
        self.pruned = False
        self.overtime_at: float | None = None  # when it measured on past max_s for an interval
        self.cpu_seen = 0.0
        self.ours_at_progress = 0.0  # the ranks' CPU seconds when the counters last moved
        # (when, CPU seconds of the trial's processes so far): idle checks and core-seconds
        self.cpu_trail: collections.deque = collections.deque()
        self.samples_per_step, self.step_note = series.samples_per_step(
            spec.ranks.command, spec.ranks.knobs, spec.samples_per_step)
        self.metric = MetricLog(parse_metric(spec.metric)) if spec.metric else None
        self.log: logs.Reader | None = None  # rank 0's log, from where it ended at the start
        self.energy: EnergyMeter | None = None  # the host's energy counters, read at each poll
        # an engine's ranks on this host, found by their marker (children of slurmstepd...)
        self.marked: proc.MarkedScan | None = None

    def processes(self) -> list:
        """The trial's live processes on this host: our launches' trees, the services working
        for them (MPS), and the ranks an engine started here with their children."""
        procs = [p for lp in self.launched for p in lp.tree()]
        if self.group is not None:
            procs += self.group.service_processes()
        if self.marked is not None:
            procs += self.marked.processes()
        return list({p.pid: p for p in procs}.values())

    def idle_for(self, over_s: float, now: float) -> bool:
        """The ranks used next to no CPU over the last ``over_s`` seconds."""
        old = next(((t, c) for t, c in self.cpu_trail if t >= now - over_s - POLL_S), None)
        if old is None or now - old[0] < over_s - 2 * POLL_S or not self.cpu_trail:
            return False
        return idle(self.cpu_trail[-1][1] - old[1], now - old[0])

    # -- messages ---------------------------------------------------------------------------
    def absorb(self, received) -> None:
        for r in received:
            rank = self.ranks.setdefault(r.conn_id, _Rank(hello=r.hello))
            msg = r.msg
            kind = msg["type"]
            if kind == protocol.TICK:
                self._tick(rank, r.t, msg)
            elif kind == protocol.SEEN:
                self._seen(msg)
            elif kind == protocol.ERROR:
                # Ranks leave at their own next batch: one that left may pull a peer out of a
                # collective. After the stop, the measurement is over; only OOM still counts.
                if self.stop_t is not None and r.t >= self.stop_t and msg.get("kind") != "oom":
                    rank.teardown = rank.teardown or msg
                else:
                    rank.error = rank.error or msg
            elif kind == protocol.BYE:
                rank.bye = msg
                if self.failed is None and r.failed_code() is not None \
                        and (self.stop_t is None or r.t < self.stop_t):
                    self.failed = r.failed_code()  # before anything was stopped

    def _tick(self, rank: _Rank, t_recv: float, msg: dict) -> None:
        offset = t_recv - float(msg.get(protocol.TICK_T, t_recv))
        rank.offset = offset if rank.offset is None else min(rank.offset, offset)
        # on the rank's clock: brought to ours when read, by the least delay seen by then
        batch_points, step_points = series.tick_points(rank.tick, msg, 0.0)
        rank.tick = msg
        rank.batch_points.extend(batch_points)
        rank.step_points.extend(step_points)
        if protocol.TICK_T in msg:  # on the rank's clock, brought to ours
            rank.parts.add(msg, float(msg[protocol.TICK_T]) + rank.offset)
        norms = msg.get(protocol.TICK_NOISE)
        if isinstance(norms, dict) and protocol.TICK_T in msg:
            rank.noise_points.append((float(msg[protocol.TICK_T]), norms))

    def _seen(self, msg: dict) -> None:
        self.script.fold(msg)
        note = Note.info(str(msg["note"])) if msg.get("note") else None
        if note is not None and note not in self.notes:
            self.notes.append(note)

    # -- totals ------------------------------------------------------------------------------
    def totals(self) -> tuple[int, int]:
        batches = sum(r.tick.get(protocol.TICK_BATCHES, 0) for r in self.ranks.values())
        steps = sum(series.step_count(r.tick) for r in self.ranks.values())
        return batches, steps

    def progress(self) -> tuple[int, int, int]:
        """What moves while the script works: batches, steps, matching metric lines."""
        batches, steps = self.totals()
        return batches, steps, self.metric.lines if self.metric is not None else 0

    def world_size(self) -> int:
        sizes = [int(r.hello.get("world_size") or 1) for r in self.ranks.values()]
        sizes.append(self.script.world_size())
        return max(max(sizes), 1) if self.ranks else max(1, self.spec.ranks.instances)

    def read_log(self, *, final: bool = False) -> None:
        """Feed what rank 0 printed since the last read to ``--metric``."""
        if self.metric is None or self.log is None:
            return
        text = self.log.read(final=final)
        if text is None:
            return
        now = time.monotonic()
        self.metric.feed(text, now)
        if final:
            self.metric.finish(now)

    def series(self) -> tuple[list[tuple[float, float]], int, str]:
        """Samples summed over ranks as one cumulative series, its point count, its source."""
        if self.metric is not None:
            factor = self.metric.metric.scale(
                batch_size=self.samples_per_step or self.script.loader_batch, ranks=self.world_size())
            points = self.metric.series(factor) if factor else []
            return points, len(points), series.Source.METRIC
        return self.counted_series()

    def counted_series(self) -> tuple[list[tuple[float, float]], int, str]:
        """What the meters counted: DataLoader samples, else steps times samples per step."""
        batches, steps = self.totals()
        ranks = self.ranks.values()
        return series.counted_series([series.on_our_clock(r.batch_points, r.offset)
                                      for r in ranks],
                                     [series.on_our_clock(r.step_points, r.offset)
                                      for r in ranks], batches=batches,
                                      steps=steps, samples_per_step=self.samples_per_step)

    def skip(self, held_s: float) -> None:
        """Let the probe's clocks skip ``held_s`` more seconds the turn held it: its first
        batch and time per batch are the running time's, holds left out."""
        self.t_begin += held_s
        self.t_start += held_s
        self.last_progress_t += held_s
        if self.first_progress is not None:
            t, n = self.first_progress
            self.first_progress = (t + held_s, n)

    def update_estimate(self) -> None:
        points, count, source = self.series()
        self.source = source
        self.estimate = steady.estimate(points, batches=count) if points else None


def run_trial(spec: TrialSpec, *, on_progress: Callable[[steady.Estimate], bool] | None = None,
              on_start: Callable[[list[proc.Launched]], None] | None = None,
              turn: alternate.Turn | None = None) -> TrialResult:
    """Probe one configuration. ``on_progress(estimate)`` returning True prunes the trial.

    With a ``turn`` (`autotune.measuring.alternate.run_together`) it takes turns with other
    trials: its clocks stand still while it is held, it ends when the turns end, and its
    figure is read from the slices it ran."""
    asked = spec.ranks
    log_dir = Path(asked.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    probe = _Probe(spec, on_progress)
    collector = for_launcher(asked.launcher)
    load = ForeignLoad(others=turn.others if turn is not None else None)
    base_env = dict(os.environ if asked.env is None else asked.env)
    base_env[protocol.ENV_TICK_S] = str(spec.tick_s)
    base_env.update(series.watch_env(asked.command, asked.cwd, spec.watch_dirs))
    if spec.metric:
        base_env["PYTHONUNBUFFERED"] = "1"  # lines are timed when they reach the log
    knobs, won = script_flags.split_knobs(asked.knobs, asked.command[1:])
    probe.notes.extend(Note.info(e.note()) for e in won)
    ranks_spec = dataclasses.replace(asked, knobs=knobs, log_dir=log_dir, env=base_env,
                                     marker=f"{asked.name}-{uuid.uuid4().hex[:12]}")
    log_path = log_path_of(ranks_spec, 0)
    probe.log = logs.Reader(log_path)
    begun = proc.birth_clock()  # what is born after this for the ranks is the trial's
    try:
        group = start_group(ranks_spec, channel=collector.env())
        probe.launched.extend(group.launched)  # first: from here `finally` stops them
        probe.group = group
        if turn is not None:
            turn.attach(probe.launched)
        if asked.launcher.kind is engines.Kind.LOCAL and turn is None:  # counters of this host only
            probe.energy = EnergyMeter([slot.gpu.index for slot in group.plan.slots
                                        if slot.gpu is not None])
        if asked.launcher.kind is not engines.Kind.LOCAL:  # ranks are the engine's children, not ours
            probe.marked = proc.MarkedScan({lp.spec.marker for lp in group.launched},
                                           since=begun)
        if on_start is not None:
            on_start(probe.launched)
        _loop(probe, collector, load, turn)
    finally:
        if turn is not None:
            turn.release()  # a held rank would take neither the stop below nor a signal
        # Ctrl-C between the group's start and the line above leaves its ranks unheld: they
        # are found among the live launches by the trial's marker
        held = {lp.pid for lp in probe.launched}
        probe.launched.extend(lp for lp in proc.live() if lp.pid not in held
                              and lp.spec.marker.startswith(f"{ranks_spec.marker}-r"))
        if any(lp.poll() is None for lp in probe.launched):
            probe.stopped_by_us = True
            probe.stop_t = time.monotonic()
            collector.stop_ranks()
            deadline = time.monotonic() + spec.grace_s
            while time.monotonic() < deadline and any(lp.poll() is None for lp in probe.launched):
                time.sleep(0.05)
                probe.absorb(collector.drain())
        exit_codes = [proc.stop(lp, grace_s=spec.grace_s) for lp in probe.launched]
        if asked.launcher.kind is engines.Kind.SRUN and -signal.SIGKILL in exit_codes:
            # a killed srun leaves its step to Slurm: the next probe must not wait for it
            why = engines.wait_steps_ended(base_env)
            if why:
                probe.notes.append(Note.warning(why))
        collector.settle()
        probe.absorb(collector.drain())
        collector.close()
    return _result(probe, exit_codes, load, log_path, turn)


def _loop(probe: _Probe, collector: Collector, load: ForeignLoad,
          turn: alternate.Turn | None = None) -> None:
    """Poll the ranks until the probe ends: a rank failed or all ended, it hung, its figure is
    tight (or it trains alone, or was pruned), its time is up; in turns, the turns ended."""
    spec = probe.spec
    next_estimate = time.monotonic() + ESTIMATE_EVERY_S
    held = 0.0  # seconds the turn held it so far: its clocks skip them
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        probe.absorb(collector.drain())
        probe.read_log()
        if turn is not None:
            if turn.ended():
                return
            skip = turn.held_s() - held
            held += skip
            probe.skip(skip)
            if not turn.running():
                if any(lp.poll() is not None for lp in probe.launched):
                    return  # killed while held (the OOM killer): nothing else ends it
                # held, it still reads the CPU the others take meanwhile: a script of theirs
                # that ends in its slice (a finite loader) is not read again, and what it
                # took since it was last read would count as foreign load on this one
                load.sample(probe.processes())
                continue
        tree = probe.processes()
        load.sample(tree)
        codes = [lp.poll() for lp in probe.launched]
        probe.exited_first = next((c for c in codes if c not in (None, 0)), None)
        # a rank failed (the rest will be stopped; an engine would run on, but the rank's
        # goodbye says so), or all ended on their own
        if probe.exited_first is not None or probe.failed is not None \
                or all(c is not None for c in codes):
            return
        progress = probe.progress()
        if _hung(probe, progress, now, tree, load, turn):
            return
        if turn is None and now >= next_estimate:  # in turns, the turns end it
            next_estimate = now + ESTIMATE_EVERY_S
            probe.update_estimate()
            if _measured_enough(probe):
                return
        probe.cpu_trail.append((now, load.ours_s()))
        if probe.energy is not None:
            probe.energy.read(now)
        if turn is None and now - probe.t_begin > spec.max_s and \
                _ends_at_limit(probe, progress, now):
            return


def _hung(probe: _Probe, progress: tuple[int, int, int], now: float, tree: list,
          load: ForeignLoad, turn: alternate.Turn | None) -> bool:
    """Take in the probe's ``progress``, and tell whether it hung (``probe.hung_s`` then says
    how long): no progress for `TrialSpec.hang_s` after its first batch (or, its ranks idle,
    for `TrialSpec.idle_hang_s`), or none and no CPU use for `TrialSpec.startup_s` from the
    start (a busy start-up, just slow, gets another such period)."""
    spec = probe.spec
    if progress != probe.last_progress:
        probe.last_progress = progress
        probe.last_progress_t = now
        probe.ours_at_progress = load.ours_s()
        if probe.first_progress is None and any(progress):
            probe.first_progress = (now, progress[0] or progress[1])
        if turn is not None:
            turn.saw(now, progress[0] or progress[1] or progress[2])
    elif any(progress):
        still = now - probe.last_progress_t
        if still > spec.hang_s or (spec.idle_hang_s is not None and still > spec.idle_hang_s
                                   and idle(load.ours_s() - probe.ours_at_progress, still)):
            probe.hung_s = still
            return True
    elif now - probe.t_start > spec.startup_s:
        cpu = cpu_s(tree)
        if cpu - probe.cpu_seen < IDLE_CORES * spec.startup_s:
            probe.hung_s = now - probe.t_start
            return True
        probe.cpu_seen = cpu
        probe.t_start = now  # busy, just slow: give it another start-up period
    return False


def _measured_enough(probe: _Probe) -> bool:
    """Whether the probe's estimate (just brought up to date) ends it: tight, or showing ranks
    that train alone where that was asked (`TrialSpec.alone_after_s`), or pruned by its
    ``on_progress`` (``probe.pruned`` then says so)."""
    spec, est = probe.spec, probe.estimate
    if est is None:
        return False
    if est.tight(spec.target_rel, spec.min_measure_s):
        return True
    if spec.alone_after_s is not None and est.measured_s >= spec.alone_after_s \
            and est.windows >= 3 and not probe.script.facts.get("backend"):
        return True
    if probe.on_progress is not None and probe.on_progress(est):
        probe.pruned = True
        return True
    return False


def _ends_at_limit(probe: _Probe, progress: tuple[int, int, int], now: float) -> bool:
    """Past its `TrialSpec.max_s`: whether the probe ends now, or measures on (within
    `TrialSpec.overtime_s`) while its batches flow and its figure has no interval yet. One
    ending with no batch, late by its baseline's first batch and its ranks idle, hung."""
    spec = probe.spec
    if now - probe.t_begin <= spec.max_s + spec.overtime_s and \
            probe.first_progress is not None and not _has_interval(probe):
        probe.overtime_at = probe.overtime_at or now
        return False
    late = spec.expect_first_s is not None and \
        now - probe.t_begin >= max(MIN_IDLE_START_S, 3 * spec.expect_first_s)
    if not any(progress) and late and probe.idle_for(MIN_IDLE_START_S, now):
        probe.hung_s = now - probe.t_begin  # no batch, and no work towards one
    return True


def _has_interval(probe: _Probe) -> bool:
    """Whether the probe's last estimate (brought up to date each `ESTIMATE_EVERY_S`) has an
    interval: enough windows for one."""
    est = probe.estimate
    return est is not None and est.windows >= steady.MIN_TIGHT_WINDOWS and \
        math.isfinite(est.ci_half)


def idle(cpu_s_used: float, over_s: float) -> bool:
    """The ranks did (next to) no work over ``over_s`` seconds: a wait, not a slow step."""
    return cpu_s_used < IDLE_CORES * over_s


def _idle_stall(probe: _Probe, load: ForeignLoad) -> bool:
    """Whether the ranks sat idle through the stall the probe ended in, and for longer than
    the idle pauses a fitted probe allows (`TrialSpec.idle_hang_s`: the baseline's own)."""
    if probe.first_progress is None:
        return False
    still = (probe.stop_t or time.monotonic()) - probe.last_progress_t
    allowed = probe.spec.idle_hang_s
    return (allowed is None or still > allowed) and \
        idle(load.ours_s() - probe.ours_at_progress, still)


def _stall(probe: _Probe) -> dict:
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
    def of(cls, probe: _Probe, exit_codes: list[int | None]) -> _Ending:
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
    def of(cls, probe: _Probe, load: ForeignLoad, est: steady.Estimate | None,
           parts: list) -> _Span:
        ran_s = time.monotonic() - probe.t_begin
        has_estimate = est is not None and est.windows >= 3 and est.samples_per_s > 0
        # judged over the span the figure stands on; the whole probe when there is none
        foreign = load.cores_over(est.start_t, est.end_t) if has_estimate else load.cores()
        unowned = load.unowned_over(est.start_t, est.end_t) if has_estimate else \
            load.unowned_over(probe.t_begin, time.monotonic())
        return cls(est, has_estimate, parts, ran_s, foreign, unowned)


def _result(probe: _Probe, exit_codes: list[int | None], load: ForeignLoad,
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
    counted = series.rate(*probe.counted_series()[:2]) if probe.source is series.Source.METRIC else 0.0
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
        noise=_noise(probe, est) if has_estimate and turn is None else None,
        kernel_cores=span.unowned.kernel_cores, steal_cores=span.unowned.steal_cores,
        slice_rates=tuple(None if part is None else part[0] / part[1] for part in parts),
        **(_cost(probe, est, turn) if has_estimate else {}), **_pace(probe))


def _final_estimate(probe: _Probe, turn: alternate.Turn | None
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


def _observed(probe: _Probe, ending: _Ending, span: _Span, load: ForeignLoad, tail: str,
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


def _steps_per_s(probe: _Probe) -> float:
    """Optimizer steps per second over the ranks, 0 when no rank counted its steps."""
    step_points = [series.on_our_clock(r.step_points, r.offset)
                   for r in probe.ranks.values() if r.step_points]
    if not step_points:
        return 0.0
    step_est = steady.estimate(series.sum_series(step_points), batches=probe.totals()[1])
    return step_est.samples_per_s if step_est else 0.0


def _notes(probe: _Probe, span: _Span, load: ForeignLoad,
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


def _cost(probe: _Probe, est: steady.Estimate, turn: alternate.Turn | None = None) -> dict:
    """``core_s_per_sample`` and ``gpu_s_per_sample`` of the result (see `TrialResult`)."""
    out = {}
    span = est.end_t - est.start_t
    if turn is not None:  # its CPU between its slices was nil: it ran in its slices only
        span = sum(min(b, est.end_t) - max(a, est.start_t) for a, b in turn.slices
                   if b > est.start_t and a < est.end_t)
    trail = list(probe.cpu_trail)
    local = probe.spec.ranks.launcher.kind is engines.Kind.LOCAL
    if local and span > 0 and len(trail) >= 2 and trail[0][0] <= est.start_t + POLL_S \
            and trail[-1][0] >= est.end_t - POLL_S:
        used = steady.interp(trail, est.end_t) - steady.interp(trail, est.start_t)
        out["core_s_per_sample"] = used / (est.samples_per_s * span)
    plan = probe.group.plan if probe.group is not None else None
    gpus = {slot.gpu.uuid for slot in plan.slots if slot.gpu is not None} if plan else set()
    if gpus and local:
        out["gpu_s_per_sample"] = len(gpus) / est.samples_per_s
    return out


def _breakdown(probe: _Probe, est: steady.Estimate) -> Breakdown | None:
    """The parts of a step over the estimate's own span, when the meters timed them."""
    return breakdown.from_trails([r.parts for r in probe.ranks.values()], est.start_t,
                                 est.end_t, windows=est.windows)


def _noise(probe: _Probe, est: steady.Estimate) -> NoiseEstimate:
    """The gradient noise scale over the estimate's span (`autotune.measuring.noise`)."""
    return noise.fold([series.on_our_clock(r.noise_points, r.offset)
                       for r in probe.ranks.values()], est.start_t, est.end_t,
                      world_size=probe.world_size(), samples_per_step=probe.samples_per_step,
                      mode=probe.spec.ranks.mode)


def _pace(probe: _Probe) -> dict:
    """``first_s`` and ``step_s`` of the result: when it first progressed, and one rank's
    time per batch (or step) from then on."""
    if probe.first_progress is None:
        return {}
    step = _stall(probe).get("step_s")
    return {"first_s": probe.first_progress[0] - probe.t_begin,
            "step_s": step * max(1, len(probe.ranks)) if step else 0.0}
