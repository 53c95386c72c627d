"""The full run: the user's script with a recipe's knobs, streamed, metered, and stopped cleanly.

Ranks start through `autotune.launching.group.start_group` (the same path as probes), their
output is streamed to our stdout (and kept in the run's logs), and the meter keeps reporting: the
journal gets ``fullrun_progress`` with live samples/s and where the time went since the last
report (`autotune.measuring.breakdown`, from the meters' cumulative part times), ``fullrun_ended``
the same over the whole run, and ``fullrun_notes`` with what the group says about where the ranks
run (collectives on gloo, oversubscribed cores, whether the MPS
daemon really serves them). SIGINT and SIGTERM are forwarded to every rank's
process group; a second one escalates to TERM-grace-KILL. When a rank fails, the others are
stopped, as torchrun does, and its exit code is the run's (the earliest failure is the cause).
Under an engine (mpirun, srun) there is one process for every rank, and the engine's own code
says little: MPICH's Hydra, for one, ORs every rank's status into its own, and it lets the
other ranks run on after one has failed. So a rank's goodbye on the channel, with its exit
code, is what tells: the engine is stopped then, and that code is the run's, with the engine's
kept beside it in the journal.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autotune.launching import engines

from autotune.hardware import proc
from autotune.launching.collector import Collector, for_launcher
from autotune.measuring import breakdown, series, steady
from autotune.measuring.foreign_load import ForeignLoad
from autotune.measuring.promise import SUSTAIN_S, Promise, PromiseWatch, Reading
from autotune.store.journal import Journal
from autotune.launching.group import RanksSpec, start_group
from autotune.store.events import Event
from probes import protocol
from probes.protocol import Mode

POLL_S = 0.2  # how often the run is read: its meters' messages, its processes' exits
# how often its processes' CPU is read for the other load: each read walks the ranks' threads'
# /proc files, a cost the ranks share the cores with (~1% of a core at five a second, 2 ranks)
LOAD_EVERY_S = 1.0
# The ranks' output as it comes; DDP's own allreduce left to DDP on a GPU too (no hook of ours:
# the probes measured the parts of a step). On the CPU DDP's own timers time it in every run
# (`probes.ddp_comm`); on a GPU the run's breakdown counts communication within backward.
FULL_RUN_ENV = {"PYTHONUNBUFFERED": "1", protocol.ENV_LEAVE_DDP_ALLREDUCE: "1"}


@dataclass(frozen=True)
class FullRunSpec:
    """The full run: its ranks (`RanksSpec`; ``knobs`` what the ranks get, threads...) and how
    it is reported and stopped."""

    ranks: RanksSpec
    journal_knobs: Mapping[str, int] = field(default_factory=dict)  # the recipe's, for display
    progress_every_s: float = 5.0
    grace_s: float = 10.0
    samples_per_step: int | None = None
    promise: Promise | None = None  # the recipe's figure, which the run is held against
    warmup_s: float = 10.0  # training time before the run is held to the promise
    sustain_s: float = SUSTAIN_S  # below the promise this long is a shortfall (`PromiseWatch`)
    # what ``autotune run --again`` starts the run with again (the launcher, the hostfile,
    # --keep-batch, --samples-per-step), journaled with its start
    settings: Mapping[str, object] = field(default_factory=dict)


def exit_status(code: int | None) -> int:
    """A process's return code as a shell would report it (killed by signal N: 128 + N)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


class _Meter:
    """Live samples/s of the run from the ranks' cumulative ticks, and where the time goes.

    Its figures are the probes': the samples the ranks counted, on the span from a batch to a
    batch (`span_rate`), and over the whole run the steady estimate (`steady`: warm-up and
    pauses left out), never the start-up before the first batch nor the exit after the last.
    """

    KEEP_START_S = 120.0  # the run's first seconds of counts are kept whole (its warm-up)
    KEEP_LATEST_S = 60.0  # ...and its latest; in between, points `POINTS_APART_S` apart
    POINTS_APART_S = 1.0

    def __init__(self, samples_per_step: int | None, thin_s: float = 5.0):
        self.samples_per_step = samples_per_step
        self.ticks: dict[int, dict] = {}
        self.counts: dict[int, series.Counts] = {}
        self.failed: tuple[int, int] | None = None  # (rank, exit code) of the first to fail
        # per rank: cumulative seconds by part, on the time they were received
        self.parts: dict[int, breakdown.PartTrail] = {}
        self.thin_s = thin_s  # points older than the last report are kept this far apart
        self.notes: list[str] = []  # what the ranks' probes said (`seen` notes), once each

    def absorb(self, received) -> None:
        for r in received:
            if r.msg.get("type") == protocol.TICK:
                self.ticks[r.conn_id] = r.msg
                self.counts.setdefault(r.conn_id, series.Counts()).add(r.msg, r.t)
                self.parts.setdefault(r.conn_id, breakdown.PartTrail()).add(r.msg, r.t)
            elif r.msg.get("type") == protocol.SEEN and r.msg.get("note") and \
                    str(r.msg["note"]) not in self.notes:
                self.notes.append(str(r.msg["note"]))
            elif self.failed is None and r.failed_code() is not None:
                self.failed = (int(r.hello.get("rank", -1)), r.failed_code())

    def breakdown(self, start_t: float | None, end_t: float) -> breakdown.Breakdown | None:
        """Where the time went over ``[start_t, end_t]``; from the training's start when None
        (the first tick with time in a part: start-up before the first batch is no step's)."""
        trails = [tr for tr in self.parts.values() if len(tr.points) >= 2]
        begun = [t for t in (_first_work(tr.points) for tr in trails) if t is not None]
        if not begun:
            return None
        start = min(begun) if start_t is None else start_t
        return breakdown.from_trails(trails, start, end_t, windows=breakdown.MIN_WINDOWS)

    def thin(self, before_t: float) -> None:
        """Points before ``before_t`` kept `thin_s` apart (a long run's memory stays small;
        the whole run's breakdown needs no more)."""
        for trail in self.parts.values():
            kept: list[tuple[float, dict]] = []
            for p in trail.points:
                if p[0] >= before_t or not kept or p[0] - kept[-1][0] >= self.thin_s:
                    kept.append(p)
            trail.points = kept
        begun = self.series()[0]
        if begun:
            for counts in self.counts.values():
                counts.thin(begun[0][0] + self.KEEP_START_S, before_t - self.KEEP_LATEST_S,
                            self.POINTS_APART_S)

    def series(self) -> tuple[list[tuple[float, float]], int, str]:
        """The samples counted, summed over ranks (`series.counted_series`, as a probe's)."""
        batches = sum(int(c.tick.get(protocol.TICK_BATCHES, 0)) for c in self.counts.values())
        steps = sum(series.step_count(c.tick) for c in self.counts.values())
        return series.counted_series([series.on_our_clock(c.batch_points, c.offset)
                                      for c in self.counts.values()],
                                     [series.on_our_clock(c.step_points, c.offset)
                                      for c in self.counts.values()],
                                     batches=batches, steps=steps,
                                     samples_per_step=self.samples_per_step)

    def span_rate(self, start_t: float, end_t: float) -> float | None:
        """Samples/s over ``[start_t, end_t]`` cut to the batches inside it: from the first
        batch at the earliest, to the latest at the last (None: no time between them)."""
        return series.span_rate(self.series()[0], start_t, end_t)

    def steady(self) -> steady.Estimate | None:
        """The whole run's steady samples/s, as a probe's (`steady.estimate`)."""
        points, count, _ = self.series()
        est = steady.estimate(points, batches=count) if points else None
        return est if est is not None and est.samples_per_s > 0 else None

    def totals(self) -> tuple[int, int]:
        """(samples over every rank, the job's steps)."""
        samples = sum(int(t.get(protocol.TICK_SAMPLES, 0)) for t in self.ticks.values())
        per_rank = [series.step_count(t) for t in self.ticks.values()]
        if not samples and per_rank and self.samples_per_step:
            samples = sum(per_rank) * self.samples_per_step
        steps = max(per_rank, default=0)  # data-parallel ranks step together
        return samples, steps

    def started(self) -> float | None:
        """When the first rank asked for its first batch (the clock of the received ticks)."""
        begun = [t for t in (_first_work(tr.points) for tr in self.parts.values())
                 if t is not None]
        return min(begun, default=None)

    def rate(self, since_t: float, now: float) -> tuple[float | None, int, int]:
        """(samples/s since ``since_t``, `span_rate`; the job's steps; samples so far)."""
        samples, steps = self.totals()
        return self.span_rate(since_t, now), steps, samples


def _first_work(points: list[tuple[float, dict]]) -> float | None:
    """When a rank's part times first grew: its first batch asked for."""
    return next((t for t, parts in points if any(float(v) > 0 for v in parts.values())), None)


class _Signals:
    """Forwards SIGINT/SIGTERM to the ranks while installed (main thread only)."""

    def __init__(self):
        self.launched: list[proc.Launched] = []
        self.count = 0
        self.first: int | None = None  # the first signal received
        self.escalate = threading.Event()
        self._old: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum, frame) -> None:
        self.count += 1
        if self.first is None:
            self.first = signum
        if self.count > 1:
            self.escalate.set()
            return
        for lp in self.launched:
            proc.signal_group(lp, signum)


def streamed_line(line: str, rank: int | None = None) -> str:
    """One line of the script's output as we pass it on: labelled with its rank where several
    are streamed, and always ended, so that a rank killed mid-line (or a last line without a
    newline) does not run into the next rank's line or into our own summary."""
    text = line if line.endswith("\n") else line + "\n"
    return text if rank is None else f"[rank {rank}] {text}"


def run_full(spec: FullRunSpec, journal: Journal, *, out=None) -> int:
    """Run the script to its end; returns its exit status (0 when every rank succeeded)."""
    asked = spec.ranks
    collector = for_launcher(asked.launcher)
    lock = threading.Lock()
    # Ranks started here are streamed one by one and labelled when there are several; an engine
    # (mpirun, srun) merges its ranks' output into its own, which is passed on as it is.
    label = asked.launcher.kind is engines.Kind.LOCAL and asked.instances > 1

    def on_output(rank: int, line: str) -> None:
        stream = out or sys.stdout
        with lock:
            try:
                stream.write(streamed_line(line, rank if label else None))
                stream.flush()
            except (OSError, ValueError):
                pass  # our stdout went away; the log file still has it

    ranks = replace(asked, mode=Mode.FULL, marker=f"{asked.name}-{uuid.uuid4().hex[:12]}")
    journal.emit(Event.FULLRUN_STARTED, command=list(asked.command),
                 knobs=dict(spec.journal_knobs or asked.knobs), instances=asked.instances,
                 launcher=engines.describe(asked.launcher),
                 **({"promised": spec.promise.samples_per_s} if spec.promise else {}),
                 **({"settings": dict(spec.settings)} if spec.settings else {}))
    signals = _Signals()
    signals.install()
    code, ended, group, told = 1, {}, None, False

    def tell(final: bool = False) -> None:
        """``fullrun_notes`` once: at the start, or when the MPS check has ended (or the run)."""
        nonlocal told
        check = group.mps_check
        if told or not (final or group.mps is None or check is not None):
            return
        told = True
        notes = group.notes()
        if notes or check is not None:
            journal.emit(Event.FULLRUN_NOTES, notes=[str(n) for n in notes], mps_check=None if check is None else
                         {"ok": check.ok, "text": check.text})

    try:
        group = start_group(ranks, channel=collector.env(), extra_env=FULL_RUN_ENV,
                            stream_output=True, on_output=on_output)
        signals.launched = group.launched
        code, ended = _supervise(spec, signals, collector, journal, on_poll=tell)
    finally:
        for lp in signals.launched:
            proc.stop(lp, grace_s=spec.grace_s)
        signals.restore()
        collector.close()
        if group is not None:
            group.wait_mps_check(timeout_s=spec.grace_s)
            tell(final=True)
        journal.emit(Event.FULLRUN_ENDED, exit_code=code, **ended)
    return code


@dataclass
class _Held:
    """The full run against its promise (`PromiseWatch`): from `FullRunSpec.warmup_s` of
    training on, each report's rate is seen; at the end the whole run's steady figure."""

    spec: FullRunSpec
    watch: PromiseWatch | None = None
    from_t: float | None = None  # when the run was warm: from then on it is held

    @classmethod
    def of(cls, spec: FullRunSpec) -> _Held:
        return cls(spec, PromiseWatch(spec.promise, sustain_s=spec.sustain_s)
                   if spec.promise is not None else None)

    def see(self, meter: _Meter, now: float, rate: float, parts, load: ForeignLoad,
            journal: Journal) -> None:
        begun = meter.started()
        if self.watch is None or begun is None or now - begun < self.spec.warmup_s:
            return
        self.from_t = self.from_t or now
        said = self.watch.see(Reading(now, rate, parts, load.cores()))
        if said:
            self._emit(journal, rate, final=False, below=True, text=said)

    def end(self, meter: _Meter, whole, journal: Journal) -> None:
        """The verdict on the whole run's steady samples/s, as a probe's: warm-up, pauses and
        the exit after the last batch left out (`_Meter.steady`)."""
        if self.watch is None or self.from_t is None:
            return
        est = meter.steady()
        if est is None:
            return
        mean = est.samples_per_s
        self._emit(journal, mean, final=True, below=mean < self.spec.promise.low,
                   text=self.watch.verdict(mean, whole))

    def _emit(self, journal: Journal, rate: float, **fields) -> None:
        journal.emit(Event.FULLRUN_PROMISE, samples_per_s=rate,
                     promised=self.spec.promise.samples_per_s,
                     ci_half=self.spec.promise.ci_half, **fields)


def _supervise(spec: FullRunSpec, signals: _Signals, collector: Collector, journal: Journal,
               *, on_poll=lambda: None) -> tuple[int, dict]:
    """Waits for every process; returns the run's exit status and what ``fullrun_ended`` adds:
    ``rank`` (the first to fail, when a rank said so), ``launcher_exit_code`` (an engine's
    own status, when it differs from the rank's or from 128 + the signal), ``signal`` (the
    run was stopped on the SIGINT or SIGTERM we were sent: `_stopped_by`), and the run's
    steady ``samples_per_s`` with the seconds it stands on."""
    meter = _Meter(spec.samples_per_step, thin_s=spec.progress_every_s)
    launched = signals.launched
    last_report = time.monotonic()
    next_report = last_report + spec.progress_every_s
    first_failure: int | None = None
    stopping = False
    engine = spec.ranks.launcher.kind is not engines.Kind.LOCAL
    reported = 0
    held = _Held.of(spec)
    load = ForeignLoad()
    next_load = 0.0
    said_signal = False
    said_notes = 0

    def tell_notes() -> None:  # the probes' notes, each once, as they come
        nonlocal said_notes
        if len(meter.notes) > said_notes:
            journal.emit(Event.FULLRUN_NOTES, notes=meter.notes[said_notes:], mps_check=None)
            said_notes = len(meter.notes)

    while True:
        time.sleep(POLL_S)
        meter.absorb(collector.drain())
        tell_notes()
        on_poll()
        if signals.first is not None and not said_signal:
            said_signal = True
            _say_signal(signals.first, journal)
        now = time.monotonic()
        if now >= next_load:
            next_load = now + LOAD_EVERY_S
            load.sample([p for lp in launched for p in lp.tree()])
        if now >= next_report:
            next_report = now + spec.progress_every_s
            reported = _report(meter, last_report, now, held, load, journal) or reported
            load = ForeignLoad()  # the next report's span
            meter.thin(last_report)
            last_report = now
        codes = [lp.poll() for lp in launched]
        if not stopping:
            first_failure = next((c for c in codes if c not in (None, 0)), None)
            # an engine runs on while one of its ranks has failed: that rank's goodbye says so
            if first_failure is not None or (engine and meter.failed is not None):
                stopping = True
                for lp, c in zip(launched, codes):
                    if c is None:  # a rank failed: the others would wait on it forever
                        proc.signal_group(lp, signal.SIGTERM)
        if signals.escalate.is_set():
            for lp in launched:
                proc.stop(lp, grace_s=spec.grace_s)
            signals.escalate.clear()
        if all(c is not None for c in codes):
            collector.settle()
            meter.absorb(collector.drain())
            tell_notes()
            return _finish(spec, signals, meter, held, journal, codes, first_failure,
                           since_t=last_report, reported=reported)


def _report(meter: _Meter, since_t: float, now: float, held: _Held, load: ForeignLoad,
            journal: Journal) -> int:
    """One ``fullrun_progress`` over the batches since ``since_t``, seen against the promise;
    the samples it reported (0: nothing to report yet)."""
    rate, steps, samples = meter.rate(since_t, now)
    if rate is None or not samples:
        return 0
    parts = meter.breakdown(since_t, now)
    journal.emit(Event.FULLRUN_PROGRESS, samples_per_s=rate, steps=steps, samples=samples,
                 breakdown=parts)
    held.see(meter, now, rate, parts, load, journal)
    return samples


def _finish(spec: FullRunSpec, signals: _Signals, meter: _Meter, held: _Held,
            journal: Journal, codes: list, first_failure: int | None, *, since_t: float,
            reported: int) -> tuple[int, dict]:
    """Every process has ended: the last stretch, the verdict, and the run's exit status with
    what ``fullrun_ended`` adds (`_supervise`)."""
    end = time.monotonic()
    rate, steps, samples = meter.rate(since_t, end)
    if samples > reported and rate:  # the last stretch, when it holds news
        journal.emit(Event.FULLRUN_PROGRESS, samples_per_s=rate, steps=steps, samples=samples)
    code = exit_status(first_failure if first_failure is not None
                       else next((c for c in codes if c != 0), 0))
    code, ended = _rank_said(spec, meter.failed, code)
    if signals.first is not None and code != 0:
        code, ended = _stopped_by(signals.first, code, ended)
    whole = meter.breakdown(None, end)
    if code == 0:
        held.end(meter, whole, journal)
    est = meter.steady()
    if est is not None:
        ended = {**ended, "samples_per_s": est.samples_per_s, "steady_s": est.measured_s}
    return code, {**ended, **({"breakdown": whole} if whole else {})}


def _say_signal(signum: int, journal: Journal) -> None:
    """A signal that stops the run, said at once on stderr and in the journal: under Slurm
    (``scancel``, the time limit) everything is killed ``KillWait`` seconds later, maybe before
    the ranks have ended and the run's last events are written."""
    name = signal.Signals(signum).name
    why = " (the Slurm job was cancelled or reached its time limit)" \
        if signum == signal.SIGTERM and os.environ.get("SLURM_JOB_ID") else ""
    text = f"{name} received{why}: passed on to the ranks, which are stopping"
    try:
        sys.stderr.write(f"HINT: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # our stderr went away; the journal says it
    journal.emit(Event.FULLRUN_NOTES, notes=[text], mps_check=None)


def _stopped_by(signum: int, code: int, ended: dict) -> tuple[int, dict]:
    """A run we stopped on a signal ends as a shell reports a process that signal killed
    (SIGTERM: 143), whatever the engine made of it: srun reports 143, MPICH's mpiexec 15 (the
    signal's number), a rank may exit 1 from its KeyboardInterrupt. The engine's or the rank's
    own code is kept beside it."""
    stopped = 128 + signum
    out = {**ended, "signal": signal.Signals(signum).name}
    if code != stopped:
        out.setdefault("launcher_exit_code", code)
    return stopped, out


def _rank_said(spec: FullRunSpec, failed: tuple[int, int] | None, code: int) -> tuple[int, dict]:
    if failed is None or code == 0:
        return code, {}
    rank, rank_code = failed
    if rank_code == code:
        return code, {"rank": rank}
    if spec.ranks.launcher.kind is engines.Kind.LOCAL:  # our own processes' codes are the ranks' already
        return code, {}
    return rank_code, {"rank": rank, "launcher_exit_code": code}
