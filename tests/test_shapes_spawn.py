"""Scripts that start their own processes with multiprocessing's spawn or forkserver method:
ranks of ``torch.multiprocessing.spawn`` are metered (from their first DataLoader, distributed
init, backward or optimizer step), DataLoader workers and helpers never are."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from autotune.launching import rank_command
from autotune.launching.collector import Collector
from autotune.store.journal import read_events
from autotune.tuning.baseline import BASELINE_TRIES
from autotune.measuring.outcome import Outcome
from probes import autostart, protocol
from conftest import autotune
from test_shapes_e2e import agrees, log, own_rate_within, probe, script
from test_shapes_probes import received

ADDR = {protocol.ENV_ADDR: "127.0.0.1:1"}
SPAWN_ARGV = ["python", "-c", "from multiprocessing.spawn import spawn_main; "
              "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork"]
FORKSERVER_ARGV = ["python", "-c", "from multiprocessing.forkserver import main; "
                   "main(4, 5, ['__main__'], **{'sys_path': []})"]
STARTED_NOTE = "the script starts its own training processes (multiprocessing 'spawn')"
# shape_spawn.py's rendezvous port is fixed (29533, as scripts in the wild write it): the tests
# that run it share one xdist group, so that two never listen on it at once (CI once failed one
# with EADDRINUSE).
FIXED_PORT = pytest.mark.xdist_group("shape-spawn-port")


# -- pure decisions ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, plan, method", [
    (["python", "train.py"], autostart.NOW, None),
    (SPAWN_ARGV, autostart.WHEN_TRAINING, "spawn"),
    (FORKSERVER_ARGV, autostart.WHEN_TRAINING, "forkserver"),
    (["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"], None, None),
    (["python", "-m", "probes.boot", "train.py"], None, None),
])
def test_how_a_process_is_metered(argv, plan, method):
    assert autostart.plan(argv, ADDR) == plan
    assert autostart.start_method(argv) == method
    assert autostart.plan(argv, {}) is None


@pytest.mark.parametrize("bootstrapped, target, worker, role", [
    (True, "torch.multiprocessing.spawn._wrap", False, autostart.TRAINING),
    (True, "__mp_main__.train", False, autostart.TRAINING),
    (True, None, False, autostart.TRAINING),  # a Process subclass with its own run()
    (True, autostart.LOADER_WORKER_TARGET, False, autostart.HELPER),
    (True, "__mp_main__.anything", True, autostart.HELPER),  # torch's worker info is set
    (False, None, False, None),  # still importing the parent's main module: not yet
    (False, autostart.LOADER_WORKER_TARGET, False, autostart.HELPER),
])
def test_what_a_multiprocessing_child_is(bootstrapped, target, worker, role):
    assert autostart.role(bootstrapped=bootstrapped, target=target, loader_worker=worker) == role


def test_how_a_child_left():
    assert autostart.exit_status(None) == (0, None)
    assert autostart.exit_status(SystemExit(0)) == (0, None)
    assert autostart.exit_status(SystemExit(None)) == (0, None)
    assert autostart.exit_status(SystemExit("bad")) == (1, None)
    boom = RuntimeError("boom")
    assert autostart.exit_status(boom) == (1, boom)
    try:  # what torch.multiprocessing.spawn does with a failing rank
        try:
            raise boom
        except RuntimeError:
            sys.exit(1)
    except SystemExit as exc:
        assert autostart.exit_status(exc) == (1, boom)
    assert autostart.exit_status(KeyboardInterrupt()) == (1, None)


# -- real children, through the sitecustomize ---------------------------------------------------
def run_script(tmp_path, code, collector, **env):
    path = tmp_path / "main.py"
    path.write_text(textwrap.dedent(code))
    full = dict(os.environ)
    # Unbuffered, print() writes a line's text and its newline apart, and another process's
    # line can land between them on the shared pipe; buffered, a flushed print is one write.
    for var in (*protocol.KNOB_ENV.values(), "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "PYTHONUNBUFFERED"):
        full.pop(var, None)
    full.update(collector.env(), PYTHONPATH=rank_command.python_path(""), **env)
    return subprocess.run([sys.executable, str(path)], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)


def by_connection(collector):
    """{pid: (hello, [messages])}, once every connection has said goodbye."""
    conns = {}
    for r in received(collector):
        conns.setdefault(r.conn_id, (r.hello, []))[1].append(r.msg)
    return {hello["pid"]: (hello, msgs) for hello, msgs in conns.values()}


def last_tick(msgs):
    return [m for m in msgs if m["type"] == "tick"][-1]


def test_spawned_children_are_metered_once_they_train(tmp_path):
    collector = Collector()
    try:
        done = run_script(tmp_path, """
            import multiprocessing as mp, os
            import torch
            from torch.utils.data import DataLoader

            def helper():  # imports torch, never trains
                torch.zeros(3).sum()
                print("helper", os.getpid(), flush=True)

            def loads():  # first sign of training: a DataLoader is built
                loader = DataLoader(list(range(40)), batch_size=8)
                print("loads", os.getpid(), loader.batch_size, torch.get_num_threads(), flush=True)
                for batch in loader:
                    pass

            def steps():  # first sign: an optimizer step (no DataLoader, no backward)
                optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
                for _ in range(3):
                    optimizer.step()
                print("steps", os.getpid(), torch.get_num_threads(), flush=True)

            def fails():
                DataLoader(list(range(8)))
                print("fails", os.getpid(), flush=True)
                raise RuntimeError("CUDA error: out of memory")

            if __name__ == "__main__":
                for method, target in [("spawn", helper), ("spawn", loads), ("spawn", steps),
                                       ("spawn", fails), ("forkserver", loads),
                                       ("fork", loads)]:
                    p = mp.get_context(method).Process(target=target)
                    p.start()
                    p.join()
                    print("exit", target.__name__, method, p.exitcode, flush=True)
        """, collector, AUTOTUNE_BATCH_SIZE="4", AUTOTUNE_THREADS="1")
        conns = by_connection(collector)
    finally:
        collector.close()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.findall(r"exit (\w+) (\w+) (\d+)", out) == [
        ("helper", "spawn", "0"), ("loads", "spawn", "0"), ("steps", "spawn", "0"),
        ("fails", "spawn", "1"), ("loads", "forkserver", "0"), ("loads", "fork", "0")]
    pids = {name: [int(p) for p in re.findall(rf"^{name} (\d+)", out, re.M)]
            for name in ("helper", "loads", "steps", "fails")}
    assert pids["helper"][0] not in conns  # never metered
    parent = [pid for pid, (hello, _) in conns.items() if not hello.get("sub")]
    assert len(parent) == 1 and len(conns) == 1 + 3 + 1 + 1
    # The knobs reached the very DataLoader whose construction started the meter.
    assert re.findall(r"^loads \d+ (\d+) (\d+)$", out, re.M) == [("4", "1")] * 3
    assert re.findall(r"^steps \d+ (\d+)$", out, re.M) == ["1"]
    for pid, method in zip(pids["loads"], ("spawn", "forkserver", "fork")):
        hello, msgs = conns[pid]
        assert hello["sub"] is True
        assert last_tick(msgs)["samples"] == 40
        started = next(m for m in msgs if m.get("what") == protocol.SEEN_STARTED_BY_SCRIPT)
        assert started["requested"]["start_method"] == method
        assert started["requested"]["target"].endswith(".loads")
        assert msgs[-1] == {**msgs[-1], "type": "bye", "exit_code": 0}
    _, msgs = conns[pids["steps"][0]]
    assert last_tick(msgs)["steps"] == 3  # the step that started the meter counts too
    _, msgs = conns[pids["fails"][0]]
    error = next(m for m in msgs if m["type"] == "error")
    assert error["kind"] == "oom" and error["exc_type"] == "RuntimeError"
    assert msgs[-1]["type"] == "bye" and msgs[-1]["exit_code"] == 1


def test_spawned_loader_workers_are_not_metered_and_keep_one_thread(tmp_path):
    collector = Collector()
    try:
        done = run_script(tmp_path, """
            import os
            import torch
            from torch.utils.data import DataLoader

            def report(worker_id):
                print(f"worker {os.getpid()} threads {torch.get_num_threads()}", flush=True)

            # Built again in every spawned worker as it imports this file.
            AT_IMPORT = DataLoader(list(range(8)), batch_size=4)

            if __name__ == "__main__":
                loader = DataLoader(list(range(64)), batch_size=8, num_workers=2,
                                    multiprocessing_context="spawn", worker_init_fn=report)
                for epoch in range(2):
                    for batch in loader:
                        pass
                print("main", os.getpid(), "threads", torch.get_num_threads(), flush=True)
        """, collector, AUTOTUNE_THREADS="2")
        conns = by_connection(collector)
    finally:
        collector.close()
    assert done.returncode == 0, done.stderr
    workers = re.findall(r"^worker (\d+) threads (\d+)$", done.stdout, re.M)
    assert len(workers) == 4 and {threads for _, threads in workers} == {"1"}
    main_pid = int(re.search(r"^main (\d+) threads 2$", done.stdout, re.M).group(1))
    assert list(conns) == [main_pid]  # metered once: the workers are not ranks
    assert last_tick(conns[main_pid][1])["samples"] == 128


# -- end to end ------------------------------------------------------------------------------------
@pytest.mark.slow
@FIXED_PORT
def test_ranks_started_with_torch_multiprocessing_spawn_are_measured(tmp_path):
    # 5 s measured at least: the script's own figure needs three of its half-second lines past
    # its first 1.5 s, and under CI's load a probe tight after 3 s held only two
    r = probe(tmp_path, script("shape_spawn.py", "--procs", "2"), max_s=60.0,
              min_measure_s=5.0, knobs={"threads": 1, "batch_size": 8, "bucket_mb": 4})
    assert r.outcome == Outcome.OK, r.reason
    assert r.source == "dataloader"
    text = log(r)
    for rank in (0, 1):  # every knob reached each rank's first DataLoader and DDP
        assert f"rank {rank} loader batch_size=8 num_workers=0 threads 1 bucket_mb 4.0 " \
               f"world 2" in text
    assert r.seen["batch_size"] == 16 and r.seen["bucket_mb"] is None
    assert any(n.text.startswith(STARTED_NOTE) for n in r.notes)
    # Both ranks carry the environment's rank 0 and are summed: the job's figure.
    own = sum(own_rate_within(text, r.window_start_t, r.window_end_t, prefix=f"rank {k} ")
              for k in (0, 1))
    assert agrees(r.samples_per_s, own)  # probe() checks that no process outlived the trial


@pytest.mark.slow
@FIXED_PORT
def test_a_spawned_ranks_own_figure_scales_by_torchs_world_size(tmp_path):
    """``--metric`` with a per-rank figure: the job's rate is it times the world torch reports,
    not the one process autotune started."""
    r = probe(tmp_path, script("shape_spawn.py", "--procs", "2"), max_s=60.0,
              min_measure_s=5.0, metric=r"rank 0 samples/s (?P<rank_samples_per_s>[\d.]+)")
    assert r.outcome == Outcome.OK and r.source == "metric", r.reason
    assert r.seen["world_size"] == 2
    text = log(r)
    assert agrees(r.samples_per_s,
                  2 * own_rate_within(text, r.window_start_t, r.window_end_t, prefix="rank 0 "))


@pytest.mark.slow
@FIXED_PORT
def test_a_global_batch_is_divided_by_the_world_the_script_starts(tmp_path):
    """--global-batch 32 for a script that spawns 2 ranks itself: each rank's loader gets 16,
    and the baseline is measured again with it (the first probe could not know the world)."""
    runs = tmp_path / "runs"
    p = autotune("tune", "--plain", "--json", "--foreign-limit", "1000", "--global-batch", "32",
                 "--trials", "1", "--seconds", "12", "--confirm-rounds", "0",
                 "--fix", "threads=1", "workers=0", "--recipe-dir", str(tmp_path / "recipes"),
                 "--", *script("shape_spawn.py", "--procs", "2"), cwd=tmp_path,
                 env=dict(os.environ, AUTOTUNE_RUNS_DIR=str(runs)), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the script starts its own 2 ranks, so each rank's batch is 16" in p.stderr
    run_dir, = runs.iterdir()
    state = json.loads((run_dir / "tune.json").read_text())
    assert state["baseline"]["knobs"]["batch_size"] == 16
    assert state["space"]["devices"] == 2 and "batch_size" not in state["space"]["domains"]
    baselines = [e for e in read_events(run_dir)[0]
                 if e["event"] == "trial_finished" and e["trial"] == "baseline"]
    # the first at 32 per rank, then again at 16 (each may take up to BASELINE_TRIES longer
    # tries when a loaded machine starts the spawned ranks too slowly for the first window)
    batches = [e["result"]["knobs"].get("batch_size") for e in baselines]
    assert batches[0] == 32 and batches[-1] == 16 and 2 <= len(batches) <= 2 * BASELINE_TRIES, \
        batches
    assert batches == sorted(batches, reverse=True), batches  # never back to 32
    logs = sorted((run_dir / "logs").glob("baseline*.log"))
    assert "rank 1 loader batch_size=16 " in logs[-1].read_text()
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["best"]["knobs"]["batch_size"] == 16
