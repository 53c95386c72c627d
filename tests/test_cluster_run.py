"""``autotune run --recipe`` and ``probe`` across the cluster bed's two hosts (issue 22), under
real Slurm allocations and through mpirun over ssh: a recipe tuned on two nodes runs on two and
on one; ``scancel`` (SIGTERM without Slurm), a rank killed on one node and a node lost mid-probe
each end in one clear line, leave nothing behind on any host, and keep the journal whole.

The recipe is written here (the tune that makes one is `test_cluster_tune`'s); its fingerprint
is this machine's, so nothing but the nodes differs from the run it describes.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from autotune.hardware import fingerprint
from autotune.store.journal import read_events
from autotune.tuning import recipes
from autotune.tuning.records import TunedOn
from conftest import (ROOT, SCRIPTS, bed_job_state, bed_settled, bed_slurm, bed_wait_job,
                      wait_for)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOB_TIMEOUT_S = 240.0
LOST_S = 40.0  # node2's link down this long in the lost-node test
LINK = "gloo allreduce of 2 ranks across 2 nodes: peak bus bandwidth 0.0118 GB/s"


def _recipe(tmp_path: Path, script: Path) -> Path:
    args = ("-b", "{batch_size}", "-j", "0", "--env-out", str(tmp_path / "envs"))
    fp = fingerprint.current([str(script), *args])
    r = recipes.Recipe(
        name="imagenet-shaped-bed", knobs={"batch_size": 64, "instances": 1, "thread_pct": 100,
                                           "bucket_mb": 4},
        samples_per_s=300.0, ci_half=20.0, baseline_samples_per_s=250.0, speedup=1.2,
        kept_baseline=False, fingerprint=fp, script_path=str(script), script_args=args,
        baseline_knobs={"batch_size": 32, "instances": 1}, trials=5, source="dataloader",
        tuned_on=TunedOn(nodes=2, busbw_gbps=0.0118, link=LINK))
    return recipes.save(r, tmp_path / "recipes")


def _script(tmp_path: Path) -> Path:
    """The imagenet-shaped script under a path no other test's processes carry (the marks
    `bed_settled` looks for)."""
    script = tmp_path / "imagenet_shaped.py"
    script.write_text((SCRIPTS / "shape_ddp_when_launched.py").read_text())
    return script


def _run_argv(tmp_path: Path, script: Path, *, workers: int, extra=()) -> list[str]:
    """``autotune run`` of ``script`` with a two-node recipe (`_recipe`), its ranks writing
    their launcher variables to an empty ``envs`` dir (`_worlds`)."""
    recipe = _recipe(tmp_path, script)
    envs = tmp_path / "envs"
    envs.mkdir(exist_ok=True)
    for old in envs.glob("*"):
        old.unlink()
    return [sys.executable, "-m", "autotune", "run", "--plain", "--recipe", str(recipe),
            str(script), "-b", "{batch_size}", "-j", str(workers), "--env-out", str(envs),
            *extra]


def _submit(cluster, tmp_path: Path, name: str, nodes: int, argv: list[str], *,
            exec_: bool = False, requeue: bool = True) -> tuple[str, Path]:
    """``sbatch -N nodes`` of ``argv`` (autotune's command line) with its exit code kept in
    ``<name>.rc``; the job id and the job's output file. With ``exec_`` the batch script is
    ``exec autotune ...`` (as docs/cluster.md's template): autotune is the batch step's own
    process, which Slurm signals and then waits for (KillWait) on ``scancel``; a shell that
    waits on it instead is killed by the signal, and the step's other processes with it."""
    out, rc_file = tmp_path / f"{name}.out", tmp_path / f"{name}.rc"
    job_name = f"{name}{os.getpid()}"
    wrap = "exec " + " ".join(argv) if exec_ else " ".join(argv) + f"; echo $? > {rc_file}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_RUNS_DIR=str(tmp_path / f"runs-{name}"))
    p = bed_slurm(cluster, "sbatch", "--parsable", "-N", str(nodes), "-n", str(nodes), "-t", "10",
                  *([] if requeue else ["--no-requeue"]), "--chdir", str(tmp_path), "-o",
                  str(out), "--wrap", wrap, env=env, job_name=job_name)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0], out


def _run_dir(tmp_path: Path, name: str) -> Path:
    return next((tmp_path / f"runs-{name}").glob("*-run-*"))


def _whole(run_dir: Path) -> list[dict]:
    """The run's journal, every line of it a complete event (none torn, none left out)."""
    skipped: list[int] = []
    events, end = read_events(run_dir, skipped=skipped)
    assert skipped == [] and end == (run_dir / "events.jsonl").stat().st_size, (skipped, end)
    return events


def _worlds(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) of every process the script started, by rank."""
    envs = [json.loads(p.read_text()) for p in (tmp_path / "envs").glob("env-*.json")]
    return sorted((e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) for e in envs)


def _probe_trains(runs: Path) -> bool:
    """A probe's run dir under ``runs`` holds a live estimate: its ranks train."""
    found = list(runs.glob("*-probe-*"))
    return bool(found) and any(e["event"] == "trial_progress" and e["samples_per_s"] > 0
                               for e in read_events(found[0])[0])


def _link(f, state: str) -> list[str]:
    """``ip`` setting node2's link ``up`` or ``down`` (the node lost to the others)."""
    return ["ip", "-n", f.namespaces[1], "link", "set", f.ifname, state]


def test_a_recipe_tuned_on_two_nodes_runs_on_two_and_on_one(cluster_nodes, tmp_path):
    """On two nodes: one rank on each (the recipe's instances per node), DDP across the link,
    exit 0, a whole journal. On one: the run says what carries over and flags the halved global
    batch and the bucket tuned for the two-node link, then runs one process, exit 0."""
    cluster = cluster_nodes
    script = _script(tmp_path)
    results = {}
    for name, nodes in (("two", 2), ("one", 1)):
        argv = _run_argv(tmp_path, script, workers=0, extra=("--epochs", "2"))
        job_id, out = _submit(cluster, tmp_path, name, nodes, argv)
        try:
            state = bed_wait_job(cluster, job_id, JOB_TIMEOUT_S)
        finally:
            bed_slurm(cluster, "scancel", job_id)
        log = out.read_text() if out.exists() else "(no job output)"
        rc = tmp_path / f"{name}.rc"
        assert rc.exists() and rc.read_text().strip() == "0", log[-4000:]
        assert state == ("COMPLETED", "0:0"), log[-4000:]
        events = _whole(_run_dir(tmp_path, name))
        kinds = [e["event"] for e in events]
        assert kinds[0] == "run_started" and kinds[-1] == "run_ended", kinds
        ended = next(e for e in events if e["event"] == "fullrun_ended")
        assert ended["exit_code"] == 0, ended
        results[name] = (next(e for e in events if e["event"] == "run_started"), log,
                         _worlds(tmp_path))

    started, log, worlds = results["two"]
    assert started["launcher"] == "srun on 2 hosts", started
    assert worlds == [("0", "2", "1"), ("1", "2", "1")], worlds
    assert "tuned on 2 node(s)" not in log  # the nodes it was tuned on: nothing to say

    started, log, worlds = results["one"]
    assert started["launcher"] == "local", started
    assert len(worlds) == 1 and worlds[0][1] in (None, "1"), worlds  # one process, no DDP
    assert f"tuned on 2 node(s) ({LINK}); this run has 1" in log, log[-3000:]
    assert "global batch goes from 128 (as tuned) to 64" in log, log[-3000:]
    assert f"bucket_mb=4 was tuned for {LINK}" in log, log[-3000:]
    assert bed_settled(cluster, (str(tmp_path),)) == []


def test_scancel_of_a_running_job_leaves_nothing_on_any_node(cluster_nodes, tmp_path):
    """A run on two nodes, cancelled by ``scancel`` once both ranks train: no process of it is
    left on either host (ranks, workers, the controller), its journal reads back whole, and the
    run says at once, in its output and its journal, that it was cancelled."""
    cluster = cluster_nodes
    script = _script(tmp_path)
    argv = _run_argv(tmp_path, script, workers=2)
    job_id, out = _submit(cluster, tmp_path, "cancel", 2, argv, exec_=True)
    try:
        def training() -> bool:
            runs = list((tmp_path / "runs-cancel").glob("*-run-*"))
            if not runs or len(_worlds(tmp_path)) < 2:
                return False
            events, _ = read_events(runs[0])
            return any(e["event"] == "fullrun_progress" and e["samples"] > 0 for e in events)

        wait_for(training, timeout_s=JOB_TIMEOUT_S, what="both ranks to train", poll_s=1.0)
        assert bed_job_state(cluster, job_id)[0] == "RUNNING"
        t0 = time.monotonic()
        p = bed_slurm(cluster, "scancel", job_id)
        assert p.returncode == 0, p.stderr
        state, exit_code = bed_wait_job(cluster, job_id, 120.0)
        took = time.monotonic() - t0
    finally:
        bed_slurm(cluster, "scancel", job_id)
    assert state == "CANCELLED" or state.startswith("CANCELLED"), state
    assert bed_settled(cluster, (str(tmp_path),)) == []
    events = _whole(_run_dir(tmp_path, "cancel"))
    # said at once (Slurm kills what is left KillWait seconds after the SIGTERM), then the
    # ranks' own end: killed by SIGTERM, 143, the job's exit code too
    said = "SIGTERM received (the Slurm job was cancelled or reached its time limit)"
    assert any(said in n for e in events if e["event"] == "fullrun_notes" for n in e["notes"])
    log = out.read_text()
    assert f"HINT: {said}" in log, log[-3000:]
    assert events[-1]["event"] == "run_ended" and events[-1]["exit_code"] == 143, events[-3:]
    assert exit_code == "143:0", (exit_code, log[-3000:])
    print(f"scancel: the job ended {took:.0f} s later; its output ends:\n{log[-600:]}")


def test_tune_and_run_through_mpirun_across_the_hosts(cluster_nodes, tmp_path):
    """Without Slurm, the way clusters start MPI: ``autotune tune --hostfile`` on node1, whose
    mpirun (MPICH's Hydra over the bed's ssh) starts ranks on both hosts; then ``autotune run
    --recipe`` through the same hostfile. Exit 0 both times, no crashed probe, probes of ranks
    on both hosts, the allreduce timed across them, the recipe's [tuned_on] the two nodes and
    their link, and nothing left on either host."""
    pytest.importorskip("mpi4py")
    from autotune.launching import engines

    mpi = engines.detect_mpi(os.environ)
    if mpi is None or mpi.flavor == "openmpi":
        pytest.skip("the bed's ssh launch is set up for MPICH's Hydra (pip mpich)")
    cluster = cluster_nodes
    f = cluster.facts
    script = _script(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
               GLOO_SOCKET_IFNAME=f.ifname)
    tune = [sys.executable, "-m", "autotune", "tune", "--json", "--plain", "--hostfile",
            f.hostfile, "--trials", "3", "--seconds", "8", "--confirm-rounds", "1",
            "--foreign-limit", "1000", "--recipe-dir", str(tmp_path / "recipes"), str(script)]
    p = cluster.run(f.hosts[0], tune, env=env, timeout_s=480)
    assert p.returncode == 0, p.stderr[-4000:]
    summary = json.loads(p.stdout.splitlines()[-1])
    events, _ = read_events(summary["run_dir"])
    started = next(e for e in events if e["event"] == "run_started")
    assert started["launcher"].startswith("mpirun") and "2 hosts" in started["launcher"], started
    finished = [e for e in events if e["event"] == "trial_finished"]
    why = [(e["trial"], e["result"]["outcome"], e["result"]["reason"]) for e in finished]
    assert not any(o == "crashed" for _, o, _ in why), why
    across = [e for e in finished if sorted(e["result"]["hosts"]) == sorted(f.hosts)]
    assert across, why
    timing = next(e for e in events if e["event"] == "allreduce")
    assert timing.get("result") and timing["result"]["world_size"] == 2, timing
    recipe = recipes.load(summary["recipe"])
    assert recipe.tuned_on.nodes == 2 and "across 2 nodes" in recipe.tuned_on.link, recipe

    run = [sys.executable, "-m", "autotune", "run", "--plain", "--hostfile", f.hostfile,
           "--recipe", str(recipe.path), str(script), "--epochs", "2"]
    p = cluster.run(f.hosts[0], run, env=env, timeout_s=240)
    assert p.returncode == 0, p.stderr[-4000:]
    run_dir = next((tmp_path / "runs").glob("*-run-*"))
    events = _whole(run_dir)
    assert events[-1]["event"] == "run_ended" and events[-1]["exit_code"] == 0
    assert "tuned on 2 node(s)" not in p.stderr  # the same two nodes: nothing to flag
    assert bed_settled(cluster, (str(tmp_path),)) == []


def test_a_node_lost_mid_probe_is_one_clear_line_and_leaves_nothing(cluster_nodes, tmp_path):
    """``autotune probe`` of two ranks, one on each node, under ``sbatch -N 2``; once they train,
    node2's link goes down (the node is lost to the others: gloo's allreduce waits on it).
    The probe says it made no progress, in one line, with how long; the journal reads back
    whole; once the link is back (after the probe gave up on the step, and within Slurm's
    SlurmdTimeout, so the node is not declared down), the probe ends and nothing of the run is
    left on either host."""
    import subprocess

    cluster = cluster_nodes
    f = cluster.facts
    script = _script(tmp_path)
    argv = [sys.executable, "-m", "autotune", "probe", "--plain", "--modes", "full", "--seconds",
            "90", str(script), "--epochs", "1000"]
    # never run twice: a node Slurm did declare down would requeue the job (JobRequeue)
    job_id, out = _submit(cluster, tmp_path, "lost", 2, argv, requeue=False)
    down, up = _link(f, "down"), _link(f, "up")
    try:
        def training() -> bool:  # a live estimate: both ranks train, well before it is tight
            assert not (tmp_path / "lost.rc").exists(), out.read_text()[-3000:]  # ended early
            return _probe_trains(tmp_path / "runs-lost")

        wait_for(training, timeout_s=JOB_TIMEOUT_S, what="the probe's ranks to train",
                 poll_s=0.5)
        subprocess.run(down, check=True, timeout=30)
        lost_at = time.monotonic()
        run_dir = next((tmp_path / "runs-lost").glob("*-probe-*"))
        # lost for longer than the probe waits on a step without progress (30 s), and back
        # long before Slurm declares the node down (the bed's SlurmdTimeout, 300 s)
        time.sleep(LOST_S)
        subprocess.run(up, check=True, timeout=30)

        def finished() -> bool:
            return any(e["event"] == "trial_finished" for e in read_events(run_dir)[0])

        wait_for(finished, timeout_s=120.0, what="the probe to end", poll_s=1.0)
        ended_after = time.monotonic() - lost_at
    finally:
        subprocess.run(up, timeout=30)
    try:
        state, _ = bed_wait_job(cluster, job_id, 120.0)
    finally:
        bed_slurm(cluster, "scancel", job_id)
    events = _whole(run_dir)
    result = next(e for e in events if e["event"] == "trial_finished")["result"]
    assert result["outcome"] in ("hung", "crashed"), result
    assert "no progress for" in result["reason"] or "Connection" in result["reason"], result
    assert events[-1]["event"] == "run_ended", events[-3:]
    log = out.read_text()
    assert result["reason"].split(" (")[0][:40] in log, log[-3000:]
    assert bed_settled(cluster, (str(tmp_path),)) == []
    print(f"lost node: the probe ended {ended_after:.0f} s after the link went down "
          f"({result['outcome']}: {result['reason'][:200]}); the job ended {state}")


def test_a_rank_lost_on_one_node_ends_the_run_with_its_code(cluster_nodes, tmp_path):
    """A run on two nodes whose rank on node2 is killed (SIGKILL, as the OOM killer does) while
    both train: srun ends the step, the run ends with a failure code and one error line naming
    its log, the journal reads back whole, and nothing is left on either host."""
    import signal
    import subprocess

    cluster = cluster_nodes
    f = cluster.facts
    script = _script(tmp_path)
    argv = _run_argv(tmp_path, script, workers=0)
    job_id, out = _submit(cluster, tmp_path, "rank", 2, argv, exec_=True)

    def rank_on_node2() -> int | None:
        """The pid of the script's process in node2's namespace, once both ranks train."""
        runs = list((tmp_path / "runs-rank").glob("*-run-*"))
        if not runs or not any(e["event"] == "fullrun_progress" and e["samples"] > 0
                               for e in read_events(runs[0])[0]):
            return None
        p = subprocess.run(["ip", "netns", "pids", f.namespaces[1]], capture_output=True,
                           text=True, timeout=30)
        for pid in p.stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if str(script).encode() in fh.read():
                        return int(pid)
            except OSError:
                continue
        return None

    try:
        pid = wait_for(rank_on_node2, timeout_s=JOB_TIMEOUT_S, what="both ranks to train",
                       poll_s=1.0)
        os.kill(pid, signal.SIGKILL)
        state, exit_code = bed_wait_job(cluster, job_id, 120.0)
    finally:
        bed_slurm(cluster, "scancel", job_id)
    log = out.read_text()
    assert state == "FAILED" and exit_code != "0:0", (state, exit_code, log[-3000:])
    events = _whole(_run_dir(tmp_path, "rank"))
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    assert ended["exit_code"] != 0, ended
    assert events[-1]["event"] == "run_ended" and events[-1]["exit_code"] == ended["exit_code"]
    errors = [ln for ln in log.splitlines() if ln.startswith("ERROR:")]
    assert len(errors) == 1 and "fullrun.log" in errors[0], errors
    assert bed_settled(cluster, (str(tmp_path),)) == []


def _mpich_or_skip():
    """The bed's ssh launch is set up for MPICH's Hydra; the engine otherwise skips."""
    pytest.importorskip("mpi4py")
    from autotune.launching import engines

    mpi = engines.detect_mpi(os.environ)
    if mpi is None or mpi.flavor == "openmpi":
        pytest.skip("the bed's ssh launch is set up for MPICH's Hydra (pip mpich)")


def _on_node1(cluster, argv: list[str], env: dict, err: Path):
    """``argv`` started on node1 (not waited for): through ``ip netns exec``, ``nsenter`` and
    ``taskset``, each of which execs the next, so the process is autotune itself and a signal
    sent to it is the one a user's Ctrl-C or kill would send."""
    import subprocess

    return subprocess.Popen(cluster.on(cluster.facts.hosts[0], argv), env=cluster.env(env),
                            stdout=subprocess.DEVNULL, stderr=open(err, "w"))


def test_a_run_through_mpirun_stopped_by_sigterm_leaves_nothing_on_either_host(
        cluster_nodes, tmp_path):
    """`scancel`'s counterpart without Slurm: ``autotune run --hostfile`` on node1, its ranks
    (and their DataLoader workers) on both hosts through mpirun over ssh, SIGTERM once both
    train. The run says so at once, passes it on, ends 143 with a whole journal, and nothing of
    it is left on either host."""
    import signal

    _mpich_or_skip()
    cluster = cluster_nodes
    f = cluster.facts
    script = _script(tmp_path)
    argv = _run_argv(tmp_path, script, workers=2)
    at = argv.index("--plain") + 1  # autotune's flags go before the script's
    argv[at:at] = ["--hostfile", f.hostfile]
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
               GLOO_SOCKET_IFNAME=f.ifname)
    err = tmp_path / "term.err"
    p = _on_node1(cluster, argv, env, err)
    try:
        def training() -> bool:
            assert p.poll() is None, err.read_text()[-3000:]
            runs = list((tmp_path / "runs").glob("*-run-*"))
            return bool(runs) and len(_worlds(tmp_path)) >= 2 and any(
                e["event"] == "fullrun_progress" and e["samples"] > 0
                for e in read_events(runs[0])[0])

        wait_for(training, timeout_s=JOB_TIMEOUT_S, what="both ranks to train", poll_s=1.0)
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    log = err.read_text()
    assert code == 143, (code, log[-3000:])
    run_dir = next((tmp_path / "runs").glob("*-run-*"))
    events = _whole(run_dir)
    started = next(e for e in events if e["event"] == "run_started")
    assert started["launcher"].startswith("mpirun") and "2 hosts" in started["launcher"], started
    said = "SIGTERM received: passed on to the ranks, which are stopping"
    assert f"HINT: {said}" in log, log[-3000:]
    # MPICH's mpiexec returns 15 for ranks a SIGTERM ended; the run still ends as a shell
    # reports it, says it was stopped as asked, and blames no script
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    assert ended["signal"] == "SIGTERM" and ended["exit_code"] == 143, ended
    assert "HINT: the run stopped on SIGTERM, as asked (exit code 143)" in log, log[-3000:]
    assert "ERROR:" not in log, log[-3000:]
    assert events[-1]["event"] == "run_ended" and events[-1]["exit_code"] == 143, events[-3:]
    assert bed_settled(cluster, (str(tmp_path),)) == []


def test_a_node_lost_mid_probe_through_mpirun_is_one_clear_line_and_leaves_nothing(
        cluster_nodes, tmp_path):
    """The lost node again, with mpirun over ssh instead of Slurm: ``autotune probe --hostfile``
    on node1, one rank on each host; node2's link goes down once they train and comes back
    after the probe gave up on the step. One line says why, the journal is whole, and nothing
    is left on either host (the rank on node2 included, which mpirun's ssh reached)."""
    import subprocess

    _mpich_or_skip()
    cluster = cluster_nodes
    f = cluster.facts
    script = _script(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
               GLOO_SOCKET_IFNAME=f.ifname)
    argv = [sys.executable, "-m", "autotune", "probe", "--plain", "--hostfile", f.hostfile,
            "--modes", "full", "--seconds", "90", str(script), "--epochs", "1000"]
    err = tmp_path / "lost.err"
    p = _on_node1(cluster, argv, env, err)
    down, up = _link(f, "down"), _link(f, "up")
    try:
        def training() -> bool:
            assert p.poll() is None, err.read_text()[-3000:]
            return _probe_trains(tmp_path / "runs")

        wait_for(training, timeout_s=JOB_TIMEOUT_S, what="the probe's ranks to train",
                 poll_s=0.5)
        subprocess.run(down, check=True, timeout=30)
        lost_at = time.monotonic()
        time.sleep(LOST_S)  # longer than the probe waits on a step without progress (30 s)
        subprocess.run(up, check=True, timeout=30)
        code = p.wait(timeout=180)
        ended_after = time.monotonic() - lost_at
    finally:
        subprocess.run(up, timeout=30)
        if p.poll() is None:
            p.kill()
            p.wait()
    run_dir = next((tmp_path / "runs").glob("*-probe-*"))
    events = _whole(run_dir)
    result = next(e for e in events if e["event"] == "trial_finished")["result"]
    assert result["outcome"] in ("hung", "crashed"), result
    assert "no progress for" in result["reason"] or "Connection" in result["reason"], result
    assert sorted(result["hosts"]) == sorted(f.hosts), result  # it did run across the hosts
    assert events[-1]["event"] == "run_ended", events[-3:]
    log = err.read_text()
    assert code == 1, (code, log[-3000:])
    assert len([ln for ln in log.splitlines() if ln.startswith("ERROR:")]) == 1, log[-3000:]
    assert bed_settled(cluster, (str(tmp_path),)) == []
    print(f"lost node under mpirun: the probe ended {ended_after:.0f} s after the link went "
          f"down ({result['outcome']}: {result['reason'][:200]})")
