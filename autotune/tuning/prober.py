"""How the stages of a tuning run take a probe, journal it and tell the user.

A `Prober` builds the `TrialSpec` of a config from the run's settings, runs it through its
``run_trial`` (the real one unless a test hands in another), re-runs a probe that foreign load
spoiled, and writes the ``trial_*`` events. It also keeps what the run told the user, for the
report. Its clock (``monotonic``, ``sleep``) is the one the run's budget is counted on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune import NoteKind
from autotune.launching import engines
from autotune.measuring import series, trial
from autotune.measuring.outcome import Outcome
from autotune.measuring.trial import TrialResult, TrialSpec
from autotune.store.journal import Journal
from autotune.tuning import fitting, state
from autotune.tuning.records import TuneSettings
from probes.protocol import Mode

FOREIGN_WAIT_S = 5.0

Notify = Callable[[str, str], None]  # (level: "info" | "warning" | "hint", message)
RunTrial = Callable[..., TrialResult]  # `autotune.measuring.trial.run_trial`'s signature


class Prober:
    """Probes for one run in ``run_dir``, journaled in ``journal``."""

    def __init__(self, settings: TuneSettings, run_dir: Path, journal: Journal,
                 launcher: engines.Launcher, *, notify: Notify | None = None,
                 run_trial: RunTrial = trial.run_trial, clock=time):
        self.settings = settings
        self.run_dir = Path(run_dir)
        self.journal = journal
        self.launcher = launcher
        self.clock = clock  # anything with monotonic() and sleep(s)
        self.notes: list[str] = []  # what the run told the user, for the report
        self._notify = notify or (lambda level, msg: None)
        self._run_trial = run_trial
        self._told_busy = False
        self.probe_notes: dict[tuple, tuple[str, ...]] = {}  # a config's last probe's notes
        # a config's last measured probe in full mode: its breakdown and cost per sample
        self.last_ok: dict[tuple, TrialResult] = {}
        # how the script moves, from the baseline (`autotune.tuning.fitting`); None before it
        self.timing: fitting.ScriptTiming | None = None
        self.paces: list[fitting.Pace] = []  # steps seen in probes since, by their knobs

    # -- the user and the journal ---------------------------------------------------------------
    def note(self, level: str, message: str) -> None:
        """Tell the user, and keep it for the report."""
        self.notes.append(message)
        self._notify(level, message)

    def tell(self, level: str, message: str) -> None:
        """Tell the user only (progress, a warning the report need not repeat)."""
        self._notify(level, message)

    def emit(self, event: str, **fields) -> None:
        self.journal.emit(event, **fields)

    # -- probes ---------------------------------------------------------------------------------
    def spec(self, knobs: Mapping, instances: int, name: str, **over) -> TrialSpec:
        """The probe of ``knobs`` on ``instances`` ranks; ``over`` replaces spec fields.

        Its time limit is ``--seconds`` when given, else fitted to the script
        (`fitting.limits`; before the baseline has timed it, the baseline's own limit); its hang
        thresholds follow the script's steps once they are known.
        """
        s = self.settings
        per_step = series.samples_per_step(s.command, knobs, s.samples_per_step)[0]
        spec = dict(command=tuple(s.command), knobs=dict(knobs), instances=instances,
                    cwd=s.cwd, log_dir=self.run_dir / "logs", name=name,
                    max_s=s.seconds or self.baseline_max_s(), min_measure_s=s.min_measure_s,
                    samples_per_step=per_step, foreign_limit_cores=s.foreign_limit_cores,
                    launcher=self.launcher)
        if self.timing is not None:
            fitted = fitting.limits(self.timing, knobs, instances,
                                    seen=self.paces).spec_fields()
            if s.seconds:  # the user's length stands; the hang thresholds are the script's
                fitted = {k: v for k, v in fitted.items() if k not in ("max_s", "min_measure_s")}
            else:  # one probe never eats the budget
                fitted["max_s"] = min(fitted["max_s"], self._budget_cap())
            spec.update(fitted)
        spec.update(over)
        spec["min_measure_s"] = min(spec["min_measure_s"], 0.6 * spec["max_s"])
        return TrialSpec.of(**spec)

    def _budget_cap(self) -> float:
        """The most one fitted probe may take: `fitting.PROBE_BUDGET_SHARE` of a budget."""
        budget = self.settings.budget_s
        if budget is None:
            return fitting.MAX_PROBE_S
        return max(2 * fitting.MIN_PROBE_S, fitting.PROBE_BUDGET_SHARE * budget)

    def baseline_max_s(self) -> float:
        """The baseline's limit without ``--seconds``: it ends once its interval is tight,
        within `fitting.BASELINE_MAX_S` and a share of a budget."""
        budget = self.settings.budget_s
        if budget is None:
            return fitting.BASELINE_MAX_S
        return min(fitting.BASELINE_MAX_S,
                   max(fitting.MIN_PROBE_S * 2, fitting.BASELINE_BUDGET_SHARE * budget))

    def probe_s(self, knobs: Mapping, instances: int) -> float:
        """What a probe of ``knobs`` is expected to take: ``--seconds``, or fitted."""
        if self.settings.seconds or self.timing is None:
            return self.settings.seconds or self.baseline_max_s()
        return min(fitting.limits(self.timing, knobs, instances, seen=self.paces).expected_s,
                   self._budget_cap())

    def remember(self, cfg: Mapping, result: TrialResult) -> None:
        """Keep ``result`` as the last measurement of ``cfg`` too: the baseline, probed with
        the script's own values before the space named all its knobs."""
        if result.outcome == Outcome.OK and result.mode is Mode.FULL:
            self.last_ok[config_key(cfg)] = result

    def typical_s(self, space) -> float:
        """What a search probe over ``space`` is expected to take: ``--seconds``, or fitted
        to the script and averaged over the space's configs."""
        if self.settings.seconds or self.timing is None or space is None:
            return self.probe_s({}, 1)
        configs = space.configs()
        return sum(self.probe_s(*space.trial_knobs(c)) for c in configs) / max(1, len(configs))

    def confirm_probe_s(self, space, probe_s: float | None = None) -> float:
        """One confirmation probe: as given (``--confirm-seconds``, else 1.5 x
        ``--seconds``), else `fitting.CONFIRM_PROBE_FACTOR` times a typical search probe."""
        given = self.settings.confirm_probe_s
        if given:
            return given
        return fitting.CONFIRM_PROBE_FACTOR * (probe_s or self.typical_s(space))

    def probe(self, spec: TrialSpec, *, label: str, number: int | None, cfg: Mapping,
              on_progress=None, events: bool = True, finish: bool = True) -> TrialResult:
        """One probe, re-run while foreign load spoils it (up to ``foreign_retries`` times).

        Each attempt's spec says which it is, so its own outcome tells a spoiled last attempt
        (`autotune.measuring.outcome.classify`); here only whether to run it again is decided.
        With ``finish=False`` the caller emits the last ``trial_finished`` itself.
        """
        attempt, attempts = 0, self.settings.foreign_retries + 1
        while True:
            attempt += 1
            spec = dataclasses.replace(spec, attempt=attempt, last_attempt=attempt >= attempts)
            if events:
                self.emit("trial_started", trial=label, number=number, knobs=dict(cfg),
                          mode=spec.ranks.mode)

            def progress(est, label=label):
                if events:
                    self.emit("trial_progress", trial=label, samples_per_s=est.samples_per_s,
                              ci_half=est.ci_half, measured_s=est.measured_s)
                return bool(on_progress and on_progress(est))

            result = self._run_trial(spec, on_progress=progress, on_start=self._on_start)
            state.mark_live(self.run_dir, [])
            result = dataclasses.replace(result, knobs=dict(cfg))
            self._keep_pace(spec, result)
            said = tuple(str(n) for n in result.notes if n.kind is not NoteKind.WARNING)
            if said:  # what autotune did to this config (a backend replaced, a flag kept)
                self.probe_notes[config_key(cfg)] = said
            if result.outcome == Outcome.OK and spec.ranks.mode is Mode.FULL:
                self.last_ok[config_key(cfg)] = result
            spoiled = result.outcome == Outcome.FOREIGN_LOAD
            last = not spoiled or spec.last_attempt
            if spoiled and last:
                self._tell_busy(label, result.foreign_cores)
            if events and (finish or not last):
                self.emit("trial_finished", trial=label, number=number, mode=spec.ranks.mode,
                          result=result)
            if last:
                return result
            self.tell("warning", f"{label}: {result.foreign_cores:.2f} cores of foreign CPU "
                                 f"load during the probe; measuring it again")
            self.clock.sleep(FOREIGN_WAIT_S)

    def _keep_pace(self, spec: TrialSpec, result: TrialResult) -> None:
        """A measured probe's step time, for fitting the next probes (`fitting.step_factor`)."""
        knobs = spec.ranks.knobs
        if result.ok and result.step_s > 0 and knobs.get("batch_size"):
            self.paces.append(fitting.Pace(int(knobs["batch_size"]),
                                           int(knobs.get("threads") or 0), result.step_s))

    def _on_start(self, launched) -> None:
        state.mark_live(self.run_dir, [lp.spec.marker for lp in launched])

    def _tell_busy(self, label: str, cores: float) -> None:
        if self._told_busy:
            return
        self._told_busy = True
        self.note("hint", f"other programs keep this machine busy ({label}: {cores:.2f} "
                          f"cores); such probes are left out, not compared. Tune when it is "
                          f"quiet, or pass --foreign-limit CORES (now "
                          f"{self.settings.foreign_limit_cores:g}) to compare anyway")


def config_key(cfg: Mapping) -> tuple:
    """A config as a key of `Prober.probe_notes` and `Prober.last_ok`."""
    return tuple(sorted((k, int(v)) for k, v in cfg.items()))
