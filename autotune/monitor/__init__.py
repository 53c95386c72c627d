"""The live monitor: what is being tried, what won, and what the hardware is doing.

Commands wrap their work in `watch`; ``autotune monitor`` attaches to a run with `follow`. The
journal (``events.jsonl``) is the monitor's only source; `RunState` is folded from its events and
`render` draws it, so views are tested from recorded journals. A monitor error never fails or
slows the run: the live view degrades to plain lines, and a failing sampler stops sampling.

The terminal package: rich is imported by modules of `autotune.monitor` only, nowhere else
(``tests/test_layout.py``); commands reach the terminal through `autotune.monitor.console` or
`watch` / `follow`.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

__all__ = ["watch", "Watching", "follow", "Monitor", "RunState", "TrialRow", "fold", "render",
           "event_line", "timed_line", "use_plain"]

# Where each name of the package lives: imported when first asked for, so that a command that
# only prints a line (`autotune.monitor.console`) does not pay for rich's live view and the
# journal's readers.
_LAZY = {"Monitor": "live", "use_plain": "console", "render": "view", "RunState": "state",
         "TrialRow": "state", "fold": "state", "event_line": "text", "timed_line": "text"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"autotune.monitor.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Watching:
    """What `watch` yields: the `Monitor` (None if it could not start) and `quiet`."""

    def __init__(self, monitor, sampler):
        self.monitor, self._sampler = monitor, sampler

    def quiet(self) -> None:
        """Stop sampling the devices into the journal, for good. Called before the run's
        ``run_ended`` is appended, so that it stays the journal's last event (a sample written
        after it would hide it from every reader that looks at the last event)."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            try:
                sampler.stop()
            except Exception:  # noqa: BLE001 - no sampling is better than a failed run
                pass


@contextlib.contextmanager
def watch(run_dir, *, plain: bool = False, title: str = "", stream=None,
          sample_interval_s: float | None = None):
    """Show the run live while the body runs, and sample the devices into its journal.

    On a terminal: a rich Live view on stderr. Otherwise (a pipe, ``plain=True``, ``NO_COLOR``):
    one line per event on stderr. Yields a `Watching`: its ``monitor`` (None if it could not
    start) and its ``quiet()``, which a command calls before it appends ``run_ended``.
    """
    from autotune.monitor.live import Monitor
    from autotune.monitor.sampler import INTERVAL_S, Sampler

    run_dir = Path(run_dir)
    monitor = sampler = None
    try:
        monitor = Monitor(run_dir, plain=plain, title=title,
                          stream=stream if stream is not None else sys.stderr)
        if monitor.plain and title:
            monitor.write(f"autotune: {title}")
        monitor.start_live()
        monitor.start_thread()
    except Exception:  # noqa: BLE001 - no monitor is better than a failed run
        monitor = None
    try:
        sampler = Sampler(run_dir, interval_s=sample_interval_s or INTERVAL_S)
        sampler.start()
    except Exception:  # noqa: BLE001
        sampler = None
    watching = Watching(monitor, sampler)
    try:
        yield watching
    finally:
        watching.quiet()
        if monitor is not None:
            try:
                monitor.stop()
            except Exception:  # noqa: BLE001
                pass


def follow(run_dir, *, plain: bool = False, title: str = "", stream=None) -> Monitor:
    """Show a live or finished run until its ``run_ended`` event, or until it is clearly gone
    (`Monitor.gone`). Ctrl-C raises as usual. Returns the monitor (its ``state``, ``gone()``)."""
    from autotune.monitor.live import Monitor

    monitor = Monitor(run_dir, plain=plain, title=title,
                      stream=stream if stream is not None else sys.stdout)
    monitor.start_live()
    try:
        monitor.loop(until_ended=True)
    finally:
        monitor.close()
    return monitor
