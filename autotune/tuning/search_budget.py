"""What a budget holds for the search beside the confirmation: its reserve, its rounds, the
room left for one more probe.

The search (`autotune.tuning.search`) asks `Budget` before each probe and after each trial:
how much time the confirmation keeps (`Budget.reserve_s`: the cost of the confirmation's plan,
`autotune.tuning.confirm_plan`, for the candidates so far), how many rounds that is
(`Budget.planned_rounds`: those asked, or as many as the spread between processes says would
show the search's best gain), whether
one more probe of a config fits (`Budget.room`), and the cheapest probe left (the stop rule).
It reads the search's `autotune.tuning.answers.Answers` and the run's state; it queues and
probes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from autotune.tuning import (confirm_entries, confirm_plan, confirm_rounds, decision,
                             search_rules, spread)
from autotune.tuning.answers import Answers
from autotune.tuning.prober import Prober
from autotune.tuning.records import TuneSettings
from autotune.tuning.state import TuneState


class Budget:
    """The search's time under its settings; ``state`` gives the run's state as it is now,
    ``elapsed`` the run's time spent so far, ``margin_rel`` the pruning margin now."""

    def __init__(self, prober: Prober, answers: Answers, *, state: Callable[[], TuneState],
                 elapsed: Callable[[], float], margin_rel: Callable[[], float]):
        self.prober = prober
        self.answers = answers
        self._state = state
        self.elapsed = elapsed
        self.margin_rel = margin_rel

    @property
    def state(self) -> TuneState:
        return self._state()

    @property
    def settings(self) -> TuneSettings:
        return self._state().settings

    @property
    def space(self):
        return self.answers.space

    def room(self, cfg: Mapping[str, int]) -> tuple[float, float]:
        """Under a budget: what is left of it beside the confirmation's reserve should ``cfg``
        join the candidates, and what a probe of ``cfg`` takes (s)."""
        need_s = self.prober.probe_s(self.state, *self.space.trial_knobs(cfg))
        return self.settings.budget_s - self.elapsed() - self.reserve_s(cfg, need_s), need_s

    def walk_blocks(self, batch: int) -> bool:
        """Whether a batch walk's jump may not land on ``batch`` (the baseline's other knobs):
        at or above one that ran out of memory, or, under a budget, a probe longer than what
        the budget left beside the confirmation holds (a larger batch's probe is longer; cut
        short, it measures nothing)."""
        sp, s = self.space, self.settings
        cfg = sp.config({**sp.baseline, "batch_size": batch})
        if search_rules.oom_blocks(cfg, self.answers.ooms) is not None:
            return True
        if s.budget_s is None or s.seconds:
            return False
        left, need_s = self.room(cfg)
        return left < need_s

    def best_scores(self) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """The search's best config and the script's own, by score: (value, 95% half-width)
        each; None while no config beats the script's."""
        sp, known = self.space, self.answers.known
        top = confirm_entries.best(sp, known, self.answers.scorer, 1)
        base = known.get(sp.key(sp.baseline))
        if not top or base is None:
            return None
        b, t = self.answers.score(base), self.answers.score(top[0])
        if not b.value or t.value is None or t.value <= b.value:
            return None
        return (t.value, t.ci_half), (b.value, b.ci_half)

    def best_gain(self) -> tuple[float, float] | None:
        """The search's best config over the script's own, by score: (speed-up, the two
        figures' own relative intervals together); None while no config beats it."""
        scores = self.best_scores()
        return None if scores is None else decision.gain_of(*scores[0], *scores[1])

    def planned_rounds(self) -> int:
        """The confirmation rounds the budget keeps time for (`confirm_plan.rounds_kept`):
        those asked (``--confirm-rounds``), unless the spread between processes is measured
        and another number would show the search's best gain beyond doubt
        (`confirm_plan.needed_rounds`, at the spread a round's ratio is planned with:
        `spread.ProcessSpread.planning_rel`; the confirmation itself still decides on its
        rounds, and time left over buys more):
        - fewer, down to `decision.MIN_ROUNDS`: minGPT's shape moves ~1% between processes,
          two rounds show its +32%, and the third round's ~70 s is a probe of the batch the
          walk goes to next;
        - one, for a gain that even the spread's upper bound from its one pair cannot
          explain (`spread.ProcessSpread.upper_rel`): the round then decides alone
          (`confirm_rounds.one_round_rel`), and time left over still buys more;
        - under a budget, more, up to `confirm_plan.MAX_CONFIRM_ROUNDS` (and
          `confirm_plan.NEEDED_SHARE` of the budget): a gain found is worth showing before the
          search goes on for another."""
        s = self.settings
        measured = self.state.learned.spread
        scores = self.best_scores()
        if scores is None or measured is None or not measured.measured:
            return s.confirm_rounds
        n, _ = confirm_plan.needed_rounds(*scores, measured.planning_rel(), 1,
                                          one_round_rel=measured.upper_rel(),
                                          prior_dof=len(measured.pair_logs()))
        return confirm_plan.rounds_kept(s.confirm_rounds, n, budgeted=s.budget_s is not None)

    def repeat_may_save_a_round(self) -> tuple[float, int] | None:
        """Under a budget, once the search's best beats the script's config beyond the pruning
        margin: that gain and the rounds that would show it were processes as alike as
        `spread.BETWEEN_FLOOR`, when those are fewer than the budget plans for
        (`planned_rounds`), so that the spread, measured now, may free a round for the search;
        None otherwise."""
        s = self.settings
        best = self.best_gain()
        if s.budget_s is None or best is None or s.confirm_rounds <= 1 or \
                best[0] - 1 <= self.margin_rel():
            return None
        n = decision.rounds_planned(best[0], spread.BETWEEN_FLOOR, best[1], 1,
                                    one_round_rel=spread.upper_rel([spread.BETWEEN_FLOOR]))
        if n is None or n >= s.confirm_rounds:
            return None
        # it pays for itself only if, the rounds cut, the search still has room for a probe
        sp = self.space
        repeat_s = self.prober.probe_s(self.state, *sp.trial_knobs(sp.baseline))
        left = s.budget_s - self.elapsed() - repeat_s - self.reserve_s() * n / s.confirm_rounds
        return (best[0], n) if left >= self.prober.typical_s(self.state) else None

    def worth_confirming(self) -> bool:
        """Whether the search's best, by score, beats the script's config by more than the
        `decision.MIN_GAIN_REL` a switch needs. Without a budget, always: the rounds asked run
        whatever the search found."""
        if self.settings.budget_s is None:
            return True
        best = self.best_gain()
        return best is not None and best[0] - 1 > decision.MIN_GAIN_REL

    def reserve_s(self, joining: Mapping[str, int] | None = None, probe_s: float = 0.0) -> float:
        """Time kept for the confirmation (`plan`'s cost); none while no config but the
        baseline measured (nothing to confirm: the search may use it), nor, under a budget,
        while the search's best reads no gain a switch could be made for
        (`worth_confirming`): word_lm's shape kept ~200 s of 5m for a best at -0.3%, spent
        them confirming it, and left its larger batches unprobed. With ``joining``, a config
        about to be probed: the most it keeps should that config become the best (its probes
        may be longer than the candidates' so far), at the fewest rounds that could switch to
        it (`decision.MIN_ROUNDS`); the first config to be measured keeps nothing back, as
        there is nothing to confirm yet, and nor does one whose probe (``probe_s``) and rounds
        the budget left cannot hold while no gain is found: its rounds could not run, and
        nothing else needs the time (the search then probes on to the budget's end)."""
        entries = confirm_entries.candidates(self.space, self.answers.known, self.answers.scorer)
        kept = self.reserve_of(entries) if self.worth_confirming() else 0.0
        if joining is not None and len(entries) >= 2:
            also = [entries[0], ("joining", dict(joining)), *entries[1:2]]  # as the best
            joined = self.reserve_of(also, least_rounds=decision.MIN_ROUNDS)
            if kept == 0.0 and probe_s + joined > self.settings.budget_s - self.elapsed():
                # The rounds that could switch to it do not fit after its probe, and no gain
                # found so far needs the time: kept back, it would buy only rounds that cannot
                # switch, where the probe at least tells what the config gives. minGPT's
                # chargpt at 5m: after its baseline and one probe at 0.65x, 185 s were left
                # and two rounds of batch 128 were planned at 180 s beside its 66 s probe; the
                # search stopped, and one confirmation round that could not switch ran.
                return 0.0
            return max(kept, joined)
        return kept

    def reserve_of(self, entries: list[tuple[str, dict]], *,
                   least_rounds: int = decision.PLANNED_ROUNDS) -> float:
        """The time the search keeps for a confirmation of ``entries`` (`plan`)."""
        return self.plan(entries, least_rounds=least_rounds).cost_s

    def plan(self, entries: list[tuple[str, dict]], *,
             least_rounds: int = decision.PLANNED_ROUNDS) -> confirm_plan.ConfirmPlan:
        """The confirmation of the `confirm_entries.essential` ``entries`` as the search
        reserves for it (`confirm_plan.plan_confirmation`; under a budget the runner-up is left
        out: `confirm.finish`), at the rounds the budget keeps (`planned_rounds`), never under
        ``least_rounds`` of search-length probes."""
        s, state, known = self.settings, self.state, self.answers.known
        entries = confirm_entries.essential(self.space, entries, known=known,
                                    scorer=self.answers.scorer)  # what a budget confirms
        return confirm_plan.plan_confirmation(
            confirm_rounds.plan_entries(self.prober, state, known, entries),
            asked=s.confirm_rounds, budget_s=s.budget_s, reserving=True,
            needed=self.planned_rounds() if len(entries) >= 2 and s.confirm_rounds else None,
            refused=confirm_rounds.turns_refused(self.prober, self.answers.scorer,
                                                  known=known),
            least_rounds=least_rounds)

    def cheapest_left_s(self) -> float:
        """The shortest probe a config not yet answered would take (`Prober.probe_s`), ruled
        out by an OOM or not; a typical probe when none is left. The stop rule weighs the
        budget against it: one config that does not fit is left out by itself (the search's
        probe), and a few in a row end the search. Weighed against the space's average probe,
        nanoGPT's shape stopped 152 s into 6m, with configs of ~15 s still fitting, once one
        probe of batch 96 at half the threads (54 s) had raised that average."""
        sp, known, ooms = self.space, self.answers.known, self.answers.ooms
        left = [c for c in sp.configs() if sp.key(c) not in known
                and not search_rules.oom_blocks(c, ooms)]
        if not left:
            return self.prober.typical_s(self.state)
        return min(self.prober.probe_s(self.state, *sp.trial_knobs(c)) for c in left)
