"""Foreign load: CPU time spent on this machine by processes that are not ours during a probe.

System busy time (from the kernel's counters) minus the CPU time of the controller and of every
process of the trial: its launches' trees, and the ranks an engine (``srun``, ``mpirun``) started
on this host, found by their marker (`autotune.hardware.proc.MarkedScan`). Other hosts' load is
not readable from here; a probe of ranks on several hosts says so. What is left, divided by the
elapsed time, is in cores: 1.0 means another program kept one core busy the whole probe.
Measured here: one such program slowed a 2-thread config 10-14x, so a probe under it is flagged
rather than compared.

A probe's figure stands on its steady span, so that is the span its load is judged over
(`ForeignLoad.cores_over`): a start-up's work no process is charged for (an engine creating its
step, authenticating it, the kernel setting up the ranks' links) and a rank's CPU time between the
last sample and its exit at the stop slowed nothing the figure counts.
"""

from __future__ import annotations

import os
import time

import psutil

from autotune.hardware import proc as procs

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
        self._born0 = procs.birth_clock()
        self._busy0 = _busy_s()
        self._me0 = _proc_cpu_s(self._me)
        self._ours: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, ctime) -> first, last
        # at each sample: (monotonic time, busy CPU s, the controller's, the trial's since start)
        self._trail: list[tuple[float, float, float, float]] = [(self._t0, self._busy0,
                                                                 self._me0, 0.0)]

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
                first = 0.0 if key[1] >= self._born0 else cpu
            else:
                first = self._ours[key][0]
            self._ours[key] = (first, cpu)
        self._trail.append((time.monotonic(), _busy_s(), _proc_cpu_s(self._me), self.ours_s()))

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

    def cores_over(self, t0: float, t1: float) -> float:
        """Average foreign load in cores over the samples from ``t0`` to ``t1``
        (time.monotonic()); the whole span so far when fewer than two samples fall inside."""
        over = span_cores(self._trail, t0, t1)
        return self.cores() if over is None else over


def span_cores(trail, t0: float, t1: float) -> float | None:
    """Foreign cores between the first sample at or after ``t0`` and the last at or before
    ``t1`` of ``trail`` ((t, busy s, controller s, trial s) in time order); None when fewer
    than two samples fall inside, or they are not apart."""
    inside = [row for row in trail if t0 <= row[0] <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (ta, busy_a, me_a, ours_a), (tb, busy_b, me_b, ours_b) = inside[0], inside[-1]
    return max(0.0, ((busy_b - busy_a) - (me_b - me_a) - (ours_b - ours_a)) / (tb - ta))
