"""How the stages of a tuning run take a probe, journal it and tell the user.

A `Prober` builds the `TrialSpec` of a config from the run's state (its settings, and the
script's timing the probes taught, `autotune.tuning.learned`), runs it through its ``run_trial``
(the real one unless a test hands in another), re-runs a probe that foreign load spoiled, and
writes the ``trial_*`` events. It holds only this process's handles (run directory, journal,
launcher, clock, the user's terminal): what a probe teaches comes back in a new `TuneState`, so
a resume goes on from ``tune.json``. Its clock (``monotonic``, ``sleep``) is the one the run's
budget is counted on.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autotune import Note
from autotune.launching import engines
from autotune.measuring import alternate, series, trial
from autotune.measuring.outcome import Outcome
from autotune.measuring.result import TrialResult
from autotune.measuring.probe_state import TrialSpec
from autotune.measuring.trial_events import TrialEvents
from autotune.store.journal import Journal
from autotune.tuning import fitting, state as states
from autotune.tuning.objective import Kind
from autotune.tuning.records import TuneSettings
from autotune.store.events import Event
from autotune.tuning.state import TuneState

FOREIGN_WAIT_S = 5.0

Notify = Callable[[Note], None]
RunTrial = Callable[..., TrialResult]  # `autotune.measuring.trial.run_trial`'s signature


class Prober:
    """Probes for one run in ``run_dir``, journaled in ``journal``."""

    def __init__(self, run_dir: Path, journal: Journal, launcher: engines.Launcher, *,
                 notify: Notify | None = None, run_trial: RunTrial = trial.run_trial,
                 clock=time):
        self.run_dir = Path(run_dir)
        self.journal = journal
        self.launcher = launcher
        self.clock = clock  # anything with monotonic() and sleep(s)
        self._notify = notify or (lambda note: None)
        self._run_trial = run_trial
        # probes that take turns need the real trial (a stand-in measures no slices)
        self.takes_turns = run_trial is trial.run_trial

    # -- the user and the journal ---------------------------------------------------------------
    def note(self, state: TuneState, note: Note) -> TuneState:
        """Tell the user; the state keeps it for the report."""
        self._notify(note)
        return state.noted(note)

    def tell(self, note: Note) -> None:
        """Tell the user only (progress, a warning the report need not repeat)."""
        self._notify(note)

    def emit(self, event: Event, **fields) -> None:
        self.journal.emit(event, **fields)

    # -- probes ---------------------------------------------------------------------------------
    def spec(self, state: TuneState, knobs: Mapping, instances: int, name: str,
             **over) -> TrialSpec:
        """The probe of ``knobs`` on ``instances`` ranks; ``over`` replaces spec fields.

        Its time limit is ``--seconds`` when given, else fitted to the script
        (`fitting.limits`; before the baseline has timed it, the baseline's own limit); its hang
        thresholds follow the script's steps once they are known, and before that allow a busy
        pause of a minute (`fitting.UNTIMED_BUSY_HANG_S`).
        """
        s = state.settings
        per_step = series.samples_per_step(s.command, knobs, s.samples_per_step)[0]
        spec = dict(command=tuple(s.command), knobs=dict(knobs), instances=instances,
                    cwd=s.cwd, log_dir=self.run_dir / "logs", name=name,
                    max_s=s.seconds or baseline_max_s(s), min_measure_s=s.min_measure_s,
                    samples_per_step=per_step, foreign_limit_cores=s.foreign_limit_cores,
                    launcher=self.launcher, noise=Kind.GOODPUT in s.objective.kinds)
        fit = self._fit(state, knobs, instances)
        if fit is None:  # a pause of the script's own is not known yet
            spec.update(hang_s=fitting.UNTIMED_BUSY_HANG_S,
                        idle_hang_s=fitting.UNTIMED_IDLE_HANG_S)
        else:
            fitted = fit.spec_fields()
            if s.seconds:  # the user's length stands; the hang thresholds are the script's
                fitted = {k: v for k, v in fitted.items() if k not in ("max_s", "min_measure_s")}
            else:  # one probe never eats the budget
                fitted["max_s"] = min(fitted["max_s"], budget_cap(s))
            spec.update(fitted)
        spec.update(over)
        spec["min_measure_s"] = min(spec["min_measure_s"], 0.6 * spec["max_s"])
        return TrialSpec.of(**spec)

    def fitted_s(self, state: TuneState, knobs: Mapping, instances: int) -> float:
        """What the fit expects a probe of ``knobs`` to take: ``--seconds``, or
        `fitting.Limits.expected_s` within the budget's cap."""
        s, fit = state.settings, self._fit(state, knobs, instances)
        if s.seconds or fit is None:
            return s.seconds or baseline_max_s(s)
        return min(fit.expected_s, budget_cap(s))

    def least_s(self, state: TuneState, knobs: Mapping, instances: int) -> float:
        """The least time a probe of ``knobs`` measures anything in (`fitting.Limits.least_s`);
        0 with ``--seconds`` or before the baseline timed the script."""
        fit = self._fit(state, knobs, instances)
        return 0.0 if state.settings.seconds or fit is None else fit.least_s

    @staticmethod
    def pace(state: TuneState, knobs: Mapping, instances: int) -> tuple[float, float] | None:
        """A probe of ``knobs``' launch to first batch and time per batch, as fitted to the
        script's timing and the paces seen since (`fitting.first_batch_s`,
        `fitting.step_factor`); None before the baseline timed the script."""
        t = state.learned.timing
        if t is None:
            return None
        seen = state.learned.paces
        start = fitting.first_batch_s(t, knobs, seen) * \
            (fitting.RANKS_START_FACTOR if instances > 1 else 1.0)
        return start, t.step_s * fitting.step_factor(t, knobs, instances, seen)

    @staticmethod
    def _fit(state: TuneState, knobs: Mapping, instances: int) -> fitting.Limits | None:
        """A probe of ``knobs`` fitted to the script's timing and the paces seen since
        (`fitting.limits`); None before the baseline timed the script."""
        learned = state.learned
        if learned.timing is None:
            return None
        return fitting.limits(learned.timing, knobs, instances, seen=learned.paces)

    def probe_s(self, state: TuneState, knobs: Mapping, instances: int) -> float:
        """What a probe of ``knobs`` will really take, as the plan and the confirmation count
        it: `fitted_s` times the largest share of their fitted time the run's search probes
        took so far (`fitting.cost_factor`: they end once tight, or pruned; 1 with
        ``--seconds``). A search probe's own limit stays the fitted one."""
        return self.cost_factor(state) * self.fitted_s(state, knobs, instances)

    def typical_s(self, state: TuneState) -> float:
        """What a search probe over the state's space is expected to take: ``--seconds``, or
        fitted to the script and averaged over the space's configs."""
        space = state.space
        if state.settings.seconds or state.learned.timing is None or space is None:
            return self.probe_s(state, {}, 1)
        configs = space.configs()
        return sum(self.probe_s(state, *space.trial_knobs(c))
                   for c in configs) / max(1, len(configs))

    @staticmethod
    def cost_factor(state: TuneState) -> float:
        """What fitted probes really take of their expected time (1.0 with ``--seconds``)."""
        if state.settings.seconds:
            return 1.0
        return fitting.cost_factor(state.learned.costs)

    def confirm_probe_s(self, state: TuneState, probe_s: float | None = None) -> float:
        """One confirmation probe: as given (``--confirm-seconds``, else 1.5 x
        ``--seconds``), else `fitting.CONFIRM_PROBE_FACTOR` times a search probe (``probe_s``,
        else a typical one)."""
        given = state.settings.confirm_probe_s
        if given:
            return given
        return fitting.CONFIRM_PROBE_FACTOR * (probe_s or self.typical_s(state))

    def probe(self, state: TuneState, spec: TrialSpec, *, label: str, number: int | None,
              cfg: Mapping, on_progress=None, events: bool = True, finish: bool = True,
              until: float | None = None) -> tuple[TuneState, TrialResult]:
        """One probe, re-run while foreign load spoils it (up to ``foreign_retries`` times, and
        under a budget only while another attempt would end by ``until``, a time on
        ``clock``); the state with what it taught (`TuneState.learn`), and its result.

        Each attempt's spec says which it is, so its own outcome tells a spoiled last attempt
        (`autotune.measuring.outcome.classify`); here only whether to run it again is decided.
        With ``finish=False`` the caller emits the last ``trial_finished`` itself.
        """
        attempt, attempts = 0, state.settings.foreign_retries + 1
        told = TrialEvents(self.journal, label, number, spec.ranks.mode)
        # a fitted search probe's real cost against its expected one, for the budget plan
        costed = number is not None and not state.settings.seconds \
            and state.learned.timing is not None
        expected_s = self.fitted_s(state, spec.ranks.knobs, spec.ranks.instances)
        took_s = expected_s  # an attempt's length: expected, then as the last one took
        while True:
            attempt += 1
            # the last where none follows: the re-runs asked are spent, or another attempt
            # after this one would not end by ``until``
            timely = until is None or \
                self.clock.monotonic() + 2 * took_s + FOREIGN_WAIT_S <= until
            spec = dataclasses.replace(spec, attempt=attempt,
                                       last_attempt=attempt >= attempts or not timely)
            if events:
                told.started(cfg)

            def progress(est):
                if events:
                    told.progress(est)
                return bool(on_progress and on_progress(est))

            began = self.clock.monotonic()
            result = self._run_trial(spec, on_progress=progress, on_start=self._on_start)
            states.mark_live(self.run_dir, [])
            result = dataclasses.replace(result, knobs=dict(cfg))
            state = state.learn(cfg, spec.ranks.knobs, result)
            took_s = self.clock.monotonic() - began
            if costed:
                state = dataclasses.replace(state, learned=state.learned.costed(
                    expected_s, took_s))
            spoiled = result.outcome == Outcome.FOREIGN_LOAD
            last = not spoiled or spec.last_attempt
            if spoiled and last:
                state = self._tell_busy(state, label, result.foreign_cores)
                if attempt < attempts:
                    self.tell(Note.info(f"{label}: not measured again: the budget left beside "
                                        f"the confirmation holds no other attempt"))
            if events and (finish or not last):
                told.finished(result)
            if last:
                return state, result
            self.tell(Note.warning(f"{label}: {result.foreign_cores:.2f} cores of foreign CPU "
                                   f"load while it measured; measuring it again"))
            self.clock.sleep(FOREIGN_WAIT_S)

    def probe_turns(self, state: TuneState, entries: Sequence[tuple[Mapping, TrialSpec]], *,
                    measure_s: float) -> tuple[TuneState, list[TrialResult]]:
        """The probes of ``entries`` (config, spec) at once, taking turns on the machine
        (`autotune.measuring.alternate.run_together`) until each ran ``measure_s`` in its
        slices; the state with what they taught, and their results in order. No foreign-load
        re-runs: a load that came fell on every entry's slices alike. The journal's live
        markers name every entry's ranks while they run, so a resume finds all of them."""
        lock = threading.Lock()
        markers: dict[int, list[str]] = {}

        def started(i: int, launched) -> None:
            with lock:
                markers[i] = [lp.spec.marker for lp in launched]
                states.mark_live(self.run_dir, [m for ms in markers.values() for m in ms])

        def one(i: int, turn: alternate.Turn) -> TrialResult:
            return self._run_trial(entries[i][1], on_start=lambda ls: started(i, ls), turn=turn)

        start_s = max(spec.startup_s for _, spec in entries)
        try:
            results = alternate.run_together(one, len(entries), measure_s=measure_s,
                                             start_s=start_s)
        finally:
            states.mark_live(self.run_dir, [])
        out = []
        for (cfg, spec), result in zip(entries, results):
            result = dataclasses.replace(result, knobs=dict(cfg))
            state = state.learn(cfg, spec.ranks.knobs, result)
            out.append(result)
        return state, out

    def _on_start(self, launched) -> None:
        states.mark_live(self.run_dir, [lp.spec.marker for lp in launched])

    def _tell_busy(self, state: TuneState, label: str, cores: float) -> TuneState:
        """The hint that foreign load spoils probes, once a run (resumes included)."""
        if state.learned.told_busy:
            return state
        state = dataclasses.replace(state, learned=dataclasses.replace(state.learned,
                                                                       told_busy=True))
        return self.note(state, Note.hint(
            f"other programs keep this machine busy ({label}: {cores:.2f} cores); such probes "
            f"are left out, not compared. Tune when it is quiet, or pass --foreign-limit CORES "
            f"(now {state.settings.foreign_limit_cores:g}) to compare anyway"))


def budget_cap(settings: TuneSettings) -> float:
    """The most one fitted probe may take: `fitting.PROBE_BUDGET_SHARE` of a budget."""
    if settings.budget_s is None:
        return fitting.MAX_PROBE_S
    return max(2 * fitting.MIN_PROBE_S, fitting.PROBE_BUDGET_SHARE * settings.budget_s)


def baseline_max_s(settings: TuneSettings) -> float:
    """The baseline's limit without ``--seconds``: it ends once its interval is tight, within
    `fitting.BASELINE_MAX_S` and a share of a budget."""
    if settings.budget_s is None:
        return fitting.BASELINE_MAX_S
    return min(fitting.BASELINE_MAX_S,
               max(fitting.MIN_PROBE_S * 2, fitting.BASELINE_BUDGET_SHARE * settings.budget_s))
