"""Rank identity from Open MPI / MPICH / Slurm variables, placement entries, core pinning, and
the NCCL -> gloo override for ranks sharing a GPU."""

import json
import os
import subprocess
import sys

import pytest

from probes import protocol, ranks_env
from probes.intercept import nccl_why_not, override_backend


def test_open_mpi_identity():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert ranks_env.identity(env) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                       "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}


def test_mpich_identity():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert ranks_env.identity(env)["LOCAL_RANK"] == "1"


def test_pmi_without_local_rank_falls_back_to_blocks():
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", protocol.ENV_LOCAL_WORLD_SIZE: "4"}
    ident = ranks_env.identity(env)
    assert (ident["LOCAL_RANK"], ident["LOCAL_WORLD_SIZE"], ident["GROUP_RANK"]) == ("1", "4", "1")


def test_slurm_identity_and_tasks_per_node():
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
           "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}
    ident = ranks_env.identity(env)
    assert (ident["RANK"], ident["LOCAL_WORLD_SIZE"]) == ("6", "1")
    assert ranks_env.slurm_tasks_on_node("2(x3),1", 1) == 2
    assert ranks_env.slurm_tasks_on_node("bad", 0) is None


def test_srun_prefers_slurm_over_inherited_mpi_vars():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "PMI_RANK": "0", "PMI_SIZE": "1", protocol.ENV_LAUNCHER: "srun"}
    assert ranks_env.identity(env)["RANK"] == "3"
    del env[protocol.ENV_LAUNCHER]
    assert ranks_env.identity(env)["RANK"] == "0"


def test_no_launcher_no_identity():
    assert ranks_env.identity({"PATH": "/bin"}) is None


def test_apply_derives_identity_then_applies_the_rank_entry():
    table = [{"CUDA_VISIBLE_DEVICES": "GPU-a", "LOCAL_RANK": "0",
              protocol.ENV_HOST_LOCAL_RANK: "0"},
             {"CUDA_VISIBLE_DEVICES": "GPU-a", "LOCAL_RANK": "0",
              protocol.ENV_HOST_LOCAL_RANK: "1"}]
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           protocol.ENV_PLACEMENT: json.dumps(table)}
    assert ranks_env.apply(env) == []
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["LOCAL_RANK"] == "0"  # the co-located GPU rule from the table
    assert env[protocol.ENV_HOST_LOCAL_RANK] == "1" and env["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    before = dict(env)
    ranks_env.apply(env)  # twice is harmless
    assert env == before


def test_apply_leaves_torchrun_identity_alone():
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PMI_RANK": "3", "PMI_SIZE": "4"}
    ranks_env.apply(env)
    assert env["RANK"] == "0"


def test_more_ranks_than_planned_is_a_warning(capsys):
    env = {"RANK": "0", protocol.ENV_HOST_LOCAL_RANK: "3", protocol.ENV_PLACEMENT: "[{}]"}
    warnings = ranks_env.apply(env)
    assert warnings and "more ranks on this host than planned" in warnings[0]
    assert "WARNING" in capsys.readouterr().err


def test_parse_cpus():
    assert protocol.parse_cpus("0,2-3, 7") == {0, 2, 3, 7}


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_apply_pins_the_process_to_its_cores():
    core = min(os.sched_getaffinity(0))
    code = ("import os; from probes import ranks_env; ranks_env.apply(); "
            "print(sorted(os.sched_getaffinity(0)))")
    env = dict(os.environ, RANK="0", **{protocol.ENV_CPUS: str(core)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == f"[{core}]"


@pytest.mark.parametrize("asked, override, expect, noted", [
    ("nccl", "gloo", "gloo", True),
    ("cuda:nccl,cpu:gloo", "gloo", "gloo", True),
    (None, "gloo", "gloo", True),
    ("gloo", "gloo", "gloo", False),
    ("mpi", "gloo", "mpi", False),
    ("nccl", None, "nccl", False),
])
def test_backend_override(asked, override, expect, noted):
    backend, note = override_backend(asked, override)
    assert backend == expect
    assert bool(note) == noted
    if noted:
        assert "NCCL refuses two ranks on one GPU" in note


@pytest.mark.parametrize("asked, expect", [
    ("nccl", "gloo"), ("NCCL", "gloo"), ("cuda:nccl,cpu:gloo", "cuda:nccl,cpu:gloo"),
    ("gloo", "gloo"), (None, None), ("mpi", "mpi"),
])
def test_nccl_that_cannot_serve_becomes_gloo_and_says_why(asked, expect):
    backend, note = override_backend(asked, None, nccl_why_not="this torch has no NCCL")
    assert backend == expect
    assert bool(note) == (expect != asked)
    if note:
        assert "cannot serve here (this torch has no NCCL)" in note and "'gloo'" in note


def test_nccl_why_not_on_this_cpu_torch():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: NCCL may serve")
    assert nccl_why_not(torch) in ("this torch has no NCCL", "no CUDA device in this process")
