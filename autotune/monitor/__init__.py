"""The live monitor: what is being tried, what won, and what the hardware is doing.

Commands wrap their work in `watch`; ``autotune monitor`` attaches to a run from another terminal.
The journal (``events.jsonl``) is the monitor's only source. A monitor error never fails the run:
it degrades to plain log lines.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from autotune.journal import Journal, read_events

__all__ = ["watch"]

POLL_S = 0.5


def _plain_line(event: dict) -> str | None:
    name = event.get("event", "?")
    if name == "device_sample":
        return None
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("t", "event"))
    return f"[{time.strftime('%H:%M:%S', time.localtime(event.get('t', 0)))}] {name} {fields}"


class _Sampler(threading.Thread):
    def __init__(self, run_dir: Path, interval_s: float = 2.0):
        super().__init__(name="autotune-sampler", daemon=True)
        self.journal = Journal(run_dir)
        self.interval_s = interval_s
        self.stop_event = threading.Event()

    def run(self):
        try:
            import psutil
            psutil.cpu_percent(percpu=True)
            while not self.stop_event.wait(self.interval_s):
                mem = psutil.virtual_memory()
                self.journal.emit("device_sample", cpu_pct=psutil.cpu_percent(percpu=True),
                                  mem_used_bytes=mem.total - mem.available,
                                  mem_total_bytes=mem.total, gpus=[], workers=0)
        except Exception:  # never fail the run
            return


@contextlib.contextmanager
def watch(run_dir, *, plain: bool = False, title: str = ""):
    """Show the run's journal live while the body runs (minimal version: plain lines)."""
    run_dir = Path(run_dir)
    stop = threading.Event()
    sampler = _Sampler(run_dir)

    def tail():
        offset = 0
        while True:
            done = stop.is_set()
            try:
                events, offset = read_events(run_dir, offset=offset)
                for ev in events:
                    line = _plain_line(ev)
                    if line:
                        print(line, file=sys.stderr, flush=True)
            except Exception:
                pass
            if done:
                return
            stop.wait(POLL_S)

    thread = threading.Thread(target=tail, name="autotune-monitor", daemon=True)
    if title:
        print(f"autotune: {title}", file=sys.stderr, flush=True)
    sampler.start()
    thread.start()
    try:
        yield
    finally:
        sampler.stop_event.set()
        stop.set()
        thread.join(timeout=5)
