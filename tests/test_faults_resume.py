"""Issue 13: what ``--resume`` keeps. The run's settings (recipe dir, budget spent), the
interrupted trial re-run first, a study file that is not a study refused, a recipe that could
not be saved saved later. Fake probes where the rule is pure, real processes where the user's
command line is the point."""

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys

import pytest

from autotune.commands import cli
from autotune.commands import tune as tune_cmd
from autotune import AutotuneError, UsageError
from autotune.tuning import fitting, recipes
from autotune.tuning import Tuner, TuneSettings, TuneState
from autotune.tuning import study as studies
from autotune.tuning.state import save, spent_s
from conftest import (SCRIPTS, assert_one_error_line, autotune, journal, live_children,
                      wait_for)
import test_study
from test_study import FakeProbe, QuickClock, surface, tune

TOY = str(SCRIPTS / "tune_toy.py")
OK = str(SCRIPTS / "ok.py")
machine = test_study.machine  # the fixture


class Interrupting(FakeProbe):
    """Ctrl-C during the second probe of the search, once."""

    def __call__(self, spec, **kw):
        search = [s for s in self.specs if s.ranks.name.startswith("trial-")]
        if spec.ranks.name.startswith("trial-") and len(search) == 1 and not getattr(self, "hit", 0):
            self.hit = spec
            self.specs.append(spec)
            raise KeyboardInterrupt
        return super().__call__(spec, **kw)


def test_the_interrupted_trial_runs_first_on_resume(tmp_path, machine):
    fake = Interrupting(surface)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, fake, trials=3, confirm_rounds=0, fix_tokens=("batch_size=16",))
    before = len(fake.specs)
    tune(tmp_path, fake, resume=True, trials=3, confirm_rounds=0, fix_tokens=("batch_size=16",))
    resumed = [s for s in fake.specs[before:] if s.ranks.name.startswith("trial-")]
    assert resumed and resumed[0].ranks.knobs == fake.hit.ranks.knobs  # first, not behind the queue
    h = studies.open_study(studies.sqlite_url(tmp_path / "run" / "study.db"),
                           "autotune-run", run_id="run")
    retry = [t for t in h.trials() if t.user_attrs.get("retry_of") is not None]
    assert len(retry) == 1 and retry[0].state in (studies.TrialState.COMPLETE,
                                                  studies.TrialState.PRUNED)


@pytest.mark.parametrize("content", [b"", b"not a database, really" * 100])
def test_a_study_file_that_is_not_a_study_is_refused_never_replaced(tmp_path, machine,
                                                                    content):
    tune(tmp_path, FakeProbe(surface), trials=3, confirm_rounds=0)
    db = tmp_path / "run" / "study.db"
    db.write_bytes(content)
    fake = FakeProbe(surface)
    with pytest.raises(AutotuneError) as err:
        tune(tmp_path, fake, resume=True, trials=5, confirm_rounds=0)
    assert str(db) in str(err.value) and "--storage" not in str(err.value)
    assert fake.specs == []  # nothing measured


def test_budget_spent_counts_each_controller_not_the_time_between(tmp_path):
    lines = [{"t": 0.0, "event": "run_started"}, {"t": 100.0, "event": "trial_finished"},
             {"t": 5000.0, "event": "run_started"}, {"t": 5050.0, "event": "run_ended"}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert spent_s(tmp_path) == 150.0


def test_resume_with_its_budget_already_spent_says_so(tmp_path):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    save(run_dir, TuneState.new(TuneSettings(command=(OK,), cwd=str(tmp_path), budget_s=600.0),
                                run_dir))
    (run_dir / "events.jsonl").write_text(
        json.dumps({"t": 1000.0, "event": "run_started"}) + "\n" +
        json.dumps({"t": 1372.0, "event": "run_ended", "exit_code": 130}) + "\n")
    p = autotune("tune", "--resume", str(run_dir), "--budget", "3m", cwd=tmp_path, timeout=120)
    assert_one_error_line(p, "budget 3m already spent (6m12s)", "larger --budget")


def test_resume_refuses_another_study_than_the_runs_own(tmp_path):
    """--storage or --study-name given again with --resume: the same is accepted, another is
    one line (it used to be ignored without a word)."""
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    save(run_dir, TuneState.new(TuneSettings(command=(OK,), cwd=str(tmp_path), budget_s=600.0,
                                             storage=url), run_dir))
    p = autotune("tune", "--resume", str(run_dir), "--storage", "sqlite:////tmp/other.db",
                 cwd=tmp_path, timeout=120)
    assert_one_error_line(p, f"--resume keeps the run's study (--storage {url})",
                          "drop --storage sqlite:////tmp/other.db")
    p = autotune("tune", "--resume", str(run_dir), "--study-name", "mine", cwd=tmp_path,
                 timeout=120)
    assert_one_error_line(p, "(--study-name autotune-r)",
                          "drop --study-name mine")


def test_a_recipe_dir_that_cannot_be_created_stops_before_any_probe(tmp_path):
    (tmp_path / "afile").write_text("")
    p = autotune("tune", "--trials", "1", "--seconds", "3", "--recipe-dir",
                 str(tmp_path / "afile" / "recipes"), "--runs-dir", str(tmp_path / "runs"),
                 "--", OK, cwd=tmp_path, timeout=120)
    assert_one_error_line(p, "--recipe-dir", "not a directory")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_recipe_that_cannot_be_saved_is_saved_by_resume(tmp_path, machine, monkeypatch):
    fake = FakeProbe(surface)
    monkeypatch.setattr(tune_cmd, "Tuner", functools.partial(Tuner, run_trial=fake,
                                                             clock=QuickClock()))
    parse = cli.build_parser().parse_args
    args = parse(["tune", "--trials", "3", "--confirm-rounds", "0", "--recipe-dir",
                  str(tmp_path / "first"), "--runs-dir", str(tmp_path / "runs"), "--", OK])
    prep = tune_cmd.prepare(args, "tune")
    assert prep.settings.recipe_dir == str(tmp_path / "first")

    def broken(recipe, recipe_dir):
        raise NotADirectoryError(20, "Not a directory")

    monkeypatch.setattr(recipes, "save", broken)
    with pytest.raises(AutotuneError, match="--resume .* --recipe-dir DIR"):
        tune_cmd.tune_in(prep)
    monkeypatch.undo()
    monkeypatch.setattr(tune_cmd, "Tuner", functools.partial(Tuner, run_trial=fake,
                                                             clock=QuickClock()))
    measured = len(fake.specs)
    (prep.run_dir / "controller.json").unlink()  # that controller (this process) is done
    again = tune_cmd.prepare(parse(["tune", "--resume", str(prep.run_dir), "--recipe-dir",
                                    str(tmp_path / "second")]), "tune")  # not "finished"
    _, _, path = tune_cmd.tune_in(again)
    assert path.parent == tmp_path / "second" and path.exists()
    assert not [s for s in fake.specs[measured:] if s.ranks.name.startswith(("trial-", "baseline"))]
    (prep.run_dir / "controller.json").unlink()
    with pytest.raises(UsageError, match="finished"):
        tune_cmd.prepare(parse(["tune", "--resume", str(prep.run_dir)]), "tune")


def interrupt_mid_search(args, *, cwd, env, runs, in_flight: bool, timeout_s: float):
    """``autotune tune --plain ARGS`` in its own session, Ctrl-C once a search trial has
    started (``in_flight``: one that has not finished yet); it must exit 130. Its run dir and
    that trial's ``trial_started`` event."""
    controller = subprocess.Popen([sys.executable, "-m", "autotune", "tune", "--plain", *args],
                                  cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)

    def search_trial():
        assert controller.poll() is None, "the tuning ended before it could be stopped"
        dirs = list(runs.glob("*"))
        if not dirs:
            return None
        done = {e["trial"] for e in journal(dirs[0], "trial_finished")} if in_flight else set()
        hit = next((e for e in journal(dirs[0], "trial_started")
                    if e["trial"].startswith("trial-") and e["trial"] not in done), None)
        return (dirs[0], hit) if hit else None

    try:
        found = wait_for(search_trial, timeout_s=timeout_s, what="a search trial",
                         poll_s=0.2)
        controller.send_signal(signal.SIGINT)
        assert controller.wait(timeout=60) == 130
    finally:
        if controller.poll() is None:
            controller.kill()
    return found


@pytest.mark.slow
def test_sigint_then_resume_keeps_the_runs_recipe_dir_and_reruns_the_trial_first(tmp_path):
    """tune --recipe-dir X, Ctrl-C mid-trial, tune --resume from elsewhere: the recipe goes to
    X, the interrupted trial is the first probe of the resume, the budget left is told."""
    recipe_dir = tmp_path / "my recipes"
    here, elsewhere = tmp_path / "a", tmp_path / "b"
    here.mkdir(), elsewhere.mkdir()
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    run_dir, hit = interrupt_mid_search(
        ["--foreign-limit", "1000", "--trials", "3", "--seconds", "6", "--budget", "10m",
         "--confirm-rounds", "0", "--seed", "3", "--space", "batch_size=8:32", "--fix",
         "threads=1", "--recipe-dir", str(recipe_dir), "--", TOY, "--work", "1"],
        cwd=here, env=env, runs=tmp_path / "runs", in_flight=True, timeout_s=150)
    started = len(journal(run_dir, "trial_started"))
    p = autotune("tune", "--resume", str(run_dir), "--plain", cwd=elsewhere, timeout=240,
                 env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "of the 10m budget" in p.stderr and "left" in p.stderr
    assert list(recipe_dir.glob("*.toml")) and not (elsewhere / "recipes").exists()
    assert not (here / "recipes").exists()
    new = [e for e in journal(run_dir, "trial_started")[started:]
           if e["trial"].startswith("trial-")]
    assert new and new[0]["knobs"] == hit["knobs"]
    assert live_children() == []


# -- issue 21: what the probes taught survives a resume ----------------------------------------

class Measuring(Interrupting):
    """Probes that report their memory (one rank, a peak that grows with the batch)."""

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        batch = int(spec.ranks.knobs.get("batch_size") or 16)
        return dataclasses.replace(r, ranks_seen=1, peak_rss_bytes=2**27 + batch * 2**20,
                                   step_s=0.1 * batch / 16)


def test_a_resume_reports_what_the_interrupted_controller_learned(tmp_path, machine):
    """Ctrl-C mid-search, then --resume with --confirm-rounds 0 (nothing re-probes the
    baseline): the report still has the baseline's probe facts, a memory fit over the probes
    of both controllers, the script's timing as the baseline fitted it, and the notes the first
    controller told; no probe of the baseline is taken again."""
    kw = dict(trials=4, confirm_rounds=0, space_tokens=("batch_size=8:32",),
              fix_tokens=("threads=1", "workers=0"))
    fake = Measuring(surface)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, fake, **kw)
    run_dir = tmp_path / "run"
    before = json.loads((run_dir / "tune.json").read_text())["learned"]
    assert before["timing"] and before["last"]  # saved as the stages went
    probed = len(fake.specs)
    report, t, _ = tune(tmp_path, fake, resume=True, **kw)
    assert not [s for s in fake.specs[probed:] if s.ranks.name == "baseline"]
    assert report.baseline_probe is not None  # was None: the prober's memory died with it
    assert report.memory is not None
    assert {b for b, _ in report.memory.fit.points} == {8, 16, 32}  # both controllers' probes
    assert t.state.learned.timing == fitting.ScriptTiming.from_dict(before["timing"])
    assert any(n.text.startswith("baseline: first batch after") for n in report.notes)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["probes"]["baseline"] is not None and summary["memory"] is not None


@pytest.mark.slow
def test_sigint_mid_search_then_resume_reports_as_an_uninterrupted_run(tmp_path):
    """The issue's case, real processes: ``tune --confirm-rounds 0``, SIGINT once a search
    trial is in flight, ``tune --resume``. The summary has what an uninterrupted run's has:
    the baseline's probe facts (they were null), the memory fit over the probes of both
    controllers, the probe fitting the baseline made (not fitted again: the resumed controller
    takes no baseline probe)."""
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    # 12 s probes: beside a busy suite a probe's first batch came 7 s in, and 8 s probes then
    # measured nothing (no-signal), leaving the memory fit a single batch
    run_dir, _ = interrupt_mid_search(
        ["--foreign-limit", "1000", "--trials", "3", "--seconds", "12", "--confirm-rounds", "0",
         "--seed", "3", "--baseline", "batch_size=8", "--space", "batch_size=16:32", "--fix",
         "threads=1", "workers=0", "instances=1", "--", TOY, "--work", "1", "--batch-size",
         "{batch_size}"], cwd=tmp_path, env=env, runs=tmp_path / "runs", in_flight=False,
        timeout_s=120)
    timing = json.loads((run_dir / "tune.json").read_text())["learned"]["timing"]
    assert timing is not None
    p = autotune("tune", "--resume", str(run_dir), "--plain", cwd=tmp_path, timeout=240,
                 env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["probes"]["baseline"] is not None and s["probes"]["best"] is not None
    assert s["probes"]["baseline"]["core_s_per_sample"] > 0
    assert s["memory"] is not None
    # the baseline's batch (8) was probed by the first controller only; every search trial's
    # is another (16 to 32: the memory fit has two batches whichever configs the search drew)
    batches = {b for b, _ in s["memory"]["points"]}
    assert 8 in batches and len(batches) >= 2, batches
    assert any(n.startswith("baseline: first batch after") for n in s["notes"])
    # the resumed controller (after the journal's last run_started) probed no baseline; the
    # first may have taken two tries of it (a slow start on a busy machine is tried again)
    events = journal(run_dir)
    resumed_at = max(i for i, e in enumerate(events) if e["event"] == "run_started")
    assert resumed_at > 0
    assert not [e for e in events[resumed_at:] if e["event"] == "trial_started"
                and e["trial"] == "baseline"]
    assert [e["trial"] for e in events[:resumed_at] if e["event"] == "trial_started"].count(
        "baseline") >= 1
    assert json.loads((run_dir / "tune.json").read_text())["learned"]["timing"] == timing
    assert s["stop_reason"] and s["recipe"]
    assert live_children() == []
