"""bench/rank_waits.py: which processes are ranks, and the counters' growth per second."""

import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import rank_waits  # noqa: E402

SCRIPT = "/x/examples/compute_bound/train.py"


def test_only_the_script_s_own_processes_are_ranks():
    assert rank_waits.is_rank(["python", "-u", SCRIPT, "--batch-size", "16"], SCRIPT)
    assert rank_waits.is_rank(["python", "-m", "probes.boot", SCRIPT], SCRIPT)
    assert not rank_waits.is_rank(["python", "-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node=2", SCRIPT], SCRIPT)
    assert not rank_waits.is_rank(["python", "-m", "autotune", "run", "--plain", "--recipe",
                                   "r.json", "--", SCRIPT], SCRIPT)
    assert not rank_waits.is_rank(["python", "bench/bench_parity.py", "--probe-one",
                                   '{"config": "short-2r"}'], SCRIPT)
    assert not rank_waits.is_rank(["python", "other.py"], SCRIPT)


def test_growth_is_summed_over_the_threads_alive_at_both_reads():
    zero = dict.fromkeys(("on_s", "wait_s", "migrations", "voluntary", "involuntary"), 0.0)
    before = {(1, 1): zero, (1, 2): {**zero, "on_s": 1.0}, (1, 3): zero}
    after = {(1, 1): {**zero, "on_s": 2.0, "wait_s": 0.5, "voluntary": 40},
             (1, 2): {**zero, "on_s": 3.0, "migrations": 10},
             (1, 4): {**zero, "on_s": 9.0}}  # born after the first read: left out
    got = rank_waits.per_second(before, after, 2.0)
    assert got == {"on_s": 2.0, "wait_s": 0.25, "migrations": 5.0, "voluntary": 20.0,
                   "involuntary": 0.0}


def test_a_busy_thread_s_time_on_a_core_is_read_from_the_kernel():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    t = threading.Thread(target=spin)
    before = rank_waits.thread_counters(os.getpid())
    t.start()
    deadline = time.monotonic() + 10.0  # a loaded machine gives it a core later
    while True:
        after = rank_waits.thread_counters(os.getpid())  # while it still runs
        if after.get(t.native_id, {}).get("on_s", 0.0) > 0.05 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    stop.set()
    t.join()
    assert t.native_id in after and t.native_id not in before
    main = after[threading.main_thread().native_id]
    assert set(main) == {"on_s", "wait_s", "migrations", "voluntary", "involuntary"}
    assert after[t.native_id]["on_s"] > 0.05, after[t.native_id]
