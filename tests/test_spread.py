"""The spread between processes: the script's own config probed twice, split from the probes'
own spread, explained, and used by the search's pruning and the one-round speed-up interval."""

import math

import pytest

from autotune.tuning import decision, search_rules, spread
from autotune.tuning.learned import Learned
from autotune.tuning.spread import ProcessSpread, Side
from test_study import FakeProbe, machine, tune  # noqa: F401  (machine: a fixture)


def side(rate, rel_ci=0.01, **kw):
    return Side(rate, rate * rel_ci, **kw)


def test_the_same_figure_twice_is_no_more_than_the_probes_own_spread():
    s = spread.measure(side(100.0), side(101.0))
    assert s.measured and s.between_rel == spread.BETWEEN_FLOOR
    assert s.margin_rel() == spread.MARGIN_FLOOR
    assert "no more than their own intervals explain" in s.why


def test_processes_that_differ_beyond_their_intervals_give_the_spread_between_them():
    s = spread.measure(side(100.0), side(80.0))  # 22% apart (log), each probe ±1%
    d = math.log(100 / 80)
    own = 2 * (0.01 / 1.96) ** 2
    assert s.between_rel == pytest.approx(math.sqrt((d * d - own) / 2), rel=1e-9)
    assert 0.15 < s.between_rel < 0.16
    assert s.process_rel() == s.between_rel
    assert s.margin_rel() == pytest.approx(math.sqrt(2) * s.between_rel)
    # a difference the probes' own intervals explain leaves nothing between processes
    wide = spread.measure(side(100.0, rel_ci=0.4), side(80.0, rel_ci=0.4))
    assert wide.between_rel == spread.BETWEEN_FLOOR


@pytest.mark.parametrize("first, second, said", [
    (dict(foreign_cores=0.0), dict(foreign_cores=1.2), "other programs' load differed"),
    (dict(steal_cores=0.1), dict(steal_cores=0.9), "the hypervisor's steal differed (0.1 and 0.9"),
    (dict(first_s=2.0), dict(first_s=9.0), "start-up differed (2.0 s and 9.0 s"),
    (dict(warmup_s=3.0, measured_s=4.0), dict(warmup_s=3.0, measured_s=20.0),
     "warm-up may be left in"),
    ({}, {}, "not foreign load, steal nor start-up"),
])
def test_a_large_spread_is_put_down_to_what_differed(first, second, said):
    s = spread.measure(side(100.0, **first), side(75.0, **second))
    assert said in s.why and said in s.text()


def test_unmeasured_the_assumed_figure_stands_and_says_why():
    s = ProcessSpread(first=side(100.0), why="--trials 3 leaves too few probes")
    assert not s.measured and not s.pending and s.between_rel is None
    assert s.process_rel() == decision.PROCESS_NOISE_REL
    assert s.margin_rel() == search_rules.PRUNE_MARGIN_REL
    assert "not measured (--trials 3 leaves too few probes)" in s.text()
    assert ProcessSpread(first=side(100.0)).pending


def test_a_probe_with_a_figure_but_no_interval_leaves_the_spread_unmeasured():
    """Beside a busy suite a repeat of the baseline gave a figure with an infinite interval:
    `measure` raised a TypeError comparing the spread (None) and the tune died. No spread can
    be told from it; the assumed figure stands, and the reason says why."""
    s = spread.measure(side(100.0), Side(90.0, math.inf))
    assert not s.measured and s.between_rel is None
    assert "no figure, or none with an interval" in s.why
    assert s.process_rel() == decision.PROCESS_NOISE_REL
    assert s.margin_rel() == search_rules.PRUNE_MARGIN_REL and s.upper_rel() is None
    assert "was not measured" in s.text()
    assert spread.ProcessSpread.from_dict(s.to_dict()) == s


def test_the_spread_survives_tune_json():
    s = spread.measure(side(100.0, foreign_cores=0.5, first_s=3.0, steal_cores=0.2), side(90.0))
    back = Learned.from_dict(Learned(spread=s).to_dict()).spread
    assert back == s and back.between_rel == s.between_rel
    assert Learned.from_dict(Learned().to_dict()).spread is None


def test_a_one_round_interval_widens_with_the_spread_between_processes():
    w, b = decision.Summary(120.0, 1.2, 1), decision.Summary(100.0, 1.0, 1)
    narrow = decision.speedup_interval(1.2, [(120.0, 100.0)], w, b, process_rel=0.02)
    assumed = decision.speedup_interval(1.2, [(120.0, 100.0)], w, b)
    assert narrow[0] > 1.0 > assumed[0]  # 2% between processes: 1.2x is beyond doubt


def test_rounds_are_planned_at_the_pairs_whole_difference_made_median_unbiased():
    """A round's ratio carries its probes' own noise as well as what differs between
    processes, and one pair reads under the true spread two times in three: nanoGPT's shape
    read its config 5.5% apart (±3.3% between processes) and its rounds then spread ±9%."""
    s = spread.measure(side(153.2, rel_ci=0.029), side(161.9, rel_ci=0.048))
    d = math.log(161.9 / 153.2)
    assert s.between_rel == pytest.approx(0.033, abs=0.002)
    assert s.planning_rel() == pytest.approx(d / math.sqrt(2) * spread.MEDIAN_FACTOR, rel=1e-9)
    assert s.planning_rel() > s.between_rel
    # planned so, a +19% gain gets four rounds, not three
    within = math.hypot(0.044 / 1.898, 0.029)
    assert decision.rounds_planned(1.19, s.process_rel(), within, 1) == 3
    assert decision.rounds_planned(1.19, s.planning_rel(), within, 1) == 4
    # never under the spread between processes, capped, and assumed when not measured
    alike = spread.measure(side(100.0, rel_ci=0.4), side(80.0, rel_ci=0.4))
    assert alike.planning_rel() >= alike.between_rel
    assert spread.measure(side(100.0), side(10.0)).planning_rel() == spread.BETWEEN_CAP
    assert ProcessSpread(first=side(100.0)).planning_rel() == decision.PROCESS_NOISE_REL


def test_a_spread_from_few_pairs_is_taken_at_its_upper_bound():
    """One pair of processes is one degree of freedom: the spread it shows may be several
    times the true one. Where a round decides alone, the bound is what counts."""
    one = spread.upper_rel([0.01])
    assert one == pytest.approx(0.01 * math.sqrt(1 / 0.015791), rel=1e-4)  # ~7.96%
    two = spread.upper_rel([0.01, 0.01])
    assert two == pytest.approx(0.01 * math.sqrt(2 / 0.210721), rel=1e-4)  # ~3.08%
    assert two < one and spread.upper_rel([0.01, 0.05]) > two  # pooled as variances
    assert spread.upper_rel([]) is None and spread.upper_rel([None]) is None
    alike = spread.measure(side(100.0), side(101.0))
    assert alike.upper_rel() == pytest.approx(one)
    assert ProcessSpread(first=side(100.0)).upper_rel() is None
    # a pair's spread from two figures of one config, as the script's own config's is
    assert spread.pair_rel(100.0, 1.0, 80.0, 0.8) == spread.measure(
        side(100.0), side(80.0)).between_rel
    assert spread.pair_rel(0.0, 1.0, 80.0, 0.8) is None


def test_one_round_counts_each_candidates_search_probe_as_another_pair():
    """The candidate's search probe and its round are two processes of one config too: where
    they agree, the bound narrows (two pairs); where they do not, it widens."""
    from autotune.tuning import confirm_rounds
    alike = spread.measure(side(32.0), side(32.1))
    rel, Round = confirm_rounds.one_round_rel, confirm_rounds.Round
    agree = rel(alike, {"t1": (Round(42.4, 0.8), decision.Measured(42.6, 0.9))})
    differ = rel(alike, {"t1": (Round(50.0, 0.8), decision.Measured(42.6, 0.9))})
    unmeasured = rel(alike, {"t1": (Round(42.4, 0.8), None)})
    assert agree == pytest.approx(spread.upper_rel([0.01, 0.01]))
    assert unmeasured == pytest.approx(alike.upper_rel()) and unmeasured > agree
    assert differ > unmeasured


def rate_with_slow_second_baseline(baseline_knobs):
    """A surface whose script's own config gives 100 samples/s, then 70 in its second process."""
    seen = []

    def rate(knobs):
        if all(knobs.get(k) == v for k, v in baseline_knobs.items()):
            seen.append(1)
            return 100.0 if len(seen) == 1 else 70.0
        return 100.0 + knobs["workers"] * 5
    return rate


def test_the_search_probes_the_baseline_again_and_prunes_with_the_measured_margin(
        tmp_path, machine):
    fake = FakeProbe(rate_with_slow_second_baseline({"batch_size": 16, "workers": 0,
                                                     "threads": 2}))
    report, t, run_dir = tune(tmp_path, fake, trials=8, confirm_rounds=0,
                              space_tokens=("batch_size=16:32",))
    names = [s.ranks.name for s in fake.specs]
    assert names.count("baseline-again") == 1
    noise = report.process_noise
    assert noise.measured and noise.second.samples_per_s == 70.0
    assert noise.between_rel == pytest.approx(0.25, abs=0.01)
    assert noise.margin_rel() == spread.MARGIN_CAP
    assert t.state.learned.spread == noise  # kept in the state: a resume does not repeat it
    assert "noise: the script's own config started twice: 100.0 and 70.0" in \
        "\n".join(n.text for n in report.notes)
    summary = (run_dir / "summary.json").read_text()
    assert '"process_noise"' in summary and '"between_rel": 0.25' in summary


def test_a_search_of_a_few_trials_spends_no_probe_on_the_repeat(tmp_path, machine):
    fake = FakeProbe(lambda k: 100.0 + k["workers"])
    report, _, _ = tune(tmp_path, fake, trials=3, confirm_rounds=0)
    assert "baseline-again" not in [s.ranks.name for s in fake.specs]
    assert not report.process_noise.measured
    assert "--trials 3 leaves too few probes" in report.process_noise.why


def test_two_rounds_pool_their_spread_with_the_script_s_config_measured_twice():
    """Two rounds alone leave their spread one degree of freedom (t 15.9 at 96%): word_lm as
    it comes read its batch 128 at 1.10x and 1.07x of batch 20 in two rounds, with the script's
    own config 84.8 and 87.4 in its two processes, and kept batch 20 at 0.862x-1.362x. The pair
    is a round of one config against itself: pooled, it is a second degree of freedom."""
    pair = spread.measure(side(84.8, rel_ci=0.066), side(87.4, rel_ci=0.040))
    assert pair.pair_logs() == (pytest.approx(math.log(87.4 / 84.8)),)
    assert ProcessSpread(first=side(84.8)).pair_logs() == ()
    base = [decision.Measured(100.0, 2.0), decision.Measured(100.0, 2.0)]
    cand = [decision.Measured(112.0, 2.0), decision.Measured(109.0, 2.0)]
    level = 0.96
    alone = decision.decide({"baseline": base, "A": cand}, "baseline", level=level)
    pooled = decision.decide({"baseline": base, "A": cand}, "baseline", level=level,
                             prior=pair.pair_logs())
    assert alone.kept_baseline and alone.rounds_needed == 3, alone.reason
    assert not pooled.kept_baseline and pooled.speedup_low > 1.0, pooled.reason
    assert "2 interleaved rounds, beyond doubt (their spread pooled with the script's own " \
        "config measured twice)" in pooled.reason, pooled.reason
    # the interval is the pooled t: one more degree of freedom, the pair's square added
    logs = [math.log(112 / 100), math.log(109 / 100)]
    m = sum(logs) / 2
    sd = math.sqrt((sum((x - m) ** 2 for x in logs) + math.log(87.4 / 84.8) ** 2) / 2)
    half = decision.t_quantile(0.98, 2) * sd / math.sqrt(2)
    assert pooled.speedup_low == pytest.approx(pooled.speedup * math.exp(-half), rel=1e-9)


def test_a_pair_far_apart_widens_two_rounds_and_leaves_three_or_more_to_their_own_spread():
    """The pair ran one process after the other; rounds taking turns lose the drift between
    them, so the pair errs wide. It never widens three rounds or more: their own spread
    stands alone there (`decision.POOL_UNDER_DOF`)."""
    apart = spread.measure(side(100.0), side(60.0)).pair_logs()  # 40% apart
    two = {"baseline": [decision.Measured(100.0, 1.0)] * 2,
           "A": [decision.Measured(115.0, 1.0), decision.Measured(114.0, 1.0)]}
    assert not decision.decide(two, "baseline").kept_baseline
    assert decision.decide(two, "baseline", prior=apart).kept_baseline
    three = {"baseline": [decision.Measured(100.0, 1.0)] * 3,
             "A": [decision.Measured(r, 1.0) for r in (115.0, 114.0, 116.0)]}
    alone = decision.decide(three, "baseline")
    pooled = decision.decide(three, "baseline", prior=apart)
    assert (pooled.speedup_low, pooled.speedup_high) == (alone.speedup_low, alone.speedup_high)


def test_the_rounds_planned_count_the_pooled_pair():
    """The planner sizes the rounds on the statistic the race will use: at a +10% gain and a
    spread between processes of 2%, two rounds with the pair pooled show it, where alone they
    need three."""
    within = 0.02
    assert decision.rounds_planned(1.10, 0.02, within, 1) == 3
    assert decision.rounds_planned(1.10, 0.02, within, 1, prior_dof=1) == 2
    # from three rounds on the pair adds nothing: a gain three rounds need still needs them
    assert decision.rounds_planned(1.06, 0.02, within, 1, prior_dof=1) == \
        decision.rounds_planned(1.06, 0.02, within, 1)
