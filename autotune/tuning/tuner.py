"""A tuning run: the baseline, the search, the confirmation, in that order. Returns a `TuneReport`.

1. **Baseline** (`autotune.tuning.baseline`): the script as it is (its own batch size, workers,
   threads), probed first, as ``python train.py`` runs it. What the meter saw it use, and its
   memory, shape the space; when it showed no torch.distributed, one probe of two ranks learns
   whether the script trains data-parallel when launched by torchrun (`baseline.discover_ranks`).
2. **Search** (`autotune.tuning.search`): an Optuna study, one probe per trial.
3. **Confirmation** (`autotune.tuning.confirm`): the best two and the baseline, re-measured
   interleaved.

Each stage takes the `Prober` (a runner of probes, with no memory of its own) and the run's
`TuneState` and hands back a frozen result holding the new state: what the stage settled and
what its probes taught (`autotune.tuning.learned`: the script's timing, each config's last
measured probe, the notes for the report). The state is saved as it grows (``tune.json``), so
``--resume`` continues where it stopped and reports as an uninterrupted run would.
Everything the run learns goes to the journal (the monitor's only source) and to the study.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from autotune.launching import engines
from autotune.measuring import trial
from autotune.hardware import fingerprint
from autotune.store.journal import Journal
from autotune import Note, UsageError
from autotune.tuning import (baseline, confirm, confirm_entries, decision, memory, objective,
                             payback, search)
from autotune.tuning.confirm_plan import MIN_SEARCH_PROBES, Stretch
from autotune.tuning.confirm_rounds import Earlier
from autotune.tuning.prober import Notify, Prober, RunTrial
from autotune.tuning.records import Stop, TunedOn, TuneReport
from autotune.store.events import Event
from autotune.tuning.study import StudyHandle
from autotune.tuning.state import (TuneState, mark_controller, minutes, save, spent_s,
                                   sweep_orphans, write_summary)


class Tuner:
    """Drives one tuning run in ``run_dir`` from ``state`` (new, or loaded for a resume).

    ``run_trial`` and ``clock`` (``monotonic``, ``sleep``) reach the prober: tests hand in fakes.
    """

    def __init__(self, state: TuneState, run_dir: Path, journal: Journal, *,
                 notify: Notify | None = None, resume: bool = False,
                 launcher: engines.Launcher | None = None,
                 run_trial: RunTrial = trial.run_trial, clock=time,
                 earlier: Earlier | None = None):
        settings = state.settings
        self.state = state
        self.run_dir = Path(run_dir)
        self.resume = resume
        # a finished run's confirmation, extended by the settings' rounds (no search probes)
        self.earlier = earlier
        self.prober = Prober(self.run_dir, journal,
                             launcher or engines.resolve(settings.launcher, settings.hostfile),
                             notify=notify, run_trial=run_trial, clock=clock)
        self.t0 = clock.monotonic()
        self.spent_before = spent_s(self.run_dir) if resume else 0.0
        self.found: search.SearchResult | None = None

    def elapsed(self) -> float:
        """The run's time so far, earlier controllers of it included."""
        return self.spent_before + self.prober.clock.monotonic() - self.t0

    def _save(self, new: TuneState) -> None:
        save(self.run_dir, new)

    def _note(self, note: Note) -> None:
        """Tell the user; the run's state keeps it for the report."""
        self.state = self.prober.note(self.state, note)

    def _tell_plan(self) -> None:
        """What the rest of the budget holds, said before the search; a budget too short for
        a few probes and the confirmation is told (with the budget that would be), not
        silently spent."""
        settings, spent = self.state.settings, self.elapsed()
        left = settings.budget_s - spent
        p = search.budget_plan(self.prober, self.state, left)
        c = p.confirm
        confirm = (f"a confirmation of {c.rounds} round(s) x {len(c.entries)} probes of "
                   f"~{c.probe_s:.0f} s, ~{c.cost_s:.0f} s kept for it once a config beats "
                   f"the script's own: {c.why}"
                   if c.remeasures else f"no confirmation ({c.why})")
        self._note(Note.info(f"budget {minutes(settings.budget_s)}: {minutes(spent)} spent on "
                             f"the baseline; {minutes(max(left, 0))} left holds about "
                             f"{p.probes} search probe(s) of ~{p.probe_s:.0f} s and {confirm}"))
        if p.short:
            self._note(Note.warning(f"--budget {minutes(settings.budget_s)} holds {p.probes} "
                                    f"search probe(s) of ~{p.probe_s:.0f} s beside the "
                                    f"confirmation of a gain, fewer than "
                                    f"{MIN_SEARCH_PROBES}; "
                                    f"--budget "
                                    f"{minutes(math.ceil(p.needed_s(spent) / 60) * 60)} would "
                                    f"hold {MIN_SEARCH_PROBES}"))

    def _run_length(self) -> payback.RunLength | None:
        """The full run's length, from the script's arguments and the baseline's facts."""
        st = self.state
        if st.baseline is None or st.space is None:
            return None
        return payback.project(st.settings.command[1:], st.baseline.seen,
                               st.space.job_batch(st.space.baseline))

    def _budget_from_run(self) -> None:
        """Say how long the full run will be; without --budget or --trials, tuning gets a
        share of it (`autotune.tuning.payback`)."""
        run, s = self._run_length(), self.state.settings
        if run is None:
            return
        rate = self.state.baseline.samples_per_s
        run_s = run.seconds_at(rate)
        self._note(Note.info(f"the full run: {run.how}, about {payback.duration(run_s)} at the "
                             f"baseline's {rate:.1f} samples/s"))
        if s.budget_s is not None or s.trials is not None:
            return
        budget = payback.budget_for(run_s)
        self.state = dataclasses.replace(self.state,
                                         settings=dataclasses.replace(s, budget_s=budget))
        text = payback.budget_text(budget, run_s)
        self._note(Note.warning(text) if run_s <= payback.MIN_BUDGET_S else Note.info(text))

    def _start(self) -> StudyHandle:
        """Everything before the search: a resumed run's leftovers swept, the study opened
        (before any probe), the baseline measured once, and what the space and the budget
        hold said. Returns the study's handle."""
        prober = self.prober
        mark_controller(self.run_dir)
        if self.resume:
            killed = sweep_orphans(self.run_dir)
            if killed:
                prober.tell(Note.info(f"resume: stopped {killed} process(es) the killed run "
                                      f"left"))
            budget = self.state.settings.budget_s
            prober.tell(Note.info(f"resume: {minutes(self.spent_before)} spent so far" + (
                f" of the {minutes(budget)} budget, {minutes(budget - self.spent_before)} left"
                if budget is not None else "")))
        else:
            self._save(self.state)
        handle = search.open_study(prober, self.state, resume=self.resume)  # before any probe
        if self.state.space is None:
            s = self.state.settings
            if s.budget_s is None and s.trials is None:
                self._note(Note.info(payback.default_text(s.max_trials)))
            self.state = baseline.measure(prober, self.state)
            self._budget_from_run()
            self._save(self.state)
        space = self.state.space
        for note in space.notes:  # kept once; a resume tells them again
            self._note(note)
        settings = self.state.settings
        if settings.budget_s is not None and self.earlier is None:
            self._tell_plan()
        if settings.confirm_rounds < decision.MIN_ROUNDS and not self.resume:
            self._note(Note.warning(
                f"--confirm-rounds {settings.confirm_rounds}: a config replaces the script's "
                f"defaults only after {decision.MIN_ROUNDS} interleaved confirmation rounds at "
                f"least, so this tuning keeps them whatever it finds; --confirm-rounds "
                f"{decision.MIN_ROUNDS} or more can switch"))
        return handle

    def run(self) -> TuneReport:
        prober = self.prober
        handle = self._start()
        settings, space = self.state.settings, self.state.space
        self._check_energy()
        scorer, note = self._scorer(())
        if note:
            prober.tell(Note.info(note))
        searching = search.Search(prober, self.state, handle, elapsed=self.elapsed,
                                  save=self._save, scorer=scorer)
        self.found = searching.settled() if self.earlier else searching.run()
        self.state = self.found.state
        stop = self.found.stop_reason
        prober.tell(Note.info(f"search stopped: {stop.text if stop else 'the study ended'}"))
        if objective.Kind.GOODPUT in settings.objective.kinds:
            scorer, note = self._scorer(self.found.noises, searched=True)
            self._note(Note.warning(note) if scorer.noise_scale is None else Note.info(note))
        left_s = settings.budget_s - self.elapsed() \
            if settings.budget_s is not None and self.earlier is None else None
        c = confirm.finish(prober, self.state, self.found.known, left_s=left_s,
                           stretch=Stretch.NONE if self.earlier else stretch_for(stop),
                           scorer=scorer, earlier=self.earlier)
        self.state = c.state
        self._save(self.state)  # what the confirmation's probes taught survives a crash too
        if c.front:
            self._note(Note.info(f"Pareto front (samples/s vs samples/J), {len(c.front)} "
                                 f"config(s); picked {c.picked}: the fastest within "
                                 f"{objective.PICK_WITHIN_REL:.0%} of the best samples/J"))
            prober.emit(Event.PARETO, front=[p.to_dict() for p in c.front], picked=c.picked,
                        points=[p.to_dict() for p in confirm_entries.pareto_points(
                            space, self.found.known, scorer)],
                        within_rel=objective.PICK_WITHIN_REL)
        report = self._report(handle, c, note)
        if report.payback:
            prober.emit(Event.PAYBACK, **report.payback.to_dict())
        if report.memory is not None:
            prober.emit(Event.MEMORY_FIT, **report.memory.to_dict())
        if report.batch_note:  # said once: the event (the live view), the summary's field
            prober.emit(Event.BATCH_CHANGE, text=report.batch_note)
        write_summary(self.run_dir, report)
        return report

    def _report(self, handle: StudyHandle, c: confirm.Confirmed, note: str) -> TuneReport:
        """The run's `TuneReport`, from the search and its confirmation ``c``; ``note``: how
        the score was made (a goodput objective's)."""
        settings, space = self.state.settings, self.state.space
        trials = [t for t in handle.trials() if t.state.is_finished()]
        learned = self.state.learned
        run = self._run_length()
        return TuneReport(
            run_dir=self.run_dir, space=space, baseline=c.baseline, best=c.best,
            speedup=c.speedup, kept_baseline=c.kept_baseline, reason=c.reason,
            trials_measured=self.found.measured + 1, trials_total=len(trials),
            stop_reason=self.found.stop_reason, source=str(self.found.source or ""),
            verdict=c.verdict,
            notes=self.state.learned.notes, best_notes=learned.notes_of(c.best.knobs),
            one_rank_samples_per_s=_one_rank_best(self.found.known, c),
            best_probe=learned.facts(c.best.knobs),
            baseline_probe=learned.facts(c.baseline.knobs),
            speedup_low=c.speedup_low, speedup_high=c.speedup_high,
            objective=settings.objective.token, best_score=c.best_score,
            baseline_score=c.baseline_score,
            objective_note=note if objective.Kind.GOODPUT in settings.objective.kinds else "",
            pareto=c.front, picked=c.picked, keep_batch=c.keep_batch, rounds=c.rounds,
            candidates=c.candidates, memory=_memory(self.state, c.best.knobs),
            process_noise=learned.spread if learned.spread and not learned.spread.pending
            else None,
            tuned_on=TunedOn.of(self.prober.launcher.host_count, self.state.allreduce),
            payback=payback.payback(self.elapsed(), run, c.baseline.samples_per_s,
                                    c.best.samples_per_s) if run else None)

    def _check_energy(self) -> None:
        """An energy objective needs the baseline's joules: without them, one line and exit
        2 before the search, never a search that cannot compare."""
        obj, b = self.state.settings.objective, self.state.baseline
        if obj.uses_energy and objective.joules_per_sample(b.energy) is None:
            raise UsageError(f"--objective {obj.token}: the baseline probe read no energy "
                             f"({objective.energy_why(b.energy)}); use --objective throughput, "
                             f"or tune where NVML's energy counter or RAPL's powercap files "
                             f"can be read")

    def _scorer(self, noises, searched: bool = False) -> tuple[objective.Scorer, str]:
        """The run's scorer and what to say of it. Goodput's B_noise comes from the baseline
        or the two-rank probe before the search and stays fixed through it (scores in the
        study never change); one the search's data-parallel probes measured (``noises``)
        re-scores the configs for the confirmation only. Without one, goodput is throughput."""
        st = self.state
        obj = st.settings.objective
        if objective.Kind.GOODPUT not in obj.kinds:
            return objective.Scorer(obj), ""
        batch0 = st.space.job_batch(st.space.baseline)
        ranks = st.ranks_probe.noise if st.ranks_probe else None
        before, steps = objective.noise_of([st.baseline.noise, ranks])
        value, found = (before, steps) if before is not None else objective.noise_of(noises)
        scorer = objective.Scorer(obj, batch0, value, st.space.world_devices)
        if not batch0:
            return objective.Scorer(obj), ("goodput needs the script's batch size (no "
                                           "DataLoader batch seen): scored as throughput")
        if value is None and not searched:
            return scorer, ("goodput: no gradient noise scale measured yet (a data-parallel "
                            "trial measures it): configs score as throughput until one has")
        if value is None:
            # why no data-parallel trial measured it: why the space held ranks at 1 (the
            # two-rank probe saw them train alone, say), else what the data-parallel trials
            # said, else the one-rank baseline's reason
            why = st.space.ranks_why or \
                next((n.reason for n in (ranks, *noises, st.baseline.noise)
                      if n is not None and n.reason), "") or "no data-parallel trial measured it"
            return scorer, (f"goodput needs a data-parallel trial: scored as throughput "
                            f"(no gradient noise scale measured: {why})")
        tail = ("fixed for the search" if before is not None else
                "measured during the search, which was steered by throughput; the "
                "confirmation compares goodput")
        return scorer, (f"goodput: B_noise {value:.4g} (over {found} steps), {tail}; each "
                        f"config scores samples/s x its statistical efficiency against the "
                        f"script's global batch of {batch0}")


def stretch_for(stop) -> Stretch:
    """What the budget the search left buys (`Stretch`): all of it after a search that
    stopped for the budget; after one that ended early (converged, the space answered, a
    streak of duplicates), the rounds its best gain needs to be shown beyond doubt, so a gain
    found early is not kept back for want of rounds while the budget sits unused; `--trials N`
    bounds the run by count, and its confirmation keeps `--confirm-rounds`."""
    if stop is not None and stop.rule is Stop.BUDGET:
        return Stretch.ALL
    if stop is not None and stop.rule is Stop.TRIALS:
        return Stretch.NONE
    return Stretch.NEEDED


def _one_rank_best(known, c) -> float:
    """The best one-rank throughput measured (the baseline's included): what N ranks are
    weighed against (`TuneReport.scaling_efficiency`)."""
    rates = [k.value for k in known.values()
             if k.outcome.usable and int(k.cfg.get("instances", 1)) == 1]
    if int(c.baseline.knobs.get("instances", 1)) == 1:
        rates.append(c.baseline.samples_per_s)
    return max(rates, default=0.0)


def _memory(state: TuneState, best_knobs) -> memory.MemoryAdvice | None:
    """Memory by batch from the measured probes (`autotune.tuning.memory`), with the largest
    per-rank batch that fits the winner's ranks in what this host (or GPU) has free now."""
    points, kind = memory.rank_points((r.cfg, r) for r in state.learned.last.values())
    fit = memory.MemoryFit.of(points, kind)
    if fit is None:
        return None
    m = fingerprint.machine()
    free = m.gpu_mem_available_bytes if kind == "gpu" else m.mem_available_bytes
    return memory.MemoryAdvice.of(fit, free, int(best_knobs.get("instances", 1)))
