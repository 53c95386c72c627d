"""A tuning run: the baseline, the search, the confirmation. Returns a `TuneReport`.

1. **Baseline**: the script as it is (its own batch size, workers, threads), probed first. What the
   meter saw it use, and its memory, shape the space (`autotune.tuning.space.build`).
2. **Search**: an Optuna study (`autotune.tuning.study`). Each trial is a probe (`run_trial`); a config
   measured once is not measured again, a batch size at or above a known OOM is not tried, a
   probe taken under foreign load is re-run (then left out, never compared), and a probe whose
   interval cannot reach the best is pruned. Stops on trials, budget, convergence, or when the
   space is exhausted.
3. **Confirmation** (`autotune.tuning.confirm`): the best two and the baseline, re-measured interleaved.

Everything the run learns goes to the journal (the monitor's only source) and to the study; the
run directory holds ``tune.json`` (settings, baseline, space) so ``--resume`` can continue it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.tuning import decision, space
from autotune.launching import engines
from autotune.store import rundir
from autotune.tuning import study as studies
from autotune.store.journal import Journal
from autotune.measuring import series
from autotune.measuring.outcome import Outcome
from autotune.measuring.trial import TrialResult, TrialSpec, run_trial
from autotune.tuning import baseline as baseline_probe
from autotune.tuning import state
from autotune.tuning.records import Known, Scored, TuneReport, TuneSettings

DUPLICATE_STREAK = 8  # proposals in a row of configs already known: the sampler has converged
FOREIGN_WAIT_S = 5.0
CONFIRM_SHARE = 0.35  # of a time budget, at most, for the confirmation

Notify = Callable[[str, str], None]  # (level: "info" | "warning" | "hint", message)


class Tuner:
    """Drives one tuning run in ``run_dir``; `run` returns the report."""

    def __init__(self, settings: TuneSettings, run_dir: Path, journal: Journal, *,
                 notify: Notify | None = None, warm_start: Mapping[str, int] | None = None,
                 kind: str = "tune", resume: bool = False,
                 launcher: engines.Launcher | None = None):
        self.s = settings
        self.launcher = launcher or engines.resolve(settings.launcher, settings.hostfile)
        self.run_dir = Path(run_dir)
        self.journal = journal
        self.notify = notify or (lambda level, msg: None)
        self.kind = kind
        self.resume = resume
        self.state = state.load_state(run_dir) if resume else {}
        self.state.setdefault("warm_start", dict(warm_start) if warm_start else None)
        self.t0 = time.monotonic()
        self.spent_before = state.spent_s(run_dir) if resume else 0.0
        self.known: dict[tuple, Known] = {}
        self.ooms: list[dict] = []
        self.measured = 0
        self.duplicate_streak = 0
        self.convergence = decision.Convergence()
        self.stop_reason = ""
        self.space: space.Space | None = None
        self.size = 0
        self.baseline: Scored | None = None
        self.source = ""
        self.notes: list[str] = []
        self.told_busy = False
        self._learned: set[int] = set()  # study trials whose answer is in `known`

    # -- bookkeeping --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.spent_before + time.monotonic() - self.t0

    def save_state(self) -> None:
        self.state.update({"kind": self.kind, "settings": self.s.to_dict(),
                           "run_id": self.run_dir.name})
        rundir.write_atomic(self.run_dir / state.STATE,
                            json.dumps(self.state, indent=2, default=str))

    def note(self, level: str, message: str) -> None:
        self.notes.append(message)
        self.notify(level, message)

    # -- probes -------------------------------------------------------------------------------
    def spec(self, cfg: Mapping[str, int], name: str, **over) -> TrialSpec:
        knobs, instances = self.space.trial_knobs(cfg) if self.space else (dict(cfg), 1)
        return self.spec_for(knobs, instances, name, **over)

    def spec_for(self, knobs: Mapping, instances: int, name: str, **over) -> TrialSpec:
        per_step = series.samples_per_step(self.s.command, knobs, self.s.samples_per_step)[0]
        spec = dict(command=tuple(self.s.command), knobs=dict(knobs), instances=instances,
                    cwd=self.s.cwd, log_dir=self.run_dir / "logs", name=name,
                    max_s=self.s.seconds, min_measure_s=self.s.min_measure_s,
                    samples_per_step=per_step, foreign_limit_cores=self.s.foreign_limit_cores,
                    launcher=self.launcher)
        spec.update(over)
        return TrialSpec.of(**spec)

    def _on_start(self, launched) -> None:
        state.mark_live(self.run_dir, [lp.spec.marker for lp in launched])

    def probe(self, spec: TrialSpec, *, label: str, number: int | None, cfg: Mapping,
              on_progress=None, events: bool = True, finish: bool = True) -> TrialResult:
        """One probe, re-run while foreign load spoils it (up to ``foreign_retries`` times).

        With ``finish=False`` the caller emits the last ``trial_finished`` itself.
        """
        attempt = 0
        while True:
            if events:
                self.journal.emit("trial_started", trial=label, number=number, knobs=dict(cfg),
                                  mode=spec.mode)

            def progress(est, label=label):
                if events:
                    self.journal.emit("trial_progress", trial=label,
                                      samples_per_s=est.samples_per_s, ci_half=est.ci_half,
                                      measured_s=est.measured_s)
                return bool(on_progress and on_progress(est))

            result = run_trial(spec, on_progress=progress, on_start=self._on_start)
            state.mark_live(self.run_dir, [])
            result = dataclasses.replace(result, knobs=dict(cfg))
            spoiled = result.outcome in (Outcome.OK, Outcome.PRUNED, Outcome.FOREIGN_LOAD) \
                and result.foreign_flagged
            last = not spoiled or attempt == self.s.foreign_retries
            if spoiled and last:
                result = dataclasses.replace(result, outcome=Outcome.FOREIGN_LOAD, reason=(
                    f"{result.foreign_cores:.2f} cores of CPU load from other programs in "
                    f"{attempt + 1} attempt(s); not compared"))
                if not self.told_busy:
                    self.told_busy = True
                    self.note("hint", f"other programs keep this machine busy ({label}: "
                                      f"{result.foreign_cores:.2f} cores); such probes are left "
                                      f"out, not compared. Tune when it is quiet, or pass "
                                      f"--foreign-limit CORES (now "
                                      f"{self.s.foreign_limit_cores:g}) to compare anyway")
            if events and (finish or not last):
                self.journal.emit("trial_finished", trial=label, number=number, mode=spec.mode,
                                  result=result)
            if last:
                return result
            self.notify("warning", f"{label}: {result.foreign_cores:.2f} cores of foreign CPU "
                                   f"load during the probe; measuring it again")
            time.sleep(FOREIGN_WAIT_S)
            attempt += 1

    # -- the search ---------------------------------------------------------------------------
    def _rebuild(self, handle: studies.StudyHandle) -> None:
        """What the study already knows (a resumed run): no finished trial is measured again."""
        for t in handle.trials():
            key = self._learn(t)
            if key is not None and not t.user_attrs.get("baseline"):
                self.measured += 1
                outcome = self.known[key].outcome
                self.convergence.update(self.known[key].value if outcome == "ok" else None)

    def _learn_from_others(self, handle: studies.StudyHandle) -> None:
        """Answers other tuners sharing the storage found since: not measured here again."""
        for t in handle.trials():
            if t.number not in self._learned and t.user_attrs.get("run") != self.run_dir.name:
                self._learn(t)

    def _learn(self, t) -> tuple | None:
        """Take a finished trial's answer into `known`; its key, or None when it has none."""
        if not t.state.is_finished():
            return None  # still running (here or in another tuner): not an answer yet
        self._learned.add(t.number)
        known = Known.of_trial(t)
        if known is None:
            return None
        key = self.space.key(known.cfg)
        self.known[key] = known
        if known.outcome == "oom":
            self.ooms.append(dict(known.cfg))
        return key

    def _objective(self, handle: studies.StudyHandle):
        sp = self.space

        def objective(trial: studies.Trial) -> float:
            trial.set_user_attr("run", self.run_dir.name)
            choice = {n: sp.domains[n][trial.suggest_int(n, 0, len(sp.domains[n]) - 1)]
                      for n in sp.names}
            cfg = sp.config(choice)
            key = sp.key(cfg)
            trial.set_user_attr("knobs", cfg)
            if key not in self.known:
                self._learn_from_others(handle)
            label = f"trial-{trial.number}"
            if key == sp.key(sp.baseline) and key not in self.known:
                return self._record_baseline(trial, cfg)
            if key in self.known:
                return self._replay(trial, self.known[key])
            blocker = decision.oom_blocks(cfg, self.ooms)
            if blocker is not None:
                self.duplicate_streak += 1
                trial.set_user_attr("outcome", "oom-skipped")
                trial.set_constraint("oom", 1.0)
                reason = (f"not tried: batch_size {cfg.get('batch_size')} with "
                          f"{cfg.get('instances', 1)} ranks is at or above one that ran out of "
                          f"memory ({blocker.get('batch_size')})")
                self.journal.emit("trial_started", trial=label, number=trial.number,
                                  knobs=cfg, mode="full")
                self.journal.emit("trial_pruned", trial=label, number=trial.number,
                                  reason=reason)
                return 0.0
            self.duplicate_streak = 0
            return self._measure(trial, cfg, key, label, handle)

        return objective

    def _record_baseline(self, trial, cfg) -> float:
        b = self.state["baseline"]
        trial.set_user_attr("baseline", True)
        trial.set_user_attr("outcome", studies.OK)
        trial.set_user_attr("samples_per_s", b["samples_per_s"])
        trial.set_user_attr("ci_half", b["ci_half"])
        self.known[self.space.key(cfg)] = Known(trial.number, studies.OK, b["samples_per_s"],
                                                b["ci_half"], dict(cfg))
        self.convergence.update(b["samples_per_s"])
        return float(b["samples_per_s"])

    def _replay(self, trial, known: Known) -> float:
        """A config already answered: the same answer, without a probe."""
        self.duplicate_streak += 1
        trial.set_user_attr("duplicate_of", known.number)
        trial.set_user_attr("outcome", known.outcome)
        if known.outcome == "pruned":
            trial.report(known.value, 0)
            raise studies.TrialPruned(f"same config as trial {known.number}")
        if known.outcome in ("oom", "failed"):
            trial.set_constraint(known.outcome, 1.0)
            return 0.0
        return known.value

    def _measure(self, trial, cfg, key, label, handle) -> float:
        reported: list[float] = []
        pruner = handle.pruner

        def on_progress(est) -> bool:
            pruner.observe(trial.number, est.ci_half, est.measured_s)
            trial.report(est.samples_per_s, len(reported))
            reported.append(est.samples_per_s)
            return trial.should_prune()

        try:
            result = self.probe(self.spec(cfg, label), label=label, number=trial.number,
                                cfg=cfg, on_progress=on_progress)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            raise
        self.measured += 1
        if not self.source and result.ok:
            self.source = result.source
        trial.set_user_attr("samples_per_s", result.samples_per_s)
        trial.set_user_attr("ci_half", result.ci_half)
        trial.set_user_attr("reason", result.reason)
        if result.outcome == Outcome.FOREIGN_LOAD:
            trial.set_user_attr("outcome", "foreign-load")
            self.convergence.update(None)
            raise studies.NotComparable(result.reason)
        outcome = {Outcome.OK: "ok", Outcome.PRUNED: "pruned", Outcome.OOM: "oom"}.get(
            result.outcome, "failed")
        trial.set_user_attr("outcome", outcome)
        value = result.samples_per_s
        if outcome == "pruned":
            value = result.samples_per_s or (reported[-1] if reported else 0.0)
        self.known[key] = Known(trial.number, outcome, value, result.ci_half, dict(cfg))
        self.convergence.update(value if outcome == "ok" else None)
        if outcome == "pruned":
            self.journal.emit("trial_pruned", trial=label, number=trial.number,
                              reason=result.reason)
            raise studies.TrialPruned(result.reason)
        if outcome in ("oom", "failed"):
            if outcome == "oom":
                self.ooms.append(dict(cfg))
            self.notify("warning", f"{label} {_fmt(cfg)}: {result.outcome.value}: "
                                   f"{result.reason} (log: {result.log_path})")
            trial.set_constraint(outcome, 1.0)
            return 0.0
        return value

    def _reserve_s(self) -> float:
        """Time kept for the confirmation: all its rounds, but never more than
        `CONFIRM_SHARE` of a budget (a short budget confirms in fewer, shorter probes)."""
        full = self.s.confirm_rounds * 3 * self.s.confirm_probe_s
        if self.s.budget_s is None:
            return full
        return min(full, CONFIRM_SHARE * self.s.budget_s)

    def _stop_reason(self) -> str:
        if self.s.max_trials is not None and self.measured + 1 >= self.s.max_trials:
            return f"{self.s.max_trials} trials done"
        if self.s.budget_s is not None and \
                self.elapsed() + self.s.seconds + self._reserve_s() > self.s.budget_s:
            return "time budget spent (the rest is kept for the confirmation)"
        answered = len(self.known) + (self._blocked_count() if self.ooms else 0)
        if answered >= self.size:
            return f"all {self.size} configs of the space measured"
        if self.duplicate_streak >= DUPLICATE_STREAK:
            return "converged: the sampler keeps proposing configs already measured"
        if self.convergence.since_best >= self.convergence.patience and \
                self.convergence.seen >= self.convergence.min_trials:
            return (f"converged: no gain above {self.convergence.rel:.0%} in the last "
                    f"{self.convergence.patience} trials")
        return ""

    def _blocked_count(self) -> int:
        """Configs of the space ruled out by an OOM and not measured."""
        sp = self.space
        count = 0
        for cfg in sp.configs():
            if sp.key(cfg) not in self.known and decision.oom_blocks(cfg, self.ooms):
                count += 1
        return count

    def _search(self, handle: studies.StudyHandle) -> None:
        self._rebuild(handle)
        self.stop_reason = self._stop_reason()
        if self.stop_reason:
            return

        def after_trial(study, frozen) -> None:
            self._maybe_combine(handle)
            reason = self._stop_reason()
            if reason:
                self.stop_reason = reason
                study.stop()

        handle.optimize(self._objective(handle), [after_trial])

    def _maybe_combine(self, handle: studies.StudyHandle) -> None:
        """Once every one-at-a-time probe is answered, queue the moves that paid off, joined.

        A pruned move counts with its last estimate: it may trail the best and still beat the
        baseline.
        """
        if self.state.get("combined"):
            return
        sp = self.space
        moves = sp.one_at_a_time()
        base = self.known.get(sp.key(sp.baseline))
        answered = [self.known.get(sp.key(c)) for c in moves]
        if base is None or not all(a is not None or decision.oom_blocks(c, self.ooms)
                                   for a, c in zip(answered, moves)):
            return
        combo = decision.combine(sp.baseline, base.value, [
            (c, a.value if a is not None and a.outcome in ("ok", "pruned") else None)
            for c, a in zip(moves, answered)])
        if combo is not None and sp.key(combo) not in self.known:
            handle.enqueue(sp.choice_from_config(combo), {"design": "combined"})
        self.state["combined"] = True
        self.save_state()

    def _open(self) -> studies.StudyHandle:
        url = self.s.storage or studies.sqlite_url(self.run_dir / "study.db")
        name = self.s.study_name or f"autotune-{self.run_dir.name}"
        handle = studies.open_study(url, name, run_id=self.run_dir.name, seed=self.s.seed,
                                    min_measure_s=min(2.0, self.s.min_measure_s),
                                    requeue=self.resume)
        if handle.recovered:
            self.notify("info", f"resume: re-running interrupted trial(s) "
                                f"{', '.join(map(str, handle.recovered))}")
        fresh = not any(t.user_attrs.get("run") == self.run_dir.name for t in handle.trials())
        if fresh and not self.state.get("enqueued"):
            handle.enqueue(self.space.choice_from_config(self.space.baseline), {"baseline": True})
            warm = self.state.get("warm_start")
            if warm:
                handle.enqueue(self.space.choice_from_config(warm), {"warm_start": True})
            for cfg in self.space.initial_design():
                handle.enqueue(self.space.choice_from_config(cfg), {"design": "initial"})
            self.state["enqueued"] = True
            self.save_state()
        return handle

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> TuneReport:
        from autotune.tuning import confirm

        state.mark_controller(self.run_dir)
        if self.resume:
            killed = state.sweep_orphans(self.run_dir)
            if killed:
                self.notify("info", f"resume: stopped {killed} process(es) the killed run left")
        else:
            self.save_state()
        if "space" not in self.state:
            baseline_probe.measure(self)
        self.space = space.Space.from_dict(self.state["space"])
        self.size = self.space.size()
        b = self.state["baseline"]
        self.baseline = Scored(dict(self.space.baseline), b["samples_per_s"], b["ci_half"])
        self.source = b.get("source", "")
        for note in self.space.notes:
            self.note("hint", note)
        handle = self._open()
        self._search(handle)
        self.notify("info", f"search stopped: {self.stop_reason}")
        return confirm.finish(self, handle)


def _fmt(cfg: Mapping) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())
