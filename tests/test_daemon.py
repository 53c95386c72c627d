"""Runs that outlive the terminal (issue 40): ``-d``, ``ps``, ``logs``, ``stop``, ``run --again``
and ``tune --resume RUN --confirm-rounds N``, with real processes."""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from autotune import UsageError
from autotune.hardware import fingerprint
from autotune.monitor.runs import Status, status_of
from autotune.monitor.state import fold
from autotune.store import controller, rundir
from autotune.store.events import Event
from autotune.store.journal import Journal
from autotune.tuning import recipes
from autotune.tuning.confirm_rounds import earlier_rounds
from conftest import SCRIPTS, assert_one_error_line, autotune, journal, wait_for

QUIET = ["--plain", "--foreign-limit", "1000"]


# -- the state of a run, from its journal and its controller's liveness ------------------------
def events(*pairs):
    return [{"t": float(i), "event": str(name), **fields} for i, (name, fields) in
            enumerate(pairs)]


STARTED = (Event.RUN_STARTED, {"kind": "wrap", "command": ["train.py"], "cwd": "."})
TRIAL = (Event.TRIAL_STARTED, {"trial": "baseline", "number": None, "knobs": {},
                               "mode": "full"})
ROUND = (Event.CONFIRMATION, {"round": 1, "trial": "baseline", "knobs": {},
                              "samples_per_s": 10.0, "ci_half": 1.0, "outcome": "ok",
                              "reason": ""})
FULL = (Event.FULLRUN_STARTED, {"command": ["train.py"], "knobs": {}, "instances": 1,
                                "launcher": "local"})


@pytest.mark.parametrize("evs, alive, want", [
    ([], None, (Status.STARTING, None)),
    ([STARTED], True, (Status.STARTING, None)),
    ([STARTED, TRIAL], True, (Status.TUNING, None)),
    ([STARTED, TRIAL, ROUND], True, (Status.CONFIRMING, None)),
    ([STARTED, TRIAL, ROUND, FULL], True, (Status.RUNNING, None)),
    ([STARTED, TRIAL], False, (Status.LOST, None)),
    ([STARTED, (Event.RUN_ENDED, {"exit_code": 0})], False, (Status.FINISHED, 0)),
    ([STARTED, (Event.RUN_ENDED, {"exit_code": 130})], False, (Status.STOPPED, 130)),
    ([STARTED, (Event.RUN_ENDED, {"exit_code": 143})], False, (Status.STOPPED, 143)),
    ([STARTED, (Event.RUN_ENDED, {"exit_code": 3})], False, (Status.FAILED, 3)),
    # a resumed run: its last session's end counts, and it is alive again
    ([STARTED, (Event.RUN_ENDED, {"exit_code": 130}), STARTED, TRIAL], True,
     (Status.TUNING, None)),
])
def test_the_state_comes_from_the_journal_and_the_controller(evs, alive, want):
    assert status_of(fold(events(*evs)), alive=alive, age_s=1.0) == want


def test_a_run_without_a_controller_is_starting_while_young_then_lost():
    state = fold(events(STARTED))
    assert status_of(state, alive=None, age_s=5.0)[0] is Status.STARTING
    assert status_of(state, alive=None, age_s=3600.0)[0] is Status.LOST


def test_a_controller_is_alive_only_with_its_own_start_time(tmp_path):
    me = controller.mark_controller(tmp_path)
    assert controller.controller(tmp_path) == me and me.alive()
    (tmp_path / controller.CONTROLLER).write_text(json.dumps(
        {"pid": me.pid, "create_time": me.create_time - 100.0, "host": me.host}))
    assert not controller.controller(tmp_path).alive()  # a reused pid is not our controller


# -- run ids ---------------------------------------------------------------------------------
def make_run(root: Path, name: str, *evs, ctl: dict | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True, mode=0o700)
    j = Journal(d)
    for ev, fields in evs:
        j.emit(ev, **fields)
    if ctl is not None:
        (d / controller.CONTROLLER).write_text(json.dumps(ctl))
    return d


def test_a_run_is_named_by_its_id_or_a_unique_prefix(tmp_path):
    a = make_run(tmp_path, "20260101-000000-tune-a", STARTED)
    b = make_run(tmp_path, "20260101-000001-wrap-b", STARTED)
    assert rundir.resolve("20260101-000001", tmp_path) == b
    assert rundir.resolve(a.name, tmp_path) == a
    assert rundir.resolve(str(a), None) == a
    with pytest.raises(UsageError, match="ambiguous: 2 runs start with it"):
        rundir.resolve("2026", tmp_path)
    with pytest.raises(UsageError, match="no run 'zzz' under"):
        rundir.resolve("zzz", tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a run to another user needs root")
def test_another_users_run_is_refused_in_one_line(tmp_path):
    d = make_run(tmp_path / "runs", "20260101-000000-run-x", STARTED)
    os.chown(d, 65534, 65534)
    for argv in (("stop", "20260101"), ("logs", "20260101"), ("ps", "--all")):
        p = autotune(*argv, "--runs-dir", str(tmp_path / "runs"), timeout=60)
        if argv[0] == "ps":
            assert p.returncode == 0 and "20260101-000000-run-x" in p.stdout
        else:
            assert_one_error_line(p, "belongs to another user")


# -- ps, stop, logs on run directories as the journal leaves them ------------------------------
def test_ps_lists_newest_first_with_state_and_figure(tmp_path):
    root = tmp_path / "runs"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_time = psutil.Process(dead.pid).create_time()
    dead.wait()
    me = psutil.Process()
    best = (Event.BEST, {"knobs": {"batch_size": 64}, "samples_per_s": 260.0, "ci_half": 5.0,
                         "baseline_samples_per_s": 200.0, "speedup": 1.3,
                         "kept_baseline": False, "reason": "", "speedup_low": 1.2,
                         "speedup_high": 1.4, "objective": "throughput", "score": None,
                         "baseline_score": None})
    make_run(root, "20260101-000000-tune-a", STARTED, best, (Event.RUN_ENDED, {"exit_code": 0}))
    make_run(root, "20260101-000001-run-b", STARTED, (Event.RUN_ENDED, {"exit_code": 130}))
    make_run(root, "20260101-000002-run-c", STARTED, (Event.RUN_ENDED, {"exit_code": 7}))
    make_run(root, "20260101-000003-wrap-d", STARTED, TRIAL,
             ctl={"pid": dead.pid, "create_time": dead_time, "host": me_host()})
    make_run(root, "20260101-000004-run-e", (Event.RUN_STARTED, {
        "kind": "run", "command": ["train.py"], "cwd": "."}),
        (Event.FULLRUN_STARTED, {**FULL[1], "promised": 200.0}),
        (Event.FULLRUN_PROGRESS, {"samples_per_s": 150.0, "steps": 10, "samples": 100}),
        ctl={"pid": me.pid, "create_time": me.create_time(), "host": me_host()})
    p = autotune("ps", "--json", "--runs-dir", str(root), timeout=60)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert [(r["id"].split("-", 2)[2], r["state"], r["exit_code"]) for r in got] == [
        ("run-e", "running", None), ("wrap-d", "lost", None), ("run-c", "failed", 7),
        ("run-b", "stopped", 130), ("tune-a", "finished", 0)]
    assert got[0]["pid"] == me.pid and got[0]["command"] == "run"
    assert got[0]["figure"] == "150.0 samples/s (75% of the 200.0 promised)"
    assert got[-1]["figure"] == "1.30x" and got[-1]["script"] == "train.py"
    assert {"id", "command", "script", "state", "pid", "started"} <= set(got[0])
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(root))
    p = autotune("ps", timeout=60, env=env)  # $AUTOTUNE_RUNS_DIR as the other commands
    lines = p.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "COMMAND", "SCRIPT", "STATE"]
    assert "failed(7)" in lines[3] and "lost" in lines[2] and "running" in lines[1]


def me_host():
    import socket
    return socket.gethostname()


@pytest.mark.parametrize("command", ["ps", "logs", "stop", "monitor"])
def test_the_commands_that_read_runs_do_not_import_the_tuner(command):
    """``autotune ps`` and its kind parse their line without importing the commands that tune
    (Optuna and SQLAlchemy: a second and a half of CPU a call); ``--help`` still lists every
    command."""
    code = ("import sys; from autotune.commands import cli; p = cli.build_parser(sys.argv[1:]); "
            "print(sorted(m for m in ('optuna', 'sqlalchemy', 'torch') if m in sys.modules)); "
            "print(sorted(p._subparsers._group_actions[0].choices))")
    p = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    imported, names = p.stdout.splitlines()
    assert imported == "[]", (command, imported)
    assert all(f"'{c}'" in names for c in ("tune", "wrap", "ps", "stop")), names
    if command != "ps":
        return
    full = subprocess.run([sys.executable, "-m", "autotune", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert "search the knobs" in full.stdout and "list runs" in full.stdout, full.stdout


def test_stop_logs_and_monitor_refuse_bad_runs_in_one_line(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "20260101-000000-run-a", STARTED, (Event.RUN_ENDED, {"exit_code": 130}))
    make_run(root, "20260101-000001-run-b", STARTED, (Event.RUN_ENDED, {"exit_code": 0}))
    where = ("--runs-dir", str(root))
    assert_one_error_line(autotune("stop", "20260101-000000", *where, timeout=60),
                          "has already ended (stopped, exit code 130)")
    assert_one_error_line(autotune("stop", "2026", *where, timeout=60), "ambiguous")
    assert_one_error_line(autotune("stop", "nope", *where, timeout=60), "no run 'nope'")
    assert_one_error_line(autotune("logs", "20260101-000001", *where, timeout=60),
                          "has no output.log")
    assert_one_error_line(autotune("monitor", "2026", *where, timeout=60), "ambiguous")
    p = autotune("report", "20260101-000001", *where, timeout=60)  # a prefix as a run id
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == root / "20260101-000001-run-b" / "report.html"


def test_detach_is_refused_inside_slurm_and_a_start_error_comes_back(tmp_path):
    env = dict(os.environ, SLURM_JOB_ID="42")
    assert_one_error_line(autotune("wrap", "-d", "x.py", cwd=tmp_path, timeout=60, env=env),
                          "-d", "Slurm job (42)")
    p = autotune("tune", "-d", "missing.py", cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "missing.py", "not found")
    assert not list((tmp_path / "runs").glob("*"))  # no run, and no start-up output left


def test_earlier_rounds_are_read_back_for_an_extension():
    cfg = {"batch_size": 64}

    def rnd(n, trial, rate, **more):
        return (Event.CONFIRMATION, {"round": n, "trial": trial, "knobs": {} if trial ==
                                     "baseline" else cfg, "samples_per_s": rate,
                                     "ci_half": 1.0, "outcome": "ok" if rate else "crashed",
                                     "reason": "", **more})

    best = (Event.BEST, {"knobs": cfg})
    # round 1 chose trial-3 over trial-5 and counts for it; trial-7 (the batch-keeping
    # alternative) joined from round 2
    evs = events(STARTED, rnd(1, "baseline", 9.0, chooses=True), rnd(1, "trial-3", 12.0,
                 chooses=True), rnd(1, "trial-5", 11.0, chooses=True),
                 rnd(2, "baseline", 10.0), rnd(2, "trial-3", 13.0), rnd(2, "trial-7", 10.5),
                 rnd(3, "baseline", 11.0), rnd(3, "trial-3", None), rnd(3, "trial-7", 10.6),
                 best)
    e = earlier_rounds(evs)
    assert e.entries == (("baseline", {}), ("trial-3", cfg), ("trial-7", cfg))
    assert [r and r.samples_per_s for r in e.rounds["baseline"]] == [9.0, 10.0, 11.0]
    assert [r and r.samples_per_s for r in e.rounds["trial-3"]] == [12.0, 13.0, None]
    assert [r and r.samples_per_s for r in e.rounds["trial-7"]] == [None, 10.5, 10.6]
    assert e.count == 3 and e.last_round == 3
    assert e.candidates == 3  # trial-5 entered the race too
    assert [r and r.ci_half for r in e.rounds["baseline"]] == [1.0, 1.0, 1.0]
    assert earlier_rounds(events(STARTED, best)) is None
    # a figure journaled without an interval (its probe ended before it had one) reads back
    # as one, as it was live (`confirm_rounds.own_intervals` lends it its search figure's), not as ±0
    bare = earlier_rounds(events(STARTED, rnd(1, "baseline", 9.0, ci_half=None),
                                 rnd(1, "trial-3", 12.0), best))
    assert math.isinf(bare.rounds["baseline"][0].ci_half)
    assert bare.rounds["trial-3"][0].ci_half == 1.0


# -- real runs --------------------------------------------------------------------------------
def run_processes(tmp_path, also: str = ""):
    """Live processes whose command line names this test's private copy of the scripts (and
    ``also``)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(tmp_path) in cmd and also in cmd and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def copy_scripts(tmp_path):
    for name in ("_tiny.py", "ok.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    return tmp_path / "ok.py"


def started_id(p) -> str:
    assert p.returncode == 0, p.stderr + p.stdout
    m = re.search(r"^run (\S+) started, detached \(controller pid (\d+)\)", p.stdout, re.M)
    assert m, p.stdout
    return m.group(1)


def ps_row(tmp_path, rid) -> dict:
    p = autotune("ps", "--json", "--all", "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert p.returncode == 0, p.stderr
    return next(r for r in json.loads(p.stdout) if r["id"] == rid)


def ok_recipe(tmp_path, script) -> Path:
    return recipes.save(recipes.Recipe(
        name="ok", knobs={"workers": 2}, samples_per_s=100.0, ci_half=5.0,
        baseline_samples_per_s=100.0, speedup=1.0, kept_baseline=True,
        fingerprint=fingerprint.current([str(script)]), script_path=str(script)), tmp_path)


@pytest.mark.slow
def test_a_detached_wrap_outlives_its_shell_and_stops_as_ctrl_c_does(tmp_path):
    script = copy_scripts(tmp_path)
    runs = tmp_path / "runs"
    # the launching shell is its own process group; it stays until hung up
    shell = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m autotune wrap -d {' '.join(QUIET)} --trials 1 "
                       f"--seconds 8 --confirm-rounds 0 --fix instances=1 --recipe-dir "
                       f"{tmp_path / 'recipes'} --runs-dir {runs} {script} --workers 2 "
                       f"--log-interval 20; echo LAUNCHED=$?; exec sleep 600"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    follower = None
    try:
        out = ""
        while "LAUNCHED=" not in out:
            line = shell.stdout.readline()
            assert line, shell.stderr.read()
            out += line
        assert "LAUNCHED=0" in out, out
        rid = re.search(r"^run (\S+) started, detached", out, re.M).group(1)
        assert f"autotune stop {rid}" in out and f"autotune logs -f {rid}" in out
        os.killpg(shell.pid, signal.SIGHUP)  # the terminal closes: the shell and its group
        assert shell.wait(10) == -signal.SIGHUP
        run_dir = runs / rid
        assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
        follower = subprocess.Popen([sys.executable, "-m", "autotune", "logs", "-f", rid[:20],
                                     "--runs-dir", str(runs)], stdout=subprocess.PIPE,
                                    text=True)
        # still training after the hang-up: the full run reports its rate
        row = wait_for(lambda: (r := ps_row(tmp_path, rid))["state"] == "running" and
                       "samples/s" in r["figure"] and r, timeout_s=240, poll_s=1.0,
                       what="the detached wrap's full run")
        assert row["command"] == "wrap" and row["script"] == "ok.py"
        ctl = psutil.Process(row["pid"])
        assert ctl.terminal() is None and os.getsid(ctl.pid) == ctl.pid
        # the rank and its two DataLoader workers (started again at each epoch)
        wait_for(lambda: len(run_processes(tmp_path, "probes.boot")) >= 3, timeout_s=30,
                 what="the rank and its DataLoader workers")

        wait_for(lambda: re.search(r"^step \d+ samples/s", (run_dir / "output.log").read_text(),
                                   re.M), timeout_s=60, what="the script's own output")
        stopped = autotune("stop", rid, "--runs-dir", str(runs), timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert f"run {rid} stopped, exit code 130" in stopped.stdout
        ended = journal(run_dir, "fullrun_ended")[-1]
        assert ended["exit_code"] == 130 and ended["signal"] == "SIGINT"
        assert journal(run_dir, "run_ended")[-1]["exit_code"] == 130
        assert journal(run_dir, "recipe_saved")
        assert wait_for(lambda: not run_processes(tmp_path), timeout_s=30,
                        what="no process of the run left")
        text, _ = follower.communicate(timeout=30)  # -f ends with the run
        assert follower.returncode == 0
        assert "full run:" in text and "samples/s" in text  # autotune's lines
        assert re.search(r"^step \d+ samples/s", text, re.M)  # the script's own
        assert "run ended: exit code 130" in text
        assert ps_row(tmp_path, rid)["state"] == "stopped"
        assert_one_error_line(autotune("stop", rid, "--runs-dir", str(runs), timeout=60),
                              "already ended (stopped, exit code 130)")
        rank0 = autotune("logs", rid, "--rank", "0", "--runs-dir", str(runs), timeout=60)
        assert re.search(r"^step \d+ samples/s", rank0.stdout, re.M)
        assert "full run:" not in rank0.stdout

        # started again from its id, the script's own flags added: the journal links the two
        again = autotune("run", "--again", rid[:20], "--runs-dir", str(runs), "--plain", "--",
                         "--steps", "150", cwd=tmp_path, timeout=240)
        assert again.returncode == 0, again.stderr[-3000:]
        new = next(e for e in journal(run_dir, "run_again"))["run"]
        first = journal(runs / new, "run_started")[0]
        assert first["again_of"] == rid and first["kind"] == "run"
        assert first["command"][-2:] == ["--steps", "150"] and "--workers" in first["command"]
        assert ps_row(tmp_path, rid)["again_in"] == new
        assert ps_row(tmp_path, new)["state"] == "finished"
    finally:
        for p in run_processes(tmp_path):
            p.kill()
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        if follower is not None and follower.poll() is None:
            follower.kill()


@pytest.mark.slow
def test_a_killed_detached_controller_shows_as_lost(tmp_path):
    script = copy_scripts(tmp_path)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    p = autotune("run", "-d", "--recipe", str(recipe), "--runs-dir", str(runs), str(script),
                 cwd=tmp_path, timeout=120)
    rid = started_id(p)
    try:
        row = wait_for(lambda: (r := ps_row(tmp_path, rid))["state"] == "running" and r,
                       timeout_s=60, poll_s=0.5, what="the detached run")
        wait_for(lambda: journal(runs / rid, "fullrun_progress"), timeout_s=90, poll_s=0.5,
                 what="the full run training")
        # two commands never both control one run
        assert_one_error_line(autotune("run", "--again", rid, "--runs-dir", str(runs),
                                       timeout=60), "--again", "is still going")
        os.kill(row["pid"], signal.SIGKILL)
        wait_for(lambda: ps_row(tmp_path, rid)["state"] == "lost", timeout_s=20,
                 what="ps to call it lost")
        assert_one_error_line(autotune("stop", rid, "--runs-dir", str(runs), timeout=60),
                              "is lost")
        # its ranks notice the controller gone and end on their own
        assert wait_for(lambda: not run_processes(tmp_path), timeout_s=60,
                        what="the lost run's ranks to end")
    finally:
        for proc in run_processes(tmp_path):
            proc.kill()


@pytest.mark.slow
def test_a_finished_tune_extended_by_more_rounds_decides_on_all_of_them(tmp_path):
    toy = str(SCRIPTS / "tune_toy.py")
    runs = tmp_path / "runs"
    p = autotune("tune", *QUIET, "--json", "--trials", "3", "--seconds", "10",
                 "--confirm-rounds", "1", "--confirm-seconds", "5", "--seed", "3",
                 "--space", "batch_size=8:64",
                 "--fix", "workers=0", "instances=1", "--recipe-dir", str(tmp_path / "recipes"),
                 "--runs-dir", str(runs), "--", toy, "--work", "1", cwd=tmp_path, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir = Path(json.loads(p.stdout.strip().splitlines()[-1])["run_dir"])
    first = journal(run_dir, "best")[-1]
    before = [e for e in journal(run_dir, "confirmation") if not e.get("chooses")]
    if first["rounds"] != 1 or len({e["trial"] for e in before}) < 2:
        pytest.skip(f"the search confirmed nothing against the baseline: {first['reason']}")
    assert first["kept_baseline"]  # one round cannot switch
    refused = autotune("tune", "--resume", run_dir.name, "--runs-dir", str(runs), timeout=60)
    assert_one_error_line(refused, "finished", "--confirm-rounds N")
    p = autotune("tune", "--resume", run_dir.name[:18], "--runs-dir", str(runs), *QUIET,
                 "--json", "--confirm-rounds", "1", cwd=tmp_path, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "after the 1 round(s) it had (judged with them)" in p.stderr
    best = journal(run_dir, "best")[-1]
    assert best["rounds"] == 2, best  # its one round and the new one, judged together
    after = [e for e in journal(run_dir, "confirmation") if not e.get("chooses")][len(before):]
    assert {e["trial"] for e in after} == {e["trial"] for e in before}  # the same configs
    assert min(e["round"] for e in after) > max(e["round"] for e in before)
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["kept_baseline"] == best["kept_baseline"]
    assert summary["confirm_rounds"] == 2
    if best["kept_baseline"]:  # kept: the two rounds' interval still holds 1.0
        assert "not beyond doubt" in best["reason"] or "kept" in best["reason"], best
    else:  # switched: the interval over both rounds lies above 1
        assert best["speedup_low"] > 1.0, best
    assert recipes.load(summary["recipe"]).kept_baseline == best["kept_baseline"]
    assert len(journal(run_dir, "run_started")) == 2
    assert journal(run_dir, "run_ended")[-1]["exit_code"] == 0


@pytest.mark.slow
def test_without_d_a_hang_up_stops_the_run_and_says_d_exists(tmp_path):
    script = copy_scripts(tmp_path)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    p = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--plain", "--recipe",
                          str(recipe), "--runs-dir", str(runs), str(script)], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        run_dir = wait_for(lambda: next(runs.glob("*"), None) if runs.exists() else None,
                           timeout_s=60, what="the run directory")
        wait_for(lambda: journal(run_dir, "fullrun_progress"), timeout_s=90, poll_s=0.5,
                 what="the full run training")
        os.killpg(p.pid, signal.SIGHUP)  # the terminal closes
        _, err = p.communicate(timeout=60)
        assert p.returncode == 128 + signal.SIGHUP, err
        assert "stopped by SIGHUP" in err
        assert "'autotune run -d ...' starts a run that outlives its terminal" in err
        assert journal(run_dir, "run_ended")[-1]["exit_code"] == 128 + signal.SIGHUP
        assert wait_for(lambda: not run_processes(tmp_path), timeout_s=30,
                        what="no process of the run left")
    finally:
        for proc in run_processes(tmp_path):
            proc.kill()
        if p.poll() is None:
            p.kill()


@pytest.mark.slow
def test_stop_kill_ends_a_run_that_outstays_its_grace(tmp_path):
    script = copy_scripts(tmp_path)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    rid = started_id(autotune("run", "-d", "--recipe", str(recipe), "--runs-dir", str(runs),
                              str(script), cwd=tmp_path, timeout=120))
    try:
        wait_for(lambda: journal(runs / rid, "fullrun_progress"), timeout_s=90, poll_s=0.5,
                 what="the full run training")
        p = autotune("stop", rid, "--grace", "0.05", "--kill", "--runs-dir", str(runs),
                     timeout=120)
        assert p.returncode == 0, p.stderr
        row = ps_row(tmp_path, rid)
        assert row["state"] == "stopped" and row["exit_code"] in (130, 137), row
        assert f"run {rid} stopped, exit code {row['exit_code']}" in p.stdout
        assert wait_for(lambda: not run_processes(tmp_path), timeout_s=20,
                        what="no process of the run left")
    finally:
        for proc in run_processes(tmp_path):
            proc.kill()


def test_stop_past_its_grace_leaves_an_mps_daemon_to_the_controller(tmp_path, monkeypatch,
                                                                     capsys):
    """What `autotune stop` SIGTERMs once the grace is over: the run's ranks, not the MPS
    control daemon its controller started (the controller quits it, as NVIDIA's guide asks)."""
    from autotune.commands import stop

    fake_mps = tmp_path / "nvidia-cuda-mps-control"
    shutil.copy(shutil.which("sleep"), fake_mps)
    code = ("import subprocess, sys, time\n"
            "kids = [subprocess.Popen(a, start_new_session=True) for a in "
            f"(['sleep', '60'], [{str(fake_mps)!r}, '60'])]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
            "time.sleep(60)\n")
    ctl_proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        rank, mps = (psutil.Process(int(x)) for x in ctl_proc.stdout.readline().split())
        ctl = controller.Controller(ctl_proc.pid, psutil.Process(ctl_proc.pid).create_time(),
                                    socket.gethostname())
        monkeypatch.setattr(stop, "RANKS_GRACE_S", 0.5)
        stop._end_ranks(ctl, tmp_path / "run-x")
        said = capsys.readouterr().err
        assert f"pid {rank.pid} (sleep 60)" in said and str(mps.pid) not in said, said
        assert wait_for(lambda: not rank.is_running() or
                        rank.status() == psutil.STATUS_ZOMBIE, timeout_s=10, what="the rank")
        assert mps.is_running() and mps.status() != psutil.STATUS_ZOMBIE
    finally:
        for p in psutil.Process(ctl_proc.pid).children(recursive=True):
            p.kill()
        ctl_proc.kill()
        ctl_proc.wait()


@pytest.mark.slow
def test_stop_ends_a_run_whose_ranks_ignore_ctrl_c_with_sigterm_after_the_grace(tmp_path):
    """A rank that trains on through SIGINT gets SIGTERM once the grace is over, as a second
    Ctrl-C would: the controller still writes the run's end, and nothing of it is left."""
    copy_scripts(tmp_path)
    script = tmp_path / "deaf.py"
    shutil.copy(SCRIPTS / "deaf.py", script)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    rid = started_id(autotune("run", "-d", "--recipe", str(recipe), "--runs-dir", str(runs),
                              str(script), "--workers", "2", cwd=tmp_path, timeout=120))
    try:
        wait_for(lambda: journal(runs / rid, "fullrun_progress"), timeout_s=90, poll_s=0.5,
                 what="the full run training")
        p = autotune("stop", rid, "--grace", "3", "--runs-dir", str(runs), timeout=120)
        assert p.returncode == 0, p.stderr
        assert "get SIGTERM, and SIGKILL 10 s later, as a second Ctrl-C would" in p.stderr
        assert "deaf.py" in p.stderr  # the processes still there are named
        row = ps_row(tmp_path, rid)
        assert row["state"] == "stopped" and row["exit_code"] == 130, row
        assert "SIGINT: training on" in (runs / rid / "logs" / "fullrun.log").read_text()
        assert wait_for(lambda: not run_processes(tmp_path), timeout_s=20,
                        what="no process of the run left")
    finally:
        for proc in run_processes(tmp_path):
            proc.kill()


@pytest.mark.slow
def test_run_again_starts_with_the_runs_own_launcher_keep_batch_and_samples_per_step(tmp_path):
    """What the full run was started with beside its recipe and command comes back with
    ``--again``; a launcher given again replaces the run's."""
    script = copy_scripts(tmp_path)
    recipe = ok_recipe(tmp_path, script)
    runs = tmp_path / "runs"
    first = autotune("run", "--plain", "--recipe", str(recipe), "--runs-dir", str(runs),
                     "--keep-batch", "--samples-per-step", "16", "--launcher", "local",
                     str(script), "--steps", "30", cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    rid = json.loads(autotune("ps", "--json", "--all", "--runs-dir", str(runs),
                              timeout=60).stdout)[0]["id"]
    told = journal(runs / rid, "fullrun_started")[0]["settings"]
    assert told == {"launcher": "local", "hostfile": None, "keep_batch": True,
                    "samples_per_step": 16}, told
    again = autotune("run", "--again", rid, "--plain", "--runs-dir", str(runs), "--",
                     "--steps", "20", cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--keep-batch: recipe" in again.stderr  # the run's own --keep-batch, said again
    new = journal(runs / rid, "run_again")[-1]["run"]
    assert journal(runs / new, "fullrun_started")[0]["settings"] == told
    # a launcher given again replaces the run's, with its hostfile
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:1\n")
    refused = autotune("run", "--again", new, "--hostfile", str(hosts), "--launcher", "srun",
                       "--runs-dir", str(runs), cwd=tmp_path, timeout=60)
    assert_one_error_line(refused, "--hostfile needs --launcher mpirun, not srun")
