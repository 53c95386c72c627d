"""autotune.launching.group: placed local ranks for real, engine commands for mpirun/srun, refusals."""

import json
import os
import time
from pathlib import Path

import pytest

from autotune.launching import engines

from autotune.hardware import proc
from autotune import LaunchError
from autotune.launching.group import RanksSpec, engine_argv, engine_env, plan_for, start_group
from fakes.gpu_host import fake_pynvml, write_nvml_config
from probes import protocol

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def wait_all(launched, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while any(lp.poll() is None for lp in launched) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [proc.stop(lp, grace_s=1) for lp in launched]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_two_cpu_ranks_get_a_share_of_cores_each_pinned(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    share = 100.0 / len(cores)  # one core each
    env = dict(os.environ, PLACEMENT_OUT=str(tmp_path))
    spec = RanksSpec(command=(str(SCRIPTS / "placement_probe.py"),), instances=2,
                     knobs={"thread_pct": share, "pin": 1, "bucket_mb": 1}, cwd=str(tmp_path),
                     log_dir=tmp_path / "logs", name="place", marker="placetest", env=env,
                     device="cpu")
    group = start_group(spec, channel={})
    assert wait_all(group.launched) == [0, 0]
    recs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    for r, rec in enumerate(recs):
        assert (rec["RANK"], rec["LOCAL_RANK"], rec["WORLD_SIZE"]) == (str(r), str(r), "2")
        assert rec["OMP_NUM_THREADS"] == rec["MKL_NUM_THREADS"] == "1"
        assert rec["torch_threads"] == 1
        assert rec["affinity"] == [cores[r]] and rec["AUTOTUNE_CPUS"] == str(cores[r])
        assert rec["HOROVOD_FUSION_THRESHOLD"] == str(2**20)
        assert rec["AUTOTUNE_LAUNCHER"] == "local"
    assert group.plan.local_world_size == 2 and group.mps is None


def _spec(**kw):
    base = dict(command=("train.py", "--epochs", "1"), instances=2, device="cpu",
                knobs={"thread_pct": 50}, env={"PATH": "/bin", "RANK": "7"})
    base.update(kw)
    return RanksSpec(**base)


def test_srun_engine_leaves_identity_to_the_ranks():
    spec = _spec(launcher=engines.Launcher(kind="srun", hosts=(engines.Host("n1"),
                                                                 engines.Host("n2"))))
    plan = plan_for(spec, spec.env)
    knobs = {**spec.knobs, "threads": plan.threads}
    env = engine_env(spec, plan, dict(spec.env), knobs, set(),
                     [s.env for s in plan.slots], {"AUTOTUNE_ADDR": "h:1"},
                     master_addr="n1", master_port=29500)
    assert "RANK" not in env and "LOCAL_RANK" not in env  # from SLURM_* in each rank
    assert env[protocol.ENV_LAUNCHER] == "srun" and env[protocol.ENV_LOCAL_WORLD_SIZE] == "2"
    assert env["MASTER_ADDR"] == "n1" and env["AUTOTUNE_ADDR"] == "h:1"
    table = json.loads(env[protocol.ENV_PLACEMENT])
    assert [e[protocol.ENV_HOST_LOCAL_RANK] for e in table] == ["0", "1"]
    argv = engine_argv(spec, plan, ["python", "-m", "probes.boot", "train.py"], env)
    assert argv[:4] == ["srun", "--ntasks=4", "--ntasks-per-node=2", "--nodes=2"]
    assert f"--cpus-per-task={plan.threads}" in argv


SRUN_TWO_NODES = engines.Launcher(kind="srun", hosts=(engines.Host("node1"),
                                                     engines.Host("node2")))


def _bed_allocation(cpus_per_node="1(x2)", **more):
    """What sbatch -N 2 gives a job (the bed's nodes hold one CPU each by default)."""
    return {"PATH": "/bin", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_NNODES": "2", "SLURM_JOB_CPUS_PER_NODE": cpus_per_node,
            "SLURM_CPUS_ON_NODE": cpus_per_node.split("(")[0].split(",")[0], **more}


def _srun_argv(spec):
    plan = plan_for(spec, spec.env)
    return plan, engine_argv(spec, plan, ["python", "t.py"], {})


@pytest.mark.parametrize("cpus, instances, knobs, per_task", [
    ("1(x2)", 1, {}, 1),  # the bed: the controller's host has more cores, the step gets one
    ("4(x2)", 1, {}, 4),  # the baseline: one rank, threads left to torch, the whole node
    ("4(x2)", 2, {}, 2),
    ("4(x2)", 2, {"threads": 1}, 1),
    ("4(x2)", 2, {"threads": 4}, 2),  # oversubscribed threads: the step still fits
    ("8,4", 1, {"thread_pct": 50}, 2),  # the node with fewer CPUs sets the share
])
def test_srun_takes_its_cpus_from_the_allocation_not_the_controller_s_host(
        cpus, instances, knobs, per_task):
    spec = _spec(instances=instances, knobs=knobs, env=_bed_allocation(cpus),
                 launcher=SRUN_TWO_NODES)
    plan, argv = _srun_argv(spec)
    assert f"--cpus-per-task={per_task}" in argv
    assert f"--ntasks-per-node={instances}" in argv and f"--ntasks={2 * instances}" in argv
    assert plan.local_world_size * per_task <= int(cpus.split("(")[0].split(",")[-1])


def test_srun_refuses_more_ranks_per_node_than_the_allocation_starts():
    spec = _spec(instances=2, knobs={}, env=_bed_allocation(), launcher=SRUN_TWO_NODES)
    with pytest.raises(LaunchError) as e:
        plan_for(spec, spec.env)
    text = str(e.value)
    assert "2 ranks per node do not fit" in text and "1 CPU per node" in text
    assert "sbatch -c N" in text and "\n" not in text
    many = _bed_allocation("4(x2)", SLURM_NTASKS_PER_NODE="1")
    with pytest.raises(LaunchError, match="2 ranks per node do not fit"):
        plan_for(_spec(instances=2, knobs={}, env=many, launcher=SRUN_TWO_NODES), many)


def test_srun_ranks_are_not_pinned_to_the_controller_s_cores():
    spec = _spec(instances=2, knobs={"threads": 1, "pin": 1}, env=_bed_allocation("2(x2)"),
                 launcher=SRUN_TWO_NODES)
    plan = plan_for(spec, spec.env)
    assert all(slot.cpus == () for slot in plan.slots)
    assert any("not pinned" in n for n in plan.notes)


def test_mpirun_engine_command():
    mpi = engines.MpiInfo("/x/mpirun", "mpich", "5")
    spec = _spec(launcher=engines.Launcher(kind="mpirun", mpi=mpi))
    plan = plan_for(spec, spec.env)
    argv = engine_argv(spec, plan, ["python", "t.py"], {})
    assert argv == ["/x/mpirun", "-n", "2", "python", "t.py"]


def test_instances_knob_and_field_must_agree():
    with pytest.raises(LaunchError, match="disagree"):
        plan_for(_spec(instances=2, knobs={"instances": 3}), {})
    assert plan_for(_spec(instances=1, knobs={"instances": 3}), {}).local_world_size == 3


def test_gpu_placement_seen_through_nvml(monkeypatch, tmp_path):
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=2)):
        plan = plan_for(_spec(device="auto", instances=3, knobs={"thread_pct": 40}), {})
        assert plan.device == "gpu" and plan.local_world_size == 3  # one GPU by default
        assert {s.gpu.index for s in plan.slots} == {0} and plan.needs_mps
        both = plan_for(_spec(device="auto", instances=3, knobs={"gpus": 2}), {})
        assert both.local_world_size == 6
        assert plan_for(_spec(device="auto", instances=1, knobs={}, gpus=None),
                        {}).local_world_size == 2  # None: every visible GPU
        one = plan_for(_spec(device="auto", instances=1, knobs={}, gpus=1),
                       {"CUDA_VISIBLE_DEVICES": "1"})
        assert [s.gpu.index for s in one.slots] == [1]
        with pytest.raises(LaunchError, match="2 visible"):
            plan_for(_spec(device="auto", gpus=3), {})


def test_shared_gpus_on_several_hosts_are_refused(monkeypatch, tmp_path):
    hosts = (engines.Host("a"), engines.Host("b"))
    spec = _spec(device="gpu", instances=2, launcher=engines.Launcher(
        kind="mpirun", hosts=hosts, mpi=engines.MpiInfo("/x/mpirun", "openmpi", "4")))
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=1)):
        with pytest.raises(LaunchError, match="MPS daemon on every host"):
            start_group(spec, channel={})


def test_no_gpu_means_cpu_placement_here(monkeypatch):
    with fake_pynvml(monkeypatch, None):
        assert plan_for(_spec(device="auto"), {}).device == "cpu"
        with pytest.raises(LaunchError, match="no GPU"):
            plan_for(_spec(device="gpu"), {})


def test_the_mps_daemon_is_counted_as_the_trials_not_as_foreign_load(tmp_path):
    """A busy MPS daemon (here a stand-in: a process with a child, both spinning) works for the
    ranks; foreign load measured over the same window drops by its CPU time when it is sampled."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from autotune.measuring.foreign_load import ForeignLoad
    from autotune.launching.placement import plan
    from autotune.launching.group import RankGroup

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    daemon = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys\n"
                               f"c = subprocess.Popen([sys.executable, '-c', {spin!r}])\n"
                               f"{spin}c.wait()\n"])
    try:
        group = RankGroup(launched=[], plan=plan(knobs={}, instances=1, cores=[0]),
                          launcher=engines.Launcher(), mps=SimpleNamespace(pid=daemon.pid))
        t0 = time.monotonic()
        with_service, without = ForeignLoad(), ForeignLoad()
        seen = set()
        while daemon.poll() is None:
            procs = group.service_processes()
            seen |= {p.pid for p in procs}
            with_service.sample(procs)
            without.sample([])
            time.sleep(0.05)
        assert daemon.pid in seen and len(seen) >= 2  # the daemon and the server it started
        # the two burn 3 CPU-seconds between them however busy the host is (a busy one only
        # stretches the window): most of them are the trial's, and foreign load drops by them
        ours_s = with_service.ours_s()
        assert ours_s >= 2.0, ours_s
        drop = without.cores() - with_service.cores()
        assert drop >= 0.8 * ours_s / (time.monotonic() - t0), (drop, ours_s)
    finally:
        daemon.kill()
        daemon.wait()
    assert RankGroup(launched=[], plan=group.plan, launcher=group.launcher).service_processes() \
        == []
