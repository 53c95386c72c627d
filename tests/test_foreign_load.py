"""The foreign-load guard knows the trial's ranks wherever they were started: an engine's ranks
(children of slurmstepd or of an ssh session, not of the controller) are found by their
AUTOTUNE_TRIAL marker (autotune/hardware/proc.py MarkedScan), with their children."""

import collections
import os
import subprocess
import sys
import time

import psutil
import pytest

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


def _step(marker, since_offset_s=0.0):
    """A stand-in ``slurmstepd``: an unmarked process that starts a marked rank and spins
    1.5 CPU-seconds itself (an engine's I/O forwarding), as a step's processes do."""
    rank = (f"import os, subprocess, sys\n"
            f"env = dict(os.environ, {protocol.ENV_TRIAL}={marker!r})\n"
            f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'], "
            f"env=env)\n{SPIN}c.wait()\n")
    env = {k: v for k, v in os.environ.items() if k != protocol.ENV_TRIAL}
    return subprocess.Popen([sys.executable, "-c", rank], env=env)


def _found_until_spun(scan):
    seen = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(seen) < 2:
        seen |= {p.pid for p in scan.processes()}
        time.sleep(0.05)
    return seen


def test_the_step_s_own_processes_born_for_the_trial_are_ours_and_older_daemons_are_not():
    before = proc.birth_clock()
    stepd = _step("trial-step-r0")
    try:
        scan = proc.MarkedScan({"trial-step-r0"}, rescan_s=0.0, since=before)
        seen = _found_until_spun(scan)
        assert stepd.pid in seen and len(seen) == 2, (stepd.pid, seen)
        # a step process older than the trial is a daemon serving others: left out
        later = proc.MarkedScan({"trial-step-r0"}, rescan_s=0.0, since=proc.birth_clock() + 0.5)
        found = {p.pid for p in later.processes()}
        assert len(found) == 1 and stepd.pid not in found, (stepd.pid, found)
    finally:
        for child in psutil.Process(stepd.pid).children(recursive=True):
            child.kill()
        stepd.kill()
        stepd.wait()


def test_load_is_judged_over_the_span_asked_for():
    """Samples: 1 s of start-up with 0.8 cores no process was charged for, then 4 s where the
    machine's busy time is all the trial's."""
    from autotune.measuring.foreign_load import Sample, span_cores
    trail = [Sample(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), Sample(1.0, 1.8, 0.1, 0.9, 0.0, 0.0)]
    for i in range(1, 5):
        t = 1.0 + i
        trail.append(Sample(t, 1.8 + 2.0 * i, 0.1 + 0.05 * i, 0.9 + 1.95 * i, 0.0, 0.0))
    assert span_cores(trail, 0.0, 5.0) == pytest.approx(0.8 / 5.0)
    assert span_cores(trail, 1.0, 5.0) == pytest.approx(0.0)


def test_interrupt_work_and_steal_are_reported_apart_not_judged_as_other_programs(monkeypatch):
    """The cluster bed's two ranks exchanging gradients: 0.4 cores of softirq and 0.5 of steal
    that no process carries, beside 0.1 cores of another program's user time."""
    from autotune.measuring import foreign_load
    Times = collections.namedtuple("Times", "user nice system idle iowait irq softirq steal")
    clock = {"t": 100.0}

    def cpu_times():
        dt = clock["t"] - 100.0
        return Times(user=50.0 + 0.1 * dt, nice=0.0, system=20.0, idle=0.0, iowait=0.0,
                     irq=1.0, softirq=3.0 + 0.4 * dt, steal=7.0 + 0.5 * dt)

    monkeypatch.setattr(foreign_load.psutil, "cpu_times", cpu_times)
    monkeypatch.setattr(foreign_load.time, "monotonic", lambda: clock["t"])
    monkeypatch.setattr(foreign_load, "_proc_cpu_s", lambda proc: 0.0)
    load = ForeignLoad()
    for _ in range(10):
        clock["t"] += 1.0
        load.sample([])
    assert load.cores() == pytest.approx(0.1)
    assert load.cores_over(102.0, 108.0) == pytest.approx(0.1)
    unowned = load.unowned_over(102.0, 108.0)
    assert (unowned.kernel_cores, unowned.steal_cores) == (pytest.approx(0.4), pytest.approx(0.5))
    assert "0.40 cores of the kernel's interrupt work" in unowned.note()
    assert "0.50 of hypervisor steal" in unowned.note()
    assert foreign_load.span_unowned([], 0.0, 1.0) is None
