"""What a tuning run keeps and parses once: ``tune.json`` as `TuneState`, the settings' typed
flags, and the baseline's guess for a placeholder (the same for ``probe`` and ``tune``)."""

import dataclasses
import json
import os

import pytest

from autotune.commands import cli
from autotune.commands import probe as probe_command
from autotune import UsageError
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.noise import NoiseEstimate
from autotune import Note
from autotune.tuning import TuneSettings, TuneState, load_state, space
from autotune.tuning import baseline, fitting
from autotune.tuning.records import AllreduceTiming, BaselineRecord, RanksProbe
from autotune.tuning.space.parse import parse_values
from autotune.tuning.state import save
from conftest import SCRIPTS
from results import trial_result

# tune.json as the controller wrote it before version 2 (no version field): the prober's
# learned state was not in it, so a resume of it could not report as the run would have.
OLD = {
    "warm_start": None, "kind": "wrap",
    "settings": {"command": ["/x/train.py", "-b", "{batch_size}"], "cwd": "/x", "seconds": 8.0,
                 "trials": 4, "budget_s": None, "confirm_rounds": 0, "confirm_s": None,
                 "space_tokens": ["batch_size=8:32"], "fix_tokens": ["threads=1"],
                 "baseline_tokens": ["batch_size=16"], "global_batch": None,
                 "samples_per_step": None, "foreign_limit_cores": 1000.0,
                 "foreign_retries": 2, "seed": 3, "verdict": False, "storage": None,
                 "study_name": None},
    "run_id": "20260101-000000-train", "run_command": ["train.py", "-b", "{batch_size}"],
    "run_cwd": "/home/u",
    "space": {"domains": {"batch_size": [8, 16, 32]}, "fixed": {"thread_pct": 50},
              "baseline": {"batch_size": 16, "thread_pct": 50}, "cores": 2},
    "baseline": {"knobs": {"batch_size": 16, "thread_pct": 50}, "samples_per_s": 120.5,
                 "ci_half": 3.0, "source": "dataloader", "seen": {"workers": 0}},
    "enqueued": True,
}


def test_a_tune_json_of_another_version_is_refused_in_one_line(tmp_path):
    (tmp_path / "tune.json").write_text(json.dumps(OLD))
    with pytest.raises(UsageError, match="format is version 1, this autotune reads version 2; "
                                         "start a new tuning"):
        load_state(tmp_path)


def test_everything_a_stage_learned_goes_through_tune_json_and_back(tmp_path):
    """The typed parts of the state (baseline, allreduce, two-rank probe, what the probes
    taught) load back equal, and save back the same."""
    s = TuneSettings.from_dict(OLD["settings"])
    st = TuneState.new(s, tmp_path / "run", kind="wrap")
    base = BaselineRecord({"batch_size": 16, "thread_pct": 50}, 120.5, 3.0, "dataloader",
                          {"workers": 0}, Breakdown({"forward": (0.5, 0.05)}, 1), None,
                          NoiseEstimate(None, reason="x"))
    r = trial_result(samples_per_s=120.5, ci_half=3.0, steps_per_s=7.5, log_path="l",
                     knobs={"batch_size": 16}, notes=(Note.info("kept a flag"),), ranks_seen=1,
                     step_s=0.13, core_s_per_sample=0.02)
    cfg = {"batch_size": 16, "thread_pct": 50}
    st = dataclasses.replace(
        st, space=space.Space.from_dict(OLD["space"]), baseline=base,
        allreduce=AllreduceTiming(error="the allreduce probe failed"),
        ranks_probe=RanksProbe({"batch_size": 16, "instances": 2}, 200.0, 5.0, None,
                               NoiseEstimate(None, reason="y")), enqueued=True)
    st = st.learn(cfg, {"batch_size": 16, "threads": 1}, r)
    st = dataclasses.replace(st, learned=dataclasses.replace(
        st.learned, timing=fitting.ScriptTiming(2.0, 1.0, 0.13, 5.0, 0.05, batch_size=16)))
    st = st.noted(Note.hint("a hint")).noted(Note.hint("a hint"))  # kept once
    assert st.learned.notes == (Note.hint("a hint"),)
    assert st.learned.paces == (fitting.Pace(16, 1, r.step_s, warmup_s=r.warmup_s),)
    assert st.learned.facts(cfg).core_s_per_sample == r.core_s_per_sample
    assert st.learned.notes_of(cfg) == ("kept a flag",)
    save(tmp_path, st)
    again = load_state(tmp_path)
    assert again == st
    (tmp_path / "run").mkdir()
    save(tmp_path / "run", again)
    assert (tmp_path / "run" / "tune.json").read_text() == (tmp_path / "tune.json").read_text()


def test_a_probe_in_turns_keeps_the_breakdown_an_earlier_probe_of_the_config_gave():
    """A confirmation round in turns measures the config again, with no breakdown (its held
    spans are no part of a step): its figures become the config's last, its breakdown stays
    the search probe's, so the verdict still names the winner's binding share. A later probe
    with a breakdown of its own replaces it."""
    from autotune.tuning.learned import Learned

    cfg = {"batch_size": 16, "workers": 1}
    searched = Breakdown({"forward": (0.6, 0.05), "data": (0.3, 0.05)}, 1)
    learned = Learned().after(cfg, cfg, trial_result(samples_per_s=500.0, breakdown=searched,
                                                     core_s_per_sample=0.01))
    learned = learned.after(cfg, cfg, trial_result(samples_per_s=540.0, breakdown=None,
                                                   core_s_per_sample=0.02))
    assert learned.facts(cfg).breakdown == searched
    assert learned.facts(cfg).core_s_per_sample == 0.02  # the rest is the last probe's
    again = Breakdown({"forward": (0.9, 0.05)}, 1)
    learned = learned.after(cfg, cfg, trial_result(breakdown=again))
    assert learned.facts(cfg).breakdown == again


def test_a_new_state_has_no_baseline_keys_yet(tmp_path):
    s = TuneSettings(command=("t.py",), cwd="/w")
    st = TuneState.new(s, tmp_path / "run-1", warm_start={"workers": 2})
    d = st.to_dict()
    assert st.run_command == ("t.py",) and st.run_cwd == "/w" and st.run_id.startswith("run-1-")
    assert not {"space", "baseline", "allreduce", "enqueued", "combined",
                "smaller_settled"} & set(d)
    assert TuneState.from_dict(json.loads(json.dumps(d))) == st
    done = dataclasses.replace(st, combined=True)
    assert TuneState.from_dict(done.to_dict()).combined
    settled = dataclasses.replace(st, smaller_settled=True)
    assert TuneState.from_dict(settled.to_dict()).smaller_settled


def test_a_state_without_the_full_runs_command_runs_the_probed_one(tmp_path):
    d = TuneState.new(TuneSettings.from_dict(OLD["settings"]), tmp_path).to_dict()
    st = TuneState.from_dict({k: v for k, v in d.items()
                              if k not in ("run_command", "run_cwd", "kind")})
    assert st.run_command == st.settings.command and st.run_cwd == "/x"
    assert st.kind == "tune"


def test_settings_carry_parsed_flags_and_save_their_tokens():
    s = TuneSettings(command=("t.py",), cwd="/w",
                     ranges=space.parse_space(["batch_size=16:64 threads=1,2"]),
                     fixed=space.parse_fix(["workers=2"]),
                     baseline_values=parse_values(["batch_size=32"]))
    d = s.to_dict()
    assert d["space_tokens"] == ["batch_size=16:64", "threads=1,2"]
    assert d["fix_tokens"] == ["workers=2"] and d["baseline_tokens"] == ["batch_size=32"]
    assert TuneSettings.from_dict(json.loads(json.dumps(d))) == s


def test_a_bad_baseline_value_names_its_own_flag():
    with pytest.raises(UsageError, match="^--baseline: 'x' in 'batch_size=x'"):
        parse_values(["batch_size=x"])
    with pytest.raises(UsageError, match="^--baseline: 'workers=1,2' is not NAME=VALUE"):
        parse_values(["workers=1,2"])


def test_a_knob_fixed_twice_is_an_error_not_the_last_one_silently():
    with pytest.raises(UsageError, match="^--fix: thread_pct given twice"):
        space.parse_fix(["threads=1", "thread_pct=50"])


def test_placeholder_guesses(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    args = ("--bs", "{batch_size}", "-j", "{workers}", "-t", "{threads}")
    assert baseline.placeholder_values(args) == (
        {"batch_size": 32, "threads": 3, "workers": 0}, ("batch_size", "threads", "workers"))
    assert baseline.placeholder_values(args, given={"workers": 4}, global_batch=64,
                                       devices=4) == (
        {"batch_size": 16, "threads": 3, "workers": 4}, ("threads",))
    # A global batch reaches the ranks without a placeholder too (interception applies it).
    assert baseline.placeholder_values((), global_batch=64, devices=2) == ({"batch_size": 32}, ())


def test_probe_gives_a_threads_placeholder_the_cores_a_rank_may_use(tmp_path, monkeypatch):
    """Not the host's count: a process pinned to 2 of 64 cores gets 2, as a tune baseline does."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    specs = []

    def fake(spec, **kw):
        specs.append(spec)
        return trial_result(spec, samples_per_s=10.0, ci_half=1.0, steps_per_s=1.0,
                            peak_rss_bytes=0, log_path=str(spec.ranks.log_dir / "x.log"))

    monkeypatch.setattr(probe_command, "run_trial", fake)
    args = cli.build_parser().parse_args(
        ["probe", "--plain", "--json", "--modes", "full", "--runs-dir", str(tmp_path / "runs"),
         "--", str(SCRIPTS / "ok.py"), "--threads", "{threads}"])
    assert probe_command.run(args) == 0
    assert [s.ranks.knobs for s in specs] == [{"threads": 2}]


def test_two_runs_of_one_name_get_distinct_run_ids(tmp_path):
    """Two tuners started in the same second on one script name their run directories alike
    (on their own hosts); on a shared study their trials must still be told apart."""
    settings = TuneSettings(command=("train.py",), cwd=str(tmp_path))
    a = TuneState.new(settings, tmp_path / "a" / "20261123-120000-tune-train")
    b = TuneState.new(settings, tmp_path / "b" / "20261123-120000-tune-train")
    assert a.run_id != b.run_id and a.run_id.startswith("20261123-120000-tune-train-")
    assert TuneState.from_dict(a.to_dict()).run_id == a.run_id  # a resume keeps it
