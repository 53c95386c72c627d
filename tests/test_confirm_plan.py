"""The confirmation's plan (`autotune.tuning.confirm_plan`): numbers in, a plan out. Pure and
fast: no processes, no clocks."""

from __future__ import annotations

import pytest

from autotune.tuning import confirm_plan as cp, decision
from autotune.tuning.confirm_plan import Entry, Stretch, plan_confirmation


def two(window_s: float, least_s: float, step_s: float = 0.1, first_s: float = 2.0):
    """The baseline and the best, probes of ``window_s`` (their search probes ``least_s``)."""
    return [Entry("baseline", window_s, least_s, (first_s, step_s)),
            Entry("best", window_s, least_s, (first_s, step_s))]


# budget left, rounds asked, probe, search probe, stretch, needed ->
# rounds, probe length, turns, cost
CASES = [
    # no budget (--trials): the rounds asked at full length, whatever their cost
    ("no budget", None, 3, 30.0, 20.0, Stretch.NONE, None, 3, 30.0, True, 3 * 60.0),
    # the rounds asked fit
    ("roomy", 400.0, 3, 30.0, 20.0, Stretch.NONE, None, 3, 30.0, True, 180.0),
    # too little: probes shortened first (rounds are what the interval stands on)...
    ("shorter probes", 150.0, 3, 30.0, 20.0, Stretch.NONE, None, 3, 25.0, True, 150.0),
    # ...down to the search probe's length, then rounds cut
    ("rounds cut", 100.0, 3, 30.0, 20.0, Stretch.NONE, None, 2, 20.0, True, 80.0),
    # one round would not switch: two of probes a little shorter than the search's instead
    ("two shorter", 200.0, 3, 53.5, 53.5, Stretch.NONE, None, 2, 50.0, True, 200.0),
    # ...unless one round decides alone (the gain beyond even the spread's upper bound)
    ("one decides", 200.0, 3, 53.5, 53.5, Stretch.NONE, 1, 1, 53.5, True, 107.0),
    # the search stopped for its budget: what is left buys rounds, up to the most
    ("stretch all", 10000.0, 3, 30.0, 20.0, Stretch.ALL, None, cp.MAX_CONFIRM_ROUNDS, 30.0,
     True, cp.MAX_CONFIRM_ROUNDS * 60.0),
    # a large spread: the search ended early and its gain needs five rounds, which fit
    ("needed", 10000.0, 3, 30.0, 20.0, Stretch.NEEDED, 5, 5, 30.0, True, 300.0),
    # the same need where the run is bounded by --trials: the rounds asked
    ("needed, --trials", None, 3, 30.0, 20.0, Stretch.NONE, 5, 3, 30.0, True, 180.0),
    # --confirm-rounds 5 asked explicitly: five, as the budget holds them
    ("asked five", 400.0, 5, 30.0, 20.0, Stretch.NONE, None, 5, 30.0, True, 300.0),
    # --confirm-rounds 1: one round, as asked (it cannot switch, and says so elsewhere)
    ("asked one", 110.0, 1, 53.5, 53.5, Stretch.NONE, None, 1, 53.5, True, 107.0),
]


@pytest.mark.parametrize("name,left,asked,window,least,stretch,needed,rounds,probe,turns,cost",
                         CASES, ids=[c[0] for c in CASES])
def test_rounds_probe_length_and_cost(name, left, asked, window, least, stretch, needed,
                                      rounds, probe, turns, cost):
    p = plan_confirmation(two(window, least), asked=asked, left_s=left, stretch=stretch,
                          needed=needed, needed_why="its gain needs them")
    assert (p.rounds, p.turns) == (rounds, turns), p
    assert p.probe_s == pytest.approx(probe) and p.cost_s == pytest.approx(cost), p
    assert p.entries == ("baseline", "best") and p.asked == asked and p.remeasures
    assert left is None or p.cost_s <= left + 1e-9
    assert p.why and len(p.why) < 300 and "\n" not in p.why
    if rounds > asked:
        assert p.why_more and "more than" in p.why


def test_nothing_to_run():
    # a budget left short of 75% of one round: the search's own probes decide
    short = plan_confirmation(two(30.0, 20.0), asked=3, left_s=20.0)
    assert short.rounds == 0 and not short.remeasures and short.cost_s == 0.0
    assert "too little for one round" in short.why
    # --confirm-rounds 0, and a lineup of the baseline alone
    assert plan_confirmation(two(30.0, 20.0), asked=0, left_s=500.0).rounds == 0
    alone = plan_confirmation(two(30.0, 20.0)[:1], asked=3, left_s=500.0)
    assert alone.rounds == 0 and "nothing to confirm" in alone.why


def test_turns_only_where_two_rounds_of_them_fit():
    # 2 s steps: a round in turns holds slices of several batches and every warm-up, far
    # more than its 2 x 30 s of probes one after another
    slow = two(30.0, 20.0, step_s=2.0, first_s=10.0)
    one_turn = cp.turn_round_s(slow, cp.TURN_MEASURE_SHARE * 30.0)
    assert one_turn > 60.0
    p = plan_confirmation(slow, asked=3, left_s=1.5 * one_turn)
    assert not p.turns and "taking turns would take" in p.refused
    assert p.cost_s == pytest.approx(p.rounds * sum(p.windows))
    roomy = plan_confirmation(slow, asked=3, left_s=10 * one_turn)
    assert roomy.turns and roomy.cost_s == pytest.approx(3 * one_turn)
    # refused by the machine (a GPU, a launcher): one after another whatever the budget
    gpu = plan_confirmation(slow, asked=3, left_s=10 * one_turn, refused="a GPU")
    assert not gpu.turns and gpu.refused == "a GPU"
    assert "paired" not in gpu.statistic and "paired" in roomy.statistic


def test_the_race_may_run_past_the_plan_where_an_early_end_leaves_the_rounds_twice_over():
    """A search that ended early, with the time left holding the rounds twice over: the race
    may run on past the rounds planned (should their spread ask for more), up to twice as
    many; else it runs the rounds planned at most. The planned look spends 4% of the 5% (one
    candidate: 96%), or 2.5% where the race may run on (the look after the most rounds spends
    1.5%)."""
    p = plan_confirmation(two(30.0, 20.0), asked=3, left_s=1000.0, stretch=Stretch.NEEDED,
                          needed=3)
    assert p.rounds == 3 and p.most == 6 and "97.5% at the planned look" in p.statistic
    plain = plan_confirmation(two(30.0, 20.0), asked=3, left_s=1000.0)
    assert plain.most == 3 and "96% at the planned look" in plain.statistic
    assert plan_confirmation(two(30.0, 20.0), asked=3, left_s=300.0, stretch=Stretch.NEEDED,
                             needed=3).most == 3


def test_the_search_reserves_the_plans_cost():
    """While the search runs, its reserve: the rounds at full length within 35% of the budget,
    never less than three rounds of search-length probes; 50% for rounds a found gain needs."""
    entries = two(37.5, 25.0)
    roomy = plan_confirmation(entries, asked=3, budget_s=1200.0, reserving=True)
    assert roomy.cost_s == pytest.approx(3 * 75.0) and roomy.rounds == 3  # all of it
    share = plan_confirmation(entries, asked=3, budget_s=500.0, reserving=True)
    assert share.cost_s == pytest.approx(0.35 * 500) and "35% of the budget" in share.why
    floor = plan_confirmation(entries, asked=3, budget_s=300.0, reserving=True)
    assert floor.cost_s == decision.PLANNED_ROUNDS * 2 * 25.0 and floor.rounds == 3
    assert floor.probe_s == pytest.approx(25.0) and "the least a confirmation takes" in floor.why
    # for a config about to be probed: the two rounds that could switch to it, at the least
    joining = plan_confirmation(entries, asked=3, budget_s=250.0, reserving=True,
                                least_rounds=decision.MIN_ROUNDS)
    assert joining.cost_s == decision.MIN_ROUNDS * 2 * 25.0 < floor.cost_s
    assert joining.rounds == decision.MIN_ROUNDS and joining.probe_s == pytest.approx(25.0)
    assert plan_confirmation(entries, asked=3, budget_s=500.0, reserving=True,
                             least_rounds=decision.MIN_ROUNDS).cost_s == share.cost_s
    assert "within 35%" in roomy.why
    # a gain found that needs five rounds at the spread measured: up to half the budget
    more = plan_confirmation(entries, asked=3, budget_s=500.0, reserving=True, needed=5)
    assert more.cost_s == pytest.approx(0.5 * 500) and more.rounds == 5  # of search length
    assert more.probe_s == pytest.approx(25.0) and "5 round(s) kept" in more.why
    # one round decides alone: one round kept, at least one of search-length probes
    one = plan_confirmation(entries, asked=3, budget_s=500.0, reserving=True, needed=1)
    assert one.cost_s == pytest.approx(75.0) and one.rounds == 1
    # --trials: no budget, all the rounds asked
    assert plan_confirmation(entries, asked=3, reserving=True).cost_s == pytest.approx(225.0)
    assert plan_confirmation(entries, asked=0, budget_s=500.0, reserving=True).cost_s == 0.0


def test_rounds_kept_and_needed():
    assert cp.rounds_kept(3, None, budgeted=True) == 3
    assert cp.rounds_kept(3, 2, budgeted=True) == 2  # fewer show it
    assert cp.rounds_kept(3, 5, budgeted=True) == 5  # more, under a budget
    assert cp.rounds_kept(3, 5, budgeted=False) == 3  # not under --trials
    assert cp.rounds_kept(3, cp.MAX_CONFIRM_ROUNDS + 1, budgeted=True) == 3  # past the most
    assert cp.rounds_kept(0, 5, budgeted=True) == 0  # --confirm-rounds 0 stays 0
    # +50% over a baseline measured tight, processes ±1% apart: two rounds show it
    n, why = cp.needed_rounds((150.0, 1.5), (100.0, 1.0), 0.01, 1)
    assert n == decision.MIN_ROUNDS and "+50.0%" in why
    # a wider spread asks for more rounds
    wide, _ = cp.needed_rounds((112.0, 1.0), (100.0, 1.0), 0.08, 1)
    assert wide is not None and wide > decision.PLANNED_ROUNDS
    assert cp.needed_rounds((101.0, 1.0), (100.0, 1.0), 0.01, 1) == (None, "")  # no gain
    assert cp.needed_rounds(None, (100.0, 1.0), 0.01, 1) == (None, "")


def test_the_budget_message_plan():
    """What the rest of a budget holds: search probes beside the confirmation's reserve."""
    roomy = cp.plan_budget(580.0, 600.0, 25.0, asked=3, confirm_probe_s=37.5)
    assert roomy.confirm_s == pytest.approx(0.35 * 600) and roomy.confirm.rounds == 3
    assert len(roomy.confirm.entries) == cp.ESSENTIAL_ENTRIES
    assert roomy.probes == int((580 - 210) // 25) and not roomy.short
    # a short budget: three rounds of search-length probes at the least, told it is short
    tight = cp.plan_budget(200.0, 220.0, 25.0, asked=3, confirm_probe_s=37.5)
    floor = decision.PLANNED_ROUNDS * cp.ESSENTIAL_ENTRIES * 25.0
    assert tight.confirm_s == floor and tight.confirm.rounds == decision.PLANNED_ROUNDS
    assert tight.probes == 2 and tight.short
    assert tight.needed_s(20.0) == 20 + 3 * 25 + floor
    one = cp.plan_budget(200.0, 220.0, 25.0, asked=1, confirm_probe_s=37.5)
    assert one.confirm_s == 75.0 and one.confirm.rounds == 1  # one round, as asked, in full


def test_which_entries_the_rounds_judge():
    """The baseline, the best and the runner-up (30 s probes, 0.1 s steps): all three with no
    budget or room for their rounds twice over; a choosing round where the rounds take turns
    and it fits beside the rounds of one candidate; the runner-up left out otherwise."""
    three = two(30.0, 20.0) + [Entry("runner-up", 30.0, 20.0, (2.0, 0.1))]
    lineup = cp.plan_lineup
    assert lineup(three, 2, asked=3, left_s=None) is cp.Lineup.ALL  # --trials
    assert lineup(three, 3, asked=3, left_s=50.0) is cp.Lineup.ALL  # the batch-keeping one
    assert lineup(three, 2, asked=3, left_s=50.0, extending=True) is cp.Lineup.ALL
    def turns_s(es):
        return cp.round_cost_s(es, [e.window_s for e in es], turns=True)

    choose_s = turns_s(three) + 3 * turns_s(three[:2])
    assert lineup(three, 2, asked=3, left_s=choose_s) is cp.Lineup.CHOOSE
    # one after another (a GPU): all three where twice their rounds fit, else two
    gpu = dict(asked=3, refused="a GPU")
    assert lineup(three, 2, left_s=2 * 3 * 90.0, **gpu) is cp.Lineup.ALL
    assert lineup(three, 2, left_s=2 * 3 * 90.0 - 1, **gpu) is cp.Lineup.ESSENTIAL
    # rounds the search's gain needs count too: five of all three do not fit in 540 s
    assert lineup(three, 2, left_s=2 * 3 * 90.0, needed=5, **gpu) is cp.Lineup.ESSENTIAL
    assert lineup(three, 2, asked=3, left_s=choose_s - 1) is cp.Lineup.ESSENTIAL


def test_a_script_the_search_saw_end_on_its_own_is_confirmed_one_probe_after_another():
    """A search probe that ended on its own (`Outcome.ENDED`, its figure from the span before
    the end) says the script's batches run out within a probe: in turns each probe first warms
    up alone and then needs several slices, so the rounds run one after another. Pruned,
    measured or failed probes say nothing of that, and a reason of the machine's comes first."""
    from types import SimpleNamespace

    from autotune.measuring.outcome import Outcome
    from autotune.tuning import confirm_rounds, objective
    from autotune.tuning.records import Known

    def known(*outcomes):
        return {(i,): Known(i, o, 100.0, 5.0, {"batch_size": 8 * (i + 1)})
                for i, o in enumerate(outcomes)}

    local = SimpleNamespace(takes_turns=True, launcher=SimpleNamespace(local=True, kind="local"))
    scorer = objective.Scorer(objective.Objective())
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}

    def refused(k, prober=local):
        return confirm_rounds.turns_refused(prober, scorer, env=no_gpu, known=k)

    assert refused(known(Outcome.OK, Outcome.PRUNED, Outcome.CRASHED)) == ""
    assert refused(None) == ""
    why = refused(known(Outcome.OK, Outcome.ENDED, Outcome.ENDED, Outcome.PRUNED))
    assert why.startswith("the script ended on its own in 2 search probe(s)"), why
    assert why == confirm_rounds.ended_in_search(known(Outcome.ENDED, Outcome.ENDED))
    mpirun = SimpleNamespace(takes_turns=True, launcher=SimpleNamespace(local=False,
                                                                         kind="mpirun"))
    assert refused(known(Outcome.ENDED), prober=mpirun).startswith("mpirun starts the ranks")
