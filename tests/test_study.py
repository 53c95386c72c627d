"""The search driven end to end against a fake probe: no processes, a real Optuna study (SQLite).

The fake `run_trial` answers from the knobs: a throughput surface, OOM above a batch size,
foreign load when told to, and intermediate estimates so the pruner can act.
"""

import dataclasses
import json
import re
import time

import pytest

from autotune import AutotuneError, Note
from autotune.hardware import fingerprint
from autotune.tuning import search_rules, space
from autotune.tuning import study as studies
from autotune.store.journal import Journal
from conftest import journal
from results import trial_result
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.outcome import Observed, Outcome, classify
from autotune.measuring.steady import Estimate
from autotune.tuning import Tuner, TuneSettings, TuneState, load_state
from autotune.tuning.records import Known, Stop

SEEN = {"batch_size": 16, "workers": 0}
NCCL_NOTE = "the script asked for backend 'nccl', which cannot serve here, so autotune used 'gloo'"


def result(spec, outcome=Outcome.OK, reason="", *, rate=0.0, foreign=0.0):
    return trial_result(spec, outcome=outcome, reason=reason, samples_per_s=rate,
                        ci_half=rate * 0.02, steps_per_s=rate / 16, foreign_cores=foreign,
                        seen=dict(SEEN))


def under_load(spec, r, foreign_cores):
    """``r``, a measured probe, as the trial classifies it when ``foreign_cores`` of other
    programs' load ran beside it (the same facts into the same `classify`)."""
    outcome, reason = classify(Observed(
        exit_code=None, stopped_by_us=True, batches=100, has_estimate=True,
        pruned=r.outcome == Outcome.PRUNED, foreign_cores=foreign_cores,
        foreign_limit_cores=spec.foreign_limit_cores, attempt=spec.attempt,
        last_attempt=spec.last_attempt))
    return dataclasses.replace(r, outcome=outcome, reason=reason, foreign_cores=foreign_cores)


class FakeProbe:
    """Stands in for `run_trial`; records every spec it was given."""

    def __init__(self, rate, *, oom_from=None, foreign=None, crash=None, ddp=False):
        self.rate = rate  # knobs -> samples/s
        self.ddp = ddp  # ranks of more than one join a process group (else: they train alone)
        self.oom_from = oom_from
        self.foreign = foreign or (lambda knobs, n: False)  # (knobs, nth call of them) -> bool
        self.crash = crash or (lambda knobs: False)
        self.specs = []

    def __call__(self, spec, *, on_progress=None, on_start=None, turn=None):
        self.specs.append(spec)
        knobs = {**SEEN, "threads": 2, **spec.ranks.knobs}
        nth = sum(1 for s in self.specs if s.ranks.knobs == spec.ranks.knobs)
        if self.oom_from and knobs["batch_size"] >= self.oom_from:
            return result(spec, Outcome.OOM, reason="out of memory: CPU")
        if self.crash(knobs):
            return result(spec, Outcome.CRASHED, reason="RuntimeError: boom")
        rate = self.rate(knobs)
        if on_progress is not None:
            for i in range(1, 5):
                est = Estimate(rate, rate * 0.02, float(i), 1.0, 0.0, 4 + i)
                if on_progress(est):
                    return result(spec, Outcome.PRUNED, rate=rate,
                                  reason="its interval could not reach the best so far")
        r = under_load(spec, result(spec, rate=rate), 2.0 if self.foreign(knobs, nth) else 0.0)
        if self.ddp and spec.ranks.instances > 1:
            r = dataclasses.replace(r, seen={**r.seen, "backend": "gloo",
                                             "world_size": spec.ranks.instances, "ddp": True},
                                    notes=(Note.info(NCCL_NOTE),))
        return r

    def measured(self):
        """Knobs of the search's probes (confirmation probes, the two-rank probe that asks
        whether the script trains data-parallel and the baseline's second process left out)."""
        return [s.ranks.knobs for s in self.specs
                if not s.ranks.name.startswith(("confirm", "ranks", "baseline-again"))]


@pytest.fixture
def machine(monkeypatch):
    monkeypatch.setattr(fingerprint, "machine",
                        lambda: space.Machine(cores=2, mem_available_bytes=16 * 2**30))
    monkeypatch.setattr(fingerprint, "cores", lambda: 2)


class QuickClock:
    """Real time, without the wait before a probe spoiled by foreign load is taken again."""

    monotonic = staticmethod(time.monotonic)

    def sleep(self, s):
        pass


def tuner(tmp_path, fake, *, resume=False, warm_start=None, clock=None, notify=None,
          **settings):
    """A tuner whose probes are ``fake``; ``settings`` as ``tune.json`` holds them (tokens);
    ``notify`` hears every note the tuning tells."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    base = dict(command=("train.py",), cwd=str(tmp_path), seconds=10.0, seed=1,
                confirm_rounds=2)
    base.update(settings)
    s = TuneSettings.from_dict(base)
    state = dataclasses.replace(load_state(run_dir), settings=s) if resume else \
        TuneState.new(s, run_dir, warm_start=warm_start)
    return Tuner(state, run_dir, Journal(run_dir), resume=resume, run_trial=fake,
                 clock=clock or QuickClock(), notify=notify)


def tune(tmp_path, fake, **kw):
    t = tuner(tmp_path, fake, **kw)
    return t.run(), t, t.run_dir


def surface(knobs):
    """Faster with workers and a smaller thread count; batch size matters a little."""
    return 100.0 * (1 + knobs["workers"]) * (1.3 if knobs["threads"] == 1 else 1.0) \
        * (1 + knobs["batch_size"] / 1024)


def test_search_measures_each_config_once_and_finds_the_best(tmp_path, machine):
    fake = FakeProbe(surface)
    report, t, run_dir = tune(tmp_path, fake, trials=12,
                              space_tokens=("batch_size=16:32",))
    probes = fake.measured()
    assert probes[0] == {}  # the baseline: the script as it is, nothing applied
    keys = [tuple(sorted(k.items())) for k in probes[1:]]
    assert len(keys) == len(set(keys)), "a config was measured twice"
    assert report.trials_measured == len(probes) <= 12, report.stop_reason
    # After the first two search probes, the script's own config once more, in a new process:
    # the spread between processes (none here: the fake gives the same figure twice)
    names = [s.ranks.name for s in fake.specs
             if not s.ranks.name.startswith(("confirm", "ranks"))]
    assert names[:4] == ["baseline", "trial-1", "trial-2", "baseline-again"], names
    again, = [s for s in fake.specs if s.ranks.name == "baseline-again"]
    assert again.ranks.knobs == {"batch_size": 16, "workers": 0, "threads": 2, "instances": 1}
    assert report.process_noise.measured and report.process_noise.between_rel == 0.01
    assert "no more than their own intervals explain" in report.process_noise.why
    # First each knob alone at its far end, a config where workers and threads share the two
    # cores, then the moves that paid off, together.
    assert probes[1:6] == [
        {"batch_size": 32, "workers": 0, "threads": 2, "instances": 1},
        {"batch_size": 16, "workers": 2, "threads": 2, "instances": 1},
        {"batch_size": 16, "workers": 0, "threads": 1, "instances": 1},
        {"batch_size": 16, "workers": 1, "threads": 1, "instances": 1},
        {"batch_size": 16, "workers": 2, "threads": 1, "instances": 1}]
    # Confirmation: the best two and the baseline, interleaved A B C; two rounds planned,
    # and the race stops after the first, whose +200% is beyond even the upper bound of the
    # spread between the fake's processes (alike), at the first look's 99.2%.
    names = [s.ranks.name.split("-", 1)[1] for s in fake.specs if s.ranks.name.startswith("confirm")]
    assert len(names) == 3 and names[0] == "baseline" and len(set(names)) == 3
    assert report.rounds == 1 and "over one interleaved round" in report.reason, report.reason
    assert not report.kept_baseline and report.speedup > 2
    assert report.best.knobs["workers"] == 2 and report.best.knobs["thread_pct"] == 50
    assert report.baseline.knobs == {"batch_size": 16, "workers": 0, "thread_pct": 100,
                                     "instances": 1}
    conf = journal(run_dir, "confirmation")
    assert [(e["round"], e["trial"]) for e in conf][:3] == [(1, n) for n in names[:3]]
    best = journal(run_dir, "best")[-1]
    assert best["knobs"] == dict(report.best.knobs) and best["kept_baseline"] is False
    started = journal(run_dir, "trial_started")
    assert started[0]["trial"] == "baseline"
    assert all(set(e) >= {"trial", "knobs", "mode"} for e in started)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best"]["knobs"] == dict(report.best.knobs)


def test_baseline_is_the_first_trial_of_the_study(tmp_path, machine):
    fake = FakeProbe(surface)
    _, t, run_dir = tune(tmp_path, fake, trials=3)
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    first = h.trials()[0]
    assert first.user_attrs["baseline"] is True
    assert first.user_attrs["knobs"] == dict(t.state.space.baseline)


def test_oom_is_infeasible_and_larger_batches_are_not_tried(tmp_path, machine):
    fake = FakeProbe(lambda k: 100.0 * k["batch_size"], oom_from=64)
    report, t, run_dir = tune(tmp_path, fake, trials=10,
                              fix_tokens=("workers=0", "threads=2"), confirm_rounds=2)
    batches = [k.get("batch_size") for k in fake.measured()[1:]]
    for i, b in enumerate(batches):  # after an OOM at b, nothing at b or above is tried
        if b >= 64:
            assert all(later < b for later in batches[i + 1:]), batches
    assert report.best.knobs["batch_size"] == 32
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    ooms = [tr for tr in h.trials() if studies.outcome_of(tr) == Outcome.OOM]
    assert ooms and all(tr.constraints and max(tr.constraints.values()) > 0 for tr in ooms)
    assert {tr.user_attrs["outcome"] for tr in ooms} == {"oom"}  # one vocabulary
    assert report.stop_reason.rule is Stop.EXHAUSTED  # 4 fit, the rest ruled out


def test_probes_whose_script_ended_after_a_steady_span_are_searched_and_win_like_ok_ones(
        tmp_path, machine):
    """A script that ends on its own within every probe (one short epoch; a ``next(it)`` loop
    whose data runs out): each probe is ``ended`` with its figure, and the search, the
    confirmation and the winner use those figures as they use ``ok`` ones."""
    ok_probe = FakeProbe(surface)
    ended = classify(Observed(exit_code=1, stopped_by_us=False, error_kind="stop_iteration",
                              error_text="StopIteration: ", batches=100, has_estimate=True))
    assert ended[0] == Outcome.ENDED

    def fake(spec, **kw):
        r = ok_probe(spec, **kw)
        return dataclasses.replace(r, outcome=ended[0], reason=ended[1], exit_code=1) \
            if r.outcome == Outcome.OK else r

    report, t, run_dir = tune(tmp_path, fake, trials=8, space_tokens=("batch_size=16:32",))
    outcomes = [e["result"]["outcome"] for e in journal(run_dir, "trial_finished")]
    assert outcomes and set(outcomes) <= {"ended", "pruned"}, outcomes
    assert not report.kept_baseline and report.speedup > 2
    assert report.best.knobs["workers"] == 2
    assert all(e["samples_per_s"] for e in journal(run_dir, "confirmation"))
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    measured = [tr for tr in h.trials() if studies.outcome_of(tr) == Outcome.ENDED]
    assert measured and all(studies.comparable(tr) for tr in measured)  # feasible, compared


def answered(h, outcome, cfg, **attrs):
    """A finished trial of ``h`` that recorded ``outcome`` through the study module."""
    trial = h.study.ask()
    trial.set_user_attr("knobs", cfg)
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    studies.record_outcome(trial, outcome)
    if outcome == Outcome.PRUNED:
        h.study.tell(trial, state=studies.TrialState.PRUNED)
    else:
        h.study.tell(trial, 0.0)
    return trial.number


def test_every_outcome_reads_back_as_written(tmp_path):
    """Each `Outcome` written to a real SQLite study reads back equal, and a finished trial's
    answer (`Known`) keeps it: an OOM stays an OOM, a hang a hang."""
    url = studies.sqlite_url(tmp_path / "study.db")
    h = studies.open_study(url, "s", run_id="r")
    numbers = {o: answered(h, o, {"batch_size": 2 ** i}) for i, o in enumerate(Outcome)}
    again = studies.open_study(url, "s", run_id="r")  # read back from the file
    by_number = {t.number: t for t in again.trials()}
    for outcome, number in numbers.items():
        t = by_number[number]
        assert studies.outcome_of(t) is outcome
        assert Known.of_trial(t).outcome is outcome
        infeasible = outcome not in (Outcome.OK, Outcome.ENDED, Outcome.PRUNED,
                                     Outcome.FOREIGN_LOAD)
        assert (max(t.constraints.values(), default=0.0) > 0) == infeasible, outcome
        if outcome.usable:
            assert not Known.of_trial(t).infeasible, outcome
    # a probe whose script ended on its own after a steady span is measured as an OK one
    assert [t.number for t in again.trials() if studies.comparable(t)] == \
        sorted([numbers[Outcome.OK], numbers[Outcome.ENDED]])


def test_a_config_an_oom_ruled_out_is_an_oom_never_measured(tmp_path):
    h = studies.open_study(studies.sqlite_url(tmp_path / "study.db"), "s", run_id="r")
    trial = h.study.ask()
    trial.set_user_attr("knobs", {"batch_size": 64})
    studies.record_outcome(trial, Outcome.OOM, not_tried=True)
    h.study.tell(trial, 0.0)
    (t,) = h.trials()
    assert studies.outcome_of(t) is Outcome.OOM and studies.not_tried(t)
    assert max(t.constraints.values()) > 0 and Known.of_trial(t) is None


def test_studies_of_earlier_versions_read_their_tags_once(tmp_path):
    h = studies.open_study(studies.sqlite_url(tmp_path / "study.db"), "s", run_id="r")
    for tag, cfg in (("failed", {"batch_size": 8}), ("oom-skipped", {"batch_size": 16})):
        trial = h.study.ask()
        trial.set_user_attr("knobs", cfg)
        trial.set_user_attr("outcome", tag)
        h.study.tell(trial, 0.0)
    failed, skipped = h.trials()
    assert studies.outcome_of(failed) is Outcome.CRASHED
    assert Known.of_trial(failed).outcome is Outcome.CRASHED
    assert studies.outcome_of(skipped) is Outcome.OOM and studies.not_tried(skipped)
    assert Known.of_trial(skipped) is None  # ruled out, never measured


def test_slow_probes_are_pruned(tmp_path, machine):
    fake = FakeProbe(lambda k: 1000.0 if k["workers"] == 0 else 10.0)
    report, t, run_dir = tune(tmp_path, fake, trials=6,
                              fix_tokens=("batch_size=16", "threads=2"))
    pruned = journal(run_dir, "trial_pruned")
    assert pruned and all("could not reach" in e["reason"] for e in pruned)
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    assert any(tr.state == studies.TrialState.PRUNED for tr in h.trials())
    assert report.kept_baseline and report.best.knobs["workers"] == 0


def test_foreign_load_is_measured_again_never_compared(tmp_path, machine):
    # workers=1 is flagged the first time only, workers=2 every time.
    def foreign(knobs, nth):
        return knobs["workers"] == 2 or (knobs["workers"] == 1 and nth == 1)

    fake = FakeProbe(lambda k: 100.0 * (1 + k["workers"]), foreign=foreign)
    report, t, run_dir = tune(tmp_path, fake, trials=4,
                              fix_tokens=("batch_size=16", "threads=2"), confirm_rounds=2,
                              foreign_retries=1)
    search = [s.ranks.knobs.get("workers") for s in fake.specs if s.ranks.name.startswith("trial-")]
    assert search.count(1) == 2  # re-measured once, then clean
    # Re-measured once, still spoiled: left out (it may be proposed again, and measured again).
    assert search.count(2) >= 2 and search.count(2) % 2 == 0
    assert report.best.knobs["workers"] == 1
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    spoiled = [tr for tr in h.trials() if tr.user_attrs.get("outcome") == "foreign-load"]
    assert spoiled and all(tr.state == studies.TrialState.FAIL for tr in spoiled)
    # each attempt's spec says which it is; the last one's own outcome says it was left out
    twos = [(s.attempt, s.last_attempt) for s in fake.specs
            if s.ranks.name.startswith("trial-") and s.ranks.knobs.get("workers") == 2]
    assert twos == [(1, False), (2, True)] * (len(twos) // 2)
    assert {tr.user_attrs["reason"] for tr in spoiled} == {
        "2.00 cores of CPU load from other programs in 2 attempt(s); not compared"}
    assert sum("--foreign-limit" in n.text for n in report.notes) == 1  # told once, not every time


def test_crashing_configs_are_infeasible(tmp_path, machine):
    fake = FakeProbe(surface, crash=lambda k: k["workers"] == 2)
    report, _, run_dir = tune(tmp_path, fake, trials=8, confirm_rounds=1,
                              fix_tokens=("batch_size=16",))
    assert report.best.knobs["workers"] != 2
    finished = [e for e in journal(run_dir, "trial_finished")
                if e["result"]["outcome"] == "crashed"]
    assert all(e["result"]["knobs"]["workers"] == 2 for e in finished)


def test_resume_reruns_the_interrupted_trial_only(tmp_path, machine):
    fake = FakeProbe(surface)
    tune(tmp_path, fake, trials=4, confirm_rounds=0,
         fix_tokens=("batch_size=16",))
    run_dir = tmp_path / "run"
    url = studies.sqlite_url(run_dir / "study.db")
    name = f"autotune-{run_dir.name}"
    # What a kill -9 leaves: a RUNNING trial of this run.
    run_id = json.loads((run_dir / "tune.json").read_text())["run_id"]
    h = studies.open_study(url, name, run_id=run_id)
    done = {tr.number: tr.value for tr in h.trials() if tr.state.is_finished()}
    stuck = h.study.ask()
    stuck.set_user_attr("run", run_id)
    params = {"workers": stuck.suggest_int("workers", 0, 2),
              "thread_pct": stuck.suggest_int("thread_pct", 0, 1)}
    before = len(fake.specs)
    report, t, _ = tune(tmp_path, fake, resume=True, trials=6)
    h = studies.open_study(url, name, run_id=run_dir.name)
    trials = {tr.number: tr for tr in h.trials()}
    assert trials[stuck.number].state == studies.TrialState.FAIL
    retry = [tr for tr in trials.values() if tr.user_attrs.get("retry_of") == stuck.number]
    assert len(retry) == 1 and retry[0].params == params
    for number, value in done.items():  # no finished trial lost or changed
        assert trials[number].value == value
    resumed = [s.ranks.knobs for s in fake.specs[before:] if s.ranks.name.startswith("trial-")]
    earlier = [s.ranks.knobs for s in fake.specs[:before] if s.ranks.name.startswith("trial-")]
    assert not any(k in earlier for k in resumed), "a finished trial was measured again"
    assert not any(s.ranks.name == "baseline" for s in fake.specs[before:])


def test_placeholders_get_values_and_count_samples(tmp_path, machine):
    fake = FakeProbe(surface)
    report, t, _ = tune(tmp_path, fake, trials=3, confirm_rounds=0,
                        command=("train.py", "--bs", "{batch_size}"),
                        baseline_tokens=("batch_size=16",), fix_tokens=("workers=0",))
    base = fake.specs[0]
    assert base.ranks.knobs == {"batch_size": 16} and base.samples_per_step == 16
    later = [s for s in fake.specs[1:] if s.ranks.name.startswith("trial-")]
    assert later and all(s.samples_per_step == s.ranks.knobs["batch_size"] for s in later)
    assert not any("placeholder" in n.text for n in report.notes)  # --baseline gave the value
    report, _, _ = tune(tmp_path / "b", FakeProbe(surface), trials=1,
                        command=("train.py", "-j", "{workers}"))
    assert any("{workers} is a placeholder" in n.text and "workers=0" in n.text for n in report.notes)


def test_pruner_bar_is_the_best_low_end(tmp_path):
    import optuna

    h = studies.open_study(studies.sqlite_url(tmp_path / "s.db"), "s", run_id="r")
    dist = {"workers": optuna.distributions.IntDistribution(0, 2)}

    def add(value, ci, outcome="ok"):
        h.study.add_trial(optuna.trial.create_trial(
            params={"workers": 0}, distributions=dist, value=value,
            user_attrs={"outcome": outcome, "ci_half": ci}))

    add(300.0, float("inf"))  # a lucky reading without a known interval sets no bar
    add(250.0, 500.0, outcome="oom")  # not comparable
    assert studies.best_floor(h.trials()) is None
    add(120.0, 20.0)
    assert studies.best_floor(h.trials()) == 100.0
    trial = h.study.ask()
    h.pruner.observe(trial.number, ci_half=5.0, measured_s=5.0)
    trial.report(80.0, 0)  # 85 < 0.9 * 100
    assert trial.should_prune()
    h.pruner.observe(trial.number, ci_half=15.0, measured_s=5.0)
    trial.report(80.0, 1)  # 95 >= 90: may still get there
    assert not trial.should_prune()
    h.pruner.observe(trial.number, ci_half=1.0, measured_s=0.5)
    trial.report(10.0, 2)  # too early to judge
    assert not trial.should_prune()
    # A trial measured again since (the baseline's second process) sets the bar it now has.
    h.pruner.revised[2] = 60.0
    assert studies.best_floor(h.trials(), h.pruner.revised) == 60.0
    h.pruner.observe(trial.number, ci_half=5.0, measured_s=5.0)
    trial.report(80.0, 3)  # 85 >= 0.9 * 60
    assert not trial.should_prune()


def test_warm_start_is_measured_right_after_the_baseline(tmp_path, machine):
    fake = FakeProbe(surface)
    tune(tmp_path, fake, trials=3, confirm_rounds=0,
         warm_start={"batch_size": 64, "workers": 1, "thread_pct": 50, "instances": 1})
    assert fake.measured()[1] == {"batch_size": 64, "workers": 1, "threads": 1, "instances": 1}


def test_storage_url_and_study_name(tmp_path, machine):
    import optuna

    url = studies.sqlite_url(tmp_path / "shared.db")
    tune(tmp_path, FakeProbe(surface), trials=3, confirm_rounds=0, storage=url,
         study_name="team")
    assert not (tmp_path / "run" / "study.db").exists()
    trials = optuna.load_study(study_name="team", storage=url).trials
    assert len([t for t in trials if t.state.is_finished()]) >= 3


def test_tuners_sharing_a_storage_do_not_measure_what_another_answered(tmp_path, machine):
    """While this tuner runs, another one (sharing the storage and study) finishes a config this
    one was about to measure: it takes that answer instead of probing it again."""
    import optuna

    url = studies.sqlite_url(tmp_path / "shared.db")
    theirs = {"batch_size": 16, "workers": 2, "thread_pct": 100, "instances": 1}
    tuner_holder = []

    class Busy(FakeProbe):
        def __call__(self, spec, **kw):
            # right after the baseline stage (its probe and the two-rank one), the other tuner
            # finishes one
            if [x.ranks.name for x in self.specs] == ["baseline", "ranks"]:
                sp = tuner_holder[0].state.space
                study = optuna.load_study(study_name="team", storage=url)
                study.add_trial(optuna.trial.create_trial(
                    params={n: sp.index(n, theirs[n]) for n in sp.names},
                    distributions={n: optuna.distributions.IntDistribution(
                        0, len(sp.domains[n]) - 1) for n in sp.names},
                    value=999.0, user_attrs={"run": "another-tuner", "knobs": theirs,
                                             "outcome": "ok", "samples_per_s": 999.0,
                                             "ci_half": 9.0}))
            return super().__call__(spec, **kw)

    fake = Busy(surface)
    t = tuner(tmp_path, fake, confirm_rounds=0, trials=6, storage=url, study_name="team",
              space_tokens=("batch_size=16:32",))
    tuner_holder.append(t)
    t.run()
    assert {"batch_size": 16, "workers": 2, "threads": 2, "instances": 1} not in fake.measured()
    assert t.found.known[t.state.space.key(theirs)].value == 999.0
    # Without the other tuner, this tuner measures that very config (the test can fail).
    alone = FakeProbe(surface)
    tune(tmp_path / "alone", alone, trials=6, confirm_rounds=0,
         space_tokens=("batch_size=16:32",))
    assert {"batch_size": 16, "workers": 2, "threads": 2, "instances": 1} in alone.measured()


def test_verdict_probes_the_winner_in_both_modes(tmp_path, machine):
    fake = FakeProbe(surface)
    report, _, run_dir = tune(tmp_path, fake, trials=3, confirm_rounds=0,
                              verdict=True)
    modes = [s.ranks.mode for s in fake.specs if s.ranks.name.startswith("verdict-")]
    assert modes == ["synthetic", "io"]
    assert report.verdict.bottleneck == "balanced"  # the fake gives both the same rate
    assert journal(run_dir, "probe_verdict")[-1]["verdict"] == report.verdict.to_dict()


@pytest.mark.parametrize("exit_code", [None, 0, 1])
def test_slow_starting_baseline_gets_one_longer_try(tmp_path, machine, exit_code):
    """However its ranks left once stopped: mp.spawn's parent exits 1 when one rank's end
    pulls the other out of a collective (CI: 'Connection closed by peer'), which is no crash."""
    class SlowStart(FakeProbe):
        def __call__(self, spec, **kw):
            if not self.specs:
                self.specs.append(spec)
                return dataclasses.replace(
                    result(spec, Outcome.NO_SIGNAL, reason="only 6 batches in 10 s"),
                    exit_code=exit_code, stopped=True)
            return super().__call__(spec, **kw)

    fake = SlowStart(surface)
    report, t, _ = tune(tmp_path, fake, trials=1)
    assert [s.max_s for s in fake.specs[:2]] == [10.0, 20.0]
    assert report.baseline.samples_per_s > 0
    assert any("trying again with 20 s" in n.text for n in report.notes)


def test_a_baseline_whose_start_took_its_window_gets_a_window_beyond_that_start(tmp_path,
                                                                              machine):
    """CI, two tuners beside another worker on 2 cores: nothing in 5 s, then the first batch at
    8.4 s of a 10 s window and 1.9 s counted. The third try allows that start plus a window."""
    class LoadedStart(FakeProbe):
        def __call__(self, spec, **kw):
            tries = sum(1 for s in self.specs if s.ranks.name == "baseline")
            if tries < 2:
                self.specs.append(spec)
                return dataclasses.replace(
                    result(spec, Outcome.NO_SIGNAL, reason="too little"), stopped=True,
                    first_s=0.0 if tries == 0 else 8.4)
            return super().__call__(spec, **kw)

    fake = LoadedStart(surface)
    report, _, _ = tune(tmp_path, fake, trials=1)
    windows = [s.max_s for s in fake.specs if s.ranks.name == "baseline"]
    assert windows[:3] == [10.0, 20.0, 40.0], windows  # twice 20 s beats 8.4 s + 20 s
    assert report.baseline.samples_per_s > 0


def test_the_next_window_holds_the_start_the_last_try_saw():
    from autotune.tuning.baseline import longer_window
    assert longer_window(10.0, 0.0) == 20.0
    assert longer_window(10.0, 8.4) == 20.0
    assert longer_window(10.0, 14.0) == 24.0  # a start longer than the window: it plus one


def test_a_baseline_that_ended_by_itself_without_a_figure_is_not_tried_again(tmp_path, machine):
    class EndsAtOnce(FakeProbe):
        def __call__(self, spec, **kw):
            self.specs.append(spec)
            return dataclasses.replace(
                result(spec, Outcome.NO_SIGNAL,
                       reason="exited 0 without a single DataLoader batch or optimizer step"),
                exit_code=0, stopped=False)

    fake = EndsAtOnce(surface)
    with pytest.raises(AutotuneError, match="did not give a throughput"):
        tune(tmp_path, fake, trials=1)
    assert len(fake.specs) == 1


def test_ranks_training_alone_are_probed_once_and_instances_stays_one(tmp_path, machine):
    fake = FakeProbe(surface)
    report, _, _ = tune(tmp_path, fake, trials=3)
    ranks = [s for s in fake.specs if s.ranks.name == "ranks"]
    assert len(ranks) == 1 and ranks[0].ranks.instances == 2 and ranks[0].alone_after_s
    assert ranks[0].ranks.knobs["threads"] == 1  # each of 2 ranks gets half the 2 cores
    assert "instances" not in report.space.domains
    assert all(s.ranks.instances == 1 for s in fake.specs if s.ranks.name != "ranks")


def test_ranks_that_join_a_process_group_make_the_probe_the_first_two_rank_trial(tmp_path,
                                                                                machine):
    fake = FakeProbe(surface, ddp=True)
    report, _, run_dir = tune(tmp_path, fake, trials=6, confirm_rounds=0)
    assert {"instances", "bucket_mb"} <= set(report.space.domains)
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    trials = h.trials()
    assert trials[0].user_attrs.get("baseline") and trials[1].user_attrs.get("ranks_probe")
    cfg = trials[1].user_attrs["knobs"]
    assert cfg["instances"] == 2 and trials[1].value == surface(
        {**SEEN, "threads": 1, **cfg})
    # measured once, in the baseline stage: no probe of the search repeats it
    ranks = next(s for s in fake.specs if s.ranks.name == "ranks")
    same = [s.ranks.name for s in fake.specs if s.ranks.knobs == ranks.ranks.knobs
            and s.ranks.instances == 2 and not s.ranks.name.startswith("confirm")]
    assert same == ["ranks"]
    assert report.trials_measured == len(fake.measured()) + 1


def test_a_winner_on_a_replaced_backend_carries_the_note_into_the_recipe(tmp_path, machine):
    from autotune.tuning import recipes

    def ranks_pay(knobs):
        return surface(knobs) * (3.0 if knobs.get("instances", 1) == 2 else 1.0)

    fake = FakeProbe(ranks_pay, ddp=True)
    report, _, _ = tune(tmp_path, fake, trials=4, confirm_rounds=2)
    assert report.best.knobs["instances"] == 2 and not report.kept_baseline
    assert report.best_notes == (NCCL_NOTE,)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    fp = fingerprint.current([str(script)])
    recipe = recipes.Recipe(name="r", knobs=dict(report.best.knobs), samples_per_s=1.0,
                            ci_half=0.1, baseline_samples_per_s=1.0, speedup=1.0,
                            kept_baseline=False, fingerprint=fp, script_path="train.py",
                            notes=report.best_notes)
    assert recipes.load(recipes.save(recipe, tmp_path / "recipes")).notes == (NCCL_NOTE,)


def test_a_winner_that_changes_the_batch_comes_with_the_fastest_that_keeps_it(tmp_path,
                                                                               machine):
    """The largest batch is fastest: the confirmation also measures the fastest config that
    keeps the script's global batch, and the summary, the recipe and ``run --keep-batch``
    carry it beside the winner."""
    from types import SimpleNamespace

    from autotune.commands import run as run_command
    from autotune.commands import tune as tune_command
    from autotune.store.events import Event
    from autotune.tuning import recipes
    from test_recipes import FP

    fake = FakeProbe(lambda k: 10.0 * k["batch_size"] * (1 + 3 * k["workers"]))
    report, _, run_dir = tune(tmp_path, fake, trials=8, confirm_rounds=2,
                              space_tokens=("batch_size=16:64", "workers=0:1"),
                              fix_tokens=("threads=2",))
    assert report.best.knobs["batch_size"] == 64 and not report.kept_baseline
    assert report.batch_note and report.candidates == 3  # the best two and the keeper
    keep = report.keep_batch
    assert keep is not None and not keep.kept_baseline
    assert keep.knobs["batch_size"] == 16 and keep.knobs["workers"] == 1
    assert keep.speedup == pytest.approx(4.0, rel=0.01) and 1.0 < keep.speedup_low < 4.0
    confirmed = {e["trial"] for e in journal(run_dir, Event.CONFIRMATION)}
    assert len(confirmed) == 4  # the baseline, the best two, the batch-keeping one
    (best,) = journal(run_dir, Event.BEST)
    assert best["keep_batch"]["knobs"] == dict(keep.knobs) and best["candidates"] == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["keep_batch"]["knobs"] == dict(keep.knobs)
    assert summary["best"]["knobs"]["batch_size"] == 64
    # the recipe keeps both, and reads back equal
    prep = SimpleNamespace(target=("train.py",), fp=FP)
    path = recipes.save(tune_command.build_recipe(report, prep), tmp_path / "recipes")
    recipe = recipes.load(path)
    assert recipe.knobs["batch_size"] == 64 and recipe.keep_batch == keep
    # run --recipe: the fastest by default, the batch-keeping one with --keep-batch
    assert run_command.chosen(recipe, keep_batch=False) is recipe
    kept = run_command.chosen(recipe, keep_batch=True)
    assert dict(kept.knobs) == dict(keep.knobs) and not kept.batch_note
    assert kept.run_knobs(2)[0]["batch_size"] == 16


def test_rounds_whose_probes_failed_leave_a_reason_that_says_the_rounds_that_would_decide(
        tmp_path, machine):
    """Three rounds asked, two lost to a crashing probe (a machine too busy for the script):
    one ratio is no spread, so the defaults stay, and the reason counts the rounds that
    measured both configs, not the rounds asked."""
    plain = FakeProbe(lambda k: 100.0 * (1 + 2 * k["workers"]))

    def fake(spec, **kw):
        if spec.ranks.name.startswith(("confirm2-", "confirm3-")) and \
                spec.ranks.knobs.get("workers"):
            plain.specs.append(spec)
            return result(spec, Outcome.CRASHED, reason="RuntimeError: boom")
        return plain(spec, **kw)

    report, _, _ = tune(tmp_path, fake, trials=4, confirm_rounds=3,
                        fix_tokens=("batch_size=16", "threads=2"))
    assert report.kept_baseline and report.rounds == 1, report.reason
    assert "a switch needs 2 rounds at least" in report.reason
    assert re.search(r"2 rounds of ~\d+ s \(\S+ more\) would decide", report.reason), \
        report.reason


def test_one_confirmation_round_keeps_the_defaults_and_says_what_would_decide(tmp_path,
                                                                              machine):
    """Workers triple the throughput, but one round of separate processes shows no spread:
    the defaults stay, and the reason names the rounds and the flag that would decide."""
    fake = FakeProbe(lambda k: 100.0 * (1 + 2 * k["workers"]))
    report, _, run_dir = tune(tmp_path, fake, trials=4, confirm_rounds=1,
                              fix_tokens=("batch_size=16", "threads=2"))
    assert report.kept_baseline and report.best.knobs == report.baseline.knobs
    assert report.rounds == 1 and report.speedup == 1.0
    assert "one interleaved round" in report.reason
    assert "a switch needs 2 rounds at least" in report.reason
    assert "2 rounds of ~" in report.reason and "--confirm-rounds 2" in report.reason
    assert any(n.text.startswith("--confirm-rounds 1: a config replaces") for n in report.notes)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kept_baseline"] and summary["keep_batch"] is None
    # the same search with two rounds switches
    again, _, _ = tune(tmp_path / "two", FakeProbe(lambda k: 100.0 * (1 + 2 * k["workers"])),
                       trials=4, confirm_rounds=2, fix_tokens=("batch_size=16", "threads=2"))
    assert not again.kept_baseline and again.best.knobs["workers"] > 0


def test_no_speed_up_is_claimed_when_the_baseline_fails_in_the_confirmation(tmp_path, machine):
    """Workers triple the throughput and two rounds would switch, but every confirmation probe
    of the baseline crashes (a step refused on a cluster, say): the search's baseline figure,
    from other processes at another time, is not what a claim is made against. The defaults
    stay and the reason says why."""

    class BaselineFailsLater(FakeProbe):
        def __call__(self, spec, **kw):
            if spec.ranks.name.startswith("confirm") and spec.ranks.name.endswith("-baseline"):
                self.specs.append(spec)
                return result(spec, Outcome.CRASHED, reason="srun: error: Unable to create step")
            return super().__call__(spec, **kw)

    fake = BaselineFailsLater(lambda k: 100.0 * (1 + 2 * k["workers"]))
    report, _, run_dir = tune(tmp_path, fake, trials=4, confirm_rounds=2,
                              fix_tokens=("batch_size=16", "threads=2"))
    confirm_base = [s for s in fake.specs if s.ranks.name.startswith("confirm")
                    and s.ranks.name.endswith("-baseline")]
    assert len(confirm_base) >= 2  # it was tried in every round
    assert report.kept_baseline and report.speedup == 1.0, report.reason
    assert "the baseline could not be re-measured in the confirmation's rounds" in report.reason
    assert (report.speedup_low, report.speedup_high) == (1.0, 1.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kept_baseline"] and summary["speedup"] == 1.0


def test_a_batch_faster_per_sample_at_a_smaller_size_is_found(tmp_path, machine):
    """The script's batch 16; each halving gains 12%: the search measures the larger
    neighbour first, and as it does not pay, queues the smaller (after the design's other
    moves and the baseline's second process, all at 16); then walks down while it pays, to
    the domain's end (4), and picks it."""
    import math

    fake = FakeProbe(lambda k: 100.0 * 1.12 ** -math.log2(k["batch_size"] / 16))
    report, _, _ = tune(tmp_path, fake, trials=8, confirm_rounds=2)
    batches = [k.get("batch_size") for k in fake.measured()[1:]]
    assert batches[0] == 32, batches  # the larger neighbour first
    assert batches[1:5] == [16, 16, 16, 8], batches
    assert 4 in batches[:6], batches  # then one step further the way it paid off
    assert report.best.knobs["batch_size"] == 4 and not report.kept_baseline


def _first_high_then_low():
    """The script's own config (batch 16 on both cores, no worker) reads 120 in its first
    process, 80 in its second, then the truth, 100; batch 32 does 106 (+6% on the truth), 64
    does 112; any other config 90-95."""
    baseline_calls = []

    def rate(k):
        if (k["batch_size"], k["threads"], k["workers"]) == (16, 2, 0):
            baseline_calls.append(1)
            return {1: 120.0, 2: 80.0}.get(len(baseline_calls), 100.0)
        return {8: 90.0, 32: 106.0, 64: 112.0}.get(k["batch_size"], 95.0)
    return FakeProbe(rate)


def test_a_move_pruned_against_a_lucky_first_figure_is_probed_again(tmp_path, machine):
    """The script's own config reads 150 in its first process and 90 in its second; batch 32
    does 125 (+4% on their mean), 64 does 140. Against the first figure 32 is pruned; the second
    process shows that figure was far off, so 32 is probed once more, and the walk goes on from
    it to 64, which wins. (nanoGPT's shape read its own config at 216.4, then 141.6, and pruned
    its 16 against the first.) Three rounds confirm it: two would pool their spread with that
    pair of processes 51% apart (`decision.POOL_UNDER_DOF`), which no +17% clears."""
    calls = []

    def rate(k):
        if (k["batch_size"], k["threads"], k["workers"]) == (16, 2, 0):
            calls.append(1)
            return {1: 150.0, 2: 90.0}.get(len(calls), 120.0)
        return {32: 125.0, 64: 140.0}.get(k["batch_size"], 80.0)
    fake, told = FakeProbe(rate), []
    report, t, _ = tune(tmp_path, fake, trials=8, confirm_rounds=3, notify=told.append,
                        fix_tokens=("workers=0", "instances=1", "threads=2"))
    texts = [n.text for n in told]
    searched = [k.get("batch_size") for k in fake.measured()[1:]]
    assert searched.count(32) == 2, (searched, texts)
    assert any(n.startswith("batch_size=32 ") and "probed again: pruned at 125.0 before the spread" in n
               for n in texts), texts
    assert 64 in searched[searched.index(32, searched.index(32) + 1):], (searched, texts)
    assert report.best.knobs["batch_size"] == 64 and not report.kept_baseline


@pytest.mark.parametrize("resumed", [False, True])
def test_moves_are_judged_against_the_mean_of_the_baselines_two_processes(tmp_path, machine,
                                                                         resumed):
    """Batch 32 is +6% on the truth but -12% on the baseline's first figure: judged against
    that figure the batch walk stopped there; against the mean of the baseline's two processes
    it walks on to 64 (+12%), which wins over three rounds (two would pool their spread with
    that pair 40% apart). A resumed run judges the same way."""
    told, fake = [], _first_high_then_low()
    fixed = ("workers=0", "instances=1")
    if resumed:  # ended after the second process, then resumed for one more trial
        tune(tmp_path, fake, trials=6, confirm_rounds=0, fix_tokens=fixed, notify=told.append)
        assert "baseline-again" in [s.ranks.name for s in fake.specs]
    report, t, _ = tune(tmp_path, fake, trials=7 if resumed else 6, confirm_rounds=3,
                        notify=told.append, fix_tokens=fixed, resume=resumed)
    names = [s.ranks.name for s in fake.specs]
    assert names.count("baseline-again") == 1 and names[-1] != "baseline-again", names
    assert any(n.text.startswith("batch: ") and "batch_size=64" in n.text for n in told), \
        [n.text for n in told]
    assert 64 in [k.get("batch_size") for k in fake.measured()]
    # The search's own figure for the baseline is the mean, with an interval of half the gap.
    base = t.found.known[t.state.space.key(t.state.space.baseline)]
    assert base.value == pytest.approx(100.0) and base.ci_half == pytest.approx(20.0)
    assert report.best.knobs["batch_size"] == 64 and not report.kept_baseline


def test_a_batch_walk_that_keeps_paying_jumps_where_the_step_time_model_says_it_ends(
        tmp_path, machine):
    """A step costs 0.5 s plus 10 ms a sample (minGPT's shape is of this kind): from the
    script's 16, batch 32 gains 32%. One step at a time the walk needs three more probes to
    reach the largest batch; the step-time model fitted to 16 and 32 sends it there next,
    and the search picks it."""
    fake = FakeProbe(lambda k: k["batch_size"] / (0.5 + 0.01 * k["batch_size"]))
    told = []
    report, t, _ = tune(tmp_path, fake, trials=6, confirm_rounds=2, notify=told.append,
                        fix_tokens=("workers=0", "instances=1", "threads=2"))
    top = max(t.state.space.domains["batch_size"])
    batches = [k.get("batch_size") for k in fake.measured()[1:]]
    # the larger neighbour first; as it pays beyond the process margin, the smaller (8) waits
    # and the model's jump comes straight after it
    assert batches[:2] == [32, top], (batches, t.state.space.domains["batch_size"])
    assert batches.index(8) > 1, batches
    assert any(n.text.startswith(f"batch: batch_size={top}") and "steps past 32" in n.text
               for n in told), [n.text for n in told]
    assert report.best.knobs["batch_size"] == top and not report.kept_baseline


def test_a_flat_batch_line_is_looked_past_once_halfway_to_the_largest_batch(tmp_path, machine):
    """The script's 16 and both its neighbours read the same; from 64 up a step does 30% more
    (a fixed cost that only a larger batch amortizes, under noise one step out). The walk has
    nowhere to go; one probe halfway from 32 to the largest finds the gain, and the walk goes
    on from there."""
    fake = FakeProbe(lambda k: 130.0 if k["batch_size"] >= 64 else 100.0)
    told = []
    report, t, _ = tune(tmp_path, fake, trials=6, confirm_rounds=2, notify=told.append,
                        fix_tokens=("workers=0", "instances=1", "threads=2"))
    domain = t.state.space.domains["batch_size"]
    assert domain[domain.index(32) + 1:] == (64, 128), domain
    batches = [k.get("batch_size") for k in fake.measured()[1:]]
    assert batches[:3] == [32, 8, 64], batches  # the larger neighbour read level: both
    assert any(n.text.startswith("batch: batch_size=64") and "halfway to the largest" in n.text
               for n in told), [n.text for n in told]
    assert report.best.knobs["batch_size"] >= 64 and not report.kept_baseline


def test_convergence_counts_gains_over_the_mean_of_the_baselines_two_processes(tmp_path,
                                                                               machine):
    """The baseline reads 120, then 80 (truth 100): judged against the first figure nothing
    the search finds is a gain and it converges six probes in; against the mean, batch 32
    (106) and 64 (112) are, and the rule waits six probes after the last of them."""
    fake = _first_high_then_low()
    # workers searched too: a space of 12 configs ran out of new proposals (the duplicates
    # rule) before the convergence rule could be seen to wait
    report, t, _ = tune(tmp_path, fake, trials=40, confirm_rounds=0,
                        fix_tokens=("instances=1",))
    assert report.stop_reason.rule is Stop.CONVERGED, report.stop_reason
    searched = [s for s in fake.specs
                if s.ranks.name.startswith("trial-") or s.ranks.name == "baseline-again"]
    names = [s.ranks.name for s in searched]
    after = names[[s.ranks.knobs.get("batch_size") for s in searched].index(64) + 1:]
    after = [n for n in after if n != "baseline-again"]
    patience = search_rules.Convergence().patience
    assert len(after) >= patience, [(n, s.ranks.knobs) for n, s in zip(names, searched)]


class WithParts(FakeProbe):
    """Every probe's breakdown says it waits ``data`` of each step for data (±10% of that)."""

    def __init__(self, rate, data):
        super().__init__(rate)
        self.parts = Breakdown({"data": (data, data * 0.1), "forward": (0.5, 0.01),
                                "other": (0.5 - data, 0.01)}, ranks=1)

    def __call__(self, spec, **kw):
        return dataclasses.replace(super().__call__(spec, **kw), breakdown=self.parts)


@pytest.mark.parametrize("data,held", [(0.001, True), (0.2, False)])
def test_workers_wait_for_the_batch_walk_when_the_baseline_barely_waits_for_data(
        tmp_path, machine, data, held):
    """More workers can take back the data wait and nothing else: where the baseline waits
    0.1% of its step for data, the workers move is probed after the batch walk, not before it
    (minGPT's shape spent a 6m budget's last room on it); at 20% it keeps its place."""
    fake = WithParts(lambda k: 100.0 * (1 + k["batch_size"] / 64), data)
    told = []
    tune(tmp_path, fake, trials=8, confirm_rounds=0, notify=told.append,
         fix_tokens=("instances=1", "threads=2"))
    searched = fake.measured()[1:]
    first_workers = next(i for i, k in enumerate(searched) if k.get("workers"))
    walk_end = next(i for i, k in enumerate(searched) if k.get("batch_size") == 128)
    assert (first_workers > walk_end) == held, (searched, [n.text for n in told])
    assert any("held back: what it moves" in n.text for n in told) == held, \
        [n.text for n in told]


@pytest.mark.parametrize("larger_pays", [True, False])
def test_the_smaller_batch_waits_while_the_larger_pays(tmp_path, machine, larger_pays):
    """The script's 16: its larger neighbour is probed first. Where it pays beyond what
    processes differ by (32 at +30%), the line rises past the script's batch and the smaller
    (8) waits until the walk has nowhere to go: here, past 64, once 128 reads lower. Where it
    does not (32 level), the smaller is probed next."""
    rates = {8: 80.0, 16: 100.0, 32: 130.0 if larger_pays else 100.0, 64: 150.0, 128: 140.0}
    fake = FakeProbe(lambda k: rates.get(k["batch_size"], 60.0))
    told = []
    tune(tmp_path, fake, trials=6, confirm_rounds=0, notify=told.append,
         fix_tokens=("workers=0", "instances=1", "threads=2"))
    batches = [k.get("batch_size") for k in fake.measured()[1:]]
    texts = [n.text for n in told]
    assert batches[0] == 32, batches
    if larger_pays:
        walk = batches[1:batches.index(8)]  # the walk's steps (or its model's jump) come first
        assert walk and all(b > 32 for b in walk), (batches, texts)
        assert any(t.startswith("batch_size=8 ") and "stays held back" in t and "+30.0%" in t
                   for t in texts), texts
    else:
        assert batches[1] == 8, (batches, texts)
        assert any(t.startswith("batch_size=8 ") and " next: " in t and "+0.0%" in t
                   for t in texts), texts
