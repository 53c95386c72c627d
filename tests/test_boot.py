"""`python -m probes.boot SCRIPT ARGS` behaves as `python SCRIPT ARGS`, with knobs applied."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.launching.group import RanksSpec, free_port
from autotune.launching.rank_command import PROJECT_ROOT
from autotune.measuring import fullrun
from autotune.store.journal import Journal, read_events
from conftest import SCRIPTS
from probes import boot, protocol


def run(script: Path, *args, env=None, cwd=None, boot=True):
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(PROJECT_ROOT)
    for var in protocol.KNOB_ENV.values():
        full_env.pop(var, None)
    full_env.update(env or {})
    argv = [sys.executable, "-m", "probes.boot"] if boot else [sys.executable]
    return subprocess.run([*argv, str(script), *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or script.parent, timeout=120)


@pytest.fixture
def write(tmp_path):
    def _write(name, body):
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path
    return _write


def test_same_view_of_the_world_as_python(write, tmp_path):
    script = write("show.py", """
        import os, sys
        print(__name__, sys.argv, sys.path[0], os.getcwd(), sep="|")
    """)
    other = tmp_path / "elsewhere"
    other.mkdir()
    plain = run(script, "-x", "1", cwd=other, boot=False)
    booted = run(script, "-x", "1", cwd=other)
    assert booted.returncode == plain.returncode == 0
    assert booted.stdout == plain.stdout
    name, argv, path0, cwd = booted.stdout.strip().split("|")
    assert name == "__main__" and path0 == str(tmp_path) and cwd == str(other)


@pytest.mark.parametrize("body, code, err", [
    ("import sys; sys.exit(3)", 3, ""),
    ("import sys; sys.exit('fatal: no data')", 1, "fatal: no data"),
    ("raise ValueError('bad config')", 1, "ValueError: bad config"),
    ("pass", 0, ""),
])
def test_exit_codes_match_python(write, body, code, err):
    script = write("exit.py", body)
    plain = run(script, boot=False)
    booted = run(script)
    assert booted.returncode == plain.returncode == code
    assert err in booted.stderr and err in plain.stderr


def test_missing_script(tmp_path):
    result = run(tmp_path / "nope.py")
    assert result.returncode == 2 and "can't open file" in result.stderr


LOADER = """
    import torch
    from torch.utils.data import DataLoader
    dl = DataLoader(list(range(100)), batch_size=32, num_workers=2, prefetch_factor=4,
                    persistent_workers=True)
    print("loader", dl.batch_size, dl.num_workers, dl.prefetch_factor, dl.persistent_workers)
    print("threads", torch.get_num_threads())
    torch.set_num_threads(1)
    print("after", torch.get_num_threads())
    print("batches", len(list(dl)))
"""


def test_knobs_applied_by_interception(write):
    script = write("loader.py", LOADER)
    result = run(script, env={protocol.ENV_BATCH_SIZE: "10", protocol.ENV_WORKERS: "0",
                              protocol.ENV_THREADS: "2"})
    assert result.returncode == 0, result.stderr
    assert "loader 10 0 None False" in result.stdout
    assert "threads 2" in result.stdout
    assert "after 2" in result.stdout  # the knob under test is not silently undone
    assert "batches 10" in result.stdout


def test_no_knobs_leaves_script_alone(write):
    script = write("loader.py", LOADER)
    result = run(script)
    assert result.returncode == 0, result.stderr
    assert "loader 32 2 4 True" in result.stdout
    assert "after 1" in result.stdout


def test_a_loader_the_script_lets_go_of_is_freed_as_under_python(write):
    # A persistent-worker loader keeps its iterator; an iterator that kept its loader made a
    # cycle only the collector frees, so the loader's orderly shutdown did not run when the
    # script dropped it. On CUDA (pin_memory) torch's exit hook then waited 5 s per worker.
    script = write("drop.py", """
        import gc, weakref
        gc.disable()
        from torch.utils.data import DataLoader

        def train():
            dl = DataLoader(list(range(64)), batch_size=8, num_workers=1,
                            persistent_workers=True)
            it = iter(dl)
            next(it)
            return weakref.ref(dl), weakref.ref(it)

        refs = train()
        print("alive", [r() is not None for r in refs])
    """)
    plain = run(script, boot=False)
    booted = run(script)
    assert plain.returncode == booted.returncode == 0, booted.stderr
    assert "alive [False, False]" in plain.stdout
    assert booted.stdout == plain.stdout


def test_a_process_group_the_script_left_open_is_ended_once_the_script_has_finished():
    """Plain, the script's group is still open when the interpreter exits (where gloo aborts
    one exit in ten); booted, it was ended after the script returned, before the exit."""
    script = SCRIPTS / "group_left_open.py"
    one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    plain = run(script, "--steps", "3", env={**one, "MASTER_PORT": str(free_port())},
                boot=False)
    booted = run(script, "--steps", "3", env={**one, "MASTER_PORT": str(free_port())})
    assert plain.returncode == booted.returncode == 0, (plain.stderr, booted.stderr)
    assert "rank 0 trained 3 steps" in plain.stdout and "rank 0 trained 3 steps" in booted.stdout
    assert "rank 0 group open at exit: True" in plain.stdout
    assert "rank 0 group open at exit: False" in booted.stdout


def test_a_full_run_ends_the_groups_its_ranks_left_open_and_says_so(tmp_path):
    """Two ranks of a DDP script that leaves its group open: the full run ends 0, each rank's
    group was ended before its exit, and the run's notes say why once."""
    ranks = RanksSpec(command=(str(SCRIPTS / "group_left_open.py"), "--steps", "5"),
                      instances=2, cwd=str(tmp_path), log_dir=tmp_path / "logs", name="fullrun",
                      device="cpu")
    out = tmp_path / "out.txt"
    with out.open("w") as f:
        code = fullrun.run_full(fullrun.FullRunSpec(ranks=ranks, progress_every_s=1.0),
                                Journal(tmp_path), out=f)
    text = out.read_text()
    assert code == 0, text
    for rank in (0, 1):
        assert f"rank {rank} group open at exit: False" in text, text
    notes = [n for e in read_events(tmp_path)[0] if e["event"] == "fullrun_notes"
             for n in e["notes"]]
    assert notes.count(boot.GROUP_LEFT_OPEN) == 1, notes


TEARDOWN_HAZARD = """
    import atexit, os, sys, threading, time
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.destroy_process_group()
    out = sys.argv[1]
    log = open(os.path.join(out, "log.txt"), "w")  # never closed: flushed at the exit
    log.write("a line left in the buffer")
    atexit.register(lambda: open(os.path.join(out, "atexit.txt"), "w").write("ran"))

    def late():
        time.sleep(0.5)
        open(os.path.join(out, "thread.txt"), "w").write("done")

    threading.Thread(target=late).start()  # not a daemon: the exit waits for it


    class Native:
        # stands for gloo's worker thread in a core dump of an exit that aborted: it let go
        # of its last work (and the Python object in it) only once the main thread had gone
        # on into the teardown, and taking the GIL there ended it in C++'s abort
        def __del__(self):
            if sys.is_finalizing():
                os.abort()


    hazard = Native()
    hazard.cycle = hazard  # freed by a collection only: at the latest, the teardown's
    del hazard
    print("script done", flush=True)
"""


def test_a_rank_that_started_a_group_ends_with_its_code_before_the_teardown_can_abort_it(
        write, tmp_path):
    """After a clean end, a process that started a torch.distributed group exits short of the
    interpreter's teardown, where a group's native threads can abort it (SIGABRT after the
    last step, 2 exits in 25 of a 2-rank gloo DDP script here): what the teardown frees that
    would abort there aborts the plain run, not the booted one. Nothing a normal exit keeps is
    lost: a non-daemon thread's work, atexit functions, a file the script left open."""
    script = write("hazard.py", TEARDOWN_HAZARD)
    one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    results = {}
    for name, booted in (("plain", False), ("booted", True)):
        out = tmp_path / name
        out.mkdir()
        results[name] = run(script, str(out), boot=booted,
                            env={**one, "MASTER_PORT": str(free_port())})
        assert "script done" in results[name].stdout, results[name].stderr
    assert results["plain"].returncode == -6, results["plain"].stderr
    assert results["booted"].returncode == 0, results["booted"].stderr
    out = tmp_path / "booted"
    assert (out / "log.txt").read_text() == "a line left in the buffer"
    assert (out / "atexit.txt").read_text() == "ran"
    assert (out / "thread.txt").read_text() == "done"


def test_a_script_that_started_no_group_exits_through_the_interpreter_s_own_teardown(
        write, tmp_path):
    """Without a group the exit is Python's own, teardown included: what it frees there runs
    there (here it writes a file), as under ``python SCRIPT``."""
    script = write("plain_teardown.py", """
        import sys

        class Last:
            def __del__(self):
                if sys.is_finalizing():
                    open(sys.argv[1], "w").write("torn down")

        last = Last()
        last.cycle = last
        del last
    """)
    for booted in (False, True):
        mark = tmp_path / f"mark-{booted}.txt"
        p = run(script, str(mark), boot=booted)
        assert p.returncode == 0, p.stderr
        assert mark.read_text() == "torn down"


def test_a_rank_with_mpi_and_a_group_finalizes_mpi_before_it_leaves(write, tmp_path):
    """mpi4py ends MPI in a hook of the teardown, which a rank with a group skips after a clean
    end: MPI_Finalize runs first (it deletes MPI_COMM_SELF's attributes, whose callback here
    writes a file), so Open MPI's mpirun does not fail the job for a rank that never ended MPI."""
    pytest.importorskip("mpi4py")
    script = write("mpi_group.py", """
        import sys
        from mpi4py import MPI
        import torch.distributed as dist

        def deleted(comm, keyval, value):
            open(sys.argv[1], "w").write("MPI finalized")
            return MPI.SUCCESS

        MPI.COMM_SELF.Set_attr(MPI.COMM_SELF.Create_keyval(delete_fn=deleted), 1)
        dist.init_process_group("gloo")
        dist.destroy_process_group()
    """)
    mark = tmp_path / "finalized.txt"
    one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    p = run(script, str(mark), env=one)
    assert p.returncode == 0, p.stderr
    assert mark.read_text() == "MPI finalized"


def test_a_rank_with_a_group_and_a_library_s_idle_thread_pool_still_leaves(write, tmp_path):
    """A thread pool a library keeps and never shuts down (its idle workers are not daemons):
    Python's exit tells them to end before it joins them, and so does the way out of a rank
    with a group. Joined without that, they wait for work forever and the rank never exits."""
    write("pool_lib.py", """
        from concurrent.futures import ThreadPoolExecutor

        POOL = ThreadPoolExecutor(2)
    """)
    script = write("uses_pool.py", """
        import torch.distributed as dist
        import pool_lib

        dist.init_process_group("gloo")
        dist.destroy_process_group()
        print("pool says", pool_lib.POOL.submit(sum, [1, 2]).result(), flush=True)
    """)
    one = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    p = run(script, env=one)  # a rank that never exits fails this by run's timeout
    assert p.returncode == 0, p.stderr
    assert "pool says 3" in p.stdout
