"""``autotune tune/wrap/run`` as a user runs them: real processes, real training, on CPU.

Probes are short and budgets tiny; nothing asserts on speed. Foreign load is not flagged here
(``--foreign-limit``): CI machines are shared, and that rule has its own test with a fake probe.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.hardware import proc
from autotune.tuning import recipes
from autotune.tuning import study as studies
from autotune.tuning.baseline import BASELINE_TRIES, longer_window
from conftest import (EXAMPLES, SCRIPTS, assert_one_error_line, autotune, journal, last_json,
                      live_children)

TOY = str(SCRIPTS / "tune_toy.py")
QUIET = ["--plain", "--foreign-limit", "1000"]


# -- usage errors: one line, exit 2, before anything runs --------------------------------------
@pytest.mark.parametrize("args, words", [
    (["tune", "--space", "batch_size=64:8", "--", TOY], ["--space", "64 > 8"]),
    (["tune", "--space", "batchsize=8:64", "--", TOY], ["unknown knob 'batchsize'"]),
    (["wrap", "--fix", "speed=3", "--", TOY], ["unknown knob 'speed'"]),
    (["tune", "--space", "workers=0:2", TOY], ["'", "is not NAME=LOW:HIGH"]),
    (["tune", "missing_script.py"], ["missing_script.py", "not found"]),
    (["wrap"], ["no training script given"]),
    (["tune", "--budget", "soon", TOY], ["--budget", "'soon'"]),
    (["tune", "--baseline", "workers=two", "--", TOY], ["--baseline", "'two'"]),
])
def test_usage_errors(tmp_path, args, words):
    p = autotune(*args, cwd=tmp_path, timeout=60)
    assert_one_error_line(p, *words)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_explicit_flag_cannot_be_searched(tmp_path):
    p = autotune("tune", "--space", "batch_size=8:64", "--", TOY, "--batch-size", "16",
                 cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "'--batch-size 16'", "--batch-size {batch_size}")


def test_run_with_corrupt_recipe(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\nname = 'x'\n")
    p = autotune("run", "--recipe", str(bad), TOY, cwd=tmp_path, timeout=60)
    assert_one_error_line(p, str(bad), "missing")


def test_resume_of_a_directory_that_is_no_run(tmp_path):
    p = autotune("tune", "--resume", str(tmp_path), cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "--resume", "tune.json")


# -- real runs ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_wrap_image_example(tmp_path):
    """The issue's check: wrap on the image example, small budget; recipe loads, run exits 0."""
    # 24 epochs of 64 images: more than a probe of 8 s can train through at any speed we know,
    # so probes are stopped by autotune and only the full run reaches the end.
    data = tmp_path / "data"
    p = autotune("wrap", *QUIET, "--json", "--budget", "40s", "--seconds", "8",
                 "--confirm-rounds", "1", "--confirm-seconds", "8", "--recipe-dir",
                 str(tmp_path / "recipes"), "--",
                 str(EXAMPLES / "image_classifier" / "train.py"), "--num-images", "64",
                 "--epochs", "24", "--data-dir", str(data), cwd=tmp_path, timeout=400)
    summary = last_json(p)
    assert summary["exit_code"] == 0
    recipe = recipes.load(summary["recipe"])
    assert recipe.knobs == summary["best"]["knobs"]
    assert recipe.samples_per_s > 0 and recipe.fingerprint.cores >= 1
    assert "done:" in p.stdout  # the script's own output, streamed
    names = [e["event"] for e in journal(summary["run_dir"])]
    for name in ("run_started", "trial_started", "trial_finished", "best", "recipe_saved",
                 "fullrun_started", "fullrun_ended", "run_ended"):
        assert name in names, name
    assert journal(summary["run_dir"], "run_ended")[-1]["exit_code"] == 0
    # The example goes data-parallel only under WORLD_SIZE > 1: found by the two-rank probe, so
    # ranks and buckets are searched by default, and at least one trial ran on 2 ranks.
    assert {"instances", "bucket_mb"} <= set(summary["space"]["domains"]), \
        (summary["space"], summary["notes"], p.stderr[-3000:])
    assert any(e["result"]["knobs"].get("instances") == 2 and e["result"]["outcome"] in ("ok", "ended")
               for e in journal(summary["run_dir"], "trial_finished"))
    assert live_children() == []


@pytest.mark.slow
def test_a_script_that_ends_inside_its_probes_is_confirmed_one_probe_after_another(tmp_path):
    """README's first command trains the image example for one epoch (64 batches, ~6 s), and
    every probe sees it end on its own. In turns each probe warms up alone before its slices,
    so the script ended before any round had a figure, and the race kept the defaults against
    a +52% the search had found. Here the rounds run one probe after another, say why, and each
    gives a figure from the span before the script's end, as the search's probes did."""
    data = tmp_path / "data"
    p = autotune("tune", *QUIET, "--json", "--trials", "3", "--fix", "instances=1",
                 "--confirm-rounds", "2", "--recipe-dir", str(tmp_path / "recipes"), "--",
                 str(EXAMPLES / "image_classifier" / "train.py"), "--num-images", "1024",
                 "--epochs", "1", "--data-dir", str(data), cwd=tmp_path, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = last_json(p)
    searched = journal(summary["run_dir"], "trial_finished")
    assert any(e["result"]["outcome"] == "ended" for e in searched), p.stderr[-3000:]
    assert "confirmation: the rounds run one probe after another: the script ended on its own" \
        in p.stderr, p.stderr[-3000:]
    rounds = journal(summary["run_dir"], "confirmation")
    assert {e["round"] for e in rounds} == {1, 2}, rounds
    assert len({e["trial"] for e in rounds}) >= 2, rounds
    assert all(e["outcome"] in ("ok", "ended") and e["samples_per_s"] > 0 for e in rounds), \
        [(e["trial"], e["outcome"], e.get("reason")) for e in rounds]
    assert live_children() == []


@pytest.mark.slow
def test_wrap_exits_with_the_scripts_code(tmp_path):
    # The toy trains --run-seconds from its first batch: longer than any probe, the baseline's
    # last slow-start retry included (its windows grow by `longer_window` over BASELINE_TRIES
    # tries, 6, 12 and 24 s; a loaded machine took 6 and 11 s to the first batch and needed all
    # three), so only the full run reaches its exit code. --keep-batch: one trial keeps the
    # script's defaults, whose batch is the script's own
    seconds = longest = 6
    for _ in range(BASELINE_TRIES - 1):  # the slowest start a window can see is its length
        longest = longer_window(longest, longest)
    p = autotune("wrap", *QUIET, "--trials", "1", "--seconds", str(seconds), "--keep-batch",
                 "--recipe-dir", str(tmp_path / "recipes"), "--", TOY, "--work", "1",
                 "--run-seconds", str(longest + 1), "--exit-code", "3", cwd=tmp_path,
                 timeout=240)
    assert p.returncode == 3, p.stderr[-3000:]
    assert "knobs keep the script's global batch already; running them" in p.stderr
    assert "tune_toy: done after" in p.stdout
    assert "exited with code 3" in p.stderr
    assert list((tmp_path / "recipes").glob("*.toml"))  # the tuning part succeeded
    assert live_children() == []


@pytest.mark.slow
def test_kill_controller_then_resume(tmp_path):
    """kill -9 mid-study; --resume keeps every finished trial and re-runs the interrupted one."""
    cmd = [sys.executable, "-m", "autotune", "tune", *QUIET, "--trials", "4", "--seconds", "8",
           "--confirm-rounds", "0", "--seed", "3", "--space", "batch_size=8:32", "--fix",
           "threads=1", "--recipe-dir", str(tmp_path / "recipes"), "--", TOY, "--work", "1"]
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    controller = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 150
    run_dir = None
    try:
        while time.monotonic() < deadline:  # until a trial is in flight after one finished
            runs = list((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else []
            if runs:
                run_dir = runs[0]
                started = [e for e in journal(run_dir, "trial_started")
                           if e["trial"].startswith("trial-")]
                finished = [e for e in journal(run_dir, "trial_finished")
                            if e["trial"].startswith("trial-")]
                if len(finished) >= 1 and len(started) > len(finished) and \
                        (run_dir / "live.json").exists() and \
                        json.loads((run_dir / "live.json").read_text())["markers"]:
                    break
            assert controller.poll() is None, "the tuning ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("no trial in flight within the deadline")
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=10)
    finally:
        if controller.poll() is None:
            controller.kill()
    markers = json.loads((run_dir / "live.json").read_text())["markers"]
    url = studies.sqlite_url(run_dir / "study.db")
    name = f"autotune-{run_dir.name}"
    import optuna

    before = {t.number: t for t in optuna.load_study(study_name=name, storage=url).trials}
    finished_before = {n: t for n, t in before.items() if t.state.is_finished()}
    running = [n for n, t in before.items() if t.state == optuna.trial.TrialState.RUNNING]
    assert len(running) == 1 and finished_before
    started_before = len(journal(run_dir, "trial_started"))

    p = autotune("tune", "--resume", str(run_dir), "--plain", cwd=tmp_path, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert all(proc.marked(m) == [] for m in markers), "the killed run's probe survived"
    after = {t.number: t for t in optuna.load_study(study_name=name, storage=url).trials}
    for n, t in finished_before.items():  # nothing finished was lost or changed
        assert after[n].state == t.state and after[n].value == t.value
    assert after[running[0]].state == optuna.trial.TrialState.FAIL
    retried = [t for t in after.values() if t.user_attrs.get("retry_of") == running[0]]
    assert len(retried) == 1 and retried[0].params == before[running[0]].params
    assert retried[0].state.is_finished()
    # No finished config was measured again after the resume (duplicates are answered, not run).
    done = [t.user_attrs["knobs"] for t in finished_before.values()]
    new = journal(run_dir, "trial_started")[started_before:]
    assert new and not any(e["knobs"] in done for e in new)
    assert "search stopped" in p.stderr
    assert live_children() == []


@pytest.mark.slow
def test_run_forwards_ctrl_c_and_meters(tmp_path):
    """run --recipe: live samples/s in the journal; SIGINT reaches the script, which ends."""
    from autotune.hardware import fingerprint

    here = fingerprint.current([TOY])
    path = recipes.save(recipes.Recipe(
        name="toy", knobs={"workers": 0}, samples_per_s=1.0, ci_half=0.1,
        baseline_samples_per_s=1.0, speedup=1.0, kept_baseline=True, fingerprint=here,
        script_path=TOY), tmp_path)
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    run = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--plain", "--recipe",
                            str(path), TOY, "--work", "1", "--run-seconds", "120"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        progress = []
        while time.monotonic() < deadline and not progress:
            for run_dir in (tmp_path / "runs").glob("*"):
                progress = [e for e in journal(run_dir, "fullrun_progress")
                            if e["samples_per_s"] > 0]
            assert run.poll() is None, run.stderr.read()
            time.sleep(0.2)
        assert progress, "no live throughput in the journal"
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err  # the script's own end: killed by SIGINT
    assert "KeyboardInterrupt" in (run_dir / "logs" / "fullrun.log").read_text()
    assert "WARNING" not in err  # the recipe matches this host and script
    # said at once, on stderr and in the journal, before the ranks have ended
    assert "HINT: SIGINT received: passed on to the ranks, which are stopping" in err
    said = [n for e in journal(run_dir, "fullrun_notes") for n in e["notes"]]
    assert "SIGINT received: passed on to the ranks, which are stopping" in said
    ended = journal(run_dir, "fullrun_ended")
    assert ended and ended[-1]["exit_code"] == 130
    assert live_children() == []
