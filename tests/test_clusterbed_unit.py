"""The cluster bed's pure parts (bench/clusterbed.py), without processes: rates, core split,
spec checks, and the Slurm, ssh and hosts files it writes."""

import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import clusterbed  # noqa: E402


def test_rates_in_tc_units():
    assert clusterbed.parse_rate("100mbit") == 100_000_000
    assert clusterbed.parse_rate("1gbit") == 10**9
    with pytest.raises(ValueError, match="but got '1GB/s'"):
        clusterbed.parse_rate("1GB/s")
    assert clusterbed.tbf_burst_bytes(100_000_000) == 64 * 1024  # floor: a GSO packet fits
    assert clusterbed.tbf_burst_bytes(10**10) == 10**10 // 8 // 200


def test_cores_are_disjoint_when_there_are_enough_and_shared_otherwise():
    assert clusterbed.split_cores([0, 1], 2) == ([[0], [1]], False)
    assert clusterbed.split_cores(list(range(16)), 2) == ([list(range(8)), list(range(8, 16))],
                                                          False)
    assert clusterbed.split_cores([0, 1], 3) == ([[0], [1], [0]], True)


def test_spec_refuses_what_cannot_be_built():
    with pytest.raises(ValueError, match="nodes <= 8"):
        clusterbed.BedSpec(nodes=0)
    with pytest.raises(ValueError, match="prefix"):
        clusterbed.BedSpec(prefix="a-very-long-prefix")  # interface names are 15 chars at most
    with pytest.raises(ValueError, match="rate"):
        clusterbed.BedSpec(rate="fast")


def test_slurm_conf_declares_what_the_bed_promises():
    text = clusterbed.slurm_conf(
        cluster="atb1", controller="vm", controller_addr="10.213.5.1", ctld_port=7000,
        hosts=["node1", "node2"], addresses=["10.213.5.11", "10.213.5.12"], cores_per_node=1,
        slurm_dir=Path("/tmp/b/slurm"), munge_socket=Path("/tmp/b/munge/s"), partition="bed")
    lines = text.splitlines()
    for want in ("SlurmctldHost=vm(10.213.5.1)", "ProctrackType=proctrack/pgid",
                 "TaskPlugin=task/none", "SelectType=select/cons_tres",
                 "SelectTypeParameters=CR_Core", "AuthInfo=socket=/tmp/b/munge/s",
                 "SlurmdSpoolDir=/tmp/b/slurm/spool/%n", "StateSaveLocation=/tmp/b/slurm/state"):
        assert want in lines
    assert any(x.startswith("NodeName=node2 NodeAddr=10.213.5.12 CPUs=1 ") for x in lines)
    assert "PartitionName=bed Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP" in lines
    assert not any("/var/spool" in x for x in lines)
    assert "CgroupPlugin=cgroup/v1" in clusterbed.cgroup_conf().splitlines()


def test_ssh_and_hosts_files_name_every_host():
    cfg = clusterbed.ssh_config(["node1", "node2"], ["10.0.0.11", "10.0.0.12"], Path("/k"),
                                Path("/kh"))
    assert "Host node2 10.0.0.12\n    HostName 10.0.0.12\n" in cfg
    assert "StrictHostKeyChecking yes" in cfg and "BatchMode yes" in cfg
    hosts = clusterbed.hosts_file(["node1", "node2"], ["10.0.0.11", "10.0.0.12"], "vm", "10.0.0.1")
    assert hosts.splitlines() == ["127.0.0.1\tlocalhost", "10.0.0.1\tvm", "10.0.0.11\tnode1",
                                  "10.0.0.12\tnode2"]
    # --loopback-names: each host's own name is 127.0.1.1 in its own view, as Debian leaves it
    own = clusterbed.hosts_file(["node1", "node2"], ["10.0.0.11", "10.0.0.12"], "vm", "10.0.0.1",
                                own="node1")
    assert own.splitlines() == ["127.0.0.1\tlocalhost", "127.0.1.1\tnode1", "10.0.0.1\tvm",
                                "10.0.0.12\tnode2"]
    sshd = clusterbed.sshd_config(address="10.0.0.11", host_key=Path("/h"),
                                  authorized_keys=Path("/a"), pid_file=Path("/p"))
    assert "PermitRootLogin prohibit-password" in sshd and "PasswordAuthentication no" in sshd
