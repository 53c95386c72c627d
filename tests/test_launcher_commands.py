"""``--launcher`` and ``--hostfile`` on tune, wrap and run: checked before anything runs, kept for
``--resume``, and a real ``mpirun`` (mpi4py's MPICH from PyPI) starting the probes and the full run.
"""

import json
import os
import re

import pytest

from autotune.hardware import fingerprint

from autotune.tuning import recipes
from autotune.measuring import fullrun
from autotune.launching import engines
from autotune.launching.collector import Received
from autotune.launching.group import RanksSpec
from autotune.store.journal import read_events
from autotune.tuning import TuneSettings
from conftest import SCRIPTS, assert_one_error_line, autotune, last_json, live_children

DDP = str(SCRIPTS / "ddp_toy.py")
QUIET = ["--plain", "--foreign-limit", "1000"]


def ddp_recipe(tmp_path, knobs, **over):
    return recipes.save(recipes.Recipe(
        name="ddp", knobs=knobs, samples_per_s=1.0, ci_half=0.1, baseline_samples_per_s=1.0,
        speedup=1.0, kept_baseline=True, fingerprint=fingerprint.current([DDP]),
        script_path=DDP, **over), tmp_path)


# -- usage errors --------------------------------------------------------------------------------
def test_hostfile_needs_mpirun(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    for command in ("tune", "wrap"):
        p = autotune(command, "--launcher", "local", "--hostfile", str(hosts), DDP, cwd=tmp_path,
                     timeout=60)
        assert_one_error_line(p, "--hostfile needs --launcher mpirun", "local")


def test_missing_and_empty_hostfile(tmp_path):
    recipe = ddp_recipe(tmp_path, {"instances": 2})
    p = autotune("run", "--recipe", str(recipe), "--hostfile", "nowhere", DDP, cwd=tmp_path,
                 timeout=60)
    assert_one_error_line(p, "--hostfile 'nowhere'", "No such file")
    (tmp_path / "empty").write_text("# no host yet\n")
    p = autotune("tune", "--hostfile", "empty", DDP, cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "--hostfile 'empty' lists no host")


def test_srun_outside_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    p = autotune("tune", "--launcher", "srun", DDP, cwd=tmp_path, timeout=60, env=env)
    assert_one_error_line(p, "--launcher srun", "not inside a Slurm allocation")


def test_resume_keeps_the_runs_launcher(tmp_path):
    p = autotune("tune", "--resume", str(tmp_path), "--launcher", "mpirun", cwd=tmp_path,
                 timeout=60)
    assert_one_error_line(p, "--resume", "drop --launcher")


def test_settings_keep_the_launcher_for_resume(tmp_path):
    s = TuneSettings(command=(DDP,), cwd=str(tmp_path), launcher="mpirun",
                     hostfile=str(tmp_path / "hosts"))
    back = TuneSettings.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s and back.launcher == "mpirun"
    # tune.json from before the launcher was saved: local ranks, as then
    old = {k: v for k, v in s.to_dict().items() if k not in ("launcher", "hostfile")}
    assert TuneSettings.from_dict(old).launcher == "local"


def test_hostfile_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("node1 slots=2\nnode2 slots=2\n")
    monkeypatch.setattr(engines, "detect_mpi",
                        lambda env: engines.MpiInfo("/x/mpirun", "openmpi", "5.0"))
    lz = engines.resolve(None, "hosts", env={})
    assert lz.kind == "mpirun" and lz.hostfile == str(tmp_path / "hosts")
    assert [h.name for h in lz.hosts] == ["node1", "node2"]
    assert engines.describe(lz) == "mpirun (openmpi) on 2 hosts"


def bye(rank, code, *, stopped=False, conn=1):
    return Received(t=0.0, conn_id=conn, hello={"type": "hello", "rank": rank},
                    msg={"type": "bye", "exit_code": code, "stopped": stopped})


@pytest.mark.parametrize("kind, engine_code, byes, want", [
    # Hydra stopped rank 0 with SIGTERM and returned 15: rank 1's own 5 is the run's
    ("mpirun", 15, [bye(1, 5), bye(0, 0, conn=2)], (5, {"rank": 1, "launcher_exit_code": 15})),
    ("srun", 5, [bye(1, 5)], (5, {"rank": 1})),
    # a rank killed by a signal says nothing: the engine's code stands
    ("mpirun", 137, [bye(0, 0)], (137, {})),
    # ranks stopped by us at the controller's request are not failures
    ("mpirun", 1, [bye(0, 0, stopped=True)], (1, {})),
    # our own processes: their codes are already the ranks'
    ("local", 3, [bye(0, 7)], (3, {})),
    ("local", 7, [bye(0, 7)], (7, {"rank": 0})),
    ("mpirun", 0, [], (0, {})),
])
def test_the_first_failing_rank_s_own_code_is_the_run_s(kind, engine_code, byes, want):
    meter = fullrun._Meter(None)
    meter.absorb(byes)
    spec = fullrun.FullRunSpec(ranks=RanksSpec(command=("x",), launcher=engines.Launcher(kind=kind)))
    assert fullrun._rank_said(spec, meter.failed, engine_code) == want


@pytest.mark.parametrize("line, rank, want", [
    ("step 3\n", None, "step 3\n"),
    ("Exception in thread ", None, "Exception in thread \n"),  # a rank killed mid-line
    ("loss 0.5", 1, "[rank 1] loss 0.5\n"),
])
def test_a_streamed_line_is_always_ended_so_our_summary_keeps_its_own_line(line, rank, want):
    assert fullrun.streamed_line(line, rank) == want


@pytest.mark.slow
def test_run_tells_where_its_ranks_run(tmp_path):
    """Two ranks of every core each oversubscribe the host: the full run's group says so, in
    the journal and on the monitor's lines (it went untold: the full run dropped its group)."""
    recipe = ddp_recipe(tmp_path, {"instances": 2, "thread_pct": 100})
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("run", "--plain", "--recipe", str(recipe), DDP, "--run-seconds", "1",
                 cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    told, = [e for e in events if e["event"] == "fullrun_notes"]
    assert told["mps_check"] is None and any("oversubscribe" in n for n in told["notes"]), told
    assert re.search(r"full run: 2 ranks x \d+ threads oversubscribe \d+ cores", p.stderr)
    assert live_children() == []


# -- a real mpirun ---------------------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.slow
def test_run_under_mpirun_streams_every_rank_and_keeps_the_exit_code(mpi, tmp_path):
    recipe = ddp_recipe(tmp_path, {"instances": 2, "thread_pct": 50})
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("run", "--plain", "--launcher", "mpirun", "--recipe", str(recipe), DDP,
                 "--run-seconds", "2", "--exit-code", "5", "--fail-rank", "1", cwd=tmp_path,
                 env=env, timeout=120)
    assert p.returncode == 5, p.stderr[-3000:]
    for rank in (0, 1):  # both ranks' output, as mpirun passed it on, without our rank labels
        assert f"ddp_toy: rank {rank} of 2, started by mpirun\n" in p.stdout, p.stdout[-2000:]
    assert "[rank" not in p.stdout
    assert "exited with code 5" in p.stderr
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    started = next(e for e in events if e["event"] == "fullrun_started")
    assert started["launcher"].startswith("mpirun")
    # the failing rank's own code, whatever mpirun folded into its own after stopping rank 0
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    assert ended["exit_code"] == 5 and ended["rank"] == 1, ended
    assert ended.get("launcher_exit_code") != 5, ended  # there only when it differs
    assert "full run ended: exit code 5 (rank 1" in p.stderr
    assert live_children() == []


@pytest.mark.mpi
@pytest.mark.slow
def test_a_failed_rank_stops_the_mpirun_job_as_torchrun_would(mpi, tmp_path):
    """Hydra lets rank 0 wait out its 10 minutes after rank 1 failed; autotune hears rank 1's
    goodbye and stops the job, and rank 1's code is the run's."""
    recipe = ddp_recipe(tmp_path, {"instances": 2, "thread_pct": 50})
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("run", "--plain", "--launcher", "mpirun", "--recipe", str(recipe), DDP,
                 "--run-seconds", "2", "--exit-code", "5", "--fail-rank", "1", "--linger", "600",
                 cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 5, p.stderr[-3000:]
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    assert ended["rank"] == 1 and ended["launcher_exit_code"] != 5, ended
    assert "ddp_toy: rank 0 done after" in p.stdout  # rank 0 had finished and was lingering
    assert live_children() == []


@pytest.mark.mpi
@pytest.mark.slow
def test_wrap_under_mpirun_probes_and_runs_through_it(mpi, tmp_path):
    """Probes and the full run both start their ranks with mpirun; tune.json keeps it. With no
    confirmation round the script's defaults (one rank) are kept, so the full run is one rank
    through mpirun (a two-rank recipe's full run: the failed-rank test above)."""
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("wrap", *QUIET, "--json", "--launcher", "mpirun", "--trials", "2",
                 "--seconds", "10", "--confirm-rounds", "0", "--fix", "instances=2", "threads=1",
                 "--recipe-dir", str(tmp_path / "recipes"), "--", DDP, "--run-seconds", "12",
                 cwd=tmp_path, env=env, timeout=300)
    summary = last_json(p)
    assert summary["exit_code"] == 0 and summary["kept_baseline"], summary["reason"]
    run_dir = summary["run_dir"]
    state = json.loads(open(os.path.join(run_dir, "tune.json")).read())
    assert state["settings"]["launcher"] == "mpirun"
    logs = os.path.join(run_dir, "logs")
    trial_logs = [open(os.path.join(logs, n)).read() for n in os.listdir(logs)
                  if n.startswith("trial-")]
    assert any("rank 1 of 2, started by mpirun" in text for text in trial_logs), trial_logs
    assert "ddp_toy: rank 0 done after" in p.stdout  # the full run, streamed
    events, _ = read_events(run_dir)
    assert next(e for e in events if e["event"] == "run_started")["launcher"].startswith("mpirun")
    assert next(e for e in events
                if e["event"] == "fullrun_started")["launcher"].startswith("mpirun")
    assert live_children() == []


@pytest.mark.mpi
@pytest.mark.slow
def test_two_hosts_in_a_hostfile_are_metered_over_the_network_address(mpi, tmp_path):
    """A hostfile of two names for this machine: mpirun puts one rank on each "host", the ranks
    rendezvous at the first host and report to the collector at its advertised address. The
    probe ends once its figure is tight; 40 s only bounds it, for a start-up under load (two
    torch imports and gloo's rendezvous beside a busy suite took 13 s of a 15 s probe in CI)."""
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
               AUTOTUNE_COLLECTOR_HOST="localhost")
    p = autotune("probe", "--json", "--modes", "full", "--seconds", "40", "--hostfile", "hosts",
                 DDP, "--print-env", "MASTER_ADDR", "AUTOTUNE_ADDR", cwd=tmp_path, env=env,
                 timeout=120)
    full = last_json(p)["modes"]["full"]
    log = open(full["log_path"]).read()
    for rank in (0, 1):
        assert f"ddp_toy: rank {rank} of 2, started by mpirun" in log, log[-2000:]
        assert f"ddp_toy: rank {rank} MASTER_ADDR=localhost" in log
        assert re.search(rf"ddp_toy: rank {rank} AUTOTUNE_ADDR=localhost:\d+", log)
    assert full["samples_per_s"] > 0 and full["seen"]["backend"] == "gloo", full
    assert live_children() == []


@pytest.mark.mpi
@pytest.mark.slow
def test_a_recipe_s_global_batch_is_divided_over_the_hosts_of_the_run(mpi, tmp_path):
    """Tuned on one host with --global-batch 64 (one rank of 64), run on two: 32 per rank."""
    (tmp_path / "hosts").write_text("localhost:1\n127.0.0.1:1\n")
    recipe = ddp_recipe(tmp_path, {"batch_size": 64, "instances": 1}, global_batch=64)
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
               AUTOTUNE_COLLECTOR_HOST="localhost")
    p = autotune("run", "--plain", "--hostfile", "hosts", "--recipe", str(recipe), DDP,
                 "--run-seconds", "1", "--print-env", "AUTOTUNE_BATCH_SIZE", cwd=tmp_path,
                 env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    for rank in (0, 1):
        assert f"ddp_toy: rank {rank} AUTOTUNE_BATCH_SIZE=32\n" in p.stdout, p.stdout[-2000:]
    assert "global batch of 64 is kept: batch_size=32 per rank on this run's 2 ranks" in p.stderr
    # a world that does not divide it: one line, exit 2, nothing started
    odd = ddp_recipe(tmp_path / "odd", {"batch_size": 32, "instances": 1}, global_batch=33)
    runs_before = sorted((tmp_path / "runs").iterdir())
    p = autotune("run", "--hostfile", "hosts", "--recipe", str(odd), DDP, cwd=tmp_path, env=env,
                 timeout=60)
    assert_one_error_line(p, str(odd), "global batch of 33 does not divide over this run's 2")
    assert sorted((tmp_path / "runs").iterdir()) == runs_before  # no run directory either


@pytest.mark.slow
def test_tune_with_a_global_batch_keeps_it_in_every_trial_and_the_recipe(tmp_path):
    """--global-batch 32 over instances 1..2: every probe's ranks share 32, and the recipe keeps
    the global batch for runs on other worlds."""
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("tune", *QUIET, "--json", "--global-batch", "32", "--space", "instances=1:2",
                 "--fix", "threads=1", "workers=0", "--trials", "3", "--seconds", "8",
                 "--confirm-rounds", "0", "--recipe-dir", str(tmp_path / "recipes"), "--", DDP,
                 cwd=tmp_path, env=env, timeout=400)
    summary = last_json(p)
    recipe = recipes.load(summary["recipe"])
    assert recipe.global_batch == 32
    assert recipe.knobs["batch_size"] * recipe.knobs.get("instances", 1) == 32
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    started = [e["knobs"] for e in events if e["event"] == "trial_started"]
    assert {k.get("instances", 1) for k in started} == {1, 2}, started
    assert all(k["batch_size"] * k.get("instances", 1) == 32 for k in started), started
