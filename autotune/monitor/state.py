"""`RunState`: everything the monitor and the report show, folded from journal events.

Pure: no clock, no I/O, no terminal. ``fold(events)`` gives the state after those events;
``state.apply(event)`` folds one more. Unknown events and malformed fields are ignored, so a
journal from a newer or older autotune still renders. `HANDLERS` folds each `Event`; `IGNORED`
would name, with the reason, one the state leaves out (`tests/test_events.py` holds the two to
every event).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from autotune.measuring.breakdown import Breakdown
from autotune.measuring.outcome import USABLE, Outcome
from autotune.measuring.result import TrialResult
from autotune.store.events import Event, RunKind
from probes import protocol

RUNNING = "running"
HISTORY_MAX = 600  # full-run throughput points kept for the sparkline


@dataclass
class TrialRow:
    """One trial (or probe mode) as the monitor shows it."""

    name: str
    number: int | None = None
    knobs: dict = field(default_factory=dict)
    mode: str = "full"
    started_t: float | None = None
    finished_t: float | None = None
    status: str = RUNNING  # RUNNING or an `Outcome` value, as the journal has it
    reason: str = ""
    samples_per_s: float | None = None  # final when finished, live while running
    ci_half: float | None = None
    measured_s: float | None = None
    duration_s: float | None = None
    source: str = ""
    foreign_flagged: bool = False
    log_path: str = ""
    breakdown: Breakdown | None = None  # where its time went
    # (per-rank batch, one rank's peak bytes, "host" | "gpu") when the probe measured it
    memory: tuple | None = None

    @property
    def finished(self) -> bool:
        return self.status != RUNNING

    @property
    def ok(self) -> bool:
        return self.status in USABLE

    @property
    def label(self) -> str:
        return f"#{self.number}" if self.number is not None else self.name


@dataclass
class FullRun:
    command: list = field(default_factory=list)
    knobs: dict = field(default_factory=dict)
    instances: int | None = None
    started_t: float | None = None
    samples_per_s: float | None = None
    steps: int | None = None
    samples: int | None = None
    history: list = field(default_factory=list)  # (t, samples_per_s)
    exit_code: int | None = None
    notes: list = field(default_factory=list)  # where its ranks run, whether MPS serves them
    ended_t: float | None = None
    # where the time went: since the last report while it runs, over the whole run once it
    # has ended
    breakdown: Breakdown | None = None
    promise: str = ""  # the run against the recipe's figure: a shortfall, then the verdict
    below_promise: bool = False  # ...and whether the run fell below it
    promised: float | None = None  # the recipe's samples/s the run is held against


@dataclass
class RunState:
    """The run as the journal tells it so far."""

    kind: RunKind | None = None  # None: not said, or a kind this autotune does not know
    command: list = field(default_factory=list)
    cwd: str = ""
    hardware: object = None
    budget_s: float | None = None
    trials_budget: int | None = None
    space: object = None
    modes: list = field(default_factory=list)
    started_t: float | None = None
    last_t: float | None = None
    ended_t: float | None = None
    exit_code: int | None = None
    trials: dict = field(default_factory=dict)  # name -> TrialRow, in start order
    confirmations: list = field(default_factory=list)
    best: dict | None = None
    recipe_path: str | None = None
    verdict: dict | None = None
    memory: dict | None = None  # the memory_fit event: memory by batch
    pareto: dict | None = None  # the pareto event (--objective throughput,energy)
    allreduce: dict | None = None  # the allreduce event: the timing, or why there is none
    payback: dict | None = None  # the payback event: tuning's cost against its saving
    batch_note: str = ""  # the batch_change event: what the winner does to the global batch
    fullrun: FullRun | None = None
    device: dict | None = None  # the latest device_sample
    events: int = 0
    sessions: int = 0  # run_started events: a resumed run has one per session
    unreadable: list = field(default_factory=list)  # byte offsets of journal lines not read
    again_of: str = ""  # the run this one started again (`autotune run --again`)
    again_in: str = ""  # the run that started this one again (its ``run_again`` event)

    # -- derived ---------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        return self.ended_t is not None

    @property
    def script(self) -> str:
        for arg in self.command:
            if isinstance(arg, str) and arg.endswith(".py"):
                return os.path.basename(arg)
        return os.path.basename(str(self.command[0])) if self.command else "?"

    @property
    def rows(self) -> list[TrialRow]:
        return list(self.trials.values())

    @property
    def finished_rows(self) -> list[TrialRow]:
        return [r for r in self.trials.values() if r.finished]

    @property
    def best_row(self) -> TrialRow | None:
        """The trial the run declared best, else the fastest ok trial so far."""
        ok = [r for r in self.trials.values() if r.ok and r.samples_per_s]
        if self.best and self.best.get("knobs") is not None:
            for r in ok:
                if r.knobs == self.best["knobs"] and r.mode == protocol.Mode.FULL:
                    return r
        full = [r for r in ok if r.mode == protocol.Mode.FULL] or ok
        return max(full, key=lambda r: r.samples_per_s, default=None)

    @property
    def baseline_samples_per_s(self) -> float | None:
        if self.best and self.best.get("baseline_samples_per_s"):
            return float(self.best["baseline_samples_per_s"])
        for r in self.trials.values():  # the baseline is measured first
            if r.mode == protocol.Mode.FULL and r.finished:
                return r.samples_per_s if r.ok else None
        return None

    @property
    def phase(self) -> str:
        if self.ended:
            return "finished" if not self.exit_code else f"ended (exit {self.exit_code})"
        if self.fullrun is not None:
            return "full run" if self.fullrun.exit_code is None else "full run ended"
        if self.recipe_path:
            return "recipe saved"
        if self.best is not None:
            return "best chosen"
        if self.confirmations:
            return "confirming the best"
        running = [r for r in self.trials.values() if not r.finished]
        if running:
            r = running[-1]
            if self.kind is RunKind.PROBE:
                return f"probing mode '{r.mode}'"
            return f"trial {r.label}"
        if self.trials:
            return "between trials"
        return "starting"

    def mode_rows(self) -> dict[str, TrialRow]:
        """The last finished synthetic and io probes, and the full one of a probe run."""
        return {r.mode: r for r in self.trials.values()
                if r.finished and (r.mode in (protocol.Mode.SYNTHETIC, protocol.Mode.IO)
                                   or (r.mode == protocol.Mode.FULL and self.kind is RunKind.PROBE))}

    def mode_rates(self) -> dict[str, float | None]:
        """Probe-mode throughputs (full/synthetic/io): None where a mode failed. In a tuning
        run the synthetic/io probes of the winner are compared with the winner's throughput."""
        rates = {m: (r.samples_per_s if r.ok else None) for m, r in self.mode_rows().items()}
        if rates and "full" not in rates and self.best and _num(self.best.get("samples_per_s")):
            rates["full"] = _num(self.best["samples_per_s"])
        return rates

    # -- folding ---------------------------------------------------------------------------
    def apply(self, ev: dict) -> None:
        """Fold one event into the state. Malformed events are ignored, never raised."""
        if not isinstance(ev, dict):
            return
        handler = HANDLERS.get(ev.get("event"))
        t = _num(ev.get("t"))
        try:
            if handler is not None:
                handler(self, ev, t)
        except (TypeError, ValueError, AttributeError, KeyError):
            return
        self.events += 1
        if t is not None:
            self.last_t = t if self.last_t is None else max(self.last_t, t)
            if self.started_t is None:
                self.started_t = t

    def _row(self, ev: dict) -> TrialRow:
        name = str(ev.get("trial") or f"trial-{ev.get('number')}")
        row = self.trials.get(name)
        if row is None:
            row = self.trials[name] = TrialRow(name=name)
        if ev.get("number") is not None:
            row.number = int(ev["number"])
        if ev.get("mode"):
            row.mode = str(ev["mode"])
        return row


def fold(events, state: RunState | None = None) -> RunState:
    state = state if state is not None else RunState()
    for ev in events:
        state.apply(ev)
    return state


def _num(value):
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _run_started(s: RunState, ev: dict, t) -> None:
    s.kind = RunKind.of(ev.get("kind"))
    cmd = ev.get("command") or []
    s.command = list(cmd) if isinstance(cmd, (list, tuple)) else [str(cmd)]
    s.cwd = str(ev.get("cwd", ""))
    s.hardware = ev.get("hardware")
    s.budget_s = _num(ev.get("budget_s"))
    trials = _num(ev.get("trials"))
    s.trials_budget = int(trials) if trials else None
    s.space = ev.get("space")
    s.modes = list(ev.get("modes") or [])
    s.started_t = t
    s.again_of = str(ev.get("again_of") or "")
    s.sessions += 1
    s.ended_t = s.exit_code = None  # a resumed run: only its last session's end counts


def _trial_started(s: RunState, ev: dict, t) -> None:
    """A trial starts, or starts again (a probe re-run after foreign load): a fresh row."""
    old = s._row(ev)
    s.trials[old.name] = TrialRow(name=old.name, number=old.number, mode=old.mode,
                                  knobs=dict(ev.get("knobs") or {}), started_t=t)


def _trial_progress(s: RunState, ev: dict, t) -> None:
    row = s._row(ev)
    if row.finished:
        return
    row.samples_per_s = _num(ev.get("samples_per_s"))
    row.ci_half = _num(ev.get("ci_half"))
    row.measured_s = _num(ev.get("measured_s"))


def _trial_finished(s: RunState, ev: dict, t) -> None:
    row = s._row(ev)
    raw = ev.get("result") or {}
    res = TrialResult.from_dict({**raw, "outcome": raw.get("outcome") or Outcome.OK.value})
    row.finished_t = t
    row.status = res.outcome.value
    row.reason = str(res.reason or "")
    if res.knobs:
        row.knobs = dict(res.knobs)
    # a figure the record lacks (a journal of an older autotune) is not known, not zero
    row.samples_per_s, row.ci_half, row.measured_s, row.duration_s = (
        _num(getattr(res, name)) if name in raw else None
        for name in ("samples_per_s", "ci_half", "measured_s", "duration_s"))
    if row.duration_s is None and row.started_t is not None and t is not None:
        row.duration_s = t - row.started_t
    row.source = res.source.value if "source" in raw else ""
    row.foreign_flagged = res.foreign_flagged
    row.log_path = str(res.log_path or "")
    row.breakdown = res.breakdown
    row.memory = _memory_point(res)
    if not row.ok:
        row.samples_per_s = row.samples_per_s or None


def _trial_pruned(s: RunState, ev: dict, t) -> None:
    row = s._row(ev)
    row.status = Outcome.PRUNED.value
    row.reason = str(ev.get("reason") or row.reason or "")
    if row.finished_t is None:
        row.finished_t = t
    if row.duration_s is None and row.started_t is not None and t is not None:
        row.duration_s = t - row.started_t


def _confirmation(s: RunState, ev: dict, t) -> None:
    s.confirmations.append({k: ev.get(k) for k in ("round", "trial", "knobs", "samples_per_s",
                                                   "ci_half", "outcome", "reason",
                                                   "chooses")})


def _best(s: RunState, ev: dict, t) -> None:
    s.best = {k: ev.get(k) for k in ("knobs", "samples_per_s", "ci_half",
                                      "baseline_samples_per_s", "speedup", "kept_baseline",
                                      "reason", "speedup_low", "speedup_high", "keep_batch",
                                      "rounds", "candidates")}


def _memory_point(res: TrialResult) -> tuple | None:
    """(per-rank batch, one rank's peak bytes, kind) of a measured probe's result."""
    batch = _num(res.knobs.get("batch_size"))
    ranks = _num(res.ranks_seen)
    if not res.ok or not batch or not ranks:
        return None
    if _num(res.cuda_peak_bytes):
        return int(batch), float(res.cuda_peak_bytes), "gpu"
    rss = _num(res.peak_rss_bytes)
    return (int(batch), rss / ranks, "host") if rss else None


def _fields(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k not in ("t", "event")}


def _memory_fit(s: RunState, ev: dict, t) -> None:
    s.memory = _fields(ev)


def _pareto(s: RunState, ev: dict, t) -> None:
    s.pareto = _fields(ev)


def _allreduce(s: RunState, ev: dict, t) -> None:
    s.allreduce = _fields(ev)


def _payback(s: RunState, ev: dict, t) -> None:
    s.payback = _fields(ev)


def _batch_change(s: RunState, ev: dict, t) -> None:
    s.batch_note = str(ev.get("text") or "")


def _recipe_saved(s: RunState, ev: dict, t) -> None:
    s.recipe_path = str(ev.get("path") or "")


def _probe_verdict(s: RunState, ev: dict, t) -> None:
    v = ev.get("verdict")
    s.verdict = dict(v) if isinstance(v, dict) else {"text": str(v)}


def _fullrun_started(s: RunState, ev: dict, t) -> None:
    cmd = ev.get("command") or []
    instances = _num(ev.get("instances"))
    s.fullrun = FullRun(command=list(cmd) if isinstance(cmd, (list, tuple)) else [str(cmd)],
                        knobs=dict(ev.get("knobs") or {}),
                        instances=int(instances) if instances else None, started_t=t,
                        promised=_num(ev.get("promised")))


def _fullrun_progress(s: RunState, ev: dict, t) -> None:
    if s.fullrun is None:
        s.fullrun = FullRun(started_t=t)
    fr = s.fullrun
    fr.samples_per_s = _num(ev.get("samples_per_s"))
    steps, samples = _num(ev.get("steps")), _num(ev.get("samples"))
    fr.steps = int(steps) if steps is not None else fr.steps
    fr.samples = int(samples) if samples is not None else fr.samples
    if isinstance(ev.get("breakdown"), dict):
        fr.breakdown = Breakdown.from_dict(ev["breakdown"])
    if fr.samples_per_s is not None:
        fr.history.append((t, fr.samples_per_s))
        del fr.history[:-HISTORY_MAX]


def _fullrun_ended(s: RunState, ev: dict, t) -> None:
    if s.fullrun is None:
        s.fullrun = FullRun()
    code = ev.get("exit_code")
    s.fullrun.exit_code = int(code) if code is not None else 0
    s.fullrun.ended_t = t
    if isinstance(ev.get("breakdown"), dict):
        s.fullrun.breakdown = Breakdown.from_dict(ev["breakdown"])


def _fullrun_notes(s: RunState, ev: dict, t) -> None:
    from autotune.monitor.text import fullrun_notes

    if s.fullrun is None:
        s.fullrun = FullRun(started_t=t)
    s.fullrun.notes = [*s.fullrun.notes,  # a later one (a signal received) adds to them
                       *(n for n in fullrun_notes(ev) if n not in s.fullrun.notes)]


def _fullrun_promise(s: RunState, ev: dict, t) -> None:
    if s.fullrun is None:
        s.fullrun = FullRun(started_t=t)
    s.fullrun.promise = str(ev.get("text") or "")
    s.fullrun.below_promise = bool(ev.get("below"))


def _device_sample(s: RunState, ev: dict, t) -> None:
    s.device = ev


def _run_ended(s: RunState, ev: dict, t) -> None:
    s.ended_t = t if t is not None else (s.last_t or 0.0)
    code = ev.get("exit_code")
    s.exit_code = int(code) if code is not None else 0


def _run_again(s: RunState, ev: dict, t) -> None:
    s.again_in = str(ev.get("run") or "")


HANDLERS = {
    Event.RUN_STARTED: _run_started, Event.TRIAL_STARTED: _trial_started,
    Event.TRIAL_PROGRESS: _trial_progress, Event.TRIAL_FINISHED: _trial_finished,
    Event.TRIAL_PRUNED: _trial_pruned, Event.ALLREDUCE: _allreduce,
    Event.CONFIRMATION: _confirmation, Event.PROBE_VERDICT: _probe_verdict, Event.BEST: _best,
    Event.PARETO: _pareto, Event.PAYBACK: _payback, Event.MEMORY_FIT: _memory_fit,
    Event.BATCH_CHANGE: _batch_change, Event.RECIPE_SAVED: _recipe_saved,
    Event.FULLRUN_STARTED: _fullrun_started, Event.FULLRUN_PROGRESS: _fullrun_progress,
    Event.FULLRUN_NOTES: _fullrun_notes, Event.FULLRUN_ENDED: _fullrun_ended,
    Event.FULLRUN_PROMISE: _fullrun_promise,
    Event.DEVICE_SAMPLE: _device_sample, Event.RUN_ENDED: _run_ended,
    Event.RUN_AGAIN: _run_again,
}
IGNORED: dict[Event, str] = {}  # the state keeps something of every event
