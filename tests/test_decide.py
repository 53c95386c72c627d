"""Pure rules of the search: OOM, pruning, convergence, the confirmation verdict."""

import math

import pytest

from autotune.tuning import decision, search_rules
from autotune.tuning.decision import Measured


def test_oom_rules_out_larger_batches_and_more_ranks():
    ooms = [{"batch_size": 128, "instances": 1}]
    assert search_rules.oom_blocks({"batch_size": 128, "instances": 1}, ooms) == ooms[0]
    assert search_rules.oom_blocks({"batch_size": 256, "instances": 2}, ooms) == ooms[0]
    assert search_rules.oom_blocks({"batch_size": 64, "instances": 2}, ooms) is None
    two_ranks = [{"batch_size": 128, "instances": 2}]
    assert search_rules.oom_blocks({"batch_size": 256, "instances": 1}, two_ranks) is None
    assert search_rules.oom_blocks({"workers": 2}, ooms) is None


def test_cannot_reach():
    assert search_rules.cannot_reach(50.0, 5.0, 100.0)  # 55 < 90
    assert not search_rules.cannot_reach(85.0, 6.0, 100.0)  # 91 >= 90: might still get there
    assert not search_rules.cannot_reach(10.0, math.inf, 100.0)  # interval not known yet
    assert not search_rules.cannot_reach(10.0, 1.0, None)  # nothing to compare with


def test_convergence_waits_for_patience():
    c = search_rules.Convergence(patience=3, rel=0.05, min_trials=4)
    assert not c.update(100.0)
    assert not c.update(102.0)  # +2%: not an improvement
    assert not c.update(None)  # a failed probe counts as no gain
    assert c.update(101.0)  # 3 without gain, 4 seen
    c = search_rules.Convergence(patience=2, rel=0.05, min_trials=2)
    c.update(100.0)
    c.update(99.0)
    assert not c.update(120.0)  # a real gain resets the count
    assert c.since_best == 0


def test_interleave_order():
    assert decision.interleave(["A", "B", "C"], 2) == [
        (1, "A"), (1, "B"), (1, "C"), (2, "A"), (2, "B"), (2, "C")]


def m(x, ci=1.0):
    return Measured(x, ci)


def test_a_clear_winner_over_three_rounds_replaces_the_defaults():
    d = decision.decide({"baseline": [m(100), m(104), m(102)],
                         "t1": [m(150), m(146), m(151)], "t2": [m(120), m(125), m(122)]},
                        "baseline")
    assert d.winner == "t1" and not d.kept_baseline and d.rounds == 3 and d.candidates == 2
    assert d.speedup == (150 + 146 + 151) / (100 + 104 + 102)
    assert 1.0 < d.speedup_low < d.speedup < d.speedup_high
    assert "beyond doubt" in d.reason and "3 interleaved rounds" in d.reason
    assert "over 2 candidates (97.5% each, Bonferroni)" in d.reason


def test_two_rounds_can_switch_when_they_agree():
    d = decision.decide({"baseline": [m(100), m(100)], "t1": [m(150), m(150.5)]}, "baseline")
    assert not d.kept_baseline and d.speedup_low > 1.0


def test_one_round_never_switches():
    # +50% with tight probe intervals: still one process each, so no switch
    d = decision.decide({"baseline": [m(100, 0.1)], "t1": [m(150, 0.1)]}, "baseline")
    assert d.kept_baseline and d.winner == "baseline" and d.speedup == 1.0
    assert d.rounds == 1 and d.candidate == "t1" and d.candidate_speedup == 1.5
    assert "one interleaved round" in d.reason and "needs 2 rounds at least" in d.reason
    assert d.reason.startswith(decision.KEPT)


def test_gain_within_noise_keeps_baseline():
    d = decision.decide({"baseline": [m(100), m(100)], "t1": [m(102), m(102)]}, "baseline")
    assert d.kept_baseline and d.winner == "baseline" and d.speedup == 1.0
    assert "not above the 3% a switch needs" in d.reason and d.rounds_needed is None


def test_lost_one_round_keeps_baseline():
    d = decision.decide({"baseline": [m(100), m(130)], "t1": [m(150), m(120)]}, "baseline")
    assert d.kept_baseline and "holds 1.0" in d.reason


def test_the_correction_for_several_candidates_can_keep_the_defaults():
    """An interval above 1.0 for one candidate alone, not once the best of four was picked."""
    rounds = {"baseline": [m(100), m(100), m(100)], "t1": [m(112), m(108), m(116)]}
    alone = decision.decide(rounds, "baseline")
    assert not alone.kept_baseline and alone.candidates == 1
    assert "95% interval of the speed-up" in alone.reason
    slow = [m(90), m(90), m(90)]
    four = decision.decide({**rounds, "t2": slow, "t3": slow, "t4": slow}, "baseline")
    assert four.winner == "baseline" and four.kept_baseline and four.candidates == 4
    assert four.candidate == "t1" and "holds 1.0 over 3 rounds" in four.reason
    # what would be needed: a number of rounds, from the spread seen
    assert four.rounds_needed is not None and four.rounds_needed > 3
    assert f"about {four.rounds_needed} rounds would show the gain" in four.reason
    # the same rounds, corrected for four candidates given explicitly
    assert decision.decide(rounds, "baseline", candidates=4).kept_baseline
    low1, _ = decision.speedup_interval(1.12, [(112, 100), (108, 100), (116, 100)],
                                        decision.summarize(rounds["t1"]),
                                        decision.summarize(rounds["baseline"]))
    low4, _ = decision.speedup_interval(1.12, [(112, 100), (108, 100), (116, 100)],
                                        decision.summarize(rounds["t1"]),
                                        decision.summarize(rounds["baseline"]), candidates=4)
    assert low4 < 1.0 < low1


def test_rounds_needed_follows_the_spread():
    logs = [math.log(1.12), math.log(1.06), math.log(1.18)]
    n = decision.rounds_needed(1.12, logs, 0.01, 4)
    assert n is not None and n > 3
    # a wider spread needs more rounds; a tighter one fewer
    wide = [math.log(1.20), math.log(1.00), math.log(1.16)]
    assert decision.rounds_needed(1.12, wide, 0.01, 4) > n
    assert decision.rounds_needed(1.02, logs, 0.01, 4) is None  # under the gain worth a switch
    assert decision.rounds_needed(1.12, logs[:1], 0.01, 4) is None  # one round: no spread


def test_rounds_planned_before_any_round_follow_the_gain_and_the_spread_between_processes():
    # +30% beside an assumed ±10% between processes (a round's ratio: sqrt(2) of it): 3 rounds
    # give t(0.975, 2) 4.30 x 0.135 / sqrt(3) = 0.34 over log(1.3) = 0.26; 4 give 0.21
    assert decision.rounds_planned(1.30, 0.10, 0.0, 1) == 4
    n = decision.rounds_planned(1.15, 0.05, 0.02, 2)
    assert n is not None and n >= decision.MIN_ROUNDS
    assert decision.rounds_planned(1.30, 0.05, 0.02, 2) < n  # a larger gain: fewer
    assert decision.rounds_planned(1.15, 0.08, 0.02, 2) > n  # a wider spread: more
    assert decision.rounds_planned(1.15, 0.05, 0.02, 4) >= n  # more picked from: no fewer
    assert decision.rounds_planned(1.15, 0.05, 0.30, 2) > n  # wide probes: more
    assert decision.rounds_planned(1.02, 0.01, 0.0, 1) is None  # no gain worth a switch
    assert decision.rounds_planned(1.04, 0.25, 0.0, 1) is None  # beyond any advice
    assert decision.rounds_planned(2.0, 0.01, 0.0, 1) == decision.MIN_ROUNDS
    # where the spread was measured, its upper bound may let one round decide alone
    assert decision.rounds_planned(2.0, 0.01, 0.0, 1, one_round_rel=0.08) == 1
    assert decision.rounds_planned(1.30, 0.01, 0.02, 1, one_round_rel=0.08) == 1
    assert decision.rounds_planned(1.15, 0.01, 0.02, 1, one_round_rel=0.08) == \
        decision.MIN_ROUNDS  # +15% is within what ±8% processes can do
    assert decision.rounds_planned(1.30, 0.01, 0.02, 3, one_round_rel=0.08) == 1
    assert decision.rounds_planned(1.30, 0.01, 0.02, 1, one_round_rel=0.2) >= decision.MIN_ROUNDS


def test_one_round_decides_alone_only_beyond_the_spreads_upper_bound():
    """minGPT's shape: its config moves ~1% between processes; +33% in one round is beyond
    even processes 8% apart, and the claim's interval allows for that spread; +15% is not."""
    one = {"baseline": [m(32.0, 0.5)], "t1": [m(42.6, 0.9)]}
    d = decision.decide(one, "baseline", one_round_rel=0.08)
    assert not d.kept_baseline and d.winner == "t1" and d.rounds == 1
    assert "over one interleaved round, beyond doubt even were processes ±8.0% apart" in d.reason
    low, high = d.speedup_low, d.speedup_high
    half = decision.one_round_half(math.hypot(0.5 / 32.0, 0.9 / 42.6), 0.08, 1)
    assert low == pytest.approx(d.speedup * math.exp(-half), rel=1e-9)
    assert 1.0 < low < d.speedup < high
    # the bound, not the spread measured, makes the interval: one round at 1% is narrower
    narrow = decision.speedup_interval(d.speedup, [(42.6, 32.0)], d.winner_summary,
                                       d.baseline_summary, process_rel=0.01)
    assert narrow[0] > low
    # without a measured spread one round never switches; with a wide bound it does not either
    assert decision.decide(one, "baseline").kept_baseline
    wide = decision.decide(one, "baseline", one_round_rel=0.25)
    assert wide.kept_baseline and "one decides alone only when the gain is beyond processes " \
        "±25.0% apart" in wide.reason
    small = decision.decide({"baseline": [m(100.0, 0.5)], "t1": [m(115.0, 0.5)]}, "baseline",
                            one_round_rel=0.08)
    assert small.kept_baseline and small.candidate == "t1"
    # two rounds or more: the per-round ratios decide, the bound plays no part
    two = {"baseline": [m(100.0), m(100.0)], "t1": [m(150.0), m(150.5)]}
    assert decision.decide(two, "baseline", one_round_rel=0.5) == decision.decide(two,
                                                                                    "baseline")


def test_t_quantile_and_levels():
    assert decision.t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert decision.t_quantile(0.975, 10) == pytest.approx(2.228, abs=1e-3)
    assert decision.t_quantile(0.9875, 2) == pytest.approx(6.205, abs=1e-3)
    assert decision.level_for(1) == 0.95 and decision.level_for(2) == pytest.approx(0.975)


def test_the_claim_is_never_rounded_up():
    assert decision.claim_text(1.0999, 0.9999, 1.2001) == "1.099x (0.999x-1.201x)"
    assert decision.claim_text(1.14, 0.89, 1.46) == "1.140x (0.890x-1.460x)"


def test_wide_intervals_raise_the_bar():
    # +10% over two agreeing rounds passes with tight probe intervals, not with +-20% ones
    tight = decision.decide({"baseline": [m(100, 1), m(100, 1)],
                             "t1": [m(110, 1), m(110, 1)]}, "baseline")
    loose = decision.decide({"baseline": [m(100, 20), m(100, 20)],
                             "t1": [m(110, 20), m(110, 20)]}, "baseline")
    assert not tight.kept_baseline and loose.kept_baseline


def test_failed_candidate_and_baseline():
    d = decision.decide({"baseline": [m(100), m(100)], "t1": [None, None],
                         "t2": [m(130), m(131)]}, "baseline")
    assert d.winner == "t2" and d.candidates == 2  # the failed one was a candidate too
    d = decision.decide({"baseline": [None], "t1": [m(130)]}, "baseline")
    assert d.kept_baseline and "could not be re-measured" in d.reason


def test_three_rounds_use_the_spread_of_ratios():
    noisy = decision.decide({"baseline": [m(100), m(100), m(100)],
                             "t1": [m(160), m(101), m(110)]}, "baseline")
    steady = decision.decide({"baseline": [m(100), m(100), m(100)],
                              "t1": [m(121), m(119), m(120)]}, "baseline")
    assert noisy.kept_baseline and not steady.kept_baseline


def test_a_load_that_moves_both_configs_of_a_round_cancels_in_their_ratio():
    """Rounds at different loads (100, 130, 85 for the baseline), the candidate 20% faster in
    each: the ratios agree, so the gain is beyond doubt, though each config's own figures
    spread wider than the gain. Unpaired, the spread would hold 1.0; paired, it does not."""
    load = [1.0, 1.3, 0.85, 1.15, 0.95]
    rounds = {"baseline": [m(100 * f) for f in load],
              "t1": [m(120 * f * (1 + e)) for f, e in zip(load, (0.01, -0.01, 0.02, 0, -0.02))]}
    d = decision.decide(rounds, "baseline")
    assert not d.kept_baseline and d.winner == "t1", d.reason
    assert 1.0 < d.speedup_low < 1.2 < d.speedup_high
    own = decision.summarize(rounds["t1"])
    assert own.ci_half > 0.2 * own.samples_per_s  # each config alone: spread wider than the gain
    assert own.own_half == pytest.approx(math.sqrt(5) / 5)  # the probes' own intervals
    # the ratios disagreeing as much as the loads did: the spread is the ratios', and it holds
    crossed = {"baseline": rounds["baseline"],
               "t1": [m(120 * f) for f in (0.85, 1.0, 1.3, 0.95, 1.15)]}
    assert decision.decide(crossed, "baseline").kept_baseline


def test_summarize():
    s = decision.summarize([m(10, 1), m(12, 1)])
    assert s.samples_per_s == 11 and s.rounds == 2
    assert s.ci_half >= math.sqrt(2) / 2  # at least the probes' own intervals
    assert decision.summarize([]).rounds == 0


def test_combine_joins_the_moves_that_paid_off():
    base = {"batch_size": 32, "workers": 0, "thread_pct": 100}
    moves = [({**base, "batch_size": 256}, 130.0), ({**base, "workers": 2}, 200.0),
             ({**base, "thread_pct": 50}, 101.0), ({**base, "bucket_mb": 5}, None)]
    assert search_rules.combine(base, 100.0, moves) == {"batch_size": 256, "workers": 2,
                                                  "thread_pct": 100}
    assert search_rules.combine(base, 100.0, moves[1:]) is None  # one move alone is measured already


def test_confirmation_fits_what_is_left_of_the_budget():
    from autotune.tuning.confirm_plan import MAX_CONFIRM_ROUNDS, fit_rounds as confirm_fit

    assert confirm_fit(3, 30.0, 3, None, 20.0) == (3, 30.0)  # no budget: as asked
    assert confirm_fit(3, 30.0, 3, 300.0, 20.0) == (3, 30.0)  # it fits
    # too little: probes shorten first (rounds are what the interval stands on)...
    assert confirm_fit(3, 30.0, 3, 225.0, 20.0) == (3, 25.0)
    # ...down to a search probe's length, then rounds go
    assert confirm_fit(3, 30.0, 3, 150.0, 20.0) == (2, 20.0)
    assert confirm_fit(3, 30.0, 3, 10.0, 20.0) == (1, 20.0)  # never shorter than a search probe
    # ...except where one round (which cannot switch) would leave the budget unspent, and two
    # of probes at 80% of the search's or more fit: minGPT's shape, 200 s for rounds of 107 s
    assert confirm_fit(3, 53.5, 2, 200.0, 53.5) == (2, 50.0)
    assert confirm_fit(3, 53.5, 2, 160.0, 53.5) == (1, 53.5)  # 40 s probes: too short
    assert confirm_fit(1, 53.5, 2, 100.0, 53.5) == (1, 53.5)  # --confirm-rounds 1: as asked
    # a search stopped by its budget: what is left buys rounds, up to the most
    most = MAX_CONFIRM_ROUNDS
    assert confirm_fit(3, 30.0, 3, 450.0, 20.0, stretch_to=most) == (5, 30.0)
    assert confirm_fit(3, 30.0, 3, 9000.0, 20.0, stretch_to=most) == (most, 30.0)
    assert confirm_fit(3, 30.0, 3, 450.0, 20.0) == (3, 30.0)  # not stretched otherwise
    # one that ended early: up to the rounds its gain needs, as the budget holds them
    assert confirm_fit(3, 30.0, 3, 9000.0, 20.0, stretch_to=4) == (4, 30.0)
    assert confirm_fit(3, 30.0, 3, 9000.0, 20.0, stretch_to=40) == (most, 30.0)
    assert confirm_fit(3, 30.0, 3, 300.0, 20.0, stretch_to=5) == (3, 30.0)


def test_scaling_efficiency_weighs_n_ranks_against_the_best_one_rank_config():
    from types import SimpleNamespace

    from autotune.measuring.outcome import Outcome
    from autotune.tuning.records import Known, Scored, TuneReport
    from autotune.tuning.tuner import _one_rank_best

    base = Scored({"batch_size": 32, "instances": 1}, 400.0, 10.0)
    best = Scored({"batch_size": 32, "instances": 2}, 720.0, 12.0)
    known = {1: Known(1, Outcome.OK, 450.0, 9.0, {"batch_size": 64, "instances": 1}),
             2: Known(2, Outcome.OK, 720.0, 12.0, dict(best.knobs)),
             3: Known(3, Outcome.CRASHED, 0.0, 0.0, {"batch_size": 256, "instances": 1})}
    one = _one_rank_best(known, SimpleNamespace(baseline=base))
    assert one == 450.0

    def report(winner, one_rank):
        return TuneReport(run_dir=None, space=None, baseline=base, best=winner, speedup=1.0,
                          kept_baseline=False, reason="", trials_measured=3, trials_total=3,
                          stop_reason="", source="dataloader", one_rank_samples_per_s=one_rank)

    assert report(best, one).scaling_efficiency == 720.0 / 900.0
    assert report(base, one).scaling_efficiency is None  # one rank: nothing to weigh
    assert report(best, 0.0).scaling_efficiency is None  # no one-rank figure


def test_combine_takes_the_better_of_two_moves_of_one_knob():
    """The batch's two neighbours both paid off: the better one joins the other knob's move;
    two moves of the batch alone are one knob, not a combination."""
    base = {"batch_size": 32, "workers": 0}
    down, up = {"batch_size": 16, "workers": 0}, {"batch_size": 64, "workers": 0}
    workers = {"batch_size": 32, "workers": 2}
    for moves in ([(down, 110.0), (up, 120.0), (workers, 130.0)],
                  [(up, 120.0), (down, 110.0), (workers, 130.0)]):
        assert search_rules.combine(base, 100.0, moves) == {"batch_size": 64, "workers": 2}
    assert search_rules.combine(base, 100.0, [(down, 110.0), (up, 120.0)]) is None


# The machine's drift from slice to slice, which two probes taking turns share.
DRIFT = [1.0, 0.84, 1.16, 0.9, 1.12, 0.95]


def _in_turns(gain, *, scatter=0.0, rounds=3):
    """Rounds of a baseline and a candidate ``gain`` times faster that took turns: each
    round's slice rates (the drift on both, ``scatter`` of the candidate's own on top), and
    each probe's figure with the interval its own slices give."""
    out = {"baseline": [], "c": []}
    slices = {"baseline": [], "c": []}
    for r in range(rounds):
        level = 1 + 0.02 * (r - 1)
        base = [200 * level * d for d in DRIFT]
        cand = [200 * gain * level * d * (1 + scatter * (-1) ** (i + r)) for i, d in
                enumerate(DRIFT)]
        for name, xs in (("baseline", base), ("c", cand)):
            mean = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
            out[name].append(Measured(mean, 2.571 * sd / math.sqrt(len(xs))))
            slices[name].append(xs)
    return out, slices


def test_slices_taken_in_turns_show_a_gain_the_probes_own_drift_hides():
    results, slices = _in_turns(1.08, scatter=0.02)
    assert decision.decide(results, "baseline").kept_baseline  # each probe's ±12% drift
    d = decision.decide(results, "baseline", slices=slices)
    assert not d.kept_baseline and d.winner == "c"
    assert 1.0 < d.speedup_low < d.speedup < d.speedup_high < 1.12


def test_slices_whose_ratios_scatter_keep_the_defaults():
    results, slices = _in_turns(1.05, scatter=0.2)
    d = decision.decide(results, "baseline", slices=slices)
    assert d.kept_baseline, d.reason
    assert d.candidate == "c" and d.rounds_needed is not None and d.rounds_needed > 3


def test_the_paired_floor_needs_three_units_of_two_cycles():
    level = decision.level_for(1)
    one = ([1.1, 1.2, 1.1, 1.3], [1.0, 1.0, 1.0, 1.0])  # two units
    assert decision.paired_half([one], level) is None
    assert decision.paired_half([one, one], level) is not None
    broken = ([1.1, None, 1.1, 1.3], [1.0, 1.0, None, 1.0])  # both its units are lost
    assert decision.paired_half([one, broken], level) is None


def test_a_drift_across_two_cycles_cancels_in_the_paired_floor():
    """Taking turns A B B A, a steady drift of 8% a slice makes one cycle's ratio read high
    and the next one's low; two cycles together cancel it, so the floor is the ratios' own."""
    rounds = []
    for _ in range(3):
        speed = [1.08 ** k for k in range(8)]  # slice k of the round, in the order they ran
        base, cand = [], []
        for cycle in range(4):
            first, second = speed[2 * cycle], speed[2 * cycle + 1]
            b, c = (first, second) if cycle % 2 == 0 else (second, first)
            base.append(200 * b)
            cand.append(220 * c)  # 1.10x
        rounds.append((cand, base))
    level = decision.level_for(1)
    assert decision.paired_half(rounds, level) == pytest.approx(0.0, abs=1e-9)
    # single slices would have read the drift as a spread of ±8% a pair
    singles = [math.log(c / b) for cand, base in rounds for c, b in zip(cand, base)]
    assert max(singles) - min(singles) > 0.14


def test_a_kept_baseline_asks_for_a_larger_budget_only_when_the_one_given_was_short():
    """word_lm's shape kept its defaults after three rounds planned from the search's spread,
    214 s of a 6m budget unspent, and the reason asked for --budget 7m: the rounds asked, not
    the budget, were short. The reason asks for a larger budget only when what was left could
    not hold the rounds that would decide."""
    from autotune.tuning import confirm
    from autotune.tuning.records import TuneSettings

    s = decision.summarize([Measured(2000.0, 40.0)] * 3)
    d = decision.Decision("baseline", True, 1.0, s, s, 0.1, f"{decision.KEPT}not beyond doubt",
                          rounds=3, rounds_needed=6, candidate="trial-2",
                          candidate_speedup=1.093)
    settings = TuneSettings(command=("t.py",), cwd="/w", budget_s=360.0, confirm_rounds=3)
    windows = {"baseline": 7.0, "trial-2": 7.0}  # 3 more rounds of 14 s: 42 s
    spare = confirm._needs(d, 3, windows, settings, 213.0)
    short = confirm._needs(d, 3, windows, settings, 30.0)
    assert spare.endswith("6 rounds of ~14 s (42s more) would decide: --confirm-rounds 6"), spare
    assert short.endswith("would decide: --confirm-rounds 6 and --budget 7m"), short
