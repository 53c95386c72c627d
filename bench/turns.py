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

`take_turns_of` takes any command (`Start`): autotune's own ways too (`bench.bench_parity`), whose
ranks run in sessions of their own under a controller, and whose rank 0 may print to a log file
rather than to the bench. A hold there stops the whole tree (the root's group, then every
descendant, looked up again until no new one appears), so the controller's work counts in its
own slices only, as its ranks' does.
"""

from __future__ import annotations

import glob
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

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.hardware.proc import signals_held  # noqa: E402
from bench import shapes  # noqa: E402

SLICE_S = 5.0  # a slice at the least
LINES_PER_SLICE = 2.5  # a slice holds this many of a run's line gaps at the least
MIN_SLICES = 4  # each run's slices at the least
TAIL_S = 0.02  # a log file is read this often for new lines


@dataclass
class Reading:
    """One run's part of a round in turns."""

    rate: float | None  # the mean of its counted lines; None: no line counted
    counted: list[float] = field(default_factory=list)  # the lines' own figures, counted
    left_out: list[float] = field(default_factory=list)  # lines that spanned a hold or start
    slices: list[tuple[float, float]] = field(default_factory=list)
    tail: str = ""  # its last line of output
    stamps: list[float] = field(default_factory=list)  # when each rate line was read


@dataclass(frozen=True)
class Start:
    """One command of a round: its argv and environment, and where its rate lines come: its
    own output, or (``log``) a file it writes, read as it grows (a glob pattern: the first
    file that matches, once one does). A line relayed by a program that is held with the
    run (autotune's own output) would be stamped when the relay catches up, not when it was
    written, so such a run's lines are read from its rank 0 log."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path | None = None
    # only the root's descendants take turns: the root's own group (autotune's controller)
    # stays held from its first hold to the end, its ranks running without it in their slices
    root_held: bool = False


class _Run:
    def __init__(self, start: Start, cwd: Path):
        self.proc = shapes.start(list(start.argv), cwd, start.env)
        self.lines: list[tuple[float, str]] = []  # (when it was read, the line)
        self.out: list[str] = []  # its own output, when its lines come from a log
        self.slices: list[tuple[float, float]] = []
        self.log = start.log
        self.root_held = start.root_held
        self._done = threading.Event()
        self.readers = [threading.Thread(target=self._read, daemon=True)]
        if self.log is not None:
            self.readers.append(threading.Thread(target=self._tail, daemon=True))
        for t in self.readers:
            t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self.log is None:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
            else:
                self.out.append(line.rstrip("\n"))
        self._done.set()

    def _tail(self) -> None:
        """The log's lines as they are written, each stamped when first seen (within
        `TAIL_S`), until the command ended and the log was read to its end."""
        f, partial = None, ""
        try:
            while True:
                ended = self._done.is_set()
                if f is None:
                    found = sorted(glob.glob(str(self.log)))
                    if found:
                        f = open(found[0], errors="replace")
                chunk = f.read() if f is not None else ""
                if chunk:
                    now = time.monotonic()
                    *whole, partial = (partial + chunk).split("\n")
                    self.lines.extend((now, line) for line in whole)
                elif ended:
                    return
                else:
                    time.sleep(TAIL_S)
        finally:
            if f is not None:
                f.close()

    def rates(self, pattern: re.Pattern) -> list[tuple[float, float]]:
        """(when, figure) of its rate lines so far."""
        out = []
        for t, line in list(self.lines):
            m = pattern.match(line)
            if m:
                out.append((t, float(m.group(1))))
        return out

    def _tree(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def signal(self, sig: int) -> None:
        """``sig`` to its group, then to every descendant (autotune's ranks run in sessions of
        their own); for SIGSTOP, the tree is looked up again until no new process shows, so
        that one started while the others were being held is held too. A `Start.root_held`
        run's SIGCONT goes to the descendants outside the root's group only."""
        resume_ranks_only = self.root_held and sig == signal.SIGCONT
        group = _group_of(self.proc.pid) if resume_ranks_only else None  # None: it ended
        if not resume_ranks_only:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        sent: set[int] = set()
        for _ in range(5 if sig == signal.SIGSTOP else 1):
            new = [p.pid for p in self._tree() if p.pid not in sent
                   and not (group is not None and _group_of(p.pid) == group)]
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            sent.update(new)

    def resume_all(self) -> None:
        """SIGCONT to the whole tree, the held root's group too (before it is stopped)."""
        held, self.root_held = self.root_held, False
        try:
            self.signal(signal.SIGCONT)
        finally:
            self.root_held = held

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Resumed, then SIGINT to its group as Ctrl-C would; SIGKILL to its tree after
        `shapes.STOP_S`, and to any descendant still running a second after its root ended
        (one its root left behind)."""
        tree = self._tree()
        self.resume_all()
        self.signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=shapes.STOP_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        _, alive = psutil.wait_procs(tree, timeout=1.0)  # its root gone: orphans
        for child in alive:
            try:
                child.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=shapes.STOP_S)
        for t in self.readers:
            t.join(timeout=shapes.STOP_S)

    def reading(self, pattern: re.Pattern) -> Reading:
        rates = self.rates(pattern)
        counted, left_out = [], []
        for (t0, _), (t1, rate) in zip(rates, rates[1:]):
            inside = any(a <= t0 and t1 <= b for a, b in self.slices)
            (counted if inside else left_out).append(rate)
        tail = (self.out or [x for _, x in self.lines] or [""])[-1]
        return Reading(sum(counted) / len(counted) if counted else None, counted, left_out,
                       list(self.slices), tail, [t for t, _ in rates])


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def take_turns(runs: Sequence[shapes.PlainRun], pattern: re.Pattern, cwd: Path, *,
               measure_s: float, start_s: float = 120.0, slice_s: float = SLICE_S,
               env: Mapping[str, str] | None = None) -> list[Reading]:
    """Plain ``runs`` of a shape in turns (`take_turns_of`): each its command and environment,
    with ``PYTHONUNBUFFERED=1`` so that its lines are read as it prints them."""
    env = os.environ if env is None else env
    return take_turns_of([Start(tuple(r.argv(sys.executable)),
                                {**r.environ(env), "PYTHONUNBUFFERED": "1"}) for r in runs],
                         pattern, cwd, measure_s=measure_s, start_s=start_s, slice_s=slice_s)


def take_turns_of(starts: Sequence[Start], pattern: re.Pattern, cwd: Path, *,
                  measure_s: float, start_s: float = 120.0,
                  slice_s: float = SLICE_S) -> list[Reading]:
    """``starts`` started one at a time (each alone until it printed two lines of ``pattern``,
    or ``start_s``), then in turns until each ran ``measure_s`` in `MIN_SLICES` slices or
    more; each run's `Reading`, in order. Every run is stopped (SIGCONT, SIGINT, SIGKILL after
    `shapes.STOP_S`, to its whole tree) before this returns or raises."""
    started: list[_Run] = []
    slice_of: list[float] = []
    try:
        for one in starts:
            with signals_held():  # held on: a run started is a run in `started`
                started.append(_Run(one, cwd))
            r = started[-1]
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
        stop_all(started)
    return [r.reading(pattern) for r in started]


def stop_all(started: Sequence[_Run]) -> None:
    """`_Run.stop` each of ``started``, the rest too when one fails, with Ctrl-C and SIGTERM
    held meanwhile (they already asked for this); the first failure is raised after."""
    first: BaseException | None = None
    with signals_held():
        for r in started:
            try:
                r.stop()
            except BaseException as exc:  # noqa: BLE001 - the others must still be stopped
                first = first or exc
    if first is not None:
        raise first


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def end_on_sigterm() -> None:
    """From now, SIGTERM ends this bench as Ctrl-C does: through its cleanup (every held run's
    tree continued, interrupted and killed), with exit status 143. Python's default ends it at
    once and leaves the runs it held stopped behind it; a bench started in the background of a
    shell ignores SIGINT, so SIGTERM is how such a bench is stopped. Each bench that holds
    processes calls it in its ``__main__``."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
