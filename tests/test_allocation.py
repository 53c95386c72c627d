"""The Slurm allocation read from a job's environment (autotune/hardware/allocation.py), and the
machine it makes: cores per node from the allocation, not from the controller's host."""

import os

import pytest

from autotune.hardware import allocation, fingerprint
from autotune.hardware.allocation import SlurmAllocation, slurm_allocation


@pytest.mark.parametrize("text, names", [
    ("gpu[01-03,07],login5", ["gpu01", "gpu02", "gpu03", "gpu07", "login5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("single", ["single"]),
    ("a1,b2", ["a1", "b2"]),
])
def test_slurm_nodelist(text, names):
    assert allocation.expand_nodelist(text) == names


@pytest.mark.parametrize("text, counts", [
    ("1(x2)", (1, 1)),
    ("4,2", (4, 2)),
    ("2(x3),1", (2, 2, 2, 1)),
    ("36", (36,)),
    ("8(x2),4(x1)", (8, 8, 4)),
])
def test_per_node_counts(text, counts):
    assert allocation.expand_counts(text) == counts


@pytest.mark.parametrize("text", ["", "2(x", "a,b", "2x3"])
def test_per_node_counts_refuse_what_slurm_does_not_write(text):
    with pytest.raises(ValueError, match="per-node count"):
        allocation.expand_counts(text)


def test_no_allocation_without_a_job_id():
    assert slurm_allocation({}) is None
    assert slurm_allocation({"SLURM_CPUS_ON_NODE": "4"}) is None


def test_the_bed_s_allocation():
    """What sbatch -N 2 -n 2 gives a job on the bed's one-core nodes."""
    alloc = slurm_allocation({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]",
                              "SLURM_CPUS_ON_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "1(x2)",
                              "SLURM_NNODES": "2", "SLURM_NTASKS": "2"})
    assert alloc == SlurmAllocation(job_id="7", nodes=("node1", "node2"), cpus_on_node=1,
                                    cpus_per_node=(1, 1), ntasks=2, nnodes=2)
    assert (alloc.node_count, alloc.node_cpus, alloc.ranks_per_node) == (2, 1, 1)
    assert alloc.describe() == "job 7: 2 nodes (node1,node2), 1 CPU per node"


def test_uneven_nodes_give_the_fewest_cpus_and_tasks_per_node_can_narrow_it():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_CPUS_ON_NODE": "4",
           "SLURM_JOB_CPUS_PER_NODE": "4,2", "SLURM_NTASKS": "3", "SLURM_GPUS_ON_NODE": "4"}
    alloc = slurm_allocation(env)
    assert alloc.cpus_per_node == (4, 2) and alloc.cpus_on_node == 4
    assert alloc.node_cpus == 2 and alloc.ranks_per_node == 2  # a step is alike on every node
    assert (alloc.ntasks, alloc.gpus_per_node, alloc.node_count) == (3, 4, 2)
    alloc = slurm_allocation({**env, "SLURM_NTASKS_PER_NODE": "1"})
    assert alloc.tasks_per_node == 1 and alloc.ranks_per_node == 1


@pytest.mark.parametrize("env, gpus", [
    ({"SLURM_GPUS_ON_NODE": "2"}, 2),
    ({"SLURM_GPUS_PER_NODE": "a100:4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "gpu:a100:8"}, 8),
    ({"SLURM_JOB_GPUS": "0,1,3"}, 3),
    ({}, None),
])
def test_gpus_per_node(env, gpus):
    assert slurm_allocation({"SLURM_JOB_ID": "1", **env}).gpus_per_node == gpus


def test_without_the_per_node_list_this_node_s_cpus_count():
    alloc = slurm_allocation({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a,b",
                              "SLURM_CPUS_ON_NODE": "32", "SLURM_JOB_CPUS_PER_NODE": "junk"})
    assert alloc.cpus_per_node == () and alloc.node_cpus == 32 and alloc.node_count == 2


def test_the_machine_is_the_allocation(monkeypatch):
    """Cores per node from the allocation, whatever the controller's affinity; node count and
    ranks per node with it. Outside an allocation: this host, no limit on ranks."""
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-3]",
           "SLURM_JOB_CPUS_PER_NODE": "3(x3)", "SLURM_NNODES": "3",
           "SLURM_NTASKS_PER_NODE": "2"}
    m = fingerprint.machine(env)
    assert (m.cores, m.nodes, m.ranks_per_node) == (3, 3, 2)
    assert fingerprint.cores(env) == 3
    here = fingerprint.machine({})
    assert here.cores == len(os.sched_getaffinity(0)) and here.nodes == 1
    assert here.ranks_per_node is None
