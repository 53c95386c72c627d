"""``--launcher srun`` end to end against a fake ``srun`` (tests/fakes/slurm/srun) that behaves as
srun(1) documents, inside a fake allocation whose nodes are all this machine: ranks take their
identity from Slurm's variables, are metered, and a failed task's code is the run's."""

import os

import pytest

from autotune.hardware import fingerprint

from autotune.tuning import recipes
from autotune.store.journal import read_events
from conftest import ROOT, SCRIPTS, autotune, last_json, live_children

DDP = str(SCRIPTS / "ddp_toy.py")
SRUN_DIR = ROOT / "tests" / "fakes" / "slurm"
pytestmark = pytest.mark.slow


def allocation(tmp_path, nodes):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=os.pathsep.join([str(SRUN_DIR), env.get("PATH", "")]), SLURM_JOB_ID="4242",
               SLURM_JOB_NODELIST=",".join(nodes), SLURM_NNODES=str(len(nodes)),
               SLURM_CPUS_ON_NODE="2", AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    return env


def test_probe_under_srun_takes_identity_from_slurm(tmp_path):
    env = allocation(tmp_path, ["localhost"])
    p = autotune("probe", "--json", "--modes", "full", "--seconds", "30", "--launcher", "srun",
                 "--instances", "2", DDP, "--print-env", "SLURM_PROCID", "LOCAL_RANK",
                 cwd=tmp_path, env=env, timeout=120)
    full = last_json(p)["modes"]["full"]
    log = open(full["log_path"]).read()
    for rank in (0, 1):
        assert f"ddp_toy: rank {rank} of 2, started by srun" in log, log[-2000:]
        assert f"ddp_toy: rank {rank} SLURM_PROCID={rank}" in log
        assert f"ddp_toy: rank {rank} LOCAL_RANK={rank}" in log
    assert full["samples_per_s"] > 0 and full["seen"]["backend"] == "gloo", full
    assert live_children() == []


def test_a_two_node_allocation_starts_ranks_with_srun_by_default(tmp_path):
    """No --launcher: inside an allocation of two nodes, srun; one rank per node, rendezvous at
    the first node, reports to the collector's advertised address."""
    env = allocation(tmp_path, ["localhost", "127.0.0.1"])
    env["AUTOTUNE_COLLECTOR_HOST"] = "localhost"
    p = autotune("probe", "--json", "--modes", "full", "--seconds", "30", DDP, "--print-env",
                 "SLURM_NODEID", "MASTER_ADDR", cwd=tmp_path, env=env, timeout=120)
    full = last_json(p)["modes"]["full"]
    log = open(full["log_path"]).read()
    for rank in (0, 1):
        assert f"ddp_toy: rank {rank} of 2, started by srun" in log, log[-2000:]
        assert f"ddp_toy: rank {rank} SLURM_NODEID={rank}" in log  # one per node
        assert f"ddp_toy: rank {rank} MASTER_ADDR=localhost" in log
    assert full["samples_per_s"] > 0
    assert live_children() == []


def test_run_under_srun_exits_with_the_failed_tasks_code(tmp_path):
    env = allocation(tmp_path, ["localhost"])
    recipe = recipes.save(recipes.Recipe(
        name="ddp", knobs={"instances": 2}, samples_per_s=1.0, ci_half=0.1,
        baseline_samples_per_s=1.0, speedup=1.0, kept_baseline=True,
        fingerprint=fingerprint.current([DDP]), script_path=DDP), tmp_path)
    p = autotune("run", "--plain", "--launcher", "srun", "--recipe", str(recipe), DDP,
                 "--run-seconds", "2", "--exit-code", "4", "--fail-rank", "0", cwd=tmp_path,
                 env=env, timeout=120)
    assert p.returncode == 4, p.stderr[-3000:]
    assert "ddp_toy: rank 1 of 2, started by srun" in p.stdout
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    assert next(e for e in events if e["event"] == "fullrun_started")["launcher"] == "srun"
    assert live_children() == []
