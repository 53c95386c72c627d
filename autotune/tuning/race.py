"""The confirmation as a race: after every round a look that drops, switches or keeps.

The confirmation's plan (`autotune.tuning.confirm_plan`) fixes the entries (the baseline
first), the rounds planned and the most rounds the race may run. The race runs them one
round at a time, each round measuring every entry still in it once (F-Race, irace), and
after each round it looks at every round so far:

- **switch** when the leader's speed-up over the baseline (`decision.decide`, the paired
  statistic of the rounds' ratios, at this look's level) lies above 1 and its gain above the
  minimum a switch needs;
- **drop** an entry once its interval against the leader lies below 1, or its interval over
  the baseline lies at or below the minimum gain (shown no better); the baseline is never
  dropped, and a dropped entry is not measured again. An entry that keeps the job's global
  batch (the batch-keeping alternative) is compared with the best entry that keeps it, not
  with a leader that changes it;
- **keep** the baseline when every other entry is dropped, or when the rounds end (the plan's,
  or the budget's) without a switch;
- else **continue**: another round. Past the rounds planned, the race goes on (up to the most
  it may run) only while the spread seen says more rounds would show the leader's gain.

The looks share the claim's 5% (`ALPHA`) so that the claim holds whichever look makes it (a
union bound over the looks): the look after the plan's last round spends `PLANNED_SHARE` of
it; every other look j (the rounds before, numbered 1, 2, ...; then the rounds past the
plan) spends ``(1 - PLANNED_SHARE) * ALPHA * 6 / (pi^2 j^2)``, a series whose sum is that
rest. Each look's share is split among the candidates that entered the race (Bonferroni, as
`decision.level_for`). With one candidate and three rounds planned, the look after round 1
is at 99.2%, after round 2 at 99.8%, and after round 3 at 96%. Where the budget ends the
race before its planned rounds (which depends on the time rounds take, not on what they
measured), its last look is the planned one. A drop claims nothing to the user: its interval
is at 95% per pair, as F-Race's tests are. A race that extends an earlier confirmation
(``tune --resume RUN --confirm-rounds N``) judges the earlier rounds with its own, counting
its rounds after them. With two objectives (`decision.decide_pair`) the race runs its
planned rounds and looks once, at 95%. The planner (`confirm_plan.needed_rounds`) still sizes
the rounds a gain needs at 95% for one candidate, a little fewer than the planned look's 96%
may need; the race's stretch past the plan, and the rounds a kept baseline's reason asks for,
are at the look's own level.

`Race` is the policy, pure: it takes the rounds so far and returns a `Look`. `run` is the
loop, on a clock and a deadline, that calls a ``measure`` function for each round (the
confirmation's probes, `autotune.tuning.confirm`; in tests, a table). A round that would end
past the deadline is cut to the time left (its probes shorter by the same share) where that is
`CUT_ROUND_SHARE` of a round at least; else the race stops there.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from autotune.tuning import decision
from autotune.tuning.decision import MIN_GAIN_REL, MIN_ROUNDS, Measured

ALPHA = 1 - decision.LEVEL  # the claim's error, shared among the looks
PLANNED_SHARE = 0.8  # of ALPHA, for the look after the plan's last round...
STRETCH_SHARE = 0.3  # ...of which this goes to the look after the most rounds, where more
# A round that would end past the budget runs with its probes cut to the time left, where that
# is this share of the longest round so far at least; under it the race stops. word_lm's shape
# had 82 s left for a round that had taken 87 s, stopped after one round (which cannot switch)
# and left the 82 s unspent.
CUT_ROUND_SHARE = 0.75

Rounds = Mapping[str, Sequence[Measured | None]]  # each entry's rounds, one objective


class Verdict(enum.Enum):
    """What a look decides."""

    CONTINUE = "continue"
    SWITCH = "switch"
    KEEP = "keep"


def look_alpha(rounds: int, planned: int, most: int | None = None) -> float:
    """The error the look after round ``rounds`` may spend, of a race of ``planned`` rounds
    that may run ``most`` (None: ``planned``)."""
    stretch = most is not None and most > planned
    if rounds == planned:
        return (PLANNED_SHARE - (STRETCH_SHARE if stretch else 0.0)) * ALPHA
    if stretch and rounds == most:
        return STRETCH_SHARE * ALPHA
    j = rounds if rounds < planned else rounds - 1
    return (1 - PLANNED_SHARE) * ALPHA * 6 / (math.pi ** 2 * j ** 2)


def look_level(rounds: int, planned: int, candidates: int, most: int | None = None) -> float:
    """Each candidate's interval's confidence at the look after round ``rounds``."""
    return 1 - look_alpha(rounds, planned, most) / max(1, candidates)


def look_words(rounds: int, planned: int, candidates: int, most: int | None = None) -> str:
    """How a look's interval was made, for the reason."""
    level = look_level(rounds, planned, candidates, most) * 100
    over = f" and {candidates} candidates" if candidates > 1 else ""
    which = "the planned look" if rounds == planned else \
        "the look after the most rounds" if rounds == most else f"look after round {rounds}"
    return f"95% interval over the race's looks{over} ({level:.4g}% at {which})"


@dataclass(frozen=True)
class Drop:
    """An entry the race dropped, after which round, and why."""

    name: str
    round: int
    why: str


@dataclass(frozen=True)
class Look:
    """A look's verdict, the decision it stands on (`decision.decide`), the entries it
    dropped, and the level its intervals were at (with the words that say so)."""

    verdict: Verdict
    decided: decision.Decision
    drops: tuple[Drop, ...] = ()
    level: float = decision.LEVEL
    words: str = ""
    why: str = ""  # why the race ends here ("" where it continues)


@dataclass(frozen=True)
class Race:
    """The race's policy: ``planned`` rounds (the look after the last spends most of the 5%),
    at most ``most`` (counted with an extended confirmation's earlier rounds),
    ``candidates`` entries beside the baseline, ``keeps`` the entries that keep the job's
    global batch (the baseline among them)."""

    planned: int
    most: int
    candidates: int
    keeps: frozenset[str] = frozenset()
    baseline: str = "baseline"
    multi: bool = False
    min_gain_rel: float = MIN_GAIN_REL
    process_rel: float = decision.PROCESS_NOISE_REL
    min_rounds: int = MIN_ROUNDS
    prior: tuple[float, ...] = ()  # one config's processes against each other (`decision.decide`)

    def look(self, by: Sequence[Rounds], slices: Mapping | None, *, rounds: int,
             live: Sequence[str], last: bool, one_round_rel: float | None = None) -> Look:
        """The look after round ``rounds`` at ``by`` (per objective, each entry's rounds;
        `autotune.tuning.confirm` scores them) of the entries still ``live``; ``last``: no
        round comes after this one (the most, or the budget's end)."""
        if self.multi:
            return self._look_pair(by, live, last)
        at = rounds
        if last and rounds < self.planned:  # the budget ended the race: its planned look
            at = self.planned
        elif last and self.planned < rounds < self.most:
            at = self.most
        level = look_level(at, self.planned, self.candidates, self.most)
        words = look_words(at, self.planned, self.candidates, self.most)
        d = self.decide(by[0], slices, live, level=level, words=words,
                        one_round_rel=one_round_rel)
        if not d.kept_baseline:
            return Look(Verdict.SWITCH, d, (), level, words,
                        f"the leader was shown over the baseline after round {rounds}")
        drops = tuple(self.drops(by[0], slices, live, rounds))
        gone = {x.name for x in drops}
        left = [n for n in live if n != self.baseline and n not in gone]
        ahead = self.most if rounds >= self.planned else self.planned
        then = self.decide(by[0], slices, live, level=look_level(
            ahead, self.planned, self.candidates, self.most))
        # the rounds so far would already show the leader at the look ahead's level: the race
        # runs on to that look (word_lm's shape at 6m read +6% to +40% in six rounds, 1.233x
        # (1.030x-1.477x) at the level of the look after the seventh, and stopped at the sixth,
        # whose level is 99.99%, as though a seventh could not show it)
        need = then.rounds_needed if then.kept_baseline else rounds + 1
        d = replace(d, rounds_needed=need)
        if not left:
            return Look(Verdict.KEEP, d, drops, level, words,
                        f"every config but the baseline was dropped after round {rounds}")
        if last:
            return Look(Verdict.KEEP, d, drops, level, words, f"the rounds ended at {rounds}")
        if rounds >= self.planned and (need is None or need > self.most):
            return Look(Verdict.KEEP, d, drops, level, words,
                        f"after {rounds} rounds the spread seen says the {self.most} the race "
                        f"may run would not show the leader's gain")
        return Look(Verdict.CONTINUE, d, drops, level, words)

    def _look_pair(self, by: Sequence[Rounds], live: Sequence[str], last: bool) -> Look:
        """Two objectives: one look, at the end, at 95% (`decision.decide_pair`)."""
        names = set(live)
        d = decision.decide_pair(*({n: b[n] for n in b if n in names} for b in by),
                                 self.baseline, candidates=self.candidates,
                                 process_rel=self.process_rel)
        if not last:
            return Look(Verdict.CONTINUE, d)
        return Look(Verdict.KEEP if d.kept_baseline else Verdict.SWITCH, d,
                    why="the rounds ended")

    def decide(self, results: Rounds, slices: Mapping | None, names: Sequence[str], *,
               level: float, words: str = "",
               one_round_rel: float | None = None) -> decision.Decision:
        """`decision.decide` among ``names`` (the baseline among them) at ``level``."""
        kept = set(names) | {self.baseline}
        return decision.decide({n: ms for n, ms in results.items() if n in kept},
                               self.baseline, min_gain_rel=self.min_gain_rel,
                               candidates=self.candidates, min_rounds=self.min_rounds,
                               process_rel=self.process_rel, one_round_rel=one_round_rel,
                               slices=slices or None, level=level, words=words,
                               prior=self.prior)

    def drops(self, results: Rounds, slices: Mapping | None, live: Sequence[str],
              rounds: int) -> list[Drop]:
        """The live entries the rounds show below their leader, or no better than the
        baseline by the minimum gain, each interval at 95% (`decision.speedup_interval`)."""
        means = {n: decision.summarize([m for m in results[n] if m is not None]).samples_per_s
                 for n in live}
        means = {n: v for n, v in means.items() if v > 0}
        out = []
        for name in means:
            if name == self.baseline:
                continue
            group = [n for n in means if n in self.keeps or n == self.baseline] \
                if name in self.keeps else list(means)
            leader = max(group, key=lambda n: means[n])
            for other, bar, words in (
                    (leader, 1.0, f"below {leader}"),
                    (self.baseline, 1.0 + self.min_gain_rel,
                     f"no better than the baseline by {self.min_gain_rel:.0%}")):
                if other == name or other not in means:
                    continue
                low_high = self.against(results, slices, name, other)
                if low_high is not None and low_high[1] <= bar:
                    claim = decision.claim_text(means[name] / means[other], *low_high)
                    out.append(Drop(name, rounds, f"{words}: {claim} at 95%"))
                    break
        return out

    def against(self, results: Rounds, slices: Mapping | None, name: str,
                other: str) -> tuple[float, float] | None:
        """``name``'s speed-up over ``other`` at 95%, from the rounds that measured both;
        None from fewer than ``min_rounds`` of them."""
        pairs = [(a.samples_per_s, b.samples_per_s)
                 for a, b in zip(results[name], results[other])
                 if a is not None and b is not None and b.samples_per_s > 0]
        if len(pairs) < self.min_rounds:
            return None
        mine = decision.summarize([m for m in results[name] if m is not None])
        theirs = decision.summarize([m for m in results[other] if m is not None])
        paired = decision.paired_slices(results, slices, name, other)
        return decision.speedup_interval(mine.samples_per_s / theirs.samples_per_s, pairs,
                                         mine, theirs, process_rel=self.process_rel,
                                         paired=paired, level=decision.LEVEL,
                                         prior=self.prior)


@dataclass(frozen=True)
class Raced:
    """What a race measured and decided: each entry's rounds (None where a probe failed or
    the entry was out of the race), its last look (None: no round ran), the rounds it ran
    (an earlier confirmation's not counted), the entries it dropped, and why it stopped."""

    results: dict[str, list]
    look: Look | None
    rounds: int
    dropped: tuple[Drop, ...]
    stopped: str


def run(race: Race, measure: Callable[[int, list[str], float], Mapping[str, object]],
        score: Callable[[Mapping[str, list]], tuple[list, Mapping | None]], *,
        names: Sequence[str], clock, deadline: float | None = None, first: int = 1,
        earlier: Mapping[str, Sequence] | None = None,
        one_round: Callable[[Mapping[str, list]], float | None] | None = None) -> Raced:
    """Race ``names`` (the baseline first): ``measure(number, live, share)`` runs one round of
    the entries still in the race, numbered ``number`` (from ``first``), its probes at
    ``share`` of their planned length (1.0, or less for a round cut to fit the deadline), and
    returns each one's result (None: it measured nothing); ``score(results)`` turns every round
    so far into `Race.look`'s ``by`` and ``slices``. ``earlier``: an extended confirmation's
    rounds, judged with the new ones. Where the longest round so far (at full length) would
    end past ``deadline`` (on ``clock``), the next round is cut to the time left
    (`round_share`), or not started when that is under `CUT_ROUND_SHARE` of it;
    ``one_round``: where one round may decide alone, the spread's upper bound from the results
    of the race's only round."""
    before = max((len(v) for v in (earlier or {}).values()), default=0)
    results = {n: [*(earlier or {}).get(n, ()), *[None] * before][:before] for n in names}
    live, dropped, look, longest = list(names), [], None, 0.0
    stopped, share = "no round ran", 1.0
    for i in range(max(0, race.most - before)):
        started = clock.monotonic()
        got = measure(first + i, list(live), share)
        # what the round would have taken at full length (its start-ups did not shrink with
        # it, so this errs long)
        longest = max(longest, (clock.monotonic() - started) / share)
        for n in names:
            results[n].append(got.get(n) if n in live else None)
        total = before + i + 1
        fit = round_share(deadline - clock.monotonic(), longest) \
            if deadline is not None else 1.0
        late, share = fit is None and total < race.most, fit or 1.0
        by, slices = score(results)
        look = race.look(by, slices, rounds=total, live=live,
                         last=late or total >= race.most,
                         one_round_rel=one_round(results) if one_round and total == 1
                         else None)
        dropped += look.drops
        live = [n for n in live if n not in {x.name for x in look.drops}]
        if look.verdict is not Verdict.CONTINUE:
            stopped = look.why if not late or look.verdict is Verdict.SWITCH else (
                f"{i + 1} of {race.most - before} rounds fit in the budget (a round took up "
                f"to {longest:.0f} s, {max(deadline - clock.monotonic(), 0):.0f} s were "
                f"left)")
            return Raced(results, look, i + 1, tuple(dropped), stopped)
    return Raced(results, look, max(0, race.most - before), tuple(dropped), stopped)


def round_share(left_s: float, round_s: float) -> float | None:
    """The share of its planned length the next round's probes get where ``left_s`` remain and
    a round takes ``round_s``: 1.0 where it fits, the time left over the round's where that is
    `CUT_ROUND_SHARE` or more, else None (no round)."""
    if left_s >= round_s:
        return 1.0
    share = max(left_s, 0.0) / round_s if round_s > 0 else 0.0
    return share if share >= CUT_ROUND_SHARE else None
