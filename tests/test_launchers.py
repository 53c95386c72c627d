"""Engine command lines and allocation detection: pure, no MPI or Slurm needed."""

import argparse
import gc
import warnings

import pytest

from autotune.launching import engines
from autotune import UsageError
from autotune.launching.engines import Host, MpiInfo

ARGV = ["/venv/bin/python", "-m", "probes.boot", "train.py", "--epochs", "1"]
MPICH = MpiInfo("/venv/bin/mpirun", "mpich", "5.0.2")
OMPI = MpiInfo("/usr/bin/mpirun", "openmpi", "4.1.6")


def test_mpich_localhost_is_plain():
    assert engines.mpirun_argv(mpi=MPICH, ranks=2, ranks_per_host=2, rank_argv=ARGV) == \
        ["/venv/bin/mpirun", "-n", "2", *ARGV]


def test_mpich_hosts_and_hostfile():
    hosts = [Host("a"), Host("b")]
    argv = engines.mpirun_argv(mpi=MPICH, ranks=4, ranks_per_host=2, hosts=hosts,
                                 rank_argv=ARGV)
    assert argv[:7] == ["/venv/bin/mpirun", "-n", "4", "-hosts", "a,b", "-ppn", "2"]
    argv = engines.mpirun_argv(mpi=MPICH, ranks=4, ranks_per_host=2, hosts=hosts,
                                 hostfile="hf", rank_argv=ARGV)
    assert argv[3:7] == ["-f", "hf", "-ppn", "2"]


def test_openmpi_unbinds_oversubscribes_and_forwards_env():
    argv = engines.mpirun_argv(mpi=OMPI, ranks=4, ranks_per_host=2,
                                 hosts=[Host("a"), Host("b")], forward=["AUTOTUNE_TOKEN", "X"],
                                 as_root=True, rank_argv=ARGV)
    joined = " ".join(argv)
    assert "--bind-to none" in joined and "--oversubscribe" in joined
    assert "--allow-run-as-root" in argv
    assert "--host a:2,b:2" in joined and "--map-by ppr:2:node" in joined
    assert "-x AUTOTUNE_TOKEN -x X" in joined
    assert argv[-len(ARGV):] == ARGV
    local = engines.mpirun_argv(mpi=OMPI, ranks=2, ranks_per_host=2, rank_argv=ARGV)
    assert "--allow-run-as-root" not in local and "--map-by" not in local


def test_mpirun_refuses_zero_ranks():
    with pytest.raises(ValueError, match="ranks >= 1"):
        engines.mpirun_argv(mpi=MPICH, ranks=0, ranks_per_host=1, rank_argv=ARGV)


def test_srun_argv():
    argv = engines.srun_argv(ranks=8, ranks_per_host=4, nodes=2, cpus_per_task=3,
                               rank_argv=ARGV)
    assert argv[:7] == ["srun", "--ntasks=8", "--ntasks-per-node=4", "--nodes=2",
                        "--kill-on-bad-exit=1", "--export=ALL", "--cpu-bind=none"]
    assert "--cpus-per-task=3" in argv and argv[-len(ARGV):] == ARGV


def test_hostfiles_of_both_flavours():
    text = "# cluster\nnode1 slots=4\nnode2:2  # mpich style\n\nnode3\n"
    assert engines.parse_hostfile(text) == [Host("node1", 4), Host("node2", 2),
                                              Host("node3", None)]


@pytest.mark.parametrize("text, flavor", [
    ("mpirun (Open MPI) 4.1.6", "openmpi"),
    ("HYDRA build details:\n    Version: 5.0.2", "mpich"),
    ("MPICH Version:      4.2.0", "mpich"),
    ("something else", "unknown"),
])
def test_mpi_flavor(text, flavor):
    assert engines.mpi_flavor(text) == flavor


def test_forwarded_names_only_what_ranks_need():
    env = {"AUTOTUNE_TOKEN": "t", "MASTER_PORT": "1", "OMP_NUM_THREADS": "2", "HOME": "/root",
           "PYTHONPATH": "/x", "CUDA_VISIBLE_DEVICES": "0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert engines.forwarded(env) == ["AUTOTUNE_TOKEN", "CUDA_VISIBLE_DEVICES",
                                        "GLOO_SOCKET_IFNAME", "MASTER_PORT", "OMP_NUM_THREADS",
                                        "PYTHONPATH"]


def _args(**kw):
    return argparse.Namespace(**{"launcher": None, "hostfile": None, **kw})


def test_from_args_defaults_and_errors(tmp_path):
    assert engines.from_args(_args(), env={}).kind == "local"
    with pytest.raises(UsageError, match="Slurm allocation"):
        engines.from_args(_args(launcher="srun"), env={})
    alloc = engines.from_args(_args(launcher="srun"),
                                env={"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"})
    assert alloc.kind == "srun" and [h.name for h in alloc.hosts] == ["n1", "n2"]
    empty = tmp_path / "hosts"
    empty.write_text("# nothing\n")
    with pytest.raises(UsageError, match="lists no host"):
        engines.from_args(_args(launcher="mpirun", hostfile=str(empty)), env={})
    with pytest.raises(UsageError, match="needs --launcher mpirun"):
        engines.from_args(_args(launcher="local", hostfile=str(empty)), env={})
    with pytest.raises(UsageError, match="no mpirun found"):
        engines.from_args(_args(launcher="mpirun"),
                            env={"AUTOTUNE_MPIRUN": str(tmp_path / "missing")})


def test_the_hostfile_is_closed_after_reading(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# nothing\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UsageError, match="lists no host"):
            engines.resolve("mpirun", str(hosts), env={})
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_launcher_kind_is_checked():
    with pytest.raises(ValueError, match="launcher must be one of"):
        engines.Launcher(kind="pbs")


def test_other_steps_leave_out_the_service_steps_and_our_own():
    text = "42.batch\n42.extern\n42.0\n42.3\n42.interactive\n"
    assert engines.other_steps(text) == ["42.0", "42.3"]
    assert engines.other_steps(text, own_step="42.0") == ["42.3"]
    assert engines.other_steps("") == []


def test_no_allocation_no_steps_to_wait_for():
    assert engines.wait_steps_ended({}, timeout_s=0.1) == ""
