"""Foreign load: CPU time spent on this machine by processes that are not ours during a probe.

System busy time (from the kernel's counters) minus the CPU time of the controller and of every
process of the trial: its launches' trees, and the ranks an engine (``srun``, ``mpirun``) started
on this host, found by their marker (`autotune.hardware.proc.MarkedScan`). Other hosts' load is
not readable from here; a probe of ranks on several hosts says so. What is left, divided by the elapsed time, is in cores: 1.0 means another
program kept one core busy the whole probe. Measured here: one such program slowed a 2-thread
config 10-14x, so a probe under it is flagged rather than compared.
"""

from __future__ import annotations

import os
import time

import psutil

FOREIGN_CORES_LIMIT = 0.3


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in
               ("user", "nice", "system", "irq", "softirq", "steal"))


def _proc_cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def cpu_s(procs) -> float:
    """CPU seconds (user + system) the processes used so far; one that just ended counts 0."""
    total = 0.0
    for proc in procs:
        try:
            total += _proc_cpu_s(proc)
        except psutil.Error:
            pass
    return total


class ForeignLoad:
    """Accumulates our own CPU time while a probe runs; `cores()` gives the foreign rest."""

    def __init__(self):
        self._me = psutil.Process(os.getpid())
        self._t0 = time.monotonic()
        self._wall0 = time.time()
        self._busy0 = _busy_s()
        self._me0 = _proc_cpu_s(self._me)
        self._ours: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, ctime) -> first, last

    def sample(self, procs: list[psutil.Process]) -> None:
        """Record the CPU time of the trial's live processes (call every tick)."""
        for proc in procs:
            try:
                key = (proc.pid, proc.create_time())
                cpu = _proc_cpu_s(proc)
            except psutil.Error:
                continue
            if key not in self._ours:
                # Born during the probe: all its CPU time is ours, from zero.
                first = 0.0 if key[1] >= self._wall0 else cpu
            else:
                first = self._ours[key][0]
            self._ours[key] = (first, cpu)

    def ours_s(self) -> float:
        """CPU seconds the sampled processes used since construction."""
        return sum(last - first for first, last in self._ours.values())

    def ours_cores(self) -> float:
        """The sampled processes' average CPU use in cores since construction."""
        elapsed = time.monotonic() - self._t0
        return self.ours_s() / elapsed if elapsed > 0 else 0.0

    def cores(self) -> float:
        """Average foreign load in cores since construction (never negative)."""
        elapsed = time.monotonic() - self._t0
        if elapsed <= 0:
            return 0.0
        busy = _busy_s() - self._busy0
        mine = _proc_cpu_s(self._me) - self._me0
        ours = self.ours_s()
        return max(0.0, (busy - mine - ours) / elapsed)
