"""The search: an Optuna study over the space, one probe per trial, until a stop rule holds.

A config measured once is not measured again (nor one another tuner sharing the storage
answered), a batch size at or above a known OOM is not tried, a probe taken under foreign load
is re-run by the prober (then left out, never compared), and a probe whose interval cannot reach
the best is pruned. Stops on trials, budget, convergence, or when the space is exhausted.
Configs are compared on their score (`autotune.tuning.objective`: samples/s unless
``--objective`` says otherwise); `Known` keeps what was measured, so scores follow the scorer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autotune import AutotuneError, Note
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from autotune.measuring.series import Source
from autotune.tuning import confirm_plan, fitting, objective, search_rules, spread
from autotune.tuning import study as studies
from autotune.tuning.answers import Answers
from autotune.tuning.confirm_rounds import turns_refused
from autotune.tuning.prober import Prober
from autotune.tuning.search_budget import Budget
from autotune.tuning.study_queue import StudyQueue
from autotune.tuning.trial_attrs import TrialAttrs
from autotune.tuning.records import Known, Stop, StopReason
from autotune.tuning.state import TuneState
from autotune.store.events import Event
from autotune.tuning.space import knobs_text
from probes.protocol import Mode

DUPLICATE_STREAK = 8  # proposals in a row of configs already known: the sampler has converged
WAIT_FOR_OTHERS_S = 600.0  # at most, for another tuner's probe of the same config
# A search probe squeezed under this share of what it takes, or under the least it measures
# anything in (`fitting.Limits.least_s`), is not taken...
SQUEEZE_LEAST = 0.5
SQUEEZE_STREAK = 3  # ...and this many such configs in a row end the search for its budget
# Under a budget, convergence (six probes without a gain) ends the search only once this share
# of the budget is spent: probes of 7-15 s make six of them a minute, and word_lm's shape
# stopped 87 s into a 6m budget, its batch 64 (+17% on the grid) never probed. The budget is
# what the user gave the search; the space running out, duplicates and the budget still end it.
CONVERGE_AFTER_SHARE = 0.5
REPEAT_AFTER = 2  # search probes measured before the script's own config is probed again


@dataclass(frozen=True)
class SearchResult:
    """What the search learned: every answered config by key, and why it stopped."""

    known: Mapping[tuple, Known]
    measured: int  # probes this run took in the search (and earlier controllers of it)
    stop_reason: StopReason | None  # None: the study ended without a stop rule
    source: Source | None  # how throughput was counted (the baseline's, else the first clean
    # probe's)
    state: TuneState  # the run's state as the search left it
    noises: tuple[NoiseEstimate, ...] = ()  # the noise-scale readings of the probes it took


def budget_plan(prober: Prober, state: TuneState, left_s: float) -> confirm_plan.BudgetPlan:
    """What ``left_s`` of the budget holds after the baseline (`confirm_plan.plan_budget`), the
    confirmation measuring the best and the baseline (`confirm_entries.essential`)."""
    probe_s = prober.typical_s(state)
    return confirm_plan.plan_budget(left_s, state.settings.budget_s, probe_s,
                                    asked=state.settings.confirm_rounds,
                                    confirm_probe_s=prober.confirm_probe_s(state, probe_s),
                                    entries=confirm_plan.ESSENTIAL_ENTRIES,
                                    refused=turns_refused(
                                        prober, objective.Scorer(state.settings.objective)))


def open_study(prober: Prober, state: TuneState, *, resume: bool) -> studies.StudyHandle:
    """The run's study; a resumed run re-queues the trials its killed controller left, first.
    A resumed run whose trials were queued refuses a study that is gone (an empty file)."""
    run_dir, settings = prober.run_dir, state.settings
    url = settings.storage or studies.sqlite_url(run_dir / "study.db")
    name = settings.study_name or f"autotune-{run_dir.name}"
    handle = studies.open_study(url, name, run_id=state.run_id or run_dir.name, seed=settings.seed,
                                min_measure_s=min(2.0, settings.min_measure_s), requeue=resume,
                                must_exist=resume and state.enqueued,
                                flag="--storage" if settings.storage else None,
                                objectives=len(settings.objective.kinds),
                                prune=settings.objective.prunes)
    if handle.recovered:
        prober.tell(Note.info(f"resume: re-running interrupted trial(s) "
                              f"{', '.join(map(str, handle.recovered))} first"))
    return handle


class Search:
    """One run's search over ``state.space`` (measured baseline included) in ``handle``: the
    Optuna adapter. Each trial is answered (`_objective`: replayed, ruled out, or probed) into
    the run's `Answers`; after each, the queueing policy (`queue_policy`) says what to queue
    and the stop rule whether to go on, under the run's `Budget`.

    ``elapsed`` gives the run's time spent so far (earlier controllers included); ``save``
    keeps each new state (what is queued in the study, what each probe taught) before the
    search goes on. ``scorer`` turns a measured config into the study's value (throughput
    unless given).
    """

    def __init__(self, prober: Prober, state: TuneState, handle: studies.StudyHandle, *,
                 elapsed: Callable[[], float], save: Callable[[TuneState], None],
                 scorer: objective.Scorer | None = None):
        self.prober = prober
        self.settings = state.settings
        self.state = state
        self.space = state.space
        self.handle = handle
        self.elapsed = elapsed
        self.save = save
        self.run_id = state.run_id or prober.run_dir.name
        self.size = self.space.size()
        self.scorer = scorer or objective.Scorer(self.settings.objective)
        self.answers = Answers(self.space, self.scorer)
        self.budget = Budget(prober, self.answers, state=lambda: self.state, elapsed=elapsed,
                             margin_rel=lambda: handle.pruner.margin_rel)
        self.queue = StudyQueue(prober, handle, self.answers, self.budget, run_id=self.run_id,
                                state=lambda: self.state, keep=self._keep)
        self.stop_reason: StopReason | None = None
        self.source = state.baseline.source
        self.squeezed = 0  # configs in a row the budget left no room to probe
        self.squeezed_keys: set[tuple] = set()  # configs the budget left out
        self.told_rounds = 0  # the rounds above those asked last said to be kept (`_tell_rounds`)

    @property
    def known(self) -> dict[tuple, Known]:
        return self.answers.known

    def run(self) -> SearchResult:
        self.queue.start()
        self.answers.rebuild(self.handle.trials())
        self._use_spread()  # a resumed run's: after the rebuild, which knows the baseline
        self.stop_reason = self._stop_reason()
        if self.stop_reason is None:
            self.handle.optimize(self._objective, [self._after_trial])
        a = self.answers
        return SearchResult(dict(a.known), a.measured, self.stop_reason, self.source,
                            self.state, tuple(a.noises))

    def settled(self) -> SearchResult:
        """What a finished search found, without a probe more (a finished tuning's
        confirmation extended: ``tune --resume RUN --confirm-rounds N``)."""
        self.answers.rebuild(self.handle.trials())
        self._use_spread()
        a = self.answers
        return SearchResult(dict(a.known), a.measured, self._stop_reason(look_again=False),
                            self.source, self.state, tuple(a.noises))

    def _keep(self, **changes) -> None:
        self.state = dataclasses.replace(self.state, **changes)
        self.save(self.state)

    # -- what other tuners answer ---------------------------------------------------------------
    def _learn_from_others(self) -> None:
        """Answers other tuners sharing the storage found since: not measured here again."""
        for t in self.handle.trials():
            if t.number not in self.answers.learned and studies.attrs_of(t).run != self.run_id:
                self.answers.learn(t)

    def _wait_for_others(self, number: int, key: tuple) -> None:
        """Another tuner sharing the study already measures this config (an earlier trial, still
        running): wait for its answer rather than measure it twice. Its tuner killed, the trial
        goes stale and fails, and this one measures it."""
        clock = self.prober.clock
        deadline = clock.monotonic() + WAIT_FOR_OTHERS_S
        while clock.monotonic() < deadline:
            running = [t for t in self.handle.trials(states=(studies.TrialState.RUNNING,))
                       if t.number < number and studies.attrs_of(t).run != self.run_id
                       and self.queue.key_of(t) == key]
            if not running:
                break
            clock.sleep(1.0)
            self.handle.fail_stale()
        self._learn_from_others()

    # -- one trial ------------------------------------------------------------------------------
    def _objective(self, trial: studies.Trial) -> float | list[float]:
        """The trial's value: its score (`objective.Scorer.values`; two for two objectives)."""
        sp, a = self.space, self.answers
        studies.write(trial, TrialAttrs(run=self.run_id))
        choice = {n: sp.domains[n][trial.suggest_int(n, 0, len(sp.domains[n]) - 1)]
                  for n in sp.names}
        cfg = sp.config(choice)
        key = sp.key(cfg)
        studies.write(trial, TrialAttrs(knobs=cfg))
        if key not in a.known:
            self._learn_from_others()
        if key not in a.known:
            self._wait_for_others(trial.number, key)
        label = f"trial-{trial.number}"
        if key == sp.key(sp.baseline) and key not in a.known:
            return self._record_baseline(trial, cfg)
        if key in a.known:
            return self._replay(trial, a.known[key])
        blocker = search_rules.oom_blocks(cfg, a.ooms)
        if blocker is not None:
            a.duplicate_streak += 1
            studies.record_outcome(trial, Outcome.OOM, not_tried=True)
            reason = (f"not tried: batch_size {cfg.get('batch_size')} with "
                      f"{cfg.get('instances', 1)} ranks is at or above one that ran out of "
                      f"memory ({blocker.get('batch_size')})")
            self.prober.emit(Event.TRIAL_STARTED, trial=label, number=trial.number, knobs=cfg,
                             mode=Mode.FULL)
            self.prober.emit(Event.TRIAL_PRUNED, trial=label, number=trial.number, reason=reason)
            return self.scorer.failed()
        a.duplicate_streak = 0
        return self._measure(trial, cfg, key, label)

    def _record_baseline(self, trial, cfg) -> float | list[float]:
        b = self.state.baseline
        known = Known(trial.number, Outcome.OK, b.samples_per_s, b.ci_half, dict(cfg), b.energy)
        score = self.answers.score(known)
        studies.write(trial, TrialAttrs(baseline=True))
        studies.record_outcome(trial, Outcome.OK)
        studies.write(trial, TrialAttrs(samples_per_s=b.samples_per_s, ci_half=b.ci_half,
                                        energy=b.energy and b.energy.to_dict(),
                                        score_ci_half=score.ci_half))
        value = self.scorer.values(score)
        if value is None:  # the tuner checks the baseline's energy before the search
            raise AutotuneError(f"the baseline has no energy reading: "
                                f"{objective.energy_why(b.energy)}")
        self.known[self.space.key(cfg)] = known
        self.answers.feed(trial.number, score.value)
        return value

    def _replay(self, trial, known: Known) -> float | list[float]:
        """A config already answered: the same answer, without a probe."""
        self.answers.duplicate_streak += 1
        studies.write(trial, TrialAttrs(duplicate_of=known.number))
        studies.record_outcome(trial, known.outcome)
        score = self.answers.score(known)
        if known.outcome == Outcome.PRUNED:
            if self.handle.prunes:
                trial.report(score.value, 0)
            raise studies.TrialPruned(f"same config as trial {known.number}")
        if known.infeasible:
            return self.scorer.failed()
        value = self.scorer.values(score)
        if value is None:
            raise studies.NotComparable(f"same config as trial {known.number}, which has no "
                                        f"energy reading")
        return value

    def _measure(self, trial, cfg, key, label) -> float | list[float]:
        """Probe ``cfg`` (in what the budget leaves: `_fitted`) and record its answer."""
        reported: list[float] = []
        pruner = self.handle.pruner
        factor = self.scorer.factor(cfg)  # goodput's efficiency: the interval scales alike

        def on_progress(est) -> bool:
            if not self.handle.prunes:
                return False
            pruner.observe(trial.number, est.ci_half * factor, est.measured_s)
            trial.report(est.samples_per_s * factor, len(reported))
            reported.append(est.samples_per_s)
            return trial.should_prune()

        spec, until = self._fitted(cfg, key, label)
        try:
            learned, result = self.prober.probe(self.state, spec, label=label,
                                                number=trial.number, cfg=cfg,
                                                on_progress=on_progress, until=until)
        except (KeyboardInterrupt, AutotuneError):  # Ctrl-C, a write that failed: retried
            studies.write(trial, TrialAttrs(interrupted=True))  # by --resume (a storage that
            raise  # fails here leaves it RUNNING: retried alike)
        self._keep(learned=learned.learned)
        self.answers.measured += 1
        if not self.source and result.ok:
            self.source = result.source
        return self._answer(trial, cfg, key, label, result, reported)

    def _fitted(self, cfg, key, label):
        """The probe's spec, its window cut to what the budget's search part has left (a config
        longer than the typical one ends there; not with ``--seconds``), and when that part ends
        on the prober's clock (None without a budget): re-runs for foreign load end there. Raises
        `studies.NotComparable` for a config the budget leaves no room to measure; a few in a
        row stop the search."""
        knobs, instances = self.space.trial_knobs(cfg)
        spec = self.prober.spec(self.state, knobs, instances, label)
        if self.settings.budget_s is None:
            return spec, None
        left, need_s = self.budget.room(cfg)
        reserved = left < self.settings.budget_s - self.elapsed()  # time kept for rounds
        until = self.prober.clock.monotonic() + left
        if self.settings.seconds:  # probes of the length asked: only the re-runs are held
            return spec, until
        least_s = self.prober.least_s(self.state, knobs, instances)
        if left < max(SQUEEZE_LEAST * need_s, least_s):
            # it would end before it measured, or measure too little to tell: left out, the
            # search goes on with configs that fit (a larger batch's probes are longer) until a
            # few in a row did not
            self.squeezed += 1
            self.squeezed_keys.add(key)
            short = (f"under the ~{least_s:.0f} s its probe needs to measure at all"
                     if least_s > SQUEEZE_LEAST * need_s else
                     f"under half the ~{need_s:.0f} s its probe takes")
            beside = " beside the confirmation" if reserved else ""
            why = f"not probed: {max(left, 0):.0f} s of the budget is left{beside}, {short}"
            self.prober.tell(Note.info(f"{label} {knobs_text(cfg)}: {why}"))
            if self.squeezed >= SQUEEZE_STREAK:
                self.stop_reason = StopReason(Stop.BUDGET, reserved=reserved)
                self.handle.stop()
            raise studies.NotComparable(why)
        self.squeezed = 0
        left = max(fitting.MIN_PROBE_S, left)
        if left < spec.max_s:
            spec = self.prober.spec(self.state, knobs, instances, label, max_s=left)
        return spec, until

    def _answer(self, trial, cfg, key, label, result, reported) -> float | list[float]:
        """A probe's result as the trial's answer: recorded, then its value (pruned, spoiled or
        not comparable: raised as the study ends such a trial)."""
        a = self.answers
        studies.write(trial, TrialAttrs(samples_per_s=result.samples_per_s,
                                        ci_half=result.ci_half, reason=result.reason,
                                        probe_s=result.duration_s))
        studies.record_outcome(trial, result.outcome)
        studies.write(trial, TrialAttrs(energy=result.energy and result.energy.to_dict()))
        if result.noise is not None:
            studies.write(trial, TrialAttrs(noise=result.noise.to_dict()))
            a.noises.append(result.noise)
        if result.outcome == Outcome.FOREIGN_LOAD:
            a.feed(trial.number, None)
            raise studies.NotComparable(result.reason)
        value = result.samples_per_s
        if result.outcome == Outcome.PRUNED:
            value = result.samples_per_s or (reported[-1] if reported else 0.0)
        known = Known(trial.number, result.outcome, value, result.ci_half, dict(cfg),
                      result.energy, result.duration_s)
        a.known[key] = known
        score = a.score(known)
        studies.write(trial, TrialAttrs(score_ci_half=score.ci_half))
        a.feed(trial.number, score.value if known.outcome.usable else None)
        if known.outcome == Outcome.PRUNED:
            self.prober.emit(Event.TRIAL_PRUNED, trial=label, number=trial.number,
                             reason=result.reason)
            raise studies.TrialPruned(result.reason)
        if known.infeasible:
            if known.outcome == Outcome.OOM:
                a.ooms.append(dict(cfg))
            self.prober.tell(Note.warning(f"{label} {knobs_text(cfg)}: {result.outcome.value}: "
                                          f"{result.reason} (log: {result.log_path})"))
            return self.scorer.failed()
        values = self.scorer.values(score)
        if values is None:  # not comparable on energy: left out, as a spoiled probe is
            raise studies.NotComparable(f"no energy reading: "
                                        f"{objective.energy_why(result.energy)}")
        return values

    # -- after each trial: what to queue, when to stop -------------------------------------------
    def _after_trial(self, study, frozen) -> None:
        self.queue.combine()
        self._maybe_repeat()  # first: the walk's room depends on the rounds its spread plans
        self._tell_rounds()
        if self.queue.walk(self.squeezed_keys):
            self.stop_reason = StopReason(Stop.BUDGET, reserved=True)
            self.handle.stop()
        self.queue.release_smaller()
        reason = self._stop_reason()
        if reason is not None:
            self.stop_reason = reason
            study.stop()

    # -- the spread between processes ------------------------------------------------------------
    def _maybe_repeat(self) -> None:
        """After the first two search probes (by then what probes really cost, and so the
        plan, is known), the script's own config once more in a new process: the spread
        between processes (`autotune.tuning.spread`), which the pruning margin, a one-round
        speed-up and the confirmation's planned rounds (`Budget.planned_rounds`) use from then
        on. Under a budget it comes at once after a first gain that processes alike would show
        in fewer rounds (`Budget.repeat_may_save_a_round`). Otherwise not taken when the search
        expects too few configs for one probe to be worth it; that is said, and the assumed
        figure stands."""
        sp = self.space
        pending = self.state.learned.spread
        if pending is None or not pending.pending:
            return
        early = self.budget.repeat_may_save_a_round()
        if self.answers.measured < REPEAT_AFTER and early is None:
            return
        why = self._repeat_not_worth(early)
        if why:
            self._keep_spread(dataclasses.replace(pending, why=why))
            return
        knobs, instances = sp.trial_knobs(sp.baseline)
        spec = self.prober.spec(self.state, knobs, instances, "baseline-again")
        self.prober.tell(Note.info(
            "measuring the script's own config again in a new process: the spread between "
            "processes" + (f", which decides whether {early[1]} confirmation "
                           f"round{'s' if early[1] > 1 else ''} can show the {early[0] - 1:+.1%} "
                           f"the search measured" if early else "")))
        learned, result = self.prober.probe(self.state, spec, label="baseline-again",
                                            number=None, cfg=dict(sp.baseline))
        self._keep(learned=learned.learned)
        if not result.ok:
            self._keep_spread(dataclasses.replace(
                pending, why=f"the second probe gave no figure ({result.outcome.value}: "
                             f"{result.reason})"))
            return
        self._keep_spread(spread.measure(pending.first, spread.Side.of(result)))

    def _repeat_not_worth(self, early) -> str:
        """Why the second process of the script's config is not worth its probe ("": it is):
        too few probes left after it, by --trials or by the budget (unless it comes ``early``)."""
        s, sp, measured = self.settings, self.space, self.answers.measured
        if s.max_trials is not None and not spread.worth_repeating(s.max_trials - measured):
            return f"--trials {s.max_trials} leaves too few probes to spend one on it"
        if s.budget_s is not None and early is None:
            probe_s = self.prober.probe_s(self.state, *sp.trial_knobs(sp.baseline))
            expect = budget_plan(self.prober, self.state,
                                 s.budget_s - self.elapsed() - probe_s).probes
            if not spread.worth_repeating(expect):
                return (f"the budget left holds {expect} more search probe(s), too few to spend "
                        f"one on it")
        return ""

    def _tell_rounds(self) -> None:
        """Say when the rounds kept for the confirmation rise above those asked
        (`Budget.planned_rounds`), each time their number changes."""
        s = self.settings
        n = self.budget.planned_rounds()
        if n <= s.confirm_rounds or n == self.told_rounds:
            return
        self.told_rounds = n
        best, measured = self.budget.best_gain(), self.state.learned.spread
        self.prober.tell(Note.info(
            f"the search's best measured {best[0] - 1:+.1%}; at the spread between processes of "
            f"±{measured.planning_rel():.1%}, about {n} confirmation rounds show it, so the budget "
            f"keeps time for {n} (more than --confirm-rounds {s.confirm_rounds}, at most "
            f"{confirm_plan.NEEDED_SHARE:.0%} of it) before the search goes on"))

    def _keep_spread(self, measured: spread.ProcessSpread) -> None:
        self._keep(learned=dataclasses.replace(self.state.learned, spread=measured))
        self.state = self.prober.note(self.state, Note.info(f"noise: {measured.text()}"))
        self.save(self.state)
        self._use_spread()
        if measured.measured:
            self.queue.requeue_misjudged()

    def _use_spread(self) -> None:
        """The pruning margin from the measured spread between processes, where there is one,
        and the script's own config at the mean of its two processes
        (`Answers.pool_baseline`)."""
        measured = self.state.learned.spread
        if measured is not None and measured.measured:
            self.handle.pruner.margin_rel = measured.margin_rel()
            self.answers.pool_baseline(measured, self.handle.pruner.revised)

    def _stop_reason(self, *, look_again: bool = True) -> StopReason | None:
        """Why the search stops now, or None. Under a budget, a space measured or a sampler
        that proposes only configs measured first takes a second look at a pruned config
        (`StudyQueue.second_look`; not with ``look_again`` False: a finished search read back)."""
        s, a = self.settings, self.answers
        if s.max_trials is not None and a.measured + 1 >= s.max_trials:
            return StopReason(Stop.TRIALS, count=s.max_trials)
        if s.budget_s is not None:
            reserve = self.budget.reserve_s()
            if self.elapsed() + self.budget.cheapest_left_s() + reserve > s.budget_s:
                return StopReason(Stop.BUDGET, reserved=bool(reserve))
        answered = len(a.known) + (a.blocked_count() if a.ooms else 0)
        ended = StopReason(Stop.EXHAUSTED, count=self.size) if answered >= self.size else \
            StopReason(Stop.DUPLICATES) if a.duplicate_streak >= DUPLICATE_STREAK else None
        if ended is not None:
            if look_again and self.queue.second_look():
                a.duplicate_streak = 0
                return None
            return ended
        young = s.budget_s is not None and self.elapsed() < CONVERGE_AFTER_SHARE * s.budget_s
        c = a.convergence
        if c.since_best >= c.patience and c.seen >= c.min_trials and not young:
            return StopReason(Stop.CONVERGED, count=c.patience, rel=c.rel)
        return None
