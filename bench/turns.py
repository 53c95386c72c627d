"""Plain runs of a script that take turns on the machine, each read by the script's own clock.

Plain runs one after another each catch a different stretch of this machine's drift (one
process of nanoGPT's shape read 213 to 296 samples/s in 5-s stretches, in runs of like values
10-30 s long), so a side by side of 30 s runs could not rank word_lm's batch 32 against 64 (7%
one way in the grid, 17% the other way beside it). Here the runs of a round are all started,
each alone until it has printed two of its own rate lines, then held (SIGSTOP to its process
group); they then take turns, one running while the others are held, in slices in the order
A B B A, until each ran ``measure_s``. The same runs as `bench.shapes.timed_run`'s: the plain
command and environment, plus ``PYTHONUNBUFFERED=1`` so that each line is read as it is printed,
stamped with the monotonic clock.

A run's figure is the mean of its own rate lines that came in the same slice as its line
before: a script's line counts what it did since its last line at most (minGPT's and
nanoGPT's shapes since the last line, word_lm's over its last few batches), so such a line
never spans a hold. A slice is at least 2.5 times the gap between a run's lines, so that it
holds two.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import shapes  # noqa: E402

SLICE_S = 5.0  # a slice at the least
LINES_PER_SLICE = 2.5  # a slice holds this many of a run's line gaps at the least
MIN_SLICES = 4  # each run's slices at the least


@dataclass
class Reading:
    """One run's part of a round in turns."""

    rate: float | None  # the mean of its counted lines; None: no line counted
    counted: list[float] = field(default_factory=list)  # the lines' own figures, counted
    left_out: list[float] = field(default_factory=list)  # lines that spanned a hold or start
    slices: list[tuple[float, float]] = field(default_factory=list)
    tail: str = ""  # its last line of output


class _Run:
    def __init__(self, run: shapes.PlainRun, cwd: Path, env: Mapping[str, str]):
        self.proc = shapes.start(run.argv(sys.executable), cwd,
                                 {**run.environ(env), "PYTHONUNBUFFERED": "1"})
        self.lines: list[tuple[float, str]] = []  # (when it was read, the line)
        self.slices: list[tuple[float, float]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def rates(self, pattern: re.Pattern) -> list[tuple[float, float]]:
        """(when, figure) of its rate lines so far."""
        out = []
        for t, line in list(self.lines):
            m = pattern.match(line)
            if m:
                out.append((t, float(m.group(1))))
        return out

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=shapes.STOP_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self.reader.join(timeout=shapes.STOP_S)

    def reading(self, pattern: re.Pattern) -> Reading:
        rates = self.rates(pattern)
        counted, left_out = [], []
        for (t0, _), (t1, rate) in zip(rates, rates[1:]):
            inside = any(a <= t0 and t1 <= b for a, b in self.slices)
            (counted if inside else left_out).append(rate)
        tail = self.lines[-1][1] if self.lines else ""
        return Reading(sum(counted) / len(counted) if counted else None, counted, left_out,
                       list(self.slices), tail)


def take_turns(runs: Sequence[shapes.PlainRun], pattern: re.Pattern, cwd: Path, *,
               measure_s: float, start_s: float = 120.0, slice_s: float = SLICE_S,
               env: Mapping[str, str] | None = None) -> list[Reading]:
    """``runs`` started one at a time (each alone until it printed two lines of ``pattern``,
    or ``start_s``), then in turns until each ran ``measure_s`` in `MIN_SLICES` slices or
    more; each run's `Reading`, in order. Every run is stopped (SIGCONT, SIGINT, SIGKILL after
    `shapes.STOP_S`) before this returns or raises."""
    env = os.environ if env is None else env
    started: list[_Run] = []
    slice_of: list[float] = []
    try:
        for run in runs:
            r = _Run(run, cwd, env)
            started.append(r)
            deadline = time.monotonic() + start_s
            while r.alive() and len(r.rates(pattern)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen = r.rates(pattern)
            gap = seen[1][0] - seen[0][0] if len(seen) >= 2 else 0.0
            slice_of.append(max(slice_s, LINES_PER_SLICE * gap))
            r.signal(signal.SIGSTOP)
        cycle = 0
        while True:
            live = [i for i, r in enumerate(started) if r.alive()]
            if not live or all(sum(b - a for a, b in started[i].slices) >= measure_s and
                               len(started[i].slices) >= MIN_SLICES for i in live):
                break
            for i in (live if cycle % 2 == 0 else live[::-1]):
                r = started[i]
                r.signal(signal.SIGCONT)
                t0 = time.monotonic()
                while r.alive() and time.monotonic() - t0 < slice_of[i]:
                    time.sleep(0.02)
                r.signal(signal.SIGSTOP)
                r.slices.append((t0, time.monotonic()))
            cycle += 1
    finally:
        for r in started:
            r.stop()
    return [r.reading(pattern) for r in started]
