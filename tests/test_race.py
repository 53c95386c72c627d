"""The confirmation's race (`autotune.tuning.race`) on tables: rounds of fake figures on a fake
clock, no processes. Each table gives, by round, each entry's samples/s; a round's probes
carry 1% intervals of their own."""

import math

import pytest

from autotune.tuning import confirm_plan, decision, race
from autotune.tuning.confirm_plan import Entry, Stretch
from autotune.tuning.decision import Measured
from autotune.tuning.race import Race, Verdict


class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t


class Table:
    """``measure`` for `race.run`: round n's figures from ``rows[n - 1]`` (by entry), each
    round taking ``round_s`` on ``clock``; records which entries each round measured."""

    def __init__(self, rows, clock=None, round_s=10.0, first=1):
        self.rows, self.clock, self.round_s, self.first = rows, clock or Clock(), round_s, first
        self.calls: list[tuple[int, list[str]]] = []
        self.shares: list[float] = []  # each round's probes' share of their length

    def __call__(self, number, live, share):
        self.calls.append((number, list(live)))
        self.shares.append(share)
        self.clock.t += self.round_s * share
        row = self.rows[number - self.first]
        return {n: Measured(row[n], row[n] * 0.01) if row.get(n) else None for n in live}


def score(results):
    return [results], None


def run(rows, *, planned, most=None, names=None, deadline=None, keeps=(), earlier=None,
        first=1, round_s=10.0):
    names = names or list(rows[0])
    candidates = len(names) - 1
    before = max((len(v) for v in (earlier or {}).values()), default=0)
    policy = Race(before + planned, before + (most or planned), candidates,
                  keeps=frozenset(keeps) | {"baseline"})
    table = Table(rows, round_s=round_s, first=first)
    raced = race.run(policy, table, score, names=names, clock=table.clock, deadline=deadline,
                     first=first, earlier=earlier)
    return raced, table


def test_the_looks_share_the_five_percent():
    """Whatever the rounds planned and the most, the looks' shares sum to 5% at most, and the
    planned look spends the most of it."""
    for planned, most in [(1, 1), (3, 3), (3, 6), (5, 10), (2, 30)]:
        total = sum(race.look_alpha(r, planned, most) for r in range(1, 1000))
        assert total <= race.ALPHA + 1e-12, (planned, most, total)
        assert race.look_alpha(planned, planned, most) == max(
            race.look_alpha(r, planned, most) for r in range(1, most + 1))
    assert race.look_level(3, 3, 1) == pytest.approx(0.96)
    assert race.look_level(3, 3, 2) == pytest.approx(0.98)
    assert race.look_level(3, 3, 1, most=6) == pytest.approx(0.975)
    assert race.look_level(6, 3, 1, most=6) == pytest.approx(0.985)
    assert race.look_level(1, 3, 1) == pytest.approx(1 - 0.01 * 6 / math.pi ** 2)


@pytest.mark.parametrize("gain, spread, left_s, rounds, most", [
    # a large gain, processes alike: two rounds would show it, so the three asked; the time
    # left holds them twice over, so the race may run up to six
    (1.40, 0.02, 600.0, 3, 6),
    (1.10, 0.05, 600.0, 5, 10),  # a modest gain and a wider spread: five rounds, room for ten
    (1.10, 0.05, 150.0, 5, 5),  # the same where the time left holds them once only
    (1.10, 0.05, 80.0, 3, 3),  # too little time for them: the three asked, shorter probes
    (1.01, 0.02, 600.0, 3, 6),  # no gain worth showing: the rounds asked
])
def test_budget_and_spread_set_the_rounds(gain, spread, left_s, rounds, most):
    """The plan (`confirm_plan.plan_confirmation`) of a search that ended early: the rounds
    the search's gain needs beside the spread between processes, within the time left, and
    the most the race may run where that time holds them twice over."""
    entries = [Entry("baseline", 15.0, 10.0), Entry("best", 15.0, 10.0)]
    needed, why = confirm_plan.needed_rounds((100.0 * gain, 1.0), (100.0, 1.0), spread, 1)
    plan = confirm_plan.plan_confirmation(entries, asked=3, left_s=left_s,
                                          stretch=Stretch.NEEDED, needed=needed,
                                          needed_why=why, refused="one after another")
    assert (plan.rounds, plan.most) == (rounds, most), plan
    assert plan.cost_s == pytest.approx(plan.rounds * sum(plan.windows))
    assert plan.cost_s <= left_s + 1e-9


def test_a_leader_only_a_later_round_reveals_wins():
    """After round 1, A leads (+12%) and B is behind (+4%); from round 2 B reads +25%, and
    leads by round 3. The race runs on, and at its planned look (round 5) shows B over the
    baseline: B wins, not the first round's leader."""
    rows = [{"baseline": 100.0, "A": 112.0, "B": 104.0},
            {"baseline": 100.0, "A": 111.0, "B": 125.0},
            {"baseline": 100.0, "A": 112.0, "B": 126.0},
            {"baseline": 100.0, "A": 111.0, "B": 125.0},
            {"baseline": 100.0, "A": 112.0, "B": 126.0}]
    policy = Race(5, 5, 2)
    for k, leader in ((1, "A"), (3, "B")):
        so_far = {n: [Measured(r[n], r[n] * 0.01) for r in rows[:k]] for n in rows[0]}
        look = policy.look([so_far], None, rounds=k, live=list(rows[0]), last=False)
        assert look.verdict is Verdict.CONTINUE and look.decided.candidate == leader, look
    raced, table = run(rows, planned=5)
    assert raced.look.verdict is Verdict.SWITCH and raced.look.decided.winner == "B", raced
    assert raced.rounds == 5 == len(table.calls)
    assert raced.look.decided.speedup_low > 1.0
    assert "98% at the planned look" in raced.look.decided.reason


def test_an_entry_dropped_mid_race_is_not_measured_again():
    """C reads 20% under the leader round after round: dropped at the first look that has
    two rounds of it, and the rounds after it measure the others only; the baseline, behind
    too, is never dropped. Its rounds after the drop hold None."""
    rows = [{"baseline": 100.0, "A": 104.0 + i % 2, "C": 84.0} for i in range(6)]
    raced, table = run(rows, planned=6)
    assert [(d.name, d.round) for d in raced.dropped] == [("C", 2)], raced.dropped
    assert "below A" in raced.dropped[0].why
    assert all(live == ["baseline", "A", "C"] for _, live in table.calls[:2])
    assert all(live == ["baseline", "A"] for _, live in table.calls[2:]), table.calls
    assert raced.results["C"][2:] == [None] * (len(table.calls) - 2)
    assert all(m is not None for m in raced.results["baseline"])


def test_every_entry_dropped_keeps_the_baseline_before_the_rounds_end():
    """Both candidates read no better than the baseline by the 3% a switch needs: the race
    keeps the baseline as soon as the rounds show it, not after all six planned."""
    rows = [{"baseline": 100.0, "A": 100.5, "B": 96.0} for _ in range(6)]
    raced, table = run(rows, planned=6)
    assert raced.look.verdict is Verdict.KEEP and raced.look.decided.kept_baseline
    assert len(table.calls) == 2 < 6 and {d.name for d in raced.dropped} == {"A", "B"}
    assert "dropped" in raced.stopped


@pytest.mark.parametrize("ratios, verdict", [
    ([1.10, 1.10, 1.10], Verdict.SWITCH),  # beyond doubt, and above the minimum gain
    ([1.02, 1.02, 1.02], Verdict.KEEP),  # beyond doubt, but under the 3% a switch needs
    ([1.30, 0.95, 1.15], Verdict.KEEP),  # a gain, but an interval that holds 1.0
])
def test_a_switch_needs_an_interval_above_one_and_the_minimum_gain(ratios, verdict):
    rows = [{"baseline": 100.0, "A": 100.0 * r} for r in ratios]
    raced, _ = run(rows, planned=3)
    assert raced.look.verdict is verdict, raced.look.decided.reason
    d = raced.look.decided
    if verdict is Verdict.SWITCH:
        assert d.speedup_low > 1.0 and d.speedup - 1 > decision.MIN_GAIN_REL
        assert "95% interval over the race's looks" in d.reason, d.reason
    else:
        assert d.kept_baseline and d.reason.startswith(decision.KEPT)


def test_the_budget_ends_the_race_and_its_last_look_is_the_planned_one():
    """Rounds of 10 s and 25 s left: two rounds fit; their look is at the planned look's
    level (the time rounds take, not what they measured, ended the race)."""
    rows = [{"baseline": 100.0, "A": 100.0 * r} for r in (1.08, 1.12, 1.08, 1.12)]
    raced, table = run(rows, planned=4, deadline=25.0)
    assert len(table.calls) == 2 and raced.rounds == 2
    assert raced.look.level == pytest.approx(race.look_level(4, 4, 1))
    assert "2 of 4 rounds fit in the budget" in raced.stopped, raced.stopped


@pytest.mark.parametrize("prior, verdict", [
    ((), Verdict.KEEP),  # two rounds alone: one degree of freedom, 1.0 inside
    ((0.030,), Verdict.SWITCH),  # the script's config 3% apart in its two processes, pooled
    ((0.5,), Verdict.KEEP),  # ...or 40% apart: wider still
])
def test_two_rounds_the_budget_ended_pool_the_script_s_config_measured_twice(prior, verdict):
    """A budget that holds two rounds of a gain near +10% (word_lm as it comes held two of
    batch 128 against 20, 1.10x and 1.07x, which pooled still read 0.994x at the low end): the
    race pools their spread with the script's own config in its two search processes
    (`decision.POOL_UNDER_DOF`)."""
    rows = [{"baseline": 100.0, "A": 100.0 * r} for r in (1.12, 1.09, 1.12, 1.09)]
    policy = Race(4, 4, 1, keeps=frozenset({"baseline"}), prior=prior)
    table = Table(rows, round_s=10.0)
    raced = race.run(policy, table, score, names=["baseline", "A"], clock=table.clock,
                     deadline=25.0)
    assert raced.rounds == 2 and raced.look.verdict is verdict, raced.look.decided.reason


def test_a_round_that_would_end_past_the_budget_is_cut_to_the_time_left():
    """Rounds of 10 s and 28 s left: two full rounds, then a third cut to the 8 s left (80% of
    a round, over `race.CUT_ROUND_SHARE`). Without the cut the race stopped after two rounds,
    kept the baseline (two rounds of 1.08x and 1.12x do not show the gain) and left 8 s
    unspent; the third round shows it."""
    rows = [{"baseline": 100.0, "A": 100.0 * r} for r in (1.08, 1.12, 1.08, 1.12)]
    two, _ = run(rows, planned=4, deadline=25.0)  # 5 s left after two rounds: no third
    assert two.rounds == 2 and two.look.verdict is Verdict.KEEP, two
    raced, table = run(rows, planned=4, deadline=28.0)
    assert table.shares == [1.0, 1.0, pytest.approx(0.8)], table.shares
    assert raced.rounds == 3 and table.clock.t == pytest.approx(28.0)
    assert raced.look.verdict is Verdict.SWITCH and raced.look.decided.winner == "A", raced


@pytest.mark.parametrize("left_s, share", [(12.0, 1.0), (10.0, 1.0), (7.5, 0.75),
                                           (7.4, None), (0.0, None), (-3.0, None)])
def test_a_round_is_cut_down_to_its_share_and_no_further(left_s, share):
    got = race.round_share(left_s, 10.0)
    assert got == (pytest.approx(share) if share is not None else None)


def test_a_resume_mid_race_judges_the_earlier_rounds_with_the_new_ones():
    """An earlier confirmation's two rounds (kept: two rounds of 1.05x and 1.15x hold 1.0),
    extended by two: the new rounds are numbered after the earlier's, and the look judges all
    four together."""
    earlier = {"baseline": [Measured(100.0, 1.0), Measured(100.0, 1.0)],
               "A": [Measured(105.0, 1.0), Measured(115.0, 1.0)]}
    first_two = Race(2, 2, 1).look([earlier], None, rounds=2, live=["baseline", "A"],
                                   last=True)
    assert first_two.verdict is Verdict.KEEP
    rows = [{"baseline": 100.0, "A": 110.0}, {"baseline": 100.0, "A": 110.0}]
    raced, table = run(rows, planned=2, earlier=earlier, first=5)
    assert [n for n, _ in table.calls] == [5, 6]
    assert len(raced.results["A"]) == 4 and raced.rounds == 2
    assert raced.look.decided.rounds == 4 and raced.look.verdict is Verdict.SWITCH, \
        raced.look.decided.reason


def test_the_batch_keeping_alternative_is_not_dropped_behind_a_leader_that_changes_the_batch():
    """K keeps the job's global batch and reads 30% under the leader (which does not), and
    6% over the baseline: it stays in the race, judged against the baseline."""
    rows = [{"baseline": 100.0, "L": 140.0 + i % 2, "K": 106.0 + i % 2} for i in range(3)]
    raced, table = run(rows, planned=3, most=3, keeps=("K",))
    assert not raced.dropped and all("K" in live for _, live in table.calls)
    alone, _ = run(rows, planned=3)
    assert [d.name for d in alone.dropped] == ["K"]


def test_a_leader_the_rounds_would_show_at_the_look_after_the_most_runs_on_to_it():
    """word_lm's shape at 6m: after the choosing round and five more, batch 64 read 1.243x,
    1.063x, 1.401x, 1.181x, 1.372x and 1.220x the baseline. At the look after round 6 (99.99%
    with two candidates) its interval held 1.0; at the level of the look after the most rounds
    (7) those six rounds already lie above it. The race runs on to round 7 and switches there
    where the gain holds; it stopped at round 6 and kept the defaults, as though a seventh
    round could not show the gain."""
    ratios = [1.243, 1.063, 1.401, 1.181, 1.372, 1.220, 1.22]
    rows = [{"baseline": 100.0, "A": 100.0 * r, "B": 95.0 if i == 0 else None}
            for i, r in enumerate(ratios)]
    policy = Race(4, 7, 2)
    so_far = {n: [Measured(r[n], r[n] * 0.01) if r[n] else None for r in rows[:6]]
              for n in ("baseline", "A")}
    look = policy.look([so_far], None, rounds=6, live=["baseline", "A"], last=False)
    assert look.verdict is Verdict.CONTINUE and look.decided.rounds_needed == 7, look
    assert look.decided.kept_baseline and look.level > 0.999
    ahead = policy.decide(so_far, None, ["baseline", "A"],
                          level=race.look_level(7, 4, 2, 7))
    assert not ahead.kept_baseline and ahead.speedup_low > 1.0, ahead.reason
    raced, table = run(rows, planned=4, most=7)
    assert raced.look.verdict is Verdict.SWITCH and raced.look.decided.winner == "A", raced
    assert raced.rounds == 7 == len(table.calls)
    assert "at the look after the most rounds" in raced.look.decided.reason
