"""The cluster bed itself (bench/clusterbed.py), on real engines: Slurm's srun, sbatch and
salloc across two namespaced hosts, torch.distributed over gloo between them, MPICH's Hydra
mpirun over ssh, the tbf-shaped link's rate, and a teardown that leaves nothing behind."""

import dataclasses
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, bed_slurm, cluster_skip_reason, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

sys.path.insert(0, str(ROOT / "bench"))
import clusterbed  # noqa: E402


JOB_NAME = f"w{os.getpid()}"  # this worker's jobs: the xdist workers share one bed


@pytest.fixture
def bed(cluster_nodes):
    """The session's bed, its nodes to this test alone (`cluster_nodes`); this worker's jobs
    cancelled after each test (a job a failed test left would hold the nodes and fail every
    test after it)."""
    cluster = cluster_nodes
    yield cluster
    subprocess.run(["scancel", "-n", JOB_NAME], env=cluster.env(), capture_output=True,
                   timeout=30)
    wait_for(lambda: slurm(cluster, "squeue", "-h", "-n", JOB_NAME).stdout.strip() == "",
             timeout_s=60, what="this worker's jobs to leave the queue", poll_s=0.2)


slurm = functools.partial(bed_slurm, job_name=JOB_NAME)  # this worker's jobs, by name


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wait_job_gone(bed, job_id, timeout_s=90.0):
    wait_for(lambda: slurm(bed, "squeue", "-h", "-j", job_id).stdout.strip() == "",
             timeout_s=timeout_s, what=f"job {job_id} to leave squeue", poll_s=0.2)


def test_srun_runs_one_task_on_each_host(bed):
    p = slurm(bed, "srun", "-N", "2", "-n", "2", "hostname")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == sorted(bed.facts.hosts)


def test_sbatch_output_shows_both_hosts_and_the_declared_allocation(bed, tmp_path):
    f = bed.facts
    out = tmp_path / "job.out"
    report = ('echo "$(hostname) $SLURM_CPUS_ON_NODE $SLURM_JOB_CPUS_PER_NODE $SLURM_NNODES"')
    p = slurm(bed, "sbatch", "--parsable", "-N", "2", "-n", "2", "-t", "5", "-o", str(out),
              "--wrap", f"srun -N 2 -n 2 sh -c '{report}'")
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    wait_job_gone(bed, job_id)
    lines = sorted(out.read_text().split("\n"))
    rows = [line.split() for line in lines if line.strip()]
    assert sorted(r[0] for r in rows) == sorted(f.hosts), out.read_text()
    for _, cpus_on_node, job_cpus_per_node, nnodes in rows:
        assert int(cpus_on_node) == f.cores_per_node
        assert job_cpus_per_node == f"{f.cores_per_node}(x2)"
        assert int(nnodes) == 2


def test_consecutive_steps_in_one_allocation(bed, tmp_path):
    """Two srun steps back to back both run; so does one after a step whose srun was killed
    (srun waits, "Requested nodes are busy", until that step's CPUs are freed); a step asking
    for more CPUs than the allocation holds is what fails with "More processors requested
    than permitted"."""
    script = tmp_path / "steps.sh"
    script.write_text(
        "set -u\n"
        "srun -n 2 hostname || exit 11\n"
        "srun -n 2 hostname || exit 12\n"
        "srun -n 2 sleep 30 & victim=$!\n"
        "for i in $(seq 100); do squeue -h -s -j $SLURM_JOB_ID | grep -q sleep && break; "
        "sleep 0.1; done\n"
        "squeue -h -s -j $SLURM_JOB_ID | grep -q sleep || exit 15\n"
        "kill -9 $victim\n"
        "srun -n 2 hostname || exit 13\n"
        "srun -n 4 hostname && exit 14\n"
        "exit 0\n")
    # srun waits for the killed step's CPUs; twice this session that wait ran past 90 s.
    p = slurm(bed, "salloc", "-N", "2", "-n", "2", "-t", "5", "bash", str(script), timeout_s=240)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert sorted(p.stdout.split()) == sorted(bed.facts.hosts * 3)
    assert "More processors requested than permitted" in p.stderr


def test_gloo_all_reduce_across_the_two_hosts(bed):
    f = bed.facts
    env = dict(os.environ, MASTER_ADDR=f.addresses[0],
               MASTER_PORT=str(random.randint(20000, 40000)), GLOO_SOCKET_IFNAME=f.ifname,
               PYTHONPATH=str(ROOT))
    p = slurm(bed, "srun", "-N", "2", "-n", "2", "--ntasks-per-node=1", sys.executable,
              str(SCRIPTS / "bed_allreduce.py"), env=env, timeout_s=180)
    assert p.returncode == 0, p.stderr
    ranks = sorted(json_lines(p.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sorted(r["host"] for r in ranks) == sorted(f.hosts)
    assert all(r["sum"] == 3.0 for r in ranks)


def test_mpirun_over_ssh_starts_ranks_on_both_hosts(bed):
    pytest.importorskip("mpi4py")
    mpirun = Path(sys.executable).with_name("mpirun")
    if not mpirun.exists():
        pytest.skip(f"no mpirun beside {sys.executable} (pip mpich)")
    f = bed.facts
    env = dict(os.environ, BED_MARKER="forwarded")
    p = bed.run(f.hosts[0], [str(mpirun), "-launcher", "ssh", "-launcher-exec", f.ssh,
                                 "-f", f.hostfile, "-n", "2", "-ppn", "1", sys.executable,
                                 str(SCRIPTS / "bed_mpi_hosts.py")], env=env, timeout_s=120)
    assert p.returncode == 0, p.stderr
    ranks = json.loads([line for line in p.stdout.splitlines() if line.startswith("[")][-1])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sorted(r["host"] for r in ranks) == sorted(f.hosts)
    assert all(r["sum"] == 3 and r["marker"] == "forwarded" for r in ranks)  # -genvall


def test_shaped_link_rate(bed):
    f = bed.facts
    nbytes = max(2 << 20, f.rate_bits_per_s // 8)  # about a second's worth, at least 2 MiB
    port = str(random.randint(20000, 40000))
    argv = [sys.executable, str(SCRIPTS / "bed_rate.py")]
    server = subprocess.Popen(bed.on(f.hosts[0], [*argv, "serve", f.addresses[0], port,
                                                      str(nbytes)]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sender = bed.run(f.hosts[1], [*argv, "send", f.addresses[0], port, str(nbytes)],
                             timeout_s=60)
        out, err = server.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    assert sender.returncode == 0, sender.stderr
    assert server.returncode == 0, err
    measured = json.loads(out.splitlines()[-1])
    assert measured["bytes"] == nbytes
    ratio = measured["bits_per_s"] / f.rate_bits_per_s
    assert 0.5 <= ratio <= 2.0, (measured, f.rate)


NOTHING = {"namespaces": [], "links": [], "etc_netns": [], "by_pid": [], "by_cmdline": [],
           "mounts": []}


def _leftovers(prefix, workdir, pids):
    """What of a bed is still there: by name, by the pids it had, by command line."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {
        "namespaces": [n for n in names.split() if n.startswith(prefix + "-")],
        "links": [line for line in links.splitlines() if f" {prefix}-" in line],
        "etc_netns": [str(p) for p in Path("/etc/netns").glob(prefix + "-*")],
        "by_pid": [p for p in pids if clusterbed.alive(p)],
        "by_cmdline": clusterbed.bed_processes(workdir),
        "mounts": [line for line in Path("/proc/mounts").read_text().splitlines()
                   if str(workdir) in line],
    }


@pytest.fixture
def bed_dir():
    """A work dir the munge user can reach (pytest's tmp_path is 0700), removed afterwards;
    skips where no bed can be built."""
    if cluster_skip_reason():
        pytest.skip(cluster_skip_reason())
    path = Path(tempfile.mkdtemp(prefix="atb-test-"))
    os.chmod(path, 0o755)
    yield path / "bed"
    shutil.rmtree(path, ignore_errors=True)


def test_down_leaves_nothing_behind(bed_dir):
    spec = clusterbed.BedSpec(nodes=3, rate="1gbit", prefix=f"atbd{os.getpid() % 100000}",
                              workdir=bed_dir)
    bed = clusterbed.ClusterBed(spec)
    start = time.monotonic()
    facts = bed.up()
    up_s = time.monotonic() - start
    assert facts.shared_cores == (len(os.sched_getaffinity(0)) < 3)
    p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                       env=bed.env(), timeout=30)
    assert sorted(p.stdout.split()) == sorted(["idle"] * 3 + list(facts.hosts))
    pids = list(clusterbed.pid_files(spec.workdir).values())
    pids += clusterbed.bed_processes(spec.workdir)
    assert len(pids) >= 2 * 3 + 2, pids  # slurmd + sshd per host, slurmctld, munged
    start = time.monotonic()
    bed.down()
    down_s = time.monotonic() - start
    assert _leftovers(spec.prefix, spec.workdir, pids) == NOTHING
    bed.down()  # idempotent
    # the next bed in the same work dir is another cluster (its own name): Slurm's saved state
    # of the last one would make slurmctld refuse it
    again = clusterbed.ClusterBed(dataclasses.replace(spec, nodes=2,
                                                      prefix=f"atbe{os.getpid() % 100000}"))
    try:
        assert tuple(again.up().hosts) == ("node1", "node2")
    finally:
        again.down()
    print(f"up {up_s:.1f} s, down {down_s:.1f} s")


def test_failed_up_leaves_nothing_behind(bed_dir, monkeypatch):
    started = []

    def broken(self, deadline):
        started.extend(clusterbed.pid_files(self.workdir).values())
        raise clusterbed.BedError("slurm refused (injected)")
    monkeypatch.setattr(clusterbed.ClusterBed, "_start_slurm", broken)
    spec = clusterbed.BedSpec(prefix=f"atbf{os.getpid() % 100000}", workdir=bed_dir)
    bed = clusterbed.ClusterBed(spec)
    with pytest.raises(clusterbed.BedError, match="injected"):
        bed.up()
    assert len(started) == 3, "munged and two sshd had started before the failure"
    assert _leftovers(spec.prefix, spec.workdir, started) == NOTHING


def test_work_dir_the_munge_user_cannot_reach_is_refused_before_anything_is_built(tmp_path):
    if cluster_skip_reason():
        pytest.skip(cluster_skip_reason())
    os.chmod(tmp_path, 0o700)
    bed = clusterbed.ClusterBed(clusterbed.BedSpec(prefix="atbzz", workdir=tmp_path / "bed"))
    with pytest.raises(clusterbed.BedError, match="reachable by the munge user"):
        bed.up()
    assert not (tmp_path / "bed").exists()
