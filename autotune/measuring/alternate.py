"""Probes of several configs that take turns on the machine, so that its drift cancels.

On a shared machine the speed one process gets drifts by ±15% over 10-30 s (nanoGPT's shape
at batch 12, alone: 5-s stretches of one process read 213 to 296 samples/s, in runs of like
values). Two configs probed one after the other, each in its own process, see different
stretches of that drift, and a round's ratio carries it: ±9-15% a round, against the +13-21%
a confirmation must show. Here the configs' processes are all started, and then take turns in
slices of a few seconds: the one whose turn it is runs, the others are held (SIGSTOP to their
process groups, SIGCONT when their turn comes), in the order A B B A, so that both see the same
stretch of the drift. The same pair alternated in 5 s slices read 1.16x, 1.22x and 1.20x in
three rounds of new processes (docs/benchmarks.md, "Search"; docs/runs/ has the records).

Each process first runs alone from its start to `WARM_S` past its first batch, so start-ups and
warm-ups never overlap and never count. A slice lasts a quarter of the time each process is to
measure (`MIN_SLICES`), within `MIN_SLICE_S` and `SLICE_S`, and at least `SLICE_BATCHES`
whole batches (long steps: minGPT's are 1-2.5 s), so that a round costs what a probe of each
config one after the other would (the budget plans it so) and its slices stay well inside the
drift's 10-30 s. Each probe's figure is read from its own slices only
(`autotune.measuring.steady.slices_estimate`). The trials themselves run as ever
(`autotune.measuring.trial.run_trial`), one thread each; their loops stand still while held.

Only for ranks this host starts, on the CPU: a held CUDA process keeps its device memory, so
two configs sized to a GPU's memory cannot be resident at once, and a held engine (mpirun,
srun) does not pass SIGSTOP on to its ranks.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psutil

from autotune.hardware import proc

T = TypeVar("T")

SLICE_S = 5.0  # a turn's slice at the longest...
MIN_SLICE_S = 1.5  # ...and at the shortest
SLICE_BATCHES = 3  # ...and the fewest batches (or steps) that end in it
WARM_S = 2.0  # alone after its first batch (and `SLICE_BATCHES` more), before the first hold
# each process's turns at least: a figure stands on three slices, and the paired floor on two
# cycles taken together (`autotune.tuning.decision.paired_half`)
MIN_SLICES = 4
MAX_SLICE_S = 120.0  # a slice with no batch this long ends (the trial's own hang rule judges)
WAIT_S = 0.05


class Turn:
    """One trial's side of the alternation: whether it may run now, and the slices it ran.

    The coordinator (`run_together`) holds and releases it; the trial's loop reads
    `running`, `held_s` and `ended`, and reports its progress with `saw`.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._running = True
        self._held_since: float | None = None
        self._held_total = 0.0
        self.ended_flag = threading.Event()  # the coordinator is done: the trial ends
        self.done = threading.Event()  # the trial has returned
        self.launched: list[proc.Launched] = []
        self.slices: list[tuple[float, float]] = []
        self.first_t: float | None = None
        self.count = 0  # batches or steps so far
        self.others: Callable[[], list[psutil.Process]] = list

    # -- the trial's side -----------------------------------------------------------------
    def attach(self, launched: list[proc.Launched]) -> None:
        """The trial's launches (its own list, which grows)."""
        self.launched = launched

    def running(self) -> bool:
        return self._running

    def ended(self) -> bool:
        return self.ended_flag.is_set()

    def held_s(self) -> float:
        """Seconds held so far, the current hold included: what the trial's clocks skip."""
        with self._lock:
            now = time.monotonic()
            return self._held_total + (now - self._held_since
                                       if self._held_since is not None else 0.0)

    def saw(self, now: float, count: int) -> None:
        """The trial's progress (batches or steps), as its loop reads it."""
        if count > self.count:
            self.count = count
            if self.first_t is None:
                self.first_t = now

    def processes(self) -> list[psutil.Process]:
        return [p for lp in self.launched for p in lp.tree()]

    # -- the coordinator's side -------------------------------------------------------------
    def hold(self) -> None:
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._held_since = time.monotonic()
        for lp in list(self.launched):
            proc.signal_group(lp, signal.SIGSTOP)

    def release(self) -> None:
        for lp in list(self.launched):
            proc.signal_group(lp, signal.SIGCONT)
        with self._lock:
            if self._running:
                return
            self._held_total += time.monotonic() - self._held_since
            self._held_since = None
            self._running = True

    def end(self) -> None:
        self.ended_flag.set()
        self.release()

    def measured_s(self) -> float:
        return sum(b - a for a, b in self.slices)

    def _wait(self, until: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.done.is_set() and not until() and time.monotonic() < deadline:
            self.done.wait(WAIT_S)

    def warm(self, warm_s: float, start_s: float) -> None:
        """Wait (it runs alone) for its first batch, then ``warm_s`` and `SLICE_BATCHES` more;
        ``start_s``: how long a start may take (the trial's own rule then ends it)."""
        self._wait(lambda: self.first_t is not None, start_s)
        if self.first_t is None:
            return
        first = self.count
        self._wait(lambda: time.monotonic() - self.first_t >= warm_s
                   and self.count - first >= SLICE_BATCHES, MAX_SLICE_S)

    def run_slice(self, slice_s: float) -> None:
        """Release it for one slice: ``slice_s`` and `SLICE_BATCHES` whole batches at least,
        then hold it.

        The first batch end a slice sees is not a whole one: the batch its hold interrupted
        ends just after the release (a script paced by the clock finds the held time gone), or
        it ended before the hold and its tick came late. `steady.slice_parts` leaves it out
        for long steps, so the slice waits for one more: with three ends only, one of them a
        hair before the release by the meter's clock, the CI's loaded machine read no slice
        of a 0.6 s-step probe and so no figure. The slice starts before the release, so
        that no batch ended in it lies before its start."""
        t0, first = time.monotonic(), self.count
        self.release()
        self._wait(lambda: time.monotonic() - t0 >= slice_s
                   and self.count - first >= SLICE_BATCHES + 1, MAX_SLICE_S)
        t1 = time.monotonic()
        if not self.done.is_set():
            self.hold()
        self.slices.append((t0, t1))


def slice_for(measure_s: float) -> float:
    """A slice's length when each process is to measure ``measure_s``: `MIN_SLICES` of them,
    within `MIN_SLICE_S` and `SLICE_S`."""
    return min(SLICE_S, max(MIN_SLICE_S, measure_s / MIN_SLICES))


def round_s(measure_s: float, paces: Sequence[tuple[float, float]], *,
            slice_s: float | None = None, warm_s: float = WARM_S) -> float:
    """What `run_together` takes for trials whose ``paces`` are (launch to first batch, one
    batch), each to measure ``measure_s``: every trial's warm-up alone (its first batch, then
    ``warm_s`` and `SLICE_BATCHES` batches), then cycles of one slice each until every trial
    measured ``measure_s`` in `MIN_SLICES` slices or more, a slice never shorter than
    `SLICE_BATCHES` of the trial's batches. Long batches make a round far longer than its
    measuring time: minGPT's shape at batch 256 (4.5 s a step) holds 13.5 s slices, and a round
    of it beside batch 32 and the script's own took 157 s where 90 s were left."""
    base = slice_for(measure_s) if slice_s is None else slice_s
    slices = [max(base, SLICE_BATCHES * step) for _, step in paces]
    if not slices:
        return 0.0
    cycles = max(MIN_SLICES, max(math.ceil(measure_s / s) for s in slices))
    warm = sum(first + max(warm_s, SLICE_BATCHES * step) for first, step in paces)
    return warm + cycles * sum(slices)


def run_together(run_one: Callable[[int, Turn], T], count: int, *, measure_s: float,
                 start_s: float, slice_s: float | None = None, warm_s: float = WARM_S,
                 on_turns: Callable[[Sequence[Turn]], None] | None = None) -> list[T]:
    """Run ``count`` trials (``run_one(i, turn)``, each in its own thread) in turns until each
    ran ``measure_s`` (and `MIN_SLICES` slices) in slices; their results in order (the first
    error a trial raised is raised instead, once all have ended).

    The trials start one at a time, each running alone through its warm-up (`Turn.warm`),
    then take turns A B B A. A trial that ends early (a crash, a hang) drops out; the others
    go on. Whatever stops this (an interrupt included) releases every trial and ends it, and
    waits for the trials to stop their processes. ``slice_s``: `slice_for` ``measure_s``
    unless given.
    """
    slice_s = slice_for(measure_s) if slice_s is None else slice_s
    turns = [Turn() for _ in range(count)]
    for t in turns:
        t.others = (lambda me: lambda: [p for u in turns if u is not me
                                        for p in u.processes()])(t)
    if on_turns is not None:
        on_turns(turns)
    results: list = [None] * count  # each trial's result, once it returned
    errors: list[BaseException | None] = [None] * count

    def body(i: int) -> None:
        try:
            results[i] = run_one(i, turns[i])
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            errors[i] = e
        finally:
            turns[i].done.set()

    threads = []
    try:
        for i, turn in enumerate(turns):
            th = threading.Thread(target=body, args=(i,), name=f"turn-{i}", daemon=True)
            threads.append(th)
            th.start()
            turn.warm(warm_s, start_s)
            if not turn.done.is_set():
                turn.hold()
        cycle = 0
        while True:
            live = [t for t in turns if not t.done.is_set()]
            if not live or all(t.measured_s() >= measure_s and len(t.slices) >= MIN_SLICES
                               for t in live):
                break
            for t in (live if cycle % 2 == 0 else live[::-1]):
                if not t.done.is_set():
                    t.run_slice(slice_s)
            cycle += 1
    finally:
        for t in turns:
            t.end()
        for th in threads:
            th.join()
    error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise error
    return results
