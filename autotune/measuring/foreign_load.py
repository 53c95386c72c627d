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

What the guard judges is programs' CPU time: the kernel's user, nice and system counters. The
kernel's interrupt work (irq, softirq: network packets, the trial's own ranks' traffic among
them) and the hypervisor's steal (time another virtual machine held this one's CPU) belong to
no program; they are kept apart (`Unowned`) and reported, not judged. Measured on the cluster
bed while two ranks exchanged gradients over veth: softirq 0.2-0.45 cores and steal 0.1-0.8,
rising and falling with the ranks' traffic, while other programs used under 0.05. With tick
accounting, a softirq tick that lands in a rank is in that rank's system time too, so the
figure judged is a lower bound on other programs' time by at most the softirq reported beside it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import psutil

from autotune.hardware import proc as procs

FOREIGN_CORES_LIMIT = 0.3


class Sample(NamedTuple):
    """One tick of the guard: cumulative seconds since boot (``busy``, ``kernel``, ``steal``)
    or since the guard began (``me``: the controller's CPU time; ``ours``: the trial's)."""
    t: float  # time.monotonic()
    busy: float  # programs' CPU time on this machine: user + nice + system
    me: float
    ours: float
    kernel: float  # interrupt work no program carries: irq + softirq
    steal: float  # time the hypervisor gave this machine's CPUs to others


@dataclass(frozen=True)
class Unowned:
    """CPU time no program carries, in cores over a span: the kernel's interrupt work and the
    hypervisor's steal. Not judged as other programs' load; it widens a probe's noise."""
    kernel_cores: float
    steal_cores: float

    @property
    def cores(self) -> float:
        return self.kernel_cores + self.steal_cores

    def note(self) -> str:
        return (f"{self.kernel_cores:.2f} cores of the kernel's interrupt work (network "
                f"packets, the trial's own among them) and {self.steal_cores:.2f} of hypervisor "
                f"steal (other virtual machines held this one's CPUs) while it measured: no "
                f"program carries them, so they are not counted as other programs' load, but "
                f"they slow the probe and widen its noise")


def _counters() -> tuple[float, float, float]:
    """(programs' CPU s, interrupt CPU s, steal s) since boot, all CPUs together."""
    t = psutil.cpu_times()
    busy = sum(getattr(t, name, 0.0) for name in ("user", "nice", "system"))
    kernel = sum(getattr(t, name, 0.0) for name in ("irq", "softirq"))
    return busy, kernel, getattr(t, "steal", 0.0)


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
    """Accumulates our own CPU time while a probe runs; `cores()` gives the foreign rest.

    ``others``: processes of this tune's that are not the trial's (the trials it takes turns
    with, `autotune.measuring.alternate`): their CPU is counted with the controller's, not as
    foreign load, nor as the trial's."""

    def __init__(self, others: Callable[[], list[psutil.Process]] | None = None):
        self._others = others
        self._theirs: dict[tuple[int, float], tuple[float, float]] = {}
        self._me = psutil.Process(os.getpid())
        self._t0 = time.monotonic()
        self._born0 = procs.birth_clock()
        self._me0 = _proc_cpu_s(self._me)
        self._ours: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, ctime) -> first, last
        busy, kernel, steal = _counters()
        self._trail: list[Sample] = [Sample(self._t0, busy, self._me0, 0.0, kernel, steal)]

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
        self._trail.append(self._now())

    def _their_s(self) -> float:
        """CPU seconds ``others`` used since construction (0 without them)."""
        if self._others is None:
            return 0.0
        for proc in self._others():
            try:
                key = (proc.pid, proc.create_time())
                cpu = _proc_cpu_s(proc)
            except psutil.Error:
                continue
            first = self._theirs[key][0] if key in self._theirs else \
                (0.0 if key[1] >= self._born0 else cpu)
            self._theirs[key] = (first, cpu)
        return sum(last - first for first, last in self._theirs.values())

    def _now(self) -> Sample:
        busy, kernel, steal = _counters()
        return Sample(time.monotonic(), busy, _proc_cpu_s(self._me) + self._their_s(),
                      self.ours_s(), kernel, steal)

    def ours_s(self) -> float:
        """CPU seconds the sampled processes used since construction."""
        return sum(last - first for first, last in self._ours.values())

    def ours_cores(self) -> float:
        """The sampled processes' average CPU use in cores since construction."""
        elapsed = time.monotonic() - self._t0
        return self.ours_s() / elapsed if elapsed > 0 else 0.0

    def cores(self) -> float:
        """Average foreign load in cores since construction (never negative)."""
        return _foreign(self._trail[0], self._now())

    def cores_over(self, t0: float, t1: float) -> float:
        """Average foreign load in cores over the samples from ``t0`` to ``t1``
        (time.monotonic()); the whole span so far when fewer than two samples fall inside."""
        over = span_cores(self._trail, t0, t1)
        return self.cores() if over is None else over

    def unowned_over(self, t0: float, t1: float) -> Unowned:
        """The interrupt work and steal over the same span as `cores_over`."""
        return _unowned(*(_span(self._trail, t0, t1) or (self._trail[0], self._now())))


def _foreign(a: Sample, b: Sample) -> float:
    dt = b.t - a.t
    if dt <= 0:
        return 0.0
    return max(0.0, ((b.busy - a.busy) - (b.me - a.me) - (b.ours - a.ours)) / dt)


def _unowned(a: Sample, b: Sample) -> Unowned:
    dt = b.t - a.t
    if dt <= 0:
        return Unowned(0.0, 0.0)
    return Unowned(max(0.0, (b.kernel - a.kernel) / dt), max(0.0, (b.steal - a.steal) / dt))


def _span(trail, t0: float, t1: float) -> tuple[Sample, Sample] | None:
    inside = [row for row in trail if t0 <= row.t <= t1]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    return inside[0], inside[-1]


def span_cores(trail, t0: float, t1: float) -> float | None:
    """Foreign cores between the first sample at or after ``t0`` and the last at or before
    ``t1`` of ``trail`` (`Sample`s in time order); None when fewer than two samples fall
    inside, or they are not apart."""
    span = _span(trail, t0, t1)
    return None if span is None else _foreign(*span)


def span_unowned(trail, t0: float, t1: float) -> Unowned | None:
    """`Unowned` over the same samples as `span_cores`; None where that is None."""
    span = _span(trail, t0, t1)
    return None if span is None else _unowned(*span)
