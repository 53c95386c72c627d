"""``controller.json``: the process that controls a run (pid, start time, host), written by
that process when it starts, and checked against the live process table by whoever asks whether
the run is still controlled: a pid reused by another program has another start time. Two
commands never both control one run (`autotune.tuning.state.check_not_running`).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.store import rundir

CONTROLLER = "controller.json"


@dataclass(frozen=True)
class Controller:
    """The process that controls a run, as it wrote itself down."""

    pid: int
    create_time: float
    host: str

    @property
    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """This very process (pid and start time) is running; on another host, assumed so
        (it cannot be looked at from here)."""
        if not self.here:
            return True
        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.create_time) < 1e-2 and \
                p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def mark_controller(run_dir: Path) -> Controller:
    """Write this process down as ``run_dir``'s controller (atomically)."""
    me = psutil.Process()
    c = Controller(me.pid, me.create_time(), socket.gethostname())
    rundir.write_atomic(Path(run_dir) / CONTROLLER, json.dumps(
        {"pid": c.pid, "create_time": c.create_time, "host": c.host}))
    return c


def controller(run_dir: Path) -> Controller | None:
    """The controller ``run_dir`` names, or None (none yet, or unreadable)."""
    try:
        c = json.loads((Path(run_dir) / CONTROLLER).read_text())
        return Controller(int(c["pid"]), float(c["create_time"]), str(c.get("host", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


