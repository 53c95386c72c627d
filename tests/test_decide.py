"""Pure rules of the search: OOM, pruning, convergence, the confirmation verdict."""

import math

from autotune.tuning import decision
from autotune.tuning.decision import Measured


def test_oom_rules_out_larger_batches_and_more_ranks():
    ooms = [{"batch_size": 128, "instances": 1}]
    assert decision.oom_blocks({"batch_size": 128, "instances": 1}, ooms) == ooms[0]
    assert decision.oom_blocks({"batch_size": 256, "instances": 2}, ooms) == ooms[0]
    assert decision.oom_blocks({"batch_size": 64, "instances": 2}, ooms) is None
    two_ranks = [{"batch_size": 128, "instances": 2}]
    assert decision.oom_blocks({"batch_size": 256, "instances": 1}, two_ranks) is None
    assert decision.oom_blocks({"workers": 2}, ooms) is None


def test_cannot_reach():
    assert decision.cannot_reach(50.0, 5.0, 100.0)  # 55 < 90
    assert not decision.cannot_reach(85.0, 6.0, 100.0)  # 91 >= 90: might still get there
    assert not decision.cannot_reach(10.0, math.inf, 100.0)  # interval not known yet
    assert not decision.cannot_reach(10.0, 1.0, None)  # nothing to compare with


def test_convergence_waits_for_patience():
    c = decision.Convergence(patience=3, rel=0.05, min_trials=4)
    assert not c.update(100.0)
    assert not c.update(102.0)  # +2%: not an improvement
    assert not c.update(None)  # a failed probe counts as no gain
    assert c.update(101.0)  # 3 without gain, 4 seen
    c = decision.Convergence(patience=2, rel=0.05, min_trials=2)
    c.update(100.0)
    c.update(99.0)
    assert not c.update(120.0)  # a real gain resets the count
    assert c.since_best == 0


def test_interleave_order():
    assert decision.interleave(["A", "B", "C"], 2) == [
        (1, "A"), (1, "B"), (1, "C"), (2, "A"), (2, "B"), (2, "C")]


def m(x, ci=1.0):
    return Measured(x, ci)


def test_winner_must_win_every_round_beyond_noise():
    d = decision.decide({"baseline": [m(100), m(104)], "t1": [m(150), m(146)],
                       "t2": [m(120), m(125)]}, "baseline")
    assert d.winner == "t1" and not d.kept_baseline
    assert d.speedup == (150 + 146) / (100 + 104)
    assert "every round" in d.reason


def test_gain_within_noise_keeps_baseline():
    d = decision.decide({"baseline": [m(100), m(100)], "t1": [m(102), m(102)]}, "baseline")
    assert d.kept_baseline and d.winner == "baseline" and d.speedup == 1.0
    assert "within the noise" in d.reason


def test_lost_one_round_keeps_baseline():
    d = decision.decide({"baseline": [m(100), m(130)], "t1": [m(150), m(120)]}, "baseline")
    assert d.kept_baseline and "did not win every round" in d.reason


def test_wide_intervals_raise_the_bar():
    # +10% would pass with tight intervals, not with +-20% ones.
    tight = decision.decide({"baseline": [m(100, 1)], "t1": [m(110, 1)]}, "baseline")
    loose = decision.decide({"baseline": [m(100, 20)], "t1": [m(110, 20)]}, "baseline")
    assert not tight.kept_baseline and loose.kept_baseline


def test_failed_candidate_and_baseline():
    d = decision.decide({"baseline": [m(100), m(100)], "t1": [None, None],
                       "t2": [m(130), m(131)]}, "baseline")
    assert d.winner == "t2"
    d = decision.decide({"baseline": [None], "t1": [m(130)]}, "baseline")
    assert d.kept_baseline and "could not be re-measured" in d.reason


def test_three_rounds_use_the_spread_of_ratios():
    noisy = decision.decide({"baseline": [m(100), m(100), m(100)],
                           "t1": [m(160), m(101), m(110)]}, "baseline")
    steady = decision.decide({"baseline": [m(100), m(100), m(100)],
                            "t1": [m(121), m(119), m(120)]}, "baseline")
    assert noisy.kept_baseline and not steady.kept_baseline


def test_summarize():
    s = decision.summarize([m(10, 1), m(12, 1)])
    assert s.samples_per_s == 11 and s.rounds == 2
    assert s.ci_half >= math.sqrt(2) / 2  # at least the probes' own intervals
    assert decision.summarize([]).rounds == 0


def test_combine_joins_the_moves_that_paid_off():
    base = {"batch_size": 32, "workers": 0, "thread_pct": 100}
    moves = [({**base, "batch_size": 256}, 130.0), ({**base, "workers": 2}, 200.0),
             ({**base, "thread_pct": 50}, 101.0), ({**base, "bucket_mb": 5}, None)]
    assert decision.combine(base, 100.0, moves) == {"batch_size": 256, "workers": 2,
                                                  "thread_pct": 100}
    assert decision.combine(base, 100.0, moves[1:]) is None  # one move alone is measured already


def test_confirmation_fits_what_is_left_of_the_budget():
    from autotune.tuning.fitting import MAX_CONFIRM_ROUNDS, confirm_fit

    assert confirm_fit(3, 30.0, 3, None, 20.0) == (3, 30.0)  # no budget: as asked
    assert confirm_fit(3, 30.0, 3, 300.0, 20.0) == (3, 30.0)  # it fits
    # too little: probes shorten first (rounds are what the interval stands on)...
    assert confirm_fit(3, 30.0, 3, 225.0, 20.0) == (3, 25.0)
    # ...down to a search probe's length, then rounds go
    assert confirm_fit(3, 30.0, 3, 150.0, 20.0) == (2, 20.0)
    assert confirm_fit(3, 30.0, 3, 10.0, 20.0) == (1, 20.0)  # never shorter than a search probe
    # a search stopped by its budget: what is left buys rounds, up to the most
    assert confirm_fit(3, 30.0, 3, 450.0, 20.0, stretch=True) == (5, 30.0)
    assert confirm_fit(3, 30.0, 3, 9000.0, 20.0, stretch=True) == (MAX_CONFIRM_ROUNDS, 30.0)
    assert confirm_fit(3, 30.0, 3, 450.0, 20.0) == (3, 30.0)  # not stretched otherwise


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
