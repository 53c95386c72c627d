"""What the search's study holds and what it queues next: the queueing policy applied.

`StudyQueue` puts the run's first trials in the study (the baseline, the two-rank probe
already measured, a warm start, the initial design less what is held back) and, after each
trial, what the pure policy (`autotune.tuning.queue_policy`) says comes next: the batch walk,
the held-back moves, the joined moves, the moves misjudged before the spread between processes
was known. Which of these are settled is kept in the run's state (``enqueued``, ``combined``,
``smaller_settled``), so a resumed run queues nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable

from autotune import Note
from autotune.measuring.outcome import Outcome
from autotune.tuning import objective, queue_policy
from autotune.tuning import study as studies
from autotune.tuning.answers import Answers
from autotune.tuning.prober import Prober
from autotune.tuning.search_budget import Budget
from autotune.tuning.state import TuneState
from autotune.tuning.trial_attrs import TrialAttrs


class StudyQueue:
    """The queue of ``handle``'s study for the run ``run_id``; ``state`` gives the run's state
    as it is now, ``keep`` saves it with the changes given."""

    def __init__(self, prober: Prober, handle: studies.StudyHandle, answers: Answers,
                 budget: Budget, *, run_id: str, state: Callable[[], TuneState],
                 keep: Callable[..., None]):
        self.prober = prober
        self.handle = handle
        self.answers = answers
        self.budget = budget
        self.run_id = run_id
        self._state = state
        self.keep = keep

    @property
    def state(self) -> TuneState:
        return self._state()

    @property
    def space(self):
        return self.answers.space

    def start(self) -> None:
        """A fresh run first measures the baseline, a warm start, then the initial design."""
        sp = self.space
        fresh = not any(studies.attrs_of(t).run == self.run_id for t in self.handle.trials())
        if not fresh or self.state.enqueued:
            return
        self.handle.enqueue(sp.choice_from_config(sp.baseline), TrialAttrs(baseline=True))
        ranks = self.state.ranks_probe
        if ranks:  # measured already: in the study from the start, whatever the budget leaves
            choice = sp.choice_from_config(ranks.knobs)
            cfg = sp.config({n: sp.domains[n][i] for n, i in choice.items()})
            score = self.answers.scorer.score(ranks.samples_per_s, ranks.ci_half, cfg, ranks.energy)
            value = self.answers.scorer.values(score)
            if sp.key(cfg) == sp.key(ranks.knobs) and value is not None:  # in the space
                self.handle.add_answered(
                    choice, {n: len(sp.domains[n]) for n in choice}, value, TrialAttrs(
                        run=self.run_id, knobs=cfg, ranks_probe=True, outcome=Outcome.OK,
                        samples_per_s=ranks.samples_per_s, ci_half=ranks.ci_half,
                        energy=ranks.energy and ranks.energy.to_dict(),
                        score_ci_half=score.ci_half))
        if self.state.warm_start:
            self.handle.enqueue(sp.choice_from_config(self.state.warm_start),
                                TrialAttrs(warm_start=True))
        start = queue_policy.start(sp, self.parts())
        for q in start.queued:
            self.handle.enqueue(sp.choice_from_config(q.cfg), TrialAttrs(design=q.design))
        for note in start.notes:
            self.prober.tell(Note.info(note))
        self.keep(enqueued=True)

    def parts(self):
        """The baseline's breakdown (`autotune.measuring.breakdown.Breakdown`), or None."""
        return self.state.baseline.breakdown if self.state.baseline is not None else None

    def queue(self, q: queue_policy.Queued, *, say: bool = True) -> None:
        """Queue what the policy chose, and say why."""
        self.handle.enqueue(self.space.choice_from_config(q.cfg), TrialAttrs(design=q.design))
        if q.note and say:
            self.prober.tell(Note.info(q.note))

    def in_study(self) -> set:
        """The config keys of every trial of the study, queued, running or finished."""
        return {self.key_of(t) for t in self.handle.trials()}

    def key_of(self, t) -> tuple | None:
        """The config key of a trial of the study, running or not; None when it has no config
        yet (a sampled trial before its suggestions)."""
        cfg = studies.attrs_of(t).knobs
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

    def combine(self) -> None:
        """Once every one-at-a-time probe is answered, the moves that paid off, joined, queued
        (`queue_policy.combine`)."""
        if self.state.combined:
            return
        a = self.answers
        answered, q = queue_policy.combine(self.space, a.known, a.ooms, a.score)
        if not answered:
            return
        if q is not None:
            self.queue(q)
        self.keep(combined=True)

    def walk(self, squeezed_keys: set) -> bool:
        """One more per-rank batch along the baseline's line (`queue_policy.walk`), queued next
        unless it is queued already; the held-back moves once the walk has nowhere to go.
        True when the walk's next batch is one the budget left out (``squeezed_keys``): the
        move most likely to pay does not fit beside the confirmation (its note said so), so the
        rest of the budget is the confirmation's. Queued again, it would be left out again,
        once per proposal, until the streak."""
        sp, a = self.space, self.answers
        if "batch_size" not in sp.domains:
            return False
        rates = self.state.settings.objective.kinds == (objective.Kind.THROUGHPUT,)
        q = queue_policy.walk(sp, a.known, a.ooms, a.score, rates=rates,
                              blocked=self.budget.walk_blocks)
        if q is None:
            self.release_held()
            return False
        key = sp.key(q.cfg)
        if key in squeezed_keys:
            return True
        waiting = self.handle.trials(states=(studies.TrialState.WAITING,))
        if not any(self.key_of(t) == key for t in waiting):
            self.queue(q)
        return False

    def release_smaller(self) -> None:
        """The smaller batch neighbour's hold settled (`queue_policy.release_smaller`)."""
        if self.state.smaller_settled:
            return
        a = self.answers
        settle = queue_policy.release_smaller(
            self.space, self.parts(), a.known, a.ooms, a.score,
            margin_rel=self.handle.pruner.margin_rel, in_study=self.in_study)
        if settle is None:
            return
        if settle.queued is not None:
            self.queue(settle.queued, say=False)
        if settle.note:
            self.prober.tell(Note.info(settle.note))
        self.keep(smaller_settled=True)

    def release_held(self) -> None:
        """The held-back configs queued (`queue_policy.release_held`) once the batch walk has
        nowhere to go and the initial design is measured."""
        if self.handle.trials(states=(studies.TrialState.WAITING,)):
            return
        for q in queue_policy.release_held(self.space, self.parts(),
                                           smaller_settled=self.state.smaller_settled,
                                           in_study=self.in_study):
            self.queue(q)

    def counts(self) -> dict[tuple | None, int]:
        """How many trials of the study hold each config key, a replay of an answer already
        known (a duplicate the sampler proposed) left out: it measured nothing."""
        counts: dict[tuple | None, int] = {}
        for t in self.handle.trials():
            if studies.attrs_of(t).duplicate_of is not None:
                continue
            key = self.key_of(t)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def requeue_misjudged(self) -> None:
        """The moves pruned before the spread between processes was measured that it shows
        misjudged (`queue_policy.misjudged`), queued once more."""
        if not self.handle.prunes:
            return
        pruner = self.handle.pruner
        floor = studies.best_floor(self.handle.trials(states=(studies.TrialState.COMPLETE,)),
                                   pruner.revised)
        waiting = {self.key_of(t) for t in self.handle.trials()
                   if t.state == studies.TrialState.WAITING}
        for q in queue_policy.misjudged(self.space, self.answers.known, self.answers.score, floor=floor,
                                        margin_rel=pruner.margin_rel, counts=self.counts(),
                                        waiting=waiting):
            del self.answers.known[self.space.key(q.cfg)]
            self.queue(q)

    def second_look(self) -> bool:
        """Under a budget, with nothing queued, the pruned config nearest the best probed once
        more where the budget holds its probe (`queue_policy.second_look`); True when one was
        queued (the search goes on for it)."""
        if self.state.settings.budget_s is None or not self.handle.prunes or \
                self.handle.trials(states=(studies.TrialState.WAITING,)):
            return False
        pruner = self.handle.pruner
        floor = studies.best_floor(self.handle.trials(states=(studies.TrialState.COMPLETE,)),
                                   pruner.revised)

        def fits(cfg) -> bool:
            left, need_s = self.budget.room(cfg)
            return left >= need_s

        q = queue_policy.second_look(self.space, self.answers.known, self.answers.score,
                                     floor=floor, margin_rel=pruner.margin_rel,
                                     counts=self.counts(), fits=fits)
        if q is None:
            return False
        del self.answers.known[self.space.key(q.cfg)]
        self.queue(q)
        return True
