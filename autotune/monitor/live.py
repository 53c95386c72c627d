"""Tail a run's journal and show it: a rich Live view on a terminal, plain lines elsewhere.

`Monitor` owns the tail loop (in a thread for `watch`, in the caller's thread for ``autotune
monitor``). Rendering is throttled: a redraw when events arrive, at most every ``REDRAW_S``, and
once every ``CLOCK_S`` for the elapsed clock. Any exception in the live view switches to plain
lines; any exception in plain lines stops the display. The run itself is never affected.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.live import Live

from autotune.store.events import Event
from autotune.store.journal import EVENTS, read_events
from autotune.monitor.above import Above
from autotune.monitor.console import is_terminal, use_plain
from autotune.monitor import text, view
from autotune.monitor.state import RunState

POLL_S = 0.5  # journal read interval
REDRAW_S = 0.5  # live view: no more than two redraws a second
CLOCK_S = 1.0  # live view: redraw at least this often so the clock moves
DEVICE_LINE_EVERY_S = 30.0  # plain lines: one device summary per this many seconds of run time
STALE_S = 30.0  # journal silent this long, though the sampler writes every 2 s: the run is gone


class Monitor:
    """Shows one run directory's journal, from the start, on ``stream``."""

    def __init__(self, run_dir, *, plain: bool = False, title: str = "", stream=None,
                 console: Console | None = None):
        self.run_dir = Path(run_dir)
        self.title = title
        self.stream = stream if stream is not None else sys.stderr
        self.plain = use_plain(self.stream, plain) if console is None else False
        self.console = console
        self.state = RunState()
        self.offset = 0
        self.cpu_s = 0.0  # CPU time of the thread running `loop`, for the bench
        self.failed: str | None = None  # why the live view fell back to plain lines
        self._live: Live | None = None
        self._saved: tuple | None = None  # sys.stdout, sys.stderr before `_redirect`
        self._last_draw = 0.0
        self._last_device_t: float | None = None
        self._dirty = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dead = False  # plain output failed too: show nothing more

    # -- lifecycle -------------------------------------------------------------------------
    def start_live(self) -> None:
        """Open the live view (terminal only); falls back to plain lines if it cannot."""
        if self.plain:
            return
        try:
            if self.console is None:
                self.console = Console(file=self.stream, highlight=False, emoji=False)
            self._live = Live(console=self.console, auto_refresh=False, transient=False,
                              redirect_stdout=False, redirect_stderr=False,
                              vertical_overflow="crop")
            self._live.start()
            self._redirect()
        except Exception as exc:  # noqa: BLE001 - any display failure degrades to plain
            self._fall_back(exc)

    def _redirect(self) -> None:
        """Whatever is printed to this terminal while the view is up goes above it (the
        command's messages, the script's own output in a full run). A stream redirected to a
        file is left alone."""
        self._saved = (sys.stdout, sys.stderr)
        if is_terminal(sys.stdout):
            sys.stdout = Above(self.console, sys.stdout)
        if is_terminal(sys.stderr):
            sys.stderr = Above(self.console, sys.stderr)

    def _restore(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for name, original in zip(("stdout", "stderr"), saved):
            current = getattr(sys, name)
            if isinstance(current, Above) and current.original is original:
                current.flush()
                setattr(sys, name, original)

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.loop, name="autotune-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Read the last events, draw the final state, close the live view."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)
        self.close()

    def close(self) -> None:
        live, self._live = self._live, None
        self._restore()
        if live is not None:
            try:
                live.update(self.renderable(), refresh=True)
                live.stop()
            except Exception:  # noqa: BLE001
                try:
                    live.stop()
                except Exception:  # noqa: BLE001
                    pass

    # -- the loop --------------------------------------------------------------------------
    def loop(self, *, until_ended: bool = False) -> None:
        """Poll the journal until `stop`; with ``until_ended``, until ``run_ended`` or until
        the run is `gone`."""
        try:
            while True:
                stopping = self._stop.is_set()
                self.step()
                if stopping or (until_ended and (self.state.ended or self.gone())):
                    break
                self._stop.wait(POLL_S)
        finally:
            self.cpu_s = time.thread_time()

    def gone(self, now: float | None = None) -> bool:
        """The run stopped without ``run_ended`` (its controller was killed): its sampler wrote
        device samples every few seconds, and the journal has been silent for ``STALE_S``."""
        if self.state.ended or self.state.device is None:
            return False
        try:
            mtime = os.stat(self.run_dir / EVENTS).st_mtime
        except OSError:
            return False
        return (time.time() if now is None else now) - mtime > STALE_S

    def step(self, now: float | None = None) -> list[dict]:
        """Read new events, fold them, show them. Returns the new events."""
        try:
            events, self.offset = read_events(self.run_dir, offset=self.offset,
                                              skipped=self.state.unreadable)
        except Exception:  # noqa: BLE001 - an unreadable journal is shown as no news
            events = []
        for ev in events:
            self.state.apply(ev)
        if events:
            self._dirty = True
        now = time.time() if now is None else now
        if self.plain:
            self._print_lines(events)
        else:
            self._draw(now)
        return events

    def renderable(self, now: float | None = None):
        height = self.console.size.height if self.console is not None else 40
        return view.render(self.state, now=time.time() if now is None else now,
                             title=self.title, max_rows=max(3, height - 30))

    def _draw(self, now: float) -> None:
        if self._live is None:
            return
        since = now - self._last_draw
        if not ((self._dirty and since >= REDRAW_S) or since >= CLOCK_S):
            return
        try:
            self._live.update(self.renderable(now), refresh=True)
            self._last_draw, self._dirty = now, False
        except Exception as exc:  # noqa: BLE001
            self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        live, self._live = self._live, None
        self._restore()
        if live is not None:
            try:
                live.stop()
            except Exception:  # noqa: BLE001
                pass
        self.plain = True
        self.write(f"WARNING: live monitor failed ({self.failed}); plain lines from here")

    def _print_lines(self, events: list[dict]) -> None:
        for ev in events:
            if ev.get("event") == Event.DEVICE_SAMPLE:
                t = ev.get("t") if isinstance(ev.get("t"), (int, float)) else 0.0
                if self._last_device_t is not None and t - self._last_device_t < DEVICE_LINE_EVERY_S:
                    continue
                self._last_device_t = t
            row = self.state.trials.get(ev.get("trial")) if "trial" in ev else None
            if row is not None and row.number is not None and ev.get("number") is None:
                ev = {**ev, "number": row.number}
            line = text.timed_line(ev)
            if line:
                self.write(line)

    def write(self, line: str) -> None:
        """One plain line on the stream; a stream that fails once is written to no more."""
        if self._dead:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing more to show
            self._dead = True
