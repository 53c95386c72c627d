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
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autotune import AutotuneError, Note
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from autotune.measuring.series import Source
from autotune.tuning import (confirm, confirm_rounds, decision, fitting, objective,
                             queue_policy, spread)
from autotune.tuning import study as studies
from autotune.tuning.prober import Prober
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


def budget_plan(prober: Prober, state: TuneState, left_s: float) -> fitting.Plan:
    """What ``left_s`` of the budget holds after the baseline (`fitting.plan`), the
    confirmation measuring the best and the baseline (`confirm.essential`)."""
    probe_s = prober.typical_s(state)
    return fitting.plan(left_s, state.settings.budget_s, probe_s,
                        confirm_rounds=max(1, state.settings.confirm_rounds),
                        confirm_probe_s=prober.confirm_probe_s(state, probe_s),
                        entries=fitting.ESSENTIAL_ENTRIES)


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
    """One run's search over ``state.space`` (measured baseline included) in ``handle``.

    ``elapsed`` gives the run's time spent so far (earlier controllers included); ``save``
    keeps each new state (what is queued in the study, what each probe taught) before the
    search goes on. ``scorer``
    turns a measured config into the study's value (throughput unless given).
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
        self.known: dict[tuple, Known] = {}
        self.ooms: list[dict] = []
        self.measured = 0
        self.duplicate_streak = 0
        self.convergence = decision.Convergence()
        self.fed: list[tuple[int | None, float | None]] = []  # (trial, value) as convergence saw
        self.stop_reason: StopReason | None = None
        self.source = state.baseline.source
        self.learned: set[int] = set()  # study trials whose answer is in `known`
        self.scorer = scorer or objective.Scorer(self.settings.objective)
        self.noises: list[NoiseEstimate] = []
        self.squeezed = 0  # configs in a row the budget left no room to probe
        self.squeezed_keys: set[tuple] = set()  # configs the budget left out
        self.told_rounds = 0  # the rounds above those asked last said to be kept (`_tell_rounds`)

    def run(self) -> SearchResult:
        self._enqueue_start()
        self._rebuild()
        self._use_spread()  # a resumed run's: after `_rebuild`, which knows the baseline
        self.stop_reason = self._stop_reason()
        if self.stop_reason is None:
            self.handle.optimize(self._objective, [self._after_trial])
        return SearchResult(dict(self.known), self.measured, self.stop_reason, self.source,
                            self.state, tuple(self.noises))

    def settled(self) -> SearchResult:
        """What a finished search found, without a probe more (a finished tuning's
        confirmation extended: ``tune --resume RUN --confirm-rounds N``)."""
        self._rebuild()
        self._use_spread()
        return SearchResult(dict(self.known), self.measured, self._stop_reason(), self.source,
                            self.state, tuple(self.noises))

    def _feed(self, number: int | None, value: float | None) -> None:
        """One measured probe's score to the convergence rule, kept so that a revised figure
        (`_pool_baseline`) can be fed again in its place."""
        self.fed.append((number, value))
        self.convergence.update(value)

    def _score(self, k: Known) -> objective.Score:
        return self.scorer.score(k.value, k.ci_half, k.cfg, k.energy)

    def _keep(self, **changes) -> None:
        self.state = dataclasses.replace(self.state, **changes)
        self.save(self.state)

    # -- what the study already knows -----------------------------------------------------------
    def _enqueue_start(self) -> None:
        """A fresh run first measures the baseline, a warm start, then the initial design."""
        sp = self.space
        fresh = not any(t.user_attrs.get("run") == self.run_id for t in self.handle.trials())
        if not fresh or self.state.enqueued:
            return
        self.handle.enqueue(sp.choice_from_config(sp.baseline), {"baseline": True})
        ranks = self.state.ranks_probe
        if ranks:  # measured already: in the study from the start, whatever the budget leaves
            choice = sp.choice_from_config(ranks.knobs)
            cfg = sp.config({n: sp.domains[n][i] for n, i in choice.items()})
            score = self.scorer.score(ranks.samples_per_s, ranks.ci_half, cfg, ranks.energy)
            value = self.scorer.values(score)
            if sp.key(cfg) == sp.key(ranks.knobs) and value is not None:  # in the space
                self.handle.add_answered(
                    choice, {n: len(sp.domains[n]) for n in choice}, value,
                    {"run": self.run_id, "knobs": cfg, "ranks_probe": True,
                     **studies.outcome_attrs(Outcome.OK), "samples_per_s": ranks.samples_per_s,
                     "ci_half": ranks.ci_half, "energy": ranks.energy and ranks.energy.to_dict(),
                     "score_ci_half": score.ci_half})
        if self.state.warm_start:
            self.handle.enqueue(sp.choice_from_config(self.state.warm_start), {"warm_start": True})
        start = queue_policy.start(sp, self._parts())
        for q in start.queued:
            self.handle.enqueue(sp.choice_from_config(q.cfg), {"design": q.design})
        for note in start.notes:
            self.prober.tell(Note.info(note))
        self._keep(enqueued=True)

    def _parts(self):
        """The baseline's breakdown (`autotune.measuring.breakdown.Breakdown`), or None."""
        return self.state.baseline.breakdown if self.state.baseline is not None else None

    def _maybe_release_smaller(self) -> None:
        """The smaller batch neighbour's hold settled (`queue_policy.release_smaller`)."""
        if self.state.smaller_settled:
            return
        settle = queue_policy.release_smaller(
            self.space, self._parts(), self.known, self.ooms, self._score,
            margin_rel=self.handle.pruner.margin_rel, in_study=self._in_study)
        if settle is None:
            return
        if settle.queued is not None:
            self._queue(settle.queued)
        elif settle.note:
            self.prober.tell(Note.info(settle.note))
        self._keep(smaller_settled=True)

    def _release_held(self) -> None:
        """The held-back configs queued (`queue_policy.release_held`) once the batch walk has
        nowhere to go and the initial design is measured."""
        if self.handle.trials(states=(studies.TrialState.WAITING,)):
            return
        for q in queue_policy.release_held(self.space, self._parts(),
                                           smaller_settled=self.state.smaller_settled,
                                           in_study=self._in_study):
            self._queue(q)

    def _queue(self, q: queue_policy.Queued) -> None:
        """Queue what the policy chose, and say why."""
        self.handle.enqueue(self.space.choice_from_config(q.cfg), {"design": q.design})
        if q.note:
            self.prober.tell(Note.info(q.note))

    def _in_study(self) -> set:
        """The config keys of every trial of the study, queued, running or finished."""
        return {self._key_of(t) for t in self.handle.trials()}

    def _rebuild(self) -> None:
        """What the study already knows (a resumed run): no finished trial is measured again."""
        for t in self.handle.trials():
            key = self._learn(t)
            if key is not None and not t.user_attrs.get("baseline"):
                self.measured += 1
                k = self.known[key]
                self._feed(k.number, self._score(k).value if k.outcome.usable else None)

    def _learn_from_others(self) -> None:
        """Answers other tuners sharing the storage found since: not measured here again."""
        for t in self.handle.trials():
            if t.number not in self.learned and t.user_attrs.get("run") != self.run_id:
                self._learn(t)

    def _wait_for_others(self, number: int, key: tuple) -> None:
        """Another tuner sharing the study already measures this config (an earlier trial, still
        running): wait for its answer rather than measure it twice. Its tuner killed, the trial
        goes stale and fails, and this one measures it."""
        clock = self.prober.clock
        deadline = clock.monotonic() + WAIT_FOR_OTHERS_S
        while clock.monotonic() < deadline:
            running = [t for t in self.handle.trials(states=(studies.TrialState.RUNNING,))
                       if t.number < number and t.user_attrs.get("run") != self.run_id
                       and self._key_of(t) == key]
            if not running:
                break
            clock.sleep(1.0)
            self.handle.fail_stale()
        self._learn_from_others()

    def _key_of(self, t) -> tuple | None:
        """The config key of a trial of the study, running or not; None when it has no config
        yet (a sampled trial before its suggestions)."""
        cfg = t.user_attrs.get("knobs")
        if cfg is None:
            params = self.handle.fixed_params(t)
            if not all(n in params for n in self.space.names):
                return None
            try:
                cfg = self.space.config({n: self.space.domains[n][int(params[n])]
                                         for n in self.space.names})
            except (IndexError, ValueError, TypeError):
                return None
        return self.space.key(cfg)

    def _learn(self, t) -> tuple | None:
        """Take a finished trial's answer into `known`; its key, or None when it has none."""
        if not t.state.is_finished():
            return None  # still running (here or in another tuner): not an answer yet
        self.learned.add(t.number)
        noise = NoiseEstimate.from_dict(t.user_attrs.get("noise"))
        if noise is not None:  # a resumed run (or another tuner) measured B_noise
            self.noises.append(noise)
        known = Known.of_trial(t)
        if known is None:
            return None
        key = self.space.key(known.cfg)
        self.known[key] = known
        if known.outcome == Outcome.OOM:
            self.ooms.append(dict(known.cfg))
        return key

    # -- one trial ------------------------------------------------------------------------------
    def _objective(self, trial: studies.Trial) -> float | list[float]:
        """The trial's value: its score (`objective.Scorer.values`; two for two objectives)."""
        sp = self.space
        trial.set_user_attr("run", self.run_id)
        choice = {n: sp.domains[n][trial.suggest_int(n, 0, len(sp.domains[n]) - 1)]
                  for n in sp.names}
        cfg = sp.config(choice)
        key = sp.key(cfg)
        trial.set_user_attr("knobs", cfg)
        if key not in self.known:
            self._learn_from_others()
        if key not in self.known:
            self._wait_for_others(trial.number, key)
        label = f"trial-{trial.number}"
        if key == sp.key(sp.baseline) and key not in self.known:
            return self._record_baseline(trial, cfg)
        if key in self.known:
            return self._replay(trial, self.known[key])
        blocker = decision.oom_blocks(cfg, self.ooms)
        if blocker is not None:
            self.duplicate_streak += 1
            studies.record_outcome(trial, Outcome.OOM, not_tried=True)
            reason = (f"not tried: batch_size {cfg.get('batch_size')} with "
                      f"{cfg.get('instances', 1)} ranks is at or above one that ran out of "
                      f"memory ({blocker.get('batch_size')})")
            self.prober.emit(Event.TRIAL_STARTED, trial=label, number=trial.number, knobs=cfg,
                             mode=Mode.FULL)
            self.prober.emit(Event.TRIAL_PRUNED, trial=label, number=trial.number, reason=reason)
            return self.scorer.failed()
        self.duplicate_streak = 0
        return self._measure(trial, cfg, key, label)

    def _record_baseline(self, trial, cfg) -> float | list[float]:
        b = self.state.baseline
        known = Known(trial.number, Outcome.OK, b.samples_per_s, b.ci_half, dict(cfg), b.energy)
        score = self._score(known)
        trial.set_user_attr("baseline", True)
        studies.record_outcome(trial, Outcome.OK)
        trial.set_user_attr("samples_per_s", b.samples_per_s)
        trial.set_user_attr("ci_half", b.ci_half)
        trial.set_user_attr("energy", b.energy and b.energy.to_dict())
        trial.set_user_attr("score_ci_half", score.ci_half)
        value = self.scorer.values(score)
        if value is None:  # the tuner checks the baseline's energy before the search
            raise AutotuneError(f"the baseline has no energy reading: "
                                f"{objective.energy_why(b.energy)}")
        self.known[self.space.key(cfg)] = known
        self._feed(trial.number, score.value)
        return value

    def _replay(self, trial, known: Known) -> float | list[float]:
        """A config already answered: the same answer, without a probe."""
        self.duplicate_streak += 1
        trial.set_user_attr("duplicate_of", known.number)
        studies.record_outcome(trial, known.outcome)
        score = self._score(known)
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

        knobs, instances = self.space.trial_knobs(cfg)
        spec = self.prober.spec(self.state, knobs, instances, label)
        if self.settings.budget_s is not None and not self.settings.seconds:
            # a config longer than the typical one ends where the budget's search part does
            left, need_s = self._room(cfg)
            least_s = self.prober.least_s(self.state, knobs, instances)
            if left < max(SQUEEZE_LEAST * need_s, least_s):
                # it would end before it measured, or measure too little to tell: left out, the
                # search goes on with configs that fit (a larger batch's probes are longer)
                # until a few in a row did not
                self.squeezed += 1
                self.squeezed_keys.add(key)
                short = (f"under the ~{least_s:.0f} s its probe needs to measure at all"
                         if least_s > SQUEEZE_LEAST * need_s else
                         f"under half the ~{need_s:.0f} s its probe takes")
                why = (f"not probed: {max(left, 0):.0f} s of the budget is left beside the "
                       f"confirmation, {short}")
                self.prober.tell(Note.info(f"{label} {knobs_text(cfg)}: {why}"))
                if self.squeezed >= SQUEEZE_STREAK:
                    self.stop_reason = StopReason(Stop.BUDGET, reserved=True)
                    self.handle.stop()
                raise studies.NotComparable(why)
            self.squeezed = 0
            left = max(fitting.MIN_PROBE_S, left)
            if left < spec.max_s:
                spec = self.prober.spec(self.state, knobs, instances, label, max_s=left)
        try:
            learned, result = self.prober.probe(self.state, spec, label=label,
                                                number=trial.number, cfg=cfg,
                                                on_progress=on_progress)
        except (KeyboardInterrupt, AutotuneError):  # Ctrl-C, a write that failed: retried
            trial.set_user_attr("interrupted", True)  # by --resume (a storage that fails
            raise  # here leaves it RUNNING: retried alike)
        self._keep(learned=learned.learned)
        self.measured += 1
        if not self.source and result.ok:
            self.source = result.source
        trial.set_user_attr("samples_per_s", result.samples_per_s)
        trial.set_user_attr("ci_half", result.ci_half)
        trial.set_user_attr("reason", result.reason)
        trial.set_user_attr("probe_s", result.duration_s)
        studies.record_outcome(trial, result.outcome)
        trial.set_user_attr("energy", result.energy and result.energy.to_dict())
        if result.noise is not None:
            trial.set_user_attr("noise", result.noise.to_dict())
            self.noises.append(result.noise)
        if result.outcome == Outcome.FOREIGN_LOAD:
            self._feed(trial.number, None)
            raise studies.NotComparable(result.reason)
        value = result.samples_per_s
        if result.outcome == Outcome.PRUNED:
            value = result.samples_per_s or (reported[-1] if reported else 0.0)
        known = Known(trial.number, result.outcome, value, result.ci_half, dict(cfg),
                      result.energy, result.duration_s)
        self.known[key] = known
        score = self._score(known)
        trial.set_user_attr("score_ci_half", score.ci_half)
        self._feed(trial.number, score.value if known.outcome.usable else None)
        if known.outcome == Outcome.PRUNED:
            self.prober.emit(Event.TRIAL_PRUNED, trial=label, number=trial.number,
                             reason=result.reason)
            raise studies.TrialPruned(result.reason)
        if known.infeasible:
            if known.outcome == Outcome.OOM:
                self.ooms.append(dict(cfg))
            self.prober.tell(Note.warning(f"{label} {knobs_text(cfg)}: {result.outcome.value}: "
                                          f"{result.reason} (log: {result.log_path})"))
            return self.scorer.failed()
        values = self.scorer.values(score)
        if values is None:  # not comparable on energy: left out, as a spoiled probe is
            raise studies.NotComparable(f"no energy reading: "
                                        f"{objective.energy_why(result.energy)}")
        return values

    # -- when to stop ---------------------------------------------------------------------------
    def _after_trial(self, study, frozen) -> None:
        self._maybe_combine()
        self._maybe_repeat()  # first: the walk's room depends on the rounds its spread plans
        self._tell_rounds()
        self._maybe_walk()
        self._maybe_release_smaller()
        reason = self._stop_reason()
        if reason is not None:
            self.stop_reason = reason
            study.stop()

    def _maybe_walk(self) -> None:
        """One more per-rank batch along the baseline's line (`queue_policy.walk`), queued next
        unless it is queued already; the held-back moves once the walk has nowhere to go."""
        sp = self.space
        if "batch_size" not in sp.domains:
            return
        rates = self.settings.objective.kinds == (objective.Kind.THROUGHPUT,)
        q = queue_policy.walk(sp, self.known, self.ooms, self._score, rates=rates,
                              blocked=self._walk_blocks)
        if q is None:
            self._release_held()
            return
        key = sp.key(q.cfg)
        if key in self.squeezed_keys:
            # the walk's next batch, the move most likely to pay, does not fit beside the
            # confirmation (its note said so): the rest of the budget is the confirmation's.
            # Queued again, it would be left out again, once per proposal, until the streak.
            self.stop_reason = StopReason(Stop.BUDGET, reserved=True)
            self.handle.stop()
            return
        waiting = self.handle.trials(states=(studies.TrialState.WAITING,))
        if any(self._key_of(t) == key for t in waiting):
            return
        self._queue(q)

    def _walk_blocks(self, batch: int) -> bool:
        """Whether a batch walk's jump may not land on ``batch`` (the baseline's other knobs):
        at or above one that ran out of memory, or, under a budget, a probe longer than what
        the budget left beside the confirmation holds (a larger batch's probe is longer; cut
        short, it measures nothing)."""
        sp, s = self.space, self.settings
        cfg = sp.config({**sp.baseline, "batch_size": batch})
        if decision.oom_blocks(cfg, self.ooms) is not None:
            return True
        if s.budget_s is None or s.seconds:
            return False
        left, need_s = self._room(cfg)
        return left < need_s

    def _room(self, cfg: Mapping[str, int]) -> tuple[float, float]:
        """Under a budget: what is left of it beside the confirmation's reserve should ``cfg``
        join the candidates, and what a probe of ``cfg`` takes (s)."""
        left = self.settings.budget_s - self.elapsed() - self._reserve_s(cfg)
        return left, self.prober.probe_s(self.state, *self.space.trial_knobs(cfg))

    # -- the spread between processes ------------------------------------------------------------
    def _maybe_repeat(self) -> None:
        """After the first two search probes (by then what probes really cost, and so the
        plan, is known), the script's own config once more in a new process: the spread
        between processes (`autotune.tuning.spread`), which the pruning margin, a one-round
        speed-up and the confirmation's planned rounds (`_planned_rounds`) use from then on.
        Under a budget it comes at once after a first gain that processes alike would show in
        fewer rounds (`_repeat_may_save_a_round`). Otherwise not taken when the search expects
        too few configs for one probe to be worth it; that is said, and the assumed figure
        stands."""
        s, sp = self.settings, self.space
        pending = self.state.learned.spread
        if pending is None or not pending.pending:
            return
        early = self._repeat_may_save_a_round()
        if self.measured < REPEAT_AFTER and early is None:
            return
        probe_s = self.prober.probe_s(self.state, *sp.trial_knobs(sp.baseline))
        why = ""
        if s.max_trials is not None and not spread.worth_repeating(s.max_trials - self.measured):
            why = f"--trials {s.max_trials} leaves too few probes to spend one on it"
        elif s.budget_s is not None and early is None:
            expect = budget_plan(self.prober, self.state,
                                 s.budget_s - self.elapsed() - probe_s).probes
            if not spread.worth_repeating(expect):
                why = (f"the budget left holds {expect} more search probe(s), too few to spend "
                       f"one on it")
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

    def _best_gain(self) -> tuple[float, float] | None:
        """The search's best config over the script's own, by score: (speed-up, the two
        figures' own relative intervals together); None while no config beats it."""
        sp = self.space
        top = confirm.best(sp, self.known, self.scorer, 1)
        base = self.known.get(sp.key(sp.baseline))
        if not top or base is None:
            return None
        b, t = self._score(base), self._score(top[0])
        if not b.value or t.value is None or t.value <= b.value:
            return None
        return decision.gain_of(t.value, t.ci_half, b.value, b.ci_half)

    def _planned_rounds(self) -> int:
        """The confirmation rounds the budget keeps time for: those asked (``--confirm-rounds``),
        unless the spread between processes is measured and another number would show the
        search's best gain beyond doubt (`decision.rounds_planned`, at the spread a round's
        ratio is planned with: `spread.ProcessSpread.planning_rel`; the confirmation itself
        still decides on its rounds, and time left over buys more):
        - fewer, down to `decision.MIN_ROUNDS`: minGPT's shape moves ~1% between processes,
          two rounds show its +32%, and the third round's ~70 s is a probe of the batch the
          walk goes to next;
        - one, for a gain that even the spread's upper bound from its one pair cannot
          explain (`spread.ProcessSpread.upper_rel`, `decision.rounds_planned`): the round
          then decides alone (`confirm_rounds.one_round_rel`), and time left over still buys more;
        - under a budget, more, up to `fitting.MAX_CONFIRM_ROUNDS` (and `fitting.NEEDED_SHARE`
          of the budget: `_reserve_of`): a gain found is worth showing before the search goes
          on for another. None are added for a gain that even those cannot show (the search
          may yet find a larger one, which fewer rounds would show)."""
        s = self.settings
        measured = self.state.learned.spread
        best = self._best_gain()
        if best is None or measured is None or not measured.measured:
            return s.confirm_rounds
        n = decision.rounds_planned(best[0], measured.planning_rel(), best[1], 1,
                                    one_round_rel=measured.upper_rel())
        if n is None:
            return s.confirm_rounds
        if n > s.confirm_rounds:
            more = s.budget_s is not None and s.confirm_rounds > 0 and \
                n <= fitting.MAX_CONFIRM_ROUNDS
            return n if more else s.confirm_rounds
        return min(s.confirm_rounds, n)

    def _tell_rounds(self) -> None:
        """Say when the rounds kept for the confirmation rise above those asked
        (`_planned_rounds`), each time their number changes."""
        s = self.settings
        n = self._planned_rounds()
        if n <= s.confirm_rounds or n == self.told_rounds:
            return
        self.told_rounds = n
        best, measured = self._best_gain(), self.state.learned.spread
        self.prober.tell(Note.info(
            f"the search's best measured {best[0] - 1:+.1%}; at the spread between processes of "
            f"±{measured.planning_rel():.1%}, about {n} confirmation rounds show it, so the budget "
            f"keeps time for {n} (more than --confirm-rounds {s.confirm_rounds}, at most "
            f"{fitting.NEEDED_SHARE:.0%} of it) before the search goes on"))

    def _repeat_may_save_a_round(self) -> tuple[float, int] | None:
        """Under a budget, once the search's best beats the script's config beyond the pruning
        margin: that gain and the rounds that would show it were processes as alike as
        `spread.BETWEEN_FLOOR`, when those are fewer than the budget plans for
        (`_planned_rounds`), so that the spread, measured now, may free a round for the search;
        None otherwise."""
        s = self.settings
        best = self._best_gain()
        if s.budget_s is None or best is None or s.confirm_rounds <= 1 or \
                best[0] - 1 <= self.handle.pruner.margin_rel:
            return None
        n = decision.rounds_planned(best[0], spread.BETWEEN_FLOOR, best[1], 1,
                                    one_round_rel=spread.upper_rel([spread.BETWEEN_FLOOR]))
        if n is None or n >= s.confirm_rounds:
            return None
        # it pays for itself only if, the rounds cut, the search still has room for a probe
        sp = self.space
        repeat_s = self.prober.probe_s(self.state, *sp.trial_knobs(sp.baseline))
        left = s.budget_s - self.elapsed() - repeat_s - self._reserve_s() * n / s.confirm_rounds
        return (best[0], n) if left >= self.prober.typical_s(self.state) else None

    def _keep_spread(self, measured: spread.ProcessSpread) -> None:
        self._keep(learned=dataclasses.replace(self.state.learned, spread=measured))
        self.state = self.prober.note(self.state, Note.info(f"noise: {measured.text()}"))
        self.save(self.state)
        self._use_spread()
        if measured.measured:
            self._requeue_misjudged()

    def _requeue_misjudged(self) -> None:
        """The moves pruned before the spread between processes was measured that it shows
        misjudged (`queue_policy.misjudged`), queued once more."""
        if not self.handle.prunes:
            return
        pruner = self.handle.pruner
        floor = studies.best_floor(self.handle.trials(states=(studies.TrialState.COMPLETE,)),
                                   pruner.revised)
        waiting = {self._key_of(t) for t in self.handle.trials()
                   if t.state == studies.TrialState.WAITING}
        counts: dict[tuple | None, int] = {}
        for t in self.handle.trials():
            key = self._key_of(t)
            counts[key] = counts.get(key, 0) + 1
        for q in queue_policy.misjudged(self.space, self.known, self._score, floor=floor,
                                        margin_rel=pruner.margin_rel, counts=counts,
                                        waiting=waiting):
            del self.known[self.space.key(q.cfg)]
            self._queue(q)

    def _use_spread(self) -> None:
        """The pruning margin from the measured spread between processes, where there is one,
        and the script's own config at the mean of its two processes (`_pool_baseline`)."""
        measured = self.state.learned.spread
        if measured is not None and measured.measured:
            self.handle.pruner.margin_rel = measured.margin_rel()
            self._pool_baseline(measured)

    def _pool_baseline(self, measured: spread.ProcessSpread) -> None:
        """From its second process on, the script's own config stands at the mean of its two
        figures wherever the search judges a move against it: the batch walk, the joined moves,
        the confirmation's candidates and the pruner's bar. Its interval is at least half
        their difference: two processes cannot say more. (The study keeps the first figure as
        the trial's value, which Optuna never changes; its sampler sees that one.) A first
        figure that was a lucky high no longer hides a real gain: nanoGPT's shape read 202.6
        then 179.0 samples/s, and a move 5% above their mean stood 1% below the first."""
        key = self.space.key(self.space.baseline)
        k = self.known.get(key)
        if k is None or measured.first is None or measured.second is None:
            return
        a, b = measured.first, measured.second
        value = (a.samples_per_s + b.samples_per_s) / 2
        ci_half = max(math.hypot(a.ci_half, b.ci_half) / 2,
                      abs(a.samples_per_s - b.samples_per_s) / 2)
        pooled = dataclasses.replace(k, value=value, ci_half=ci_half)
        self.known[key] = pooled
        score = self._score(pooled)
        self.handle.pruner.revised[k.number] = score.value - score.ci_half
        # the convergence rule counts gains over the mean too: nanoGPT's shape read its
        # baseline at 144.0 then 129.7, and a batch at 144.5 (+5.6% on the mean) counted as no
        # gain over the first; the search converged six probes in with most of its budget left
        self.convergence = decision.Convergence()
        self.fed = [(n, score.value if n == k.number else v) for n, v in self.fed]
        for _, v in self.fed:
            self.convergence.update(v)

    def _reserve_s(self, joining: Mapping[str, int] | None = None) -> float:
        """Time kept for the confirmation (`fitting.confirm_reserve`); none while no config but
        the baseline measured (nothing to confirm: the search may use it). With ``joining``,
        a config about to be probed: the most it keeps should that config become a candidate
        (its probes may be longer than the candidates' so far); the first config to be
        measured keeps nothing back, as there is nothing to confirm yet."""
        entries = confirm.candidates(self.space, self.known, self.scorer)
        if joining is not None and len(entries) >= 2:
            also = [entries[0], ("joining", dict(joining)), *entries[1:2]]  # as the best
            return max(self._reserve_of(entries), self._reserve_of(also))
        return self._reserve_of(entries)

    def _reserve_of(self, entries: list[tuple[str, dict]]) -> float:
        """All the confirmation's rounds of the `confirm.essential` ``entries`` (under a budget
        the runner-up is left out: `confirm.finish`) within its share of the budget, and at the
        least `decision.PLANNED_ROUNDS` rounds of them."""
        s = self.settings
        entries = confirm.essential(self.space, entries)  # what a budget confirms
        if len(entries) < 2 or s.confirm_rounds == 0:
            return 0.0
        cfgs = [c for _, c in entries]
        windows = confirm_rounds.probe_windows(self.prober, self.state, self.known, cfgs)
        floor = dict(zip((n for n, _ in entries), windows))
        one_round = sum(min(confirm_rounds.entry_probe_s(self.prober, self.state, self.known, c),
                            floor[n]) for n, c in entries)
        rounds = self._planned_rounds()
        share = fitting.NEEDED_SHARE if rounds > s.confirm_rounds else fitting.CONFIRM_SHARE
        return fitting.confirm_reserve(s.budget_s, rounds * sum(windows), one_round,
                                       rounds=rounds, share=share)

    def _stop_reason(self) -> StopReason | None:
        s = self.settings
        if s.max_trials is not None and self.measured + 1 >= s.max_trials:
            return StopReason(Stop.TRIALS, count=s.max_trials)
        if s.budget_s is not None:
            reserve = self._reserve_s()
            if self.elapsed() + self._cheapest_left_s() + reserve > s.budget_s:
                return StopReason(Stop.BUDGET, reserved=bool(reserve))
        answered = len(self.known) + (self._blocked_count() if self.ooms else 0)
        if answered >= self.size:
            return StopReason(Stop.EXHAUSTED, count=self.size)
        if self.duplicate_streak >= DUPLICATE_STREAK:
            return StopReason(Stop.DUPLICATES)
        young = s.budget_s is not None and self.elapsed() < CONVERGE_AFTER_SHARE * s.budget_s
        if self.convergence.since_best >= self.convergence.patience and \
                self.convergence.seen >= self.convergence.min_trials and not young:
            return StopReason(Stop.CONVERGED, count=self.convergence.patience,
                              rel=self.convergence.rel)
        return None

    def _cheapest_left_s(self) -> float:
        """The shortest probe a config not yet answered would take (`Prober.probe_s`), ruled
        out by an OOM or not; a typical probe when none is left. The stop rule weighs the
        budget against it: one config that does not fit is left out by itself (`_measure`),
        and a few in a row end the search. Weighed against the space's average probe, nanoGPT's
        shape stopped 152 s into 6m, with configs of ~15 s still fitting, once one probe of
        batch 96 at half the threads (54 s) had raised that average."""
        sp = self.space
        left = [c for c in sp.configs() if sp.key(c) not in self.known
                and not decision.oom_blocks(c, self.ooms)]
        if not left:
            return self.prober.typical_s(self.state)
        return min(self.prober.probe_s(self.state, *sp.trial_knobs(c)) for c in left)

    def _blocked_count(self) -> int:
        """Configs of the space ruled out by an OOM and not measured."""
        sp = self.space
        count = 0
        for cfg in sp.configs():
            if sp.key(cfg) not in self.known and decision.oom_blocks(cfg, self.ooms):
                count += 1
        return count

    def _maybe_combine(self) -> None:
        """Once every one-at-a-time probe is answered, the moves that paid off, joined, queued
        (`queue_policy.combine`)."""
        if self.state.combined:
            return
        answered, q = queue_policy.combine(self.space, self.known, self.ooms, self._score)
        if not answered:
            return
        if q is not None:
            self.handle.enqueue(self.space.choice_from_config(q.cfg), {"design": q.design})
        self._keep(combined=True)
