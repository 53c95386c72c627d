"""``autotune env``: detection on this host, on a fake GPU host, and the 'why not' lines."""

import json
import os
import subprocess
import sys

import pytest

from autotune.commands import env as env_cmd
from fakes.gpu_host import ROOT, fake_gpu_env, write_nvml_config


def run_env(env, *args):
    out = subprocess.run([sys.executable, "-m", "autotune", "env", *args], env=env,
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_this_host(tmp_path):
    env = dict(os.environ)
    env.pop("FAKE_PYNVML_CONFIG", None)
    info = json.loads(run_env(env, "--json"))
    assert info["cpu"]["usable"] == len(os.sched_getaffinity(0))
    assert info["memory"]["total_bytes"] > 0
    if not info["gpus"]["available"]:
        assert info["gpus"]["why_not"] and info["gpus"]["devices"] == []
        assert not info["mps"]["available"] and info["mps"]["why_not"]
    assert info["torch"]["distributed"]["gloo"] is True
    text = run_env(env, "--plain")
    assert text.startswith("host ") and "launchers local" in text


def test_fake_gpu_host_with_slurm(tmp_path):
    env = fake_gpu_env(write_nvml_config(tmp_path, gpus=2), "/tmp")
    env.update(SLURM_JOB_ID="77", SLURM_JOB_NODELIST="gpu[1-2]", SLURM_CPUS_ON_NODE="64")
    info = json.loads(run_env(env, "--json"))
    assert info["gpus"]["available"] and len(info["gpus"]["devices"]) == 2
    assert info["gpus"]["driver"] == "550.54.15"
    assert info["mps"]["available"] and info["mps"]["control"].endswith("nvidia-cuda-mps-control")
    assert info["slurm"]["nodes"] == ["gpu1", "gpu2"] and info["slurm"]["cpus_on_node"] == 64
    text = "\n".join(env_cmd.lines(info))
    assert "gpus      2 (driver 550.54.15)" in text and "slurm     job 77: 2 node(s)" in text


def test_mismatched_mpirun_is_a_warning(tmp_path):
    pytest.importorskip("mpi4py")
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.6'\n")
    fake.chmod(0o755)
    env = dict(os.environ, AUTOTUNE_MPIRUN=str(fake))
    info = json.loads(run_env(env, "--json"))
    assert info["mpi"]["flavor"] == "openmpi" and info["mpi"]["match"] is False
    assert "singletons" in info["mpi"]["why_not"]
    assert "WARNING: mpirun is openmpi" in "\n".join(env_cmd.lines(info))


def test_numa_from_sysfs(tmp_path):
    for node, cpus in ((0, "0-3"), (1, "4-7,12")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-1\n")
    assert env_cmd.numa_nodes(str(tmp_path)) == [
        {"node": 0, "cpus": [0, 1, 2, 3]}, {"node": 1, "cpus": [4, 5, 6, 7, 12]}]
    assert env_cmd.numa_nodes(str(tmp_path / "missing")) == []


def test_inside_an_allocation_the_machine_is_the_allocation():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_ON_NODE": "1",
           "SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_NNODES": "2", "SLURM_NTASKS": "2"}
    info = env_cmd.collect(env)
    s = info["slurm"]
    assert (s["nnodes"], s["cpus_per_node"], s["node_cpus"], s["ranks_per_node"]) == \
        (2, [1, 1], 1, 1)
    assert info["machine"] == {"cores_per_node": 1, "nodes": 2, "ranks_per_node": 1,
                               "from": "slurm allocation"}
    text = "\n".join(env_cmd.lines(info))
    assert "slurm     job 7: 2 node(s) node1,node2, 1 cpus/node" in text
    assert "machine   2 node(s) x 1 core(s), at most 1 rank(s) per node (from slurm allocation" \
        in text
    here = env_cmd.collect({})
    assert here["slurm"] is None and here["machine"]["from"] == "this host"
    assert here["machine"]["cores_per_node"] == len(os.sched_getaffinity(0))
