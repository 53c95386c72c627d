"""A tuning run: the baseline, the search, the confirmation, in that order. Returns a `TuneReport`.

1. **Baseline** (`autotune.tuning.baseline`): the script as it is (its own batch size, workers,
   threads), probed first, as ``python train.py`` runs it. What the meter saw it use, and its
   memory, shape the space; when it showed no torch.distributed, one probe of two ranks learns
   whether the script trains data-parallel when launched by torchrun (`baseline.discover_ranks`).
2. **Search** (`autotune.tuning.search`): an Optuna study, one probe per trial.
3. **Confirmation** (`autotune.tuning.confirm`): the best two and the baseline, re-measured
   interleaved.

Each stage takes the `Prober` and the run's `TuneState` and hands back a frozen result (the
baseline and the search, a new state); the state is saved as it grows (``tune.json``), so
``--resume`` continues where it stopped.
Everything the run learns goes to the journal (the monitor's only source) and to the study.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from autotune.launching import engines
from autotune.measuring import trial
from autotune.measuring.outcome import Outcome
from autotune.measuring.noise import NoiseEstimate
from autotune.hardware import fingerprint
from autotune.store import jsontext, rundir
from autotune.store.journal import Journal
from autotune import UsageError
from autotune.tuning import baseline, confirm, fitting, memory, objective, payback, search
from autotune.tuning.space import global_batch
from autotune.tuning.prober import Notify, Prober, RunTrial, config_key
from autotune.tuning.records import ProbeFacts, TuneReport
from autotune.tuning.state import (TuneState, mark_controller, minutes, save, spent_s,
                                   sweep_orphans)


class Tuner:
    """Drives one tuning run in ``run_dir`` from ``state`` (new, or loaded for a resume).

    ``run_trial`` and ``clock`` (``monotonic``, ``sleep``) reach the prober: tests hand in fakes.
    """

    def __init__(self, state: TuneState, run_dir: Path, journal: Journal, *,
                 notify: Notify | None = None, resume: bool = False,
                 launcher: engines.Launcher | None = None,
                 run_trial: RunTrial = trial.run_trial, clock=time):
        settings = state.settings
        self.state = state
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.prober = Prober(settings, self.run_dir, journal,
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

    def _tell_plan(self) -> None:
        """What the rest of the budget holds, said before the search; a budget too short for
        a few probes and the confirmation is told (with the budget that would be), not
        silently spent."""
        settings, spent = self.state.settings, self.elapsed()
        left = settings.budget_s - spent
        p = search.budget_plan(self.prober, self.state, left)
        confirm = (f"a confirmation of {p.confirm_rounds} round(s) x {p.confirm_entries} probes "
                   f"of ~{p.confirm_probe_s:.0f} s")
        self.prober.note("info", f"budget {minutes(settings.budget_s)}: {minutes(spent)} spent "
                                 f"on the baseline; {minutes(max(left, 0))} left holds about "
                                 f"{p.probes} search probe(s) of ~{p.probe_s:.0f} s and "
                                 f"{confirm}")
        if p.short:
            self.prober.note("warning", f"--budget {minutes(settings.budget_s)} holds "
                                        f"{p.probes} search probe(s) of ~{p.probe_s:.0f} s "
                                        f"beside the confirmation, fewer than "
                                        f"{fitting.MIN_SEARCH_PROBES}; --budget "
                                        f"{minutes(math.ceil(p.needed_s(spent) / 60) * 60)} "
                                        f"would hold {fitting.MIN_SEARCH_PROBES}")

    def _run_length(self) -> payback.RunLength | None:
        """The full run's length, from the script's arguments and the baseline's facts."""
        st = self.state
        if st.baseline is None or st.space is None:
            return None
        return payback.project(st.settings.command[1:], st.baseline.seen,
                               global_batch(st.space.baseline, st.space.devices))

    def _budget_from_run(self) -> None:
        """Say how long the full run will be; without --budget or --trials, tuning gets a
        share of it (`autotune.tuning.payback`)."""
        run, s = self._run_length(), self.state.settings
        if run is None:
            return
        rate = self.state.baseline.samples_per_s
        run_s = run.seconds_at(rate)
        self.prober.note("info", f"the full run: {run.how}, about {payback.duration(run_s)} at "
                                 f"the baseline's {rate:.1f} samples/s")
        if s.budget_s is not None or s.trials is not None:
            return
        budget = payback.budget_for(run_s)
        new = dataclasses.replace(s, budget_s=budget)
        self.state = dataclasses.replace(self.state, settings=new)
        self.prober.settings = new
        if run_s < payback.MIN_BUDGET_S:
            self.prober.note("warning", f"tuning budget {payback.duration(budget)}, the whole "
                                        f"projected run: a run this short cannot pay for "
                                        f"tuning; --budget or --trials tunes anyway")
        else:
            self.prober.note("info", f"tuning budget {minutes(budget)}: "
                                     f"{payback.SHARE:.0%} of the projected run (at least "
                                     f"{minutes(payback.MIN_BUDGET_S)}, never more than the "
                                     f"run); --budget or --trials sets another")

    def run(self) -> TuneReport:
        prober, settings = self.prober, self.state.settings
        mark_controller(self.run_dir)
        if self.resume:
            killed = sweep_orphans(self.run_dir)
            if killed:
                prober.tell("info", f"resume: stopped {killed} process(es) the killed run left")
            budget = settings.budget_s
            prober.tell("info", f"resume: {minutes(self.spent_before)} spent so far" + (
                f" of the {minutes(budget)} budget, {minutes(budget - self.spent_before)} left"
                if budget is not None else ""))
        else:
            self._save(self.state)
        handle = search.open_study(prober, self.state, resume=self.resume)  # before any probe
        if self.state.timing:
            prober.timing = fitting.ScriptTiming.from_dict(self.state.timing)
        if self.state.space is None:
            self.state = baseline.measure(prober, self.state)
            self._budget_from_run()
            self._save(self.state)
        space = self.state.space
        for note in space.notes:
            prober.note("hint", note)
        if settings.budget_s is not None:
            self._tell_plan()
        self._check_energy()
        scorer, note = self._scorer(())
        if note:
            prober.tell("info", note)
        self.found = search.Search(prober, self.state, handle, elapsed=self.elapsed,
                                   save=self._save, scorer=scorer).run()
        self.state = self.found.state
        prober.tell("info", f"search stopped: {self.found.stop_reason}")
        if objective.Kind.GOODPUT in settings.objective.kinds:
            scorer, note = self._scorer(self.found.noises, searched=True)
            prober.note("warning" if scorer.noise_scale is None else "info", note)
        left_s = settings.budget_s - self.elapsed() if settings.budget_s is not None else None
        c = confirm.finish(prober, self.state, self.found.known, left_s=left_s,
                           stretch=self.found.stop_reason.startswith(search.BUDGET_SPENT),
                           scorer=scorer)
        if c.front:
            prober.note("info", f"Pareto front (samples/s vs samples/J), "
                                f"{len(c.front)} config(s); picked {c.picked}: the fastest "
                                f"within {objective.PICK_WITHIN_REL:.0%} of the best samples/J")
            prober.emit("pareto", front=[p.to_dict() for p in c.front], picked=c.picked,
                        points=[p.to_dict() for p in confirm.pareto_points(
                            space, self.found.known, scorer)],
                        within_rel=objective.PICK_WITHIN_REL)
        trials = [t for t in handle.trials() if t.state.is_finished()]
        report = TuneReport(
            run_dir=self.run_dir, space=space, baseline=c.baseline, best=c.best,
            speedup=c.speedup, kept_baseline=c.kept_baseline, reason=c.reason,
            trials_measured=self.found.measured + 1, trials_total=len(trials),
            stop_reason=self.found.stop_reason, source=self.found.source, verdict=c.verdict,
            notes=tuple(prober.notes),
            best_notes=prober.probe_notes.get(config_key(c.best.knobs), ()),
            one_rank_samples_per_s=_one_rank_best(self.found.known, c),
            best_probe=_measured(prober, c.best.knobs),
            baseline_probe=_measured(prober, c.baseline.knobs),
            speedup_low=c.speedup_low, speedup_high=c.speedup_high,
            objective=settings.objective.token,
            score={"best": c.best_score.to_dict() if c.best_score else None,
                   "baseline": c.baseline_score.to_dict() if c.baseline_score else None}
            if settings.objective != objective.THROUGHPUT else None,
            objective_note=note if objective.Kind.GOODPUT in settings.objective.kinds else "",
            pareto=tuple({**p.to_dict(), "picked": p.name == c.picked} for p in c.front))
        run = self._run_length()
        report = dataclasses.replace(
            report, memory=_memory(prober, c.best.knobs),
            payback=payback.payback(self.elapsed(), run, c.baseline.samples_per_s,
                                    c.best.samples_per_s).to_dict() if run else None)
        if report.payback:
            prober.emit("payback", **report.payback)
        if report.memory is not None:
            prober.emit("memory_fit", **report.memory)
        if report.batch_note:
            prober.note("warning", report.batch_note)
            prober.emit("batch_change", text=report.batch_note)
        rundir.write_atomic(self.run_dir / "summary.json",
                            jsontext.dumps(report.to_dict(), indent=2))
        return report


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
        batch0 = global_batch(st.space.baseline, st.space.devices)
        ranks = NoiseEstimate.from_dict((st.ranks_probe or {}).get("noise"))  # tune.json's
        before, steps = objective.noise_of([st.baseline.noise, ranks])
        value, found = (before, steps) if before is not None else objective.noise_of(noises)
        scorer = objective.Scorer(obj, batch0, value, st.space.devices)
        if not batch0:
            return objective.Scorer(obj), ("goodput needs the script's batch size (no "
                                           "DataLoader batch seen): scored as throughput")
        if value is None and not searched:
            return scorer, ("goodput: no gradient noise scale measured yet (a data-parallel "
                            "trial measures it): configs score as throughput until one has")
        if value is None:
            # why no data-parallel trial measured it: the space's note when ranks stayed at 1
            # (the two-rank probe saw them train alone, say), else what the data-parallel
            # trials said, else the one-rank baseline's reason
            alone = "instances: fixed at 1: "
            why = next((n[len(alone):].split("; --space")[0] for n in st.space.notes
                        if n.startswith(alone)), "") or \
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


def _measured(prober, knobs) -> ProbeFacts | None:
    """What the last probe of ``knobs`` told beyond its throughput."""
    r = prober.last_ok.get(config_key(knobs))
    if r is None:
        return None
    return ProbeFacts(breakdown=r.breakdown, core_s_per_sample=r.core_s_per_sample,
                      gpu_s_per_sample=r.gpu_s_per_sample, energy=r.energy)


def _one_rank_best(known, c) -> float:
    """The best one-rank throughput measured (the baseline's included): what N ranks are
    weighed against (`TuneReport.scaling_efficiency`)."""
    rates = [k.value for k in known.values()
             if k.outcome == Outcome.OK and int(k.cfg.get("instances", 1)) == 1]
    if int(c.baseline.knobs.get("instances", 1)) == 1:
        rates.append(c.baseline.samples_per_s)
    return max(rates, default=0.0)


def _memory(prober, best_knobs) -> dict | None:
    """Memory by batch from the measured probes (`autotune.tuning.memory`), with the largest
    per-rank batch that fits the winner's ranks in what this host (or GPU) has free now."""
    points, kind = memory.rank_points((dict(k), r) for k, r in prober.last_ok.items())
    fit = memory.MemoryFit.of(points, kind)
    if fit is None:
        return None
    m = fingerprint.machine()
    free = m.gpu_mem_available_bytes if kind == "gpu" else m.mem_available_bytes
    ranks = int(best_knobs.get("instances", 1))
    top = fit.max_batch(free, ranks)
    if top is None:
        text = f"{fit.describe()}; it does not grow with the batch"
    else:
        who = f"{ranks} ranks" if ranks > 1 else "one rank"
        text = (f"{fit.describe()}; batches up to {top} per rank fit {who} in "
                f"{memory.HEADROOM:.0%} of the {free / 2**30:.1f} GB free")
    return {**fit.to_dict(), "available_bytes": free, "ranks": ranks, "max_batch": top,
            "text": text}
