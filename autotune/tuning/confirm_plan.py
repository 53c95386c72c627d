"""The confirmation's plan: one model of what the confirmation measures and what it costs.

`plan_confirmation` takes numbers (each entry's probe length, the rounds asked and the rounds
the search's gain needs, the time left or the budget) and returns a frozen `ConfirmPlan`: the
entries, the rounds, each probe's length, turns or one probe after another, the statistic,
its cost in seconds and why, in plain words. The search reserves `ConfirmPlan.cost_s`
(`autotune.tuning.search_budget`), the budget message reports it (`plan_budget`,
`autotune.tuning.tuner`), and the confirmation runs the plan it is given
(`autotune.tuning.confirm`). Pure: no I/O, no Optuna, no run state.

Before this module the confirmation's time was modelled in several places:

- ``fitting.confirm_reserve``: the time the search keeps back, all the rounds at full length
  within a share of the budget (35%, or 50% for rounds a found gain needs), and never less
  than three rounds (or those asked, when fewer) of search-length probes;
- ``fitting.confirm_fit``: rounds and probe length within the time left, probes shortened
  first (down to a search probe's length), then rounds cut, two rounds of shorter probes
  where one would not switch, time left over buying more rounds where asked (`Stretch`);
- ``fitting.plan``: the budget message's split of the time left between search probes and
  that reserve (the runner-up left out where three rounds of it did not fit);
- ``search_budget.Budget.reserve_of``/``planned_rounds``: the reserve of the candidates so far,
  at the rounds the search's best gain needs (its best picked by score, the spread measured);
- ``confirm_rounds.planned_rounds``: the same rounds for the confirmation, its best picked by
  raw samples/s, and ``confirm._plan_rounds``: rounds too short to run (under 75% of one
  round), `Stretch`, ``confirm_fit``, turns where two rounds of them fit (``turns_fit``), and
  the looks (``looks_planned``);
- ``confirm_rounds.holds_all``/``selection_fits`` and ``confirm._line_up``: which entries the
  rounds judge (all, a round choosing between the best and the runner-up, or the runner-up
  left out), from what the rounds of each cost;
- ``search.budget_plan``/``tuner._tell_plan``: the message, from ``fitting.plan``.

All of those now ask this module: `plan_confirmation` (with `needed_rounds`, `rounds_kept`)
and `plan_lineup`; the search and the confirmation both pick the search's best by score.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.measuring import alternate
from autotune.tuning import decision, race
from autotune.tuning.decision import MIN_ROUNDS, PLANNED_ROUNDS

CONFIRM_SHARE = 0.35  # of a time budget, at most, kept for the confirmation
# ...and at most this share for the rounds a gain the search found needs, when the spread
# between processes measured says more than those asked show it (`rounds_kept`):
# nanoGPT's shape found its grid's best 87 s into 6m, searched on to 220 s, and the three rounds
# left showed +12% at 0.976x-1.286x, where about four would have shown it
NEEDED_SHARE = 0.5
MAX_CONFIRM_ROUNDS = 6  # leftover budget buys rounds up to this many
ESSENTIAL_ENTRIES = 2  # the baseline and the best: what a short budget confirms at the least
# A confirmation that would get one round at the search probes' lengths (which cannot switch)
# takes the two a switch needs instead when probes this share of those lengths fit: minGPT's
# shape had 200 s for rounds of 107 s, ran one, and left 96 s of its 6-minute budget unspent.
SHORTEST_SHARE = 0.8
# less than this share of one round left: no re-measurement (the race cuts a round that would
# end past the budget to the time left down to the same share, `race.CUT_ROUND_SHARE`)
TOO_SHORT_SHARE = race.CUT_ROUND_SHARE
# In turns, the time each probe measures, as a share of its sequential window: the rest of a
# round goes on the probes' start-ups and warm-ups, which a window holds too.
TURN_MEASURE_SHARE = 0.6
MIN_SEARCH_PROBES = 3  # a budget that holds fewer is told so


class Stretch(enum.Enum):
    """What budget the search left buys for the confirmation."""

    NONE = "none"  # `--trials N` bounds the run by count: `--confirm-rounds` rounds
    NEEDED = "needed"  # the search ended early: the rounds its gain and spread need
    ALL = "all"  # the search stopped for its budget: what is left is the confirmation's


@dataclass(frozen=True)
class Entry:
    """One config the confirmation measures: its name, its probe at full length (s), the
    shortest a short budget cuts that probe to (its search probe's length, or the full length
    when shorter), and its pace (launch to first batch, one batch; None: not known), which a
    round taking turns costs by."""

    name: str
    window_s: float
    least_s: float
    pace: tuple[float, float] | None = None


@dataclass(frozen=True)
class ConfirmPlan:
    """What the confirmation measures and what it costs."""

    entries: tuple[str, ...]  # the baseline first
    rounds: int  # 0: no re-measurement (the search's own probes decide)
    asked: int  # --confirm-rounds
    windows: tuple[float, ...]  # each entry's probe length, in ``entries``' order
    turns: bool  # a round's probes take turns on the machine, else one after another
    refused: str  # why they do not take turns ("" when they do)
    most: int  # the most rounds the race may run (past ``rounds`` where the data asks)
    statistic: str
    cost_s: float  # what the rounds take (while the search runs: the time it keeps back)
    why: str
    why_more: str = ""  # why the rounds are more than asked
    window_s: float = 0.0  # the probes' mean length as fitted, and as first sized
    mean_window_s: float = 0.0

    @property
    def remeasures(self) -> bool:
        return self.rounds > 0 and len(self.entries) > 1

    @property
    def probe_s(self) -> float:
        """The probes' mean length."""
        return self.window_s

    @property
    def measure_s(self) -> float:
        """In turns, what each probe measures."""
        return TURN_MEASURE_SHARE * self.window_s

    def window_of(self) -> dict[str, float]:
        return dict(zip(self.entries, self.windows))


def needed_rounds(best: tuple[float, float] | None, base: tuple[float, float] | None,
                  planning_rel: float, candidates: int, *,
                  one_round_rel: float | None = None,
                  prior_dof: int = 0) -> tuple[int | None, str]:
    """The rounds the search's best gain needs (`decision.rounds_planned`; one where
    ``one_round_rel``, the spread's upper bound, lets one decide) and why, from the best's and
    the baseline's scores as the search measured them (value, 95% half-width), the rounds'
    spread pooled with ``prior_dof`` pairs of one config's processes; None where there is no
    gain to show (or none of a size rounds can show)."""
    if best is None or base is None:
        return None, ""
    gain = decision.gain_of(best[0], best[1], base[0], base[1])
    if gain is None:
        return None, ""
    speedup, within = gain
    n = decision.rounds_planned(speedup, planning_rel, within, candidates,
                                one_round_rel=one_round_rel, prior_dof=prior_dof)
    if n is None:
        return None, ""
    return n, (f"the search's best measured {speedup - 1:+.1%} with a spread between processes "
               f"of ±{planning_rel:.1%}, which about {n} rounds can show beyond doubt")


def rounds_kept(asked: int, needed: int | None, *, budgeted: bool) -> int:
    """The rounds the search keeps time for: those asked, unless the search's gain needs
    another number (`needed_rounds`): fewer (down to one that decides alone), or under a
    budget more, up to `MAX_CONFIRM_ROUNDS`; none are added for a gain that even those cannot
    show (the search may yet find a larger one, which fewer rounds would show)."""
    if needed is None:
        return asked
    if needed > asked:
        return needed if budgeted and asked > 0 and needed <= MAX_CONFIRM_ROUNDS else asked
    return min(asked, needed)


def fit_rounds(rounds: int, window_s: float, entries: int, left_s: float | None,
               least_s: float, *, stretch_to: int | None = None,
               one_decides: bool = False) -> tuple[int, float]:
    """Rounds and probe length within ``left_s`` (None: no limit).

    Variance lives between processes more than within one, so rounds are kept before length:
    a short budget first shortens the probes (down to ``least_s``, a search probe's), then drops
    rounds (down to one, which cannot switch from the script's defaults; where two rounds of
    probes `SHORTEST_SHARE` of ``least_s`` fit, it takes those instead, unless
    ``one_decides``: one round can show the search's gain alone). With ``stretch_to``, time
    left over buys more rounds, up to that many (`Stretch`)."""
    if left_s is None:
        return rounds, window_s
    asked = rounds
    if rounds * entries * window_s > left_s:
        window_s = max(least_s, left_s / (rounds * entries))
        if rounds * entries * window_s > left_s:
            rounds = max(1, int(left_s // (entries * window_s)))
            two = min(MIN_ROUNDS, asked)
            if rounds < two and not one_decides and \
                    left_s >= two * entries * SHORTEST_SHARE * least_s:
                # one round cannot switch; two of probes a little shorter than the search's can
                rounds, window_s = two, left_s / (two * entries)
    elif stretch_to is not None:
        rounds = max(rounds, min(stretch_to, MAX_CONFIRM_ROUNDS,
                                 int(left_s // (entries * window_s))))
    return rounds, window_s


def turn_round_s(entries: Sequence[Entry], measure_s: float) -> float | None:
    """One round of ``entries`` taking turns, each to measure ``measure_s``
    (`alternate.round_s`); None where a pace is not known."""
    paces = [e.pace for e in entries]
    if not paces or any(p is None for p in paces):
        return None
    return alternate.round_s(measure_s, paces)


def round_cost_s(entries: Sequence[Entry], windows: Sequence[float], *, turns: bool) -> float:
    """One round: its probes one after another, or where they take turns, what that costs
    when it is more (`turn_round_s`, each measuring `TURN_MEASURE_SHARE` of the mean)."""
    measure_s = TURN_MEASURE_SHARE * sum(windows) / max(1, len(windows))
    one = turn_round_s(entries, measure_s) if turns else None
    return max(one or 0.0, sum(windows))


def _turn_cost_s(entries: Sequence[Entry]) -> float:
    """One round in turns of ``entries`` at their full probes (`round_cost_s`)."""
    return round_cost_s(entries, [e.window_s for e in entries], turns=True)


def holds_all(entries: Sequence[Entry], left_s: float, rounds: int, *,
              turns: bool = False) -> bool:
    """Whether ``left_s`` holds all of ``rounds`` (at least `PLANNED_ROUNDS`) rounds of every
    entry at full length, twice over where they run one after another (a search that ended
    well inside its budget can afford the runner-up, whose probes hedge against the best
    being a lucky reading: word_lm's shape stopped 117 s into 6m with its runner-up, the grid's
    best, left out and 170 s unspent), once where they take ``turns`` (their paired slices
    decide within the rounds planned). ``rounds`` is at least what two candidates' interval
    needs to show the search's best gain (`needed_rounds`): where the time left cannot hold
    those of all three entries, the runner-up's probes would cost the best the rounds that
    show it."""
    rounds = max(rounds, PLANNED_ROUNDS)
    if not turns:
        return left_s >= 2 * rounds * sum(e.window_s for e in entries)
    return left_s >= rounds * _turn_cost_s(entries)


def selection_fits(entries: Sequence[Entry], left_s: float, rounds: int) -> bool:
    """Whether ``left_s`` holds a selection round in turns of the baseline, the best and the
    runner-up (``entries[:3]``), then ``rounds`` (at least `PLANNED_ROUNDS`) rounds in turns of
    the baseline, the one chosen and any entry past the runner-up (the batch-keeping
    alternative). ``rounds`` is what the confirmation asks for, not what the search's gain
    needs: where the spread is wide the rounds needed rarely fit either way, and the time left
    still buys what it holds (a second look). word_lm's 6m left out its runner-up (64, the
    grid's best) on a plan of that kind, then ran eleven rounds of the best (32, 0.88 of the
    grid's best) and the baseline."""
    pair = [entries[0], entries[1], *entries[3:]]
    return left_s >= _turn_cost_s(entries[:3]) + \
        max(rounds, PLANNED_ROUNDS) * _turn_cost_s(pair)


class Lineup(enum.Enum):
    """Which entries the rounds judge (`plan_lineup`)."""

    ALL = "all"  # every entry
    CHOOSE = "choose"  # a first round in turns chooses between the best and the runner-up
    ESSENTIAL = "essential"  # the runner-up left out (`autotune.tuning.confirm_entries.essential`)


def plan_lineup(entries: Sequence[Entry], essential: int, *, asked: int, left_s: float | None,
                needed: int | None = None, refused: str = "", multi: bool = False,
                extending: bool = False) -> Lineup:
    """Which of ``entries`` (the baseline, the best, the runner-up, any batch-keeping
    alternative) the rounds judge, where ``essential`` of them are what a budget confirms at
    the least: all of them without a budget, when none can be left out, or when an earlier
    confirmation is ``extending``; else a round that chooses between the best and the
    runner-up where the rounds take turns and it fits (`selection_fits`); else all where the
    time left holds their rounds (`holds_all`, at the rounds asked or the ``needed`` ones,
    whichever are more), and the runner-up left out where it does not."""
    if not (essential < len(entries) and left_s is not None and not extending):
        return Lineup.ALL
    if not refused and not multi and selection_fits(entries, left_s, asked):
        return Lineup.CHOOSE
    need = asked if multi else max(asked, needed or 0)
    return Lineup.ALL if holds_all(entries, left_s, need, turns=not refused) else \
        Lineup.ESSENTIAL


def _statistic(candidates: int, rounds: int, most: int, turns: bool) -> str:
    """The decision's statistic (`decision.decide` at `autotune.tuning.race`'s looks),
    named."""
    level = race.look_level(rounds, rounds, candidates, most) * 100
    floor = ", floored by slices paired within each round" if turns else ""
    return (f"the speed-up's t interval over the rounds' ratios to the baseline{floor}, "
            f"two rounds' spread pooled with the script's own config measured twice, "
            f"looked at after every round, {level:.4g}% at the planned look "
            f"({candidates} candidate(s))")


def _none(entries: Sequence[Entry], asked: int, why: str, refused: str = "") -> ConfirmPlan:
    return ConfirmPlan(tuple(e.name for e in entries), 0, asked,
                       tuple(e.window_s for e in entries), False, refused, 0,
                       "none: the search's own probes, one each", 0.0, why)


def plan_confirmation(entries: Sequence[Entry], *, asked: int, left_s: float | None = None,
                      budget_s: float | None = None, reserving: bool = False,
                      stretch: Stretch = Stretch.NONE, needed: int | None = None,
                      needed_why: str = "", multi: bool = False,
                      refused: str = "", least_rounds: int = PLANNED_ROUNDS) -> ConfirmPlan:
    """The confirmation of ``entries`` (the baseline first).

    ``reserving``: planned while the search runs, under ``budget_s``; the plan's cost is the
    time the search keeps back (`_reserve`, never under ``least_rounds`` rounds of search-length
    probes). Otherwise planned as the confirmation starts,
    within ``left_s`` (None: no limit): the rounds asked, or more as ``stretch`` says (all the
    time left holds, or the ``needed`` rounds the search's gain asks for, `needed_rounds`),
    fitted to the time left (`fit_rounds`); none where a round does not fit
    (`TOO_SHORT_SHARE`); taking turns where `MIN_ROUNDS` rounds of them fit and nothing
    ``refused`` them. The race may run past the rounds planned (``most``) where the search
    ended early and the time left holds the rounds twice over: up to twice as many."""
    n = len(entries)
    if n < 2:
        return _none(entries, asked, "nothing to confirm: no config but the baseline")
    if asked <= 0:
        return _none(entries, asked, "no rounds: --confirm-rounds 0")
    if reserving:
        return _reserve(entries, asked, budget_s, needed, refused, least_rounds)
    mean_window = sum(e.window_s for e in entries) / n
    # no entry's probe shorter than its search probe (nor longer than its own window)
    least = sum(min(e.least_s, e.window_s) for e in entries) / n
    if left_s is not None and left_s < TOO_SHORT_SHARE * n * least:
        return _none(entries, asked,
                     f"{max(left_s, 0):.0f} s of the budget left, too little for one round of "
                     f"{n} probes of ~{least:.0f} s; the search's own probes decide", refused)
    stretch_to, why_more = None, ""
    if stretch is Stretch.ALL:
        stretch_to = MAX_CONFIRM_ROUNDS
        why_more = "the search stopped for its budget, and what it kept buys them"
    elif stretch is Stretch.NEEDED and not multi:
        stretch_to, why_more = needed, needed_why
    rounds, window_s = fit_rounds(asked, mean_window, n, left_s, least, stretch_to=stretch_to,
                                  one_decides=needed == 1 and not multi)
    scale = window_s / mean_window
    windows = tuple(e.window_s * scale for e in entries)
    if not refused and left_s is not None:
        refused = _turns_refused(entries, rounds, TURN_MEASURE_SHARE * window_s, left_s)
    turns = not refused
    one = round_cost_s(entries, windows, turns=turns)
    most = rounds
    if stretch is Stretch.NEEDED and left_s is not None and not multi and \
            rounds >= MIN_ROUNDS and 2 * rounds * one <= left_s:
        most = 2 * rounds
    cost = rounds * one
    if turns and left_s is not None:  # the executor leaves out rounds past the budget
        cost = min(cost, max(left_s, MIN_ROUNDS * one))
    why = _why(entries, rounds, asked, window_s, mean_window, turns, cost, left_s, why_more)
    return ConfirmPlan(tuple(e.name for e in entries), rounds, asked, windows, turns, refused,
                       most, _statistic(n - 1, rounds, most, turns), cost, why, why_more, window_s,
                       mean_window)


def _turns_refused(entries: Sequence[Entry], rounds: int, measure_s: float,
                   left_s: float) -> str:
    """Why ``rounds`` rounds, fitted at their probes' length one after another, cannot take
    turns in ``left_s``; "" when `MIN_ROUNDS` of them (or those asked, when fewer) fit so (a
    round in turns also holds every entry's warm-up, and slices of several of its batches);
    the rounds past the budget are left out as they come."""
    one = turn_round_s(entries, measure_s)
    need = min(rounds, MIN_ROUNDS)
    if one is None or need * one <= left_s:
        return ""
    return (f"{need} round{'s' if need > 1 else ''} taking turns would take ~{need * one:.0f} s "
            f"(every config's warm-up, and slices of several of its own batches), and "
            f"{max(left_s, 0):.0f} s are left")


def _reserve(entries: Sequence[Entry], asked: int, budget_s: float | None,
             needed: int | None, refused: str, least_rounds: int) -> ConfirmPlan:
    """What the search keeps back: all the rounds kept (`rounds_kept`) at full length, but at
    most `CONFIRM_SHARE` of the budget (`NEEDED_SHARE` for rounds a found gain needs), and
    never less than ``least_rounds`` rounds (those kept, when fewer) of search-length probes:
    what the confirmation takes at the least (`PLANNED_ROUNDS`; for a config not yet probed,
    `MIN_ROUNDS`, the fewest that can switch to it). Its rounds and probe length are those that
    reserve holds (`fit_rounds`); a round is costed one probe after another, as the
    confirmation fits its rounds first (it takes turns only where those fit)."""
    n = len(entries)
    rounds = rounds_kept(asked, needed, budgeted=budget_s is not None)
    k = max(1, min(rounds, least_rounds))
    full_round = sum(e.window_s for e in entries)
    least_round = sum(min(e.least_s, e.window_s) for e in entries)
    if budget_s is None:
        cost = rounds * full_round
        share = None
    else:
        share = NEEDED_SHARE if rounds > asked else CONFIRM_SHARE
        cost = max(min(rounds * full_round, share * budget_s), k * least_round)
    mean_window = full_round / n
    fitted, window_s = fit_rounds(rounds, mean_window, n, cost, least_round / n)
    windows = tuple(e.window_s * window_s / mean_window for e in entries)
    if share is None:
        why = f"all {rounds} round(s) at full length, no budget to fit"
    elif rounds * full_round <= share * budget_s:
        why = f"all {rounds} round(s) at full length, within {share:.0%} of the budget"
    elif k * least_round >= share * budget_s:
        why = (f"{k} round(s) of search-length probes, the least a confirmation takes, "
               f"above {share:.0%} of the budget")
    else:
        why = f"{share:.0%} of the budget, the most kept for it"
    if rounds != asked:
        why += f"; {rounds} round(s) kept for the gain found, --confirm-rounds {asked}"
    return ConfirmPlan(tuple(e.name for e in entries), fitted, asked, windows, not refused,
                       refused, fitted, _statistic(n - 1, fitted, fitted, not refused), cost,
                       why, "", window_s, mean_window)


def _why(entries: Sequence[Entry], rounds: int, asked: int, window_s: float, mean_window: float,
         turns: bool, cost: float, left_s: float | None, why_more: str) -> str:
    """The plan in one plain sentence."""
    how = "taking turns on the machine" if turns else "one probe after another"
    said = (f"{rounds} round(s) of {len(entries)} probes of ~{window_s:.0f} s, {how}, "
            f"about {cost:.0f} s")
    if rounds > asked:
        return f"{said}: more than the {asked} asked, as {why_more}"
    if left_s is None:
        return f"{said}: the {asked} asked, no budget to fit"
    if rounds < asked or window_s < mean_window - 1e-9:
        return (f"{said}: the {left_s:.0f} s left hold no more (shorter probes first, then "
                f"fewer rounds; {asked} asked)")
    return f"{said}: the {asked} asked, which the {left_s:.0f} s left hold"


@dataclass(frozen=True)
class BudgetPlan:
    """What the rest of a budget holds: search probes, then the confirmation."""

    left_s: float
    probe_s: float  # a search probe, typically
    probes: int  # search probes that fit beside the confirmation
    confirm: ConfirmPlan

    @property
    def confirm_s(self) -> float:
        return self.confirm.cost_s

    @property
    def short(self) -> bool:
        return self.probes < MIN_SEARCH_PROBES

    def needed_s(self, spent_s: float) -> float:
        """A budget that would hold `MIN_SEARCH_PROBES` probes and the confirmation."""
        return spent_s + MIN_SEARCH_PROBES * self.probe_s + self.confirm_s


def plan_budget(left_s: float, budget_s: float, probe_s: float, *, asked: int,
                confirm_probe_s: float, entries: int = ESSENTIAL_ENTRIES,
                refused: str = "") -> BudgetPlan:
    """Split ``left_s`` between search probes of ``probe_s`` and the confirmation of
    ``entries`` configs (probes of ``confirm_probe_s``) the search keeps time for
    (`plan_confirmation`, reserving; ``refused``: why its rounds cannot take turns)."""
    names = ["baseline", "best", "alternative"][:entries] + \
        [f"entry-{i}" for i in range(3, entries)]
    plan = plan_confirmation([Entry(name, confirm_probe_s, probe_s) for name in names],
                             asked=asked, budget_s=budget_s, reserving=True, refused=refused)
    probes = max(0, int((left_s - plan.cost_s) // max(probe_s, 1e-9)))
    return BudgetPlan(left_s, probe_s, probes, plan)
