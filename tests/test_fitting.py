"""Probes fitted to the script (`autotune.tuning.fitting`): the rules on plain numbers, then a
tuning run against a fake probe that behaves like a script with slow steps, on a fake clock."""

import dataclasses
import math

import re

import pytest

from autotune.measuring.outcome import Outcome
from autotune.measuring.result import TrialResult
from autotune.tuning import decision, fitting, search, search_budget
from autotune.tuning.fitting import Pace, ScriptTiming
from autotune.tuning.records import Stop
from conftest import journal
from test_study import FakeProbe, machine, result, tune  # noqa: F401
from test_study_budget import FakeClock, race_ran

SLOW = ScriptTiming(first_s=8.0, warmup_s=2.0, step_s=1.0, measured_s=16.0, rel_half=0.05,
                    batch_size=32, threads=2)
FAST = ScriptTiming(first_s=2.0, warmup_s=0.5, step_s=0.01, measured_s=5.0, rel_half=0.03,
                    batch_size=32, threads=2)


def test_a_slow_script_gets_long_probes_and_a_fast_one_short_ones():
    slow, fast = fitting.limits(SLOW, {"batch_size": 32}), fitting.limits(FAST, {"batch_size": 32})
    # start-up, warm-up and the baseline's measuring time, with a margin
    assert slow.expected_s == pytest.approx(8 + 2 + 16)
    assert slow.max_s >= slow.expected_s * fitting.MARGIN
    assert fast.max_s < 15 < slow.max_s
    # enough windows of ~2 steps each to measure
    assert slow.min_measure_s >= 4 * 2 * SLOW.step_s


def test_a_larger_batch_or_fewer_threads_stretch_the_probe():
    base = fitting.limits(SLOW, {"batch_size": 32, "threads": 2})
    big = fitting.limits(SLOW, {"batch_size": 128, "threads": 2})
    thin = fitting.limits(SLOW, {"batch_size": 32, "threads": 1})
    small = fitting.limits(SLOW, {"batch_size": 8, "threads": 2})
    # 1 s steps have 2 s windows; 4 s steps 5 s windows (the most), 2 s steps 4 s windows:
    # warm-up and measuring stretch with the windows, the limit with the steps
    assert big.expected_s == pytest.approx(8 + 2.5 * (2 + 16))
    assert big.max_s >= fitting.MARGIN * (8 + 4 * (2 + 16))
    assert thin.expected_s == pytest.approx(8 + 2 * (2 + 16))
    assert small.expected_s == base.expected_s  # never shortened on a guess
    # two ranks start slower than one
    assert fitting.limits(SLOW, {"batch_size": 32}, 2).expected_s > base.expected_s


def test_the_least_a_probe_measures_in_holds_its_first_batch_warm_up_and_windows():
    """Below its least a probe ends with no signal; the least stretches with the step, warm-up
    included (a guess is never shortened), so a larger batch's least is longer than its share of
    the expected time suggests."""
    base = fitting.limits(SLOW, {"batch_size": 32, "threads": 2})
    big = fitting.limits(SLOW, {"batch_size": 128, "threads": 2})
    # 1 s steps: 2 s windows; 4 s steps: 5 s windows, the most
    assert base.least_s == pytest.approx(8 + 2 + fitting.MIN_WINDOWS * 2)
    assert big.least_s == pytest.approx(8 + 4 * 2 + fitting.MIN_WINDOWS * 5)
    assert base.least_s < base.expected_s
    # half of the large batch's expected time would measure nothing
    assert 0.5 * big.expected_s < big.least_s < big.max_s


def test_a_larger_batch_of_short_steps_is_expected_to_take_the_baseline_s_time():
    """Steps of 10 ms and 40 ms both fill the same 0.5 s windows, and a probe ends once its
    windows agree: the larger batch costs what the baseline did (nanoGPT's batch 64, 5x the
    step, measured 7 s where its baseline measured 10), while its limit makes room for 4x."""
    base = fitting.limits(FAST, {"batch_size": 32, "threads": 2})
    big = fitting.limits(FAST, {"batch_size": 128, "threads": 2})
    assert big.expected_s == pytest.approx(base.expected_s)
    assert big.max_s > base.max_s


def test_a_pace_seen_nearer_the_batch_replaces_the_proportional_guess():
    # batch 128 stepped in 2 s, not the 4 s that proportion to the baseline's batch 32 says
    seen = [Pace(batch_size=128, threads=2, step_s=2.0)]
    assert fitting.step_factor(SLOW, {"batch_size": 128, "threads": 2}, 1, seen) == 2.0
    assert fitting.step_factor(SLOW, {"batch_size": 256, "threads": 2}, 1, seen) == 4.0
    assert fitting.step_factor(SLOW, {"batch_size": 32, "threads": 2}, 1, seen) == 1.0


def test_a_larger_batch_s_first_batch_comes_as_late_as_the_nearest_probe_s_did():
    """nanoGPT's shape evaluates before step 0 at the batch it trains with: its first batch came
    after 5.7 s at batch 12, 7.3 at 32, 10.6 at 64; batch 96 then took 16.5."""
    t = dataclasses.replace(FAST, first_s=5.7, batch_size=12)
    seen = [Pace(32, 2, 0.02, first_s=7.3), Pace(64, 2, 0.04, first_s=10.6),
            Pace(128, 2, 0.08)]  # a pace without its first batch (two ranks) says nothing
    assert fitting.first_batch_s(t, {"batch_size": 96}, seen) == 10.6
    assert fitting.first_batch_s(t, {"batch_size": 40}, seen) == 7.3
    assert fitting.first_batch_s(t, {"batch_size": 8}, seen) == 5.7
    # never sooner than the baseline's
    quick = [Pace(64, 2, 0.04, first_s=2.0)]
    assert fitting.first_batch_s(t, {"batch_size": 64}, quick) == 5.7
    late = fitting.limits(t, {"batch_size": 96}, seen=seen)
    early = fitting.limits(t, {"batch_size": 96})
    assert late.expect_first_s == 10.6 and early.expect_first_s == 5.7
    assert late.expected_s == pytest.approx(early.expected_s + 10.6 - 5.7)
    assert late.max_s > early.max_s
    # kept in tune.json with the paces
    from autotune.tuning.learned import Learned
    back = Learned.from_dict(Learned(timing=t, paces=tuple(seen)).to_dict())
    assert back.paces == tuple(seen)


def test_a_probe_is_expected_to_end_on_the_windows_an_interval_needs_not_the_limit_s():
    """minGPT's chargpt: 2.5 s steps (5 s windows), ±3% after 19 s of measuring. The 5% target
    needs 7 s by the baseline's own interval; a probe ending once tight stands on 4 windows
    (20 s), not the 6 (30 s) its limit makes room for."""
    chargpt = ScriptTiming(first_s=12.0, warmup_s=5.0, step_s=2.5, measured_s=19.0,
                           rel_half=0.03, batch_size=64, threads=2)
    lim = fitting.limits(chargpt, {"batch_size": 64, "threads": 2})
    assert lim.expected_s == pytest.approx(12 + 5 + 4 * 5)
    assert lim.max_s >= fitting.MARGIN * (12 + 5 + fitting.MIN_WINDOWS * 5)
    assert lim.least_s <= lim.max_s
    # a noisier baseline asks for more than the windows: its own interval sizes the probe
    noisy = dataclasses.replace(chargpt, rel_half=0.08)
    assert fitting.limits(noisy, {"batch_size": 64, "threads": 2}).expected_s == \
        pytest.approx(12 + 5 + 19 * (0.08 / 0.05) ** 2)


def test_a_probe_is_expected_to_take_no_longer_than_the_baseline_took_to_be_tight():
    """pytorch/examples' word_language_model as it comes: 250 ms steps, the baseline tight
    after 4 s of measuring, its final estimate ±21% after 6 s (what it measured until its ranks
    stopped). By that final interval a probe needs 24 s of measuring (the bound of four times
    the baseline's) and a 5-minute budget held none; by the time it took to be tight, 4 s."""
    final = ScriptTiming(first_s=4.0, warmup_s=1.0, step_s=0.25, measured_s=6.0,
                         rel_half=0.21, batch_size=20, threads=2)
    tight = dataclasses.replace(final, tight_s=4.0)
    knobs = {"batch_size": 20, "threads": 2}
    wide, fitted = fitting.limits(final, knobs), fitting.limits(tight, knobs)
    # 250 ms steps: 0.5 s windows; warm-up 4 steps of 250 ms
    assert wide.expected_s == pytest.approx(4.0 + 1.0 + 4 * 6.0)
    assert fitted.expected_s == pytest.approx(4.0 + 1.0 + 4.0)
    assert fitted.max_s == wide.max_s  # the limit is not cut on it
    # a larger batch's probe stretches it with its windows (2 steps of 1 s: 2 s windows)
    big = fitting.limits(tight, {"batch_size": 80, "threads": 2})
    assert big.expected_s == pytest.approx(4.0 + 4 * 1.0 + 4.0 * 4)
    # a tighter target than the baseline's (a confirmation's) is not capped by it
    assert fitting.limits(tight, knobs, target_rel=0.02).expected_s == \
        fitting.limits(final, knobs, target_rel=0.02).expected_s
    # never below the windows an interval needs, nor above what the final interval asks
    assert fitting.expected_measure_s(dataclasses.replace(tight, tight_s=0.5), 0.05) == \
        pytest.approx(4 * 0.5)
    calm = dataclasses.replace(tight, rel_half=0.02, tight_s=5.0)
    assert fitting.expected_measure_s(calm, 0.05) == fitting.measure_s(calm, 0.05, 4)
    assert "within ±5% after 4 s, where it ended" in tight.describe()
    assert "where it ended" not in final.describe()
    assert ScriptTiming.from_dict(tight.to_dict()) == tight


def test_a_script_whose_data_runs_out_is_expected_to_last_its_own_run_at_most():
    """The bundled image classifier with --epochs 1: 64 batches, then it exits. Its probes end
    when it does (13-25 s), not after the ~51 s an unending script would measure."""
    finite = ScriptTiming(first_s=4.3, warmup_s=2.0, step_s=0.184, measured_s=8.0,
                          rel_half=0.09, batch_size=32, threads=2, ended_s=17.0)
    endless = dataclasses.replace(finite, ended_s=0.0)
    for knobs in ({"batch_size": 32}, {"batch_size": 256}, {"batch_size": 16}):
        lim, free = fitting.limits(finite, knobs), fitting.limits(endless, knobs)
        assert lim.expected_s <= free.expected_s
        assert lim.max_s == free.max_s  # the limit is not cut on a guess
    # at its own batch, or a larger one (fewer, longer steps over the same samples)
    assert fitting.limits(finite, {"batch_size": 32}).expected_s == \
        pytest.approx(4.3 + (17.0 - 4.3) + fitting.END_S)
    assert fitting.limits(finite, {"batch_size": 256}).expected_s == \
        pytest.approx(4.3 + (17.0 - 4.3) + fitting.END_S)
    # a smaller batch runs longer (twice the steps, each no shorter: never shortened on a guess)
    assert fitting.limits(finite, {"batch_size": 16}).expected_s == pytest.approx(
        min(fitting.limits(endless, {"batch_size": 16}).expected_s,
            4.3 + 2 * (17.0 - 4.3) + fitting.END_S))
    assert "data ran out 17 s after launch" in finite.describe()


def test_the_baseline_s_own_end_is_kept_only_when_the_script_ended_it():
    base = dict(outcome=Outcome.OK, duration_s=30.0, step_s=0.2, measured_s=10.0,
                samples_per_s=100.0, ci_half=3.0, first_s=4.0, warmup_s=1.0, paused_s=0.0,
                tight_s=0.0)

    class R:  # the fields ScriptTiming.of reads
        def __init__(self, **kw):
            self.__dict__.update(kw)

    assert ScriptTiming.of(R(**base), {"batch_size": 8}).ended_s == 0.0
    ended = ScriptTiming.of(R(**{**base, "outcome": Outcome.ENDED}), {"batch_size": 8})
    assert ended.ended_s == 30.0
    assert ScriptTiming.from_dict(ended.to_dict()) == ended


def test_a_noisy_baseline_asks_for_more_measuring_time_within_a_bound():
    noisy = dataclasses.replace(SLOW, rel_half=0.10)
    assert fitting.measure_s(noisy, 0.05) == pytest.approx(4 * 16)  # (0.10/0.05)^2 = 4
    very = dataclasses.replace(SLOW, rel_half=0.5)
    assert fitting.measure_s(very, 0.05) == 4 * 16  # at most four times the baseline's


def test_hang_thresholds_follow_the_steps():
    slow = fitting.limits(SLOW, {"batch_size": 32})
    fast = fitting.limits(FAST, {"batch_size": 32})
    assert fast.idle_hang_s == fitting.HANG_MIN_S  # never sooner than that
    assert slow.idle_hang_s == 20 * SLOW.step_s
    ten = dataclasses.replace(SLOW, step_s=10.0)
    assert fitting.limits(ten, {"batch_size": 32}).hang_s == 200.0  # past the busy default


def test_before_the_baseline_timed_the_script_a_busy_pause_is_not_a_hang_for_a_minute(
        tmp_path, machine):  # noqa: F811
    """The baseline's probe knows no pause of the script's own: no progress while its ranks
    work is a hang after a minute (minGPT's chargpt samples text after its first step, 20-35 s
    here, and was judged hung at 30 s), while they idle after 30 s. Once the script is timed,
    the thresholds are its steps' (`fitting.limits`)."""
    from test_study import tuner

    t = tuner(tmp_path, FakeProbe(lambda k: 100.0), seconds=None)
    knobs = {"batch_size": 32}
    first = t.prober.spec(t.state, knobs, 1, "baseline")
    assert (first.hang_s, first.idle_hang_s) == (fitting.UNTIMED_BUSY_HANG_S,
                                                  fitting.UNTIMED_IDLE_HANG_S) == (60.0, 30.0)
    timed = dataclasses.replace(t.state, learned=dataclasses.replace(t.state.learned,
                                                                     timing=SLOW))
    later = t.prober.spec(timed, knobs, 1, "trial-1")
    fitted = fitting.limits(SLOW, knobs)
    assert (later.hang_s, later.idle_hang_s) == (fitted.hang_s, fitted.idle_hang_s)


def test_the_speed_up_interval_allows_for_new_processes():
    s = decision.Summary
    one = decision.speedup_interval(1.3, [(130.0, 100.0)], s(130, 2, 1), s(100, 2, 1))
    # one round: the probes' own 2% intervals are not the story; two new processes are
    assert one[0] < 1.3 / 1.25 and one[1] > 1.3 * 1.25
    steady = [(130.0, 100.0), (131.0, 100.5), (129.0, 99.0)]
    three = decision.speedup_interval(1.3, steady, s(130, 2, 3), s(100, 2, 3))
    assert one[0] < three[0] < 1.3 < three[1] < one[1]
    spread = [(150.0, 100.0), (120.0, 100.0), (120.0, 100.0)]
    wide = decision.speedup_interval(1.3, spread, s(130, 2, 3), s(100, 2, 3))
    assert wide[1] - wide[0] > three[1] - three[0]


class SlowScript(FakeProbe):
    """Probes that behave like a script with 8 s of start-up and steps of 0.5 s + 15.6 ms a
    sample: a probe measures only when its limit holds start-up, warm-up and 6 windows of
    two steps; it takes that long (ending once tight) or its whole limit, on the fake clock."""

    def __init__(self, clock, **kw):
        super().__init__(lambda k: k["batch_size"] / (0.5 + 0.0156 * k["batch_size"]), **kw)
        self.clock = clock

    def first_s(self, knobs) -> float:
        return 8.0

    def __call__(self, spec, **kw):
        knobs = {"batch_size": 32, **spec.ranks.knobs}
        step = 0.5 + 0.0156 * knobs["batch_size"]
        first = self.first_s(knobs)
        need = first + 2 * step + max(5.0, 6 * 2 * step)
        if spec.max_s < need:
            self.specs.append(spec)
            self.clock.t += spec.max_s
            return dataclasses.replace(result(spec, Outcome.NO_SIGNAL,
                                              reason="only 3 batches in 20 s"),
                                       duration_s=spec.max_s)
        self.clock.t += need
        r = super().__call__(spec, **kw)
        return dataclasses.replace(r, first_s=first, step_s=step, warmup_s=2 * step,
                                   measured_s=need - first - 2 * step, duration_s=need)


def test_a_budget_on_a_script_with_slow_steps_measures_every_probe_and_is_used(tmp_path,
                                                                            machine):  # noqa: F811
    clock = FakeClock()
    fake = SlowScript(clock)
    report, t, run_dir = tune(tmp_path, fake, seconds=None, budget_s=300.0, clock=clock,
                              confirm_rounds=3)
    searched = [e for e in journal(run_dir, "trial_finished") if e["trial"].startswith("trial-")]
    assert len(searched) >= 3
    # each one measured: an answer, or an estimate that could not reach the best
    assert all(e["result"]["outcome"] in ("ok", "pruned") for e in searched), searched
    assert report.stop_reason.rule is Stop.BUDGET
    assert 0.8 * 300 <= clock.t <= 300 + 10  # used, and not overrun
    assert any(n.text.startswith("budget 5m: ") for n in report.notes)
    assert not report.kept_baseline and report.best.knobs["batch_size"] > 16  # larger pays
    # the claim comes with an interval that holds it
    assert report.speedup_low < report.speedup < report.speedup_high
    assert math.isfinite(report.speedup_high)


class LateFirstBatch(SlowScript):
    """A larger batch's first batch comes far later than the baseline's (nanoGPT's shape
    evaluates before step 0 at the batch it trains with): 30 s from batch 48 up, where the
    baseline's came after 8; no fit from the baseline foresees it."""

    def first_s(self, knobs) -> float:
        return 30.0 if knobs["batch_size"] >= 48 else 8.0


def test_a_confirmation_probe_holds_what_the_config_s_own_search_probe_took(tmp_path,
                                                                          machine):  # noqa: F811
    clock = FakeClock()
    fake = LateFirstBatch(clock)
    report, t, run_dir = tune(tmp_path, fake, seconds=None, budget_s=600.0, clock=clock,
                              confirm_rounds=2, space_tokens=("batch_size=32:64",))
    took = {e["trial"]: e["result"]["duration_s"] for e in journal(run_dir, "trial_finished")}
    late = [s for s in fake.specs if s.ranks.name.startswith("trial-")
            and s.ranks.knobs.get("batch_size", 32) >= 48 and took.get(s.ranks.name, 0) > 30]
    assert late, [(s.ranks.name, s.ranks.knobs) for s in fake.specs]  # searched, and measured
    confirmed = [e for e in journal(run_dir, "confirmation")
                 if e["knobs"].get("batch_size", 32) >= 48]
    assert confirmed, report.reason  # a late-starting config is a candidate
    # each of its confirmation probes measured (a cut one is no-signal), none shorter than its
    # search probe
    assert all(e["outcome"] == "ok" for e in confirmed), confirmed
    confirm_specs = [s for s in fake.specs if s.ranks.name.startswith("confirm")
                     and s.ranks.knobs.get("batch_size", 32) >= 48]
    own = min(took[s.ranks.name] for s in late)
    assert confirm_specs and all(s.max_s >= 0.99 * own for s in confirm_specs), \
        ([s.max_s for s in confirm_specs], own)


class SlowToTighten(SlowScript):
    """The script's first probe needs 40 s more measuring to tighten than any later probe
    (nanoGPT's shape: its baseline measured 34 s, its repeat and the search's probes were tight
    after 3-10 s)."""

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        if spec.ranks.name != "baseline" or r.outcome is not Outcome.OK:
            return r
        self.clock.t += 40.0  # tight at the search's target only then
        return dataclasses.replace(r, measured_s=r.measured_s + 40.0,
                                   duration_s=r.duration_s + 40.0,
                                   ci_half=fitting.TARGET_REL * r.samples_per_s)


def test_confirmation_probes_last_what_each_config_s_own_probes_took_not_a_slow_baseline_s_fit(
        tmp_path, machine):  # noqa: F811
    clock = FakeClock()
    fake, told = SlowToTighten(clock), []
    report, t, run_dir = tune(tmp_path, fake, seconds=None, budget_s=600.0, clock=clock,
                              confirm_rounds=3, notify=told.append)
    took: dict[str, list[float]] = {}
    for e in journal(run_dir, "trial_finished"):
        if e["result"]["outcome"] == "ok":
            took.setdefault(e["trial"], []).append(e["result"]["duration_s"])
    confirms = [s for s in fake.specs if s.ranks.name.startswith("confirm")]
    assert confirms, report.reason
    baseline_s = min(took["baseline"] + took.get("baseline-again", []))
    first = next(e for e in journal(run_dir, "trial_finished") if e["trial"] == "baseline")
    timing = ScriptTiming.of(TrialResult.from_dict(first["result"]), first["result"]["knobs"])
    for spec in confirms:
        fitted = fitting.limits(timing, spec.ranks.knobs).expected_s
        entry = spec.ranks.name.split("-", 1)[1]  # confirmN-NAME
        own = baseline_s if entry == "baseline" else min(took[entry])
        assert spec.max_s == pytest.approx(own), (spec.ranks.name, spec.max_s, own)
        assert spec.max_s < 0.6 * fitted, (spec.ranks.name, spec.max_s, fitted)
    # the time the fit would have spent buys rounds (the race may decide before them)
    assert race_ran(report, [n.text for n in told]) >= 3 and report.rounds >= 1


def test_a_budget_too_short_is_told_with_the_budget_that_would_do(tmp_path, machine):  # noqa: F811
    clock = FakeClock()
    report, t, run_dir = tune(tmp_path, SlowScript(clock), seconds=None, budget_s=90.0,
                              clock=clock)
    warned = [n.text for n in report.notes if n.text.startswith("--budget 1m30s holds")]
    assert warned and "would hold 3" in warned[0], report.notes


def test_the_monitor_line_of_the_best_carries_the_interval():
    from autotune.monitor.text import event_line

    line = event_line({"event": "best", "knobs": {"batch_size": 64}, "samples_per_s": 130.0,
                       "ci_half": 2.0, "baseline_samples_per_s": 100.0, "speedup": 1.3,
                       "kept_baseline": False, "speedup_low": 1.18, "speedup_high": 1.43})
    assert "1.300x (1.180x-1.430x) the baseline 100.0" in line


def test_the_cost_factor_is_the_longest_share_probes_took_within_bounds():
    cost = fitting.Cost
    assert fitting.cost_factor([]) == 1.0
    assert fitting.cost_factor([cost(40.0, 10.0)]) == 1.0  # one probe is not a rule yet
    room = fitting.COST_HEADROOM
    assert fitting.cost_factor([cost(40.0, 20.0), cost(40.0, 30.0)]) == pytest.approx(0.75 * room)
    assert fitting.cost_factor([cost(40.0, 20.0), cost(20.0, 5.0)]) == pytest.approx(0.5 * room)
    assert fitting.cost_factor([cost(40.0, 1.0)] * 3) == fitting.COST_FACTOR_RANGE[0]
    assert fitting.cost_factor([cost(40.0, 400.0)] * 3) == fitting.COST_FACTOR_RANGE[1]
    # only the last COST_WINDOW count
    old = [cost(40.0, 4.0)] * 20
    assert fitting.cost_factor(old + [cost(40.0, 30.0)] * fitting.COST_WINDOW) == \
        pytest.approx(0.75 * room)


def test_the_costs_are_kept_in_the_state_and_read_back():
    from autotune.tuning.learned import Learned

    learned = Learned()
    for i in range(fitting.COST_WINDOW + 3):
        learned = learned.costed(40.0, float(i))
    assert len(learned.costs) == fitting.COST_WINDOW and learned.costs[-1].actual_s == 10.0
    assert Learned.from_dict(learned.to_dict()).costs == learned.costs


class QuickScript(SlowScript):
    """Its search probes end at half what the fit expects (tight early), as probes of a steady
    script do; the baseline and the confirmation take their full time."""

    def __call__(self, spec, **kw):
        if not spec.ranks.name.startswith("trial-"):
            return super().__call__(spec, **kw)
        t0 = self.clock.t
        r = super().__call__(spec, **kw)
        self.clock.t = t0 + (self.clock.t - t0) / 2
        return r


def test_the_budget_plan_counts_what_probes_really_cost(tmp_path, machine,  # noqa: F811
                                                        monkeypatch):
    """Search probes that end at half their fitted time: counted, the same budget holds more of
    them than when every probe is taken at its fitted time, and is still not overrun. (The
    script's own config reads 15% lower in its second process, so no round decides alone and
    the confirmation's reserve stays that of two rounds.)"""
    def search(where, count_costs):
        if not count_costs:
            monkeypatch.setattr(fitting, "COST_MIN_PROBES", 10**6)
        clock = FakeClock()
        report, t, run_dir = tune(where, QuickApart(clock, 0.85), seconds=None,
                                  budget_s=200.0, clock=clock, confirm_rounds=2)
        monkeypatch.undo()
        searched = [e for e in journal(run_dir, "trial_finished")  # the search's probes
                    if e["trial"].startswith("trial-") or e["trial"] == "baseline-again"]
        return len(searched), clock.t, t.state.learned

    counted, spent, learned = search(tmp_path / "counted", True)
    fitted, spent_fitted, _ = search(tmp_path / "fitted", False)
    assert counted > fitted, (counted, fitted)
    assert spent <= 200 + 10 and spent_fitted <= 200 + 10
    # below the fit (which expects the 4 windows a tight probe ends on, not the limit's 6)
    assert 0.3 <= fitting.cost_factor(learned.costs) < 1.0


def test_a_probe_the_budget_would_squeeze_below_what_it_measures_in_is_not_taken(tmp_path,
                                                                                machine):  # noqa: F811
    """Every probe the search takes gets at least half what it needs, and at least the least it
    measures anything in (first batch, warm-up, its windows): each one measured. One the budget
    left beside the confirmation would squeeze further is not taken (said); a few such in a row
    end the search for its budget. The baseline's batch line (no worker) reads flat here, so
    no walk step is among them (one left out ends the search at once: the next test); workers
    pay more the larger the batch, which draws the sampler to the larger batches, whose probes
    are the longer, and their gains are past the 3% a switch needs, so the confirmation's time
    is kept (a search without a gain keeps none once a probe and its rounds no longer fit)."""
    clock, told = FakeClock(), []
    fake = SlowScript(clock)
    fake.rate = lambda knobs: 100.0 + knobs["workers"] * knobs["batch_size"] / 10
    report, t, run_dir = tune(tmp_path, fake, seconds=None, budget_s=300.0, clock=clock,
                              confirm_rounds=3, notify=told.append)
    searched = [s for s in fake.specs if s.ranks.name.startswith("trial-")]
    assert searched and all(s.max_s >= 0.5 * t.prober.probe_s(t.state, s.ranks.knobs, 1)
                            for s in searched), [(s.ranks.knobs, s.max_s) for s in searched]
    outcomes = [(e["trial"], e["result"]["outcome"]) for e in journal(run_dir, "trial_finished")
                if e["trial"].startswith("trial-")]
    assert outcomes and all(o in ("ok", "pruned") for _, o in outcomes), outcomes
    skipped = [n.text for n in told if "not probed:" in n.text]
    assert skipped and all("under half the" in n or "needs to measure at all" in n
                           for n in skipped), (report.stop_reason, [n.text for n in told])
    assert any("needs to measure at all" in n for n in skipped), skipped
    # a config left out is not probed (its trial number never reaches a probe)
    probed = {s.ranks.name for s in searched}
    assert not any(n.split(" ", 1)[0] in probed for n in skipped), (skipped, probed)
    # left out, the search goes on with what fits; a streak of such configs ends it: the
    # last few trials the search opened were all left out
    assert len(skipped) >= search.SQUEEZE_STREAK, skipped
    opened = sorted({int(n.split(" ", 1)[0].split("-")[1]) for n in skipped} |
                    {int(n.split("-")[1]) for n in probed if n.split("-")[1].isdigit()})
    tail = [f"trial-{k}" for k in opened[-search.SQUEEZE_STREAK:]]
    assert [n.split(" ", 1)[0] for n in skipped[-search.SQUEEZE_STREAK:]] == tail, \
        (skipped, sorted(probed))
    assert report.stop_reason.rule is Stop.BUDGET
    # the confirmation kept its rounds (the race may decide before them)
    assert race_ran(report, [n.text for n in told]) >= decision.PLANNED_ROUNDS


def test_a_walk_step_the_budget_leaves_out_ends_the_search_once(tmp_path, machine):  # noqa: F811
    """The walk's next batch does not fit beside the confirmation: it is left out once, said
    once, and the search stops for its budget. Queued again after each left-out trial, it was
    left out three times, three identical lines, until the streak ended the search. (The
    budget is one where the walk's third step is the one that does not fit.)"""
    clock, told = FakeClock(), []
    fake = SlowScript(clock)
    report, t, run_dir = tune(tmp_path, fake, seconds=None, budget_s=215.0, clock=clock,
                              confirm_rounds=3, notify=told.append,
                              fix_tokens=("workers=0", "instances=1", "threads=2"),
                              space_tokens=("batch_size=8:256",))
    walked = [n.text for n in told if n.text.startswith("batch: ")]
    skipped = [n.text for n in told if "not probed:" in n.text]
    last = walked[-1].split()[1]  # the walk's last step: the batch left out
    assert len(set(walked)) == len(walked) and len(skipped) == 1 and \
        f"{last} " in skipped[0], [n.text for n in told]
    assert report.stop_reason.rule is Stop.BUDGET and report.stop_reason.reserved
    assert not report.kept_baseline and report.rounds >= 1  # what was found is confirmed


class Apart(SlowScript):
    """`SlowScript`, whose script's own config (batch 16) reads ``second`` of its figure in its
    second process: the spread between processes the search's repeat measures."""

    def __init__(self, clock, second):
        super().__init__(clock)
        calls, rate = [], self.rate

        def apart(knobs):
            if knobs["batch_size"] == 16:
                calls.append(1)
                return rate(knobs) * (second if len(calls) == 2 else 1.0)
            return rate(knobs)
        self.rate = apart


class QuickApart(QuickScript, Apart):
    """`QuickScript`'s quick search probes, `Apart`'s second process of the script's config."""


@pytest.mark.parametrize("alike", [True, False])
def test_rounds_the_spread_shows_enough_free_the_third_for_the_search(tmp_path, machine,
                                                                     alike):  # noqa: F811
    """minGPT's shape: batch 32 gains 50% on the script's 16, and the step-time model sends
    the walk to 128, whose ~45 s probe does not fit a 4-minute budget beside three rounds.
    Such a gain makes the search measure the spread between processes at once: processes that
    agree (±1%) show +50% in one round even were the spread 8%, its upper bound from one pair,
    so the reserve keeps one, and 128's probe is confirmed in one round that decides alone.
    Processes 15% apart plan more rounds, and 128 is probed still: its probe fits beside the
    two rounds that could switch to it (before, the three rounds kept for 32 left it out, and
    the search confirmed 64 at 2.0x with 100 s of the budget unspent)."""
    clock, told = FakeClock(), []
    fake = Apart(clock, 1.0 if alike else 0.85)
    report, t, _ = tune(tmp_path, fake, seconds=None, budget_s=240.0, clock=clock,
                        confirm_rounds=3, notify=told.append,
                        fix_tokens=("workers=0", "instances=1", "threads=2"),
                        space_tokens=("batch_size=8:128",))
    texts = [n.text for n in told]
    names = [s.ranks.name for s in fake.specs]
    assert names.index("baseline-again") == names.index("trial-1") + 1, names  # at once
    assert any("decides whether 1 confirmation round can show the +50.0%" in n
               for n in texts), texts
    probed = [s.ranks.knobs["batch_size"] for s in fake.specs if s.ranks.name.startswith("trial")]
    if alike:
        assert 128 in probed and report.best.knobs["batch_size"] == 128, (probed, texts)
        assert report.rounds == 1 and not report.kept_baseline, texts
        assert "over one interleaved round, beyond doubt even were processes" in report.reason
    else:
        assert 128 in probed and report.best.knobs["batch_size"] == 128, (probed, texts)
        assert not report.kept_baseline, texts
        planned = [re.search(r"confirming: .*?(\d+) interleaved round", n) for n in texts]
        assert [int(m.group(1)) for m in planned if m] >= [decision.MIN_ROUNDS], texts
    assert clock.t <= 240.0 + 10


class ModestGain(SlowScript):
    """`SlowScript`'s timing, with a batch line that peaks at 32 (+12% on the script's 16) and
    workers and one thread that cost a little; the script's own config reads 10% lower in its
    second process: a gain that needs more rounds than three at that spread."""

    CURVE = {8: 0.85, 16: 1.0, 32: 1.12, 64: 1.02, 128: 0.9}

    def __init__(self, clock):
        super().__init__(clock)
        self.rate = lambda k: 30.0 * self.CURVE[k["batch_size"]] * (1 - 0.02 * k["workers"]) \
            * (0.98 if k["threads"] == 1 else 1.0)

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        if spec.ranks.name == "baseline-again" and r.samples_per_s:
            r = dataclasses.replace(r, samples_per_s=0.9 * r.samples_per_s,
                                    ci_half=0.9 * r.ci_half)
        return r


def test_a_found_gain_keeps_the_rounds_its_spread_needs_before_the_search_goes_on(
        tmp_path, machine, monkeypatch):  # noqa: F811
    """nanoGPT's shape found its grid's best 87 s into 6m, searched on, and the three rounds
    left showed +12% at 0.976x-1.286x where about four would have shown it. Here the search
    finds batch 32 (+18% over the mean of the script's two processes, 10% apart): planned at
    their whole difference, made median-unbiased (±11% a process), about six rounds show it,
    so the budget keeps time for six (at most half of it) and the confirmation plans the four
    that half holds. The same tune keeping the three asked for searches on and confirms in
    three (its race may decide sooner). Either way within the budget."""
    def run(where, rule):
        clock, told = FakeClock(), []
        if rule == "asked":
            planned = search_budget.Budget.planned_rounds
            monkeypatch.setattr(search_budget.Budget, "planned_rounds",
                                lambda self: min(self.settings.confirm_rounds, planned(self)))
        else:
            monkeypatch.undo()
        report, _, _ = tune(tmp_path / where, ModestGain(clock), seconds=None, budget_s=480.0,
                            clock=clock, confirm_rounds=3, notify=told.append,
                            fix_tokens=("instances=1",),
                            space_tokens=("batch_size=8:128", "workers=0:3", "threads=1:2"))
        assert clock.t <= 480.0 + 10
        return report, [n.text for n in told]

    report, texts = run("needed", "needed")
    assert any("about 6 confirmation rounds show it, so the budget keeps time for 6" in t
               for t in texts), texts
    assert race_ran(report, texts) == 4 and report.best.knobs["batch_size"] == 32, texts
    assert 1 <= report.rounds <= 4
    asked, texts = run("asked", "asked")
    assert not any("keeps time for" in t for t in texts), texts
    assert race_ran(asked, texts) == 3 and asked.best.knobs["batch_size"] == 32, texts


def test_the_budget_stops_the_search_when_the_cheapest_config_left_does_not_fit(
        tmp_path, machine, monkeypatch):  # noqa: F811
    """Steps of 0.5 s + 15.6 ms a sample: a probe of batch 8 takes ~15 s, one of 256 ~70 s. The
    search stops for its budget once the cheapest config not yet answered no longer fits beside
    the confirmation, not once a probe of the space's average length does not: the same tune
    weighed against the average stops earlier, with configs that fit left unprobed (nanoGPT's
    shape stopped 152 s into 6m so). Either way it keeps to its budget. The script's own
    config reads 15% lower in its second process, as nanoGPT's did, so the confirmation keeps
    its three rounds (where processes agree, one round may decide, and the reserve shrinks)."""
    def run(where, rule):
        clock = FakeClock()
        fake = Apart(clock, 0.85)
        if rule == "average":
            monkeypatch.setattr(search_budget.Budget, "cheapest_left_s",
                                lambda self: self.prober.typical_s(self.state))
        else:
            monkeypatch.undo()
        report, _, _ = tune(tmp_path / where, fake, seconds=None, budget_s=360.0, clock=clock,
                            confirm_rounds=3, fix_tokens=("instances=1", "threads=2"))
        probed = [s for s in fake.specs if s.ranks.name.startswith("trial-")]
        return report, probed, clock.t

    old, old_probed, old_t = run("average", "average")
    new, new_probed, new_t = run("cheapest", "cheapest")
    assert old.stop_reason.rule is Stop.BUDGET, old.stop_reason
    assert len(new_probed) > len(old_probed), ([s.ranks.knobs for s in old_probed],
                                               [s.ranks.knobs for s in new_probed])
    assert new_t <= 360.0 + 10 and old_t <= 360.0 + 10


def test_a_larger_batch_warms_up_for_as_many_steps_as_the_nearest_probe_did():
    """word_lm's shape: its baseline (batch 20, 426 ms steps) left out 15 s as warm-up, a
    change of the machine's pace, and every later probe 1-1.3 s. A batch of 128 fitted to the
    baseline's warm-up scaled by its step needed ~134 s to measure at all, which a 5-minute
    budget never held; fitted to the nearest probe's (batch 32: 1.3 s of 685 ms steps) it
    needs about a third of that."""
    t = fitting.ScriptTiming(first_s=4.6, warmup_s=15.1, step_s=0.426, measured_s=26.0,
                             rel_half=0.07, batch_size=20, threads=2)
    big = {"batch_size": 128, "threads": 2}
    seen = [Pace(32, 2, 0.685, first_s=6.4, warmup_s=1.3)]
    alone, fitted = fitting.limits(t, big), fitting.limits(t, big, seen=seen)
    assert fitting.warmup_steps(t, big) == pytest.approx(15.1 / 0.426)
    assert fitting.warmup_steps(t, big, seen) == pytest.approx(1.3 / 0.685)
    assert alone.least_s > 120.0 and fitted.least_s < alone.least_s / 2.5
    # batch 40 (its limits under the 240 s cap): its limit and expected time shrink by the
    # warm-up left out
    mid = {"batch_size": 40, "threads": 2}
    a, b = fitting.limits(t, mid), fitting.limits(t, mid, seen=seen)
    assert a.max_s < fitting.MAX_PROBE_S and b.expected_s < a.expected_s - 20.0
    assert b.max_s < a.max_s - 20.0
    # a pace without its warm-up (an older tune.json) says nothing of it; the baseline's own
    # knobs keep the baseline's warm-up, the nearest of all
    older = [Pace(32, 2, 0.685, first_s=6.4)]
    assert fitting.warmup_steps(t, big, older) == pytest.approx(15.1 / 0.426)
    assert fitting.limits(t, big, seen=older).least_s > 120.0
    assert fitting.warmup_steps(t, {"batch_size": 20, "threads": 2}, seen) == \
        pytest.approx(15.1 / 0.426)
