"""Nodes whose own host name resolves to loopback (``127.0.1.1``, as Debian's installer leaves
``/etc/hosts``; issue 42): the controller finds its address the way the engines find theirs
(`autotune.launching.reach`), and ``autotune tune`` under ``sbatch -N 2`` tunes across both
nodes with no ``AUTOTUNE_COLLECTOR_HOST`` set. The job sets ``GLOO_SOCKET_IFNAME``, as any job on
such nodes must for gloo itself (its default device comes from the host name too).

A bed of its own (``clusterbed.py up --loopback-names``), built here and torn down after.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.store.journal import read_events
from conftest import CLUSTER_RATE, ROOT, SCRIPTS, bed_settled, bed_slurm, bed_wait_job, \
    cluster_skip_reason

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOB_TIMEOUT_S = 600.0
FIND = ("import json, os; from autotune.launching import reach; "
        "c = reach.find(os.environ, ['node1', 'node2']); print(json.dumps([c.host, c.how]))")


@pytest.fixture(scope="module")
def bed():
    reason = cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    sys.path.insert(0, str(ROOT / "bench"))
    from clusterbed import ClusterBed

    workdir = Path("/tmp") / f"atb-loopback-{os.getpid()}" / "bed"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "clusterbed.py"), "up",
                        "--loopback-names", "--rate", CLUSTER_RATE, "--workdir", str(workdir)],
                       capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        pytest.fail(f"the loopback-names bed did not come up:\n{p.stderr}", pytrace=False)
    bed = ClusterBed.attach(workdir)
    try:
        yield bed
    finally:
        bed.down()
        shutil.rmtree(workdir.parent, ignore_errors=True)


def on_node(bed, host, code, env):
    """``python -c code`` on ``host`` (its network, /etc/hosts and name), with autotune."""
    return bed.run(host, [sys.executable, "-c", code], env=env, timeout_s=60)


def test_each_node_s_name_is_loopback_on_it_and_its_address_elsewhere(bed):
    f = bed.facts
    assert f.loopback_names
    resolve = "import socket; print(socket.gethostname(), socket.gethostbyname('node1'))"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert on_node(bed, "node1", resolve, env).stdout.split() == ["node1", "127.0.1.1"]
    assert on_node(bed, "node2", resolve, env).stdout.split() == ["node2", f.addresses[0]]


def test_the_address_comes_from_slurm_or_the_route_never_the_name(bed):
    """Without a *_SOCKET_IFNAME: inside a job step, the node's NodeAddr from scontrol;
    outside Slurm, our address on the route to node2; never 127.0.1.1."""
    f = bed.facts
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "GLOO_", "NCCL_", "AUTOTUNE_COLLECTOR"))}
    env["PYTHONPATH"] = str(ROOT)
    p = bed_slurm(bed, "srun", "-N", "1", "-n", "1", "-w", "node1", sys.executable, "-c", FIND,
                  env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [f.addresses[0], "Slurm's address of node node1 (its NodeAddr)"]
    routed = on_node(bed, "node1", FIND, env)
    assert routed.returncode == 0, routed.stderr
    assert json.loads(routed.stdout) == [f.addresses[0],
                                         "this host's address on the route to node2"]


def test_tune_in_a_two_node_allocation_with_loopback_names(bed, tmp_path):
    f = bed.facts
    script = tmp_path / "imagenet_shaped.py"  # a path no other test's processes carry
    shutil.copy(SCRIPTS / "shape_ddp_when_launched.py", script)
    out, rc_file, runs = tmp_path / "job.out", tmp_path / "tune.rc", tmp_path / "runs"
    job_name = f"tunelo{os.getpid()}"
    # As a user submits it on such nodes: GLOO_SOCKET_IFNAME in the job (gloo needs it), no
    # AUTOTUNE_COLLECTOR_HOST; a short budget keeps the test to a few minutes. What is tested
    # is how the ranks reach the controller, not the foreign-load guard (test_cluster_tune's):
    # its limit is raised, so that other work on this machine cannot refuse the baseline.
    tune = [sys.executable, "-m", "autotune", "tune", "--json", "--plain", "--budget", "2m",
            "--foreign-limit", "16", str(script), "--epochs", "200"]
    wrap = (f"export GLOO_SOCKET_IFNAME={f.ifname}; " + " ".join(tune)
            + f" > {tmp_path}/tune.json; echo $? > {rc_file}")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GLOO_", "NCCL_", "AUTOTUNE_COLLECTOR"))}
    env.update(PYTHONPATH=str(ROOT), AUTOTUNE_RUNS_DIR=str(runs), SBATCH_JOB_NAME=job_name,
               SLURM_JOB_NAME=job_name)
    start = time.monotonic()
    p = bed_slurm(bed, "sbatch", "--parsable", "-N", "2", "-n", "2", "-t", "15",
                  "--chdir", str(tmp_path), "-o", str(out), "--wrap", wrap, env=env)
    assert p.returncode == 0, p.stderr
    job_id = p.stdout.strip().split(";")[0]
    try:
        state, exit_code = bed_wait_job(bed, job_id, JOB_TIMEOUT_S)
    finally:
        bed_slurm(bed, "scancel", "-n", job_name)
    took_s = time.monotonic() - start
    log = out.read_text() if out.exists() else "(no job output)"
    assert "cannot reach this controller" not in log, log[-4000:]
    assert rc_file.exists() and rc_file.read_text().strip() == "0", log[-4000:]
    assert (state, exit_code) == ("COMPLETED", "0:0"), log[-4000:]
    # the message names what it chose: node1's address on the interface the job named
    assert (f"ranks on other hosts reach this controller at {f.addresses[0]}: the address of "
            f"{f.ifname}, the interface GLOO_SOCKET_IFNAME names") in log, log[-4000:]
    summary = json.loads((tmp_path / "tune.json").read_text().splitlines()[-1])
    assert summary["reason"] and summary["stop_reason"], summary
    events, _ = read_events(summary["run_dir"])
    assert next(e for e in events if e["event"] == "run_started")["launcher"] == \
        "srun on 2 hosts"
    finished = [e for e in events if e["event"] == "trial_finished"]
    why = [(e["trial"], e["result"]["outcome"], e["result"]["reason"]) for e in finished]
    assert "crashed" not in [e["result"]["outcome"] for e in finished], why
    across = [e for e in finished if e["result"]["ranks_seen"] >= 2
              and sorted(e["result"]["hosts"]) == sorted(f.hosts)]
    assert across, why
    timing = next(e for e in events if e["event"] == "allreduce")
    assert timing.get("result") and timing["result"]["world_size"] == 2, timing
    assert bed_settled(bed, (str(tmp_path),)) == []
    print(f"tune with loopback names: {took_s:.0f} s, {len(finished)} probes, {why}")
