"""One probe as it runs: what it measures (`TrialSpec`) and what its ranks have told so far
(`ProbeState`, a `RankState` per connection). `autotune.measuring.trial.run_trial` drives it;
`autotune.measuring.reading.result_of` reads it once its processes are gone."""

from __future__ import annotations

import collections
import dataclasses
import time
from dataclasses import dataclass, field

from autotune import Note
from autotune.hardware import proc
from autotune.launching.group import RanksSpec
from autotune.measuring import breakdown, logs, series, steady
from autotune.measuring.energy import EnergyMeter
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT
from autotune.measuring.metric import MetricLog, parse_metric
from autotune.measuring.outcome import idle
from autotune.measuring.script_facts import Seen
from probes import protocol

# how often a running probe is read: its meters' messages, its processes' CPU. Each read is
# about 1 ms of the controller's CPU, on the cores the ranks train on (five a second took 0.55%
# of a core beside two ranks of the short config)
POLL_S = 0.5
TREE_EVERY_S = 1.0  # how often its processes are looked for (`ProbeState.processes`)


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
    # The gradient noise scale (`probes.protocol.ENV_NOISE`): measured only where it is used
    # (a goodput tune, `autotune probe`); its norms cost a short step at two ranks some 3%.
    noise: bool = False

    @classmethod
    def of(cls, **fields) -> TrialSpec:
        """From flat keywords: `RanksSpec`'s (``command``, ``knobs``, ``instances``, ``mode``,
        ``cwd``, ``log_dir``, ``launcher``, ``device``, ``gpus``...; ``name`` "trial" unless
        given) and this class's own."""
        own = {f.name for f in dataclasses.fields(cls)} - {"ranks"}
        ranks = {"name": "trial", **{k: v for k, v in fields.items() if k not in own}}
        return cls(ranks=RanksSpec(**ranks), **{k: v for k, v in fields.items() if k in own})


@dataclass(kw_only=True)
class RankState(series.Counts):
    """What one connection has told us so far: its counts (`series.Counts`) and the rest."""

    hello: dict
    parts: breakdown.PartTrail = field(default_factory=breakdown.PartTrail)
    noise_points: list = field(default_factory=list)  # (t, cumulative gradient norms)
    error: dict | None = None
    teardown: dict | None = None  # an error after we asked it to stop (a peer left first)
    bye: dict | None = None


class ProbeState:
    """The state of one running trial; `run_trial` drives it."""

    def __init__(self, spec: TrialSpec, on_progress):
        self.spec = spec
        self.on_progress = on_progress
        self.ranks: dict[int, RankState] = {}
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
        self.tight_s = 0.0  # measuring of the estimate that ended it as tight (0: none did)
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
        self.poll_s = POLL_S  # how often the trail is read
        self._procs: list | None = None  # `processes`, as last found, and when
        self._procs_t = 0.0
        self.samples_per_step, self.step_note = series.samples_per_step(
            spec.ranks.command, spec.ranks.knobs, spec.samples_per_step)
        self.metric = MetricLog(parse_metric(spec.metric)) if spec.metric else None
        self.log: logs.Reader | None = None  # rank 0's log, from where it ended at the start
        self.energy: EnergyMeter | None = None  # the host's energy counters, read at each poll
        # an engine's ranks on this host, found by their marker (children of slurmstepd...)
        self.marked: proc.MarkedScan | None = None

    def processes(self) -> list:
        """The trial's processes on this host: our launches' trees, the services working for
        them (MPS), and the ranks an engine started here with their children. Found anew at
        most every `TREE_EVERY_S` (a walk reads every rank thread's /proc files, on the cores
        the ranks train on); between walks, the last walk's (one that has ended reads as
        gone wherever its CPU time is read)."""
        now = time.monotonic()
        if self._procs is not None and now < self._procs_t + TREE_EVERY_S:
            return self._procs
        procs = [p for lp in self.launched for p in lp.tree()]
        if self.group is not None:
            procs += self.group.service_processes()
        if self.marked is not None:
            procs += self.marked.processes()
        self._procs, self._procs_t = list({p.pid: p for p in procs}.values()), now
        return self._procs

    def idle_for(self, over_s: float, now: float) -> bool:
        """The ranks used next to no CPU over the last ``over_s`` seconds."""
        old = next(((t, c) for t, c in self.cpu_trail if t >= now - over_s - POLL_S), None)
        if old is None or now - old[0] < over_s - 2 * POLL_S or not self.cpu_trail:
            return False
        return idle(self.cpu_trail[-1][1] - old[1], now - old[0])

    # -- messages ---------------------------------------------------------------------------
    def absorb(self, received) -> None:
        for r in received:
            rank = self.ranks.setdefault(r.conn_id, RankState(hello=r.hello))
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

    def _tick(self, rank: RankState, t_recv: float, msg: dict) -> None:
        rank.add(msg, t_recv)  # on the rank's clock: brought to ours when read
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
