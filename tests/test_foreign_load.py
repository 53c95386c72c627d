"""The foreign-load guard knows the trial's ranks wherever they were started: an engine's ranks
(children of slurmstepd or of an ssh session, not of the controller) are found by their
AUTOTUNE_TRIAL marker (autotune/hardware/proc.py MarkedScan), with their children."""

import os
import subprocess
import sys
import time

from autotune.hardware import proc
from autotune.measuring.foreign_load import ForeignLoad
from probes import protocol

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"


def _start(marker):
    """A stand-in rank carrying ``marker`` that starts a child (a DataLoader worker) without
    it; both spin 1.5 CPU-seconds."""
    env = dict(os.environ, **{protocol.ENV_TRIAL: marker})
    code = ("import os, subprocess, sys\n"
            f"env = {{k: v for k, v in os.environ.items() if k != {protocol.ENV_TRIAL!r}}}\n"
            f"c = subprocess.Popen([sys.executable, '-c', {SPIN!r}], env=env)\n"
            f"{SPIN}c.wait()\n")
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def test_marked_ranks_and_their_children_are_the_trial_s_not_foreign_load():
    rank = _start("trial-abc-r0")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env=dict(os.environ, **{protocol.ENV_TRIAL: "someone-else-r0"}))
    try:
        scan = proc.MarkedScan({"trial-abc-r0"}, rescan_s=0.2)
        t0 = time.monotonic()
        with_scan, without = ForeignLoad(), ForeignLoad()
        seen = set()
        while rank.poll() is None:
            procs = scan.processes()
            seen |= {p.pid for p in procs}
            with_scan.sample(procs)
            without.sample([])
            time.sleep(0.05)
        assert rank.pid in seen and len(seen) == 2, seen  # the rank and its worker
        assert other.pid not in seen
        ours_s = with_scan.ours_s()
        assert ours_s >= 2.0, ours_s
        drop = without.cores() - with_scan.cores()
        assert drop >= 0.8 * ours_s / (time.monotonic() - t0), (drop, ours_s)
    finally:
        for p in (rank, other):
            p.kill()
            p.wait()


def test_the_process_table_is_scanned_for_new_pids_at_most_every_rescan_s():
    slow = proc.MarkedScan({"trial-late-r0"}, rescan_s=60.0)
    fast = proc.MarkedScan({"trial-late-r0"}, rescan_s=0.0)
    assert slow.processes() == [] and fast.processes() == []
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                            env=dict(os.environ, **{protocol.ENV_TRIAL: "trial-late-r0"}))
    try:
        assert [p.pid for p in fast.processes()] == [late.pid]
        assert slow.processes() == []  # found at its next scan, not at every tick
    finally:
        late.kill()
        late.wait()
    assert fast.processes() == []  # gone: no longer given
