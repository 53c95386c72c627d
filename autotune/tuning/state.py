"""The run directory of a tuning run, for ``--resume``: state file, controller, orphans.

``tune.json`` holds the settings, the baseline and the space; ``controller.json`` the controller's
pid (a live controller is never resumed under); ``live.json`` the markers of the probe in flight,
so a resume can stop what a ``kill -9``-ed controller left running.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import psutil

from autotune.launching import proc
from autotune.store import rundir
from autotune.errors import UsageError
from autotune.store.journal import read_events

STATE = "tune.json"
CONTROLLER = "controller.json"
LIVE = "live.json"


def load_state(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / STATE).read_text())
    except FileNotFoundError:
        raise UsageError(f"--resume: {run_dir} holds no {STATE}: not a tune or wrap run "
                         f"directory") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: cannot read {Path(run_dir) / STATE}: {exc}") from None


def check_not_running(run_dir: Path) -> None:
    """Refuse to resume a run whose controller is still alive."""
    try:
        c = json.loads((Path(run_dir) / CONTROLLER).read_text())
    except (OSError, ValueError):
        return
    if c.get("host") != socket.gethostname():
        return
    try:
        p = psutil.Process(int(c["pid"]))
        alive = abs(p.create_time() - float(c["create_time"])) < 1e-2 and \
            p.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, ValueError, TypeError):
        alive = False
    if alive:
        raise UsageError(f"--resume: the run in {run_dir} is still going (pid {c['pid']}); "
                         f"stop it first or watch it with 'autotune monitor {run_dir}'")


def sweep_orphans(run_dir: Path) -> int:
    """Kill what a killed controller left running (markers of the probe it was taking)."""
    try:
        markers = json.loads((Path(run_dir) / LIVE).read_text()).get("markers", [])
    except (OSError, ValueError):
        return 0
    killed = 0
    for marker in markers:
        # proc.sweep needs only the marker of a launch that is gone; build that launch's spec.
        gone = proc.Launched(spec=proc.LaunchSpec(argv=(), env={}, cwd=".", marker=marker,
                                                  stdout_path=Path(os.devnull),
                                                  stderr_path=Path(os.devnull)),
                             popen=None, pgid=0)
        killed += len(proc.sweep(gone))
    rundir.write_atomic(Path(run_dir) / LIVE, json.dumps({"markers": []}))
    return killed


def spent_s(run_dir: Path) -> float:
    """Wall time a previous controller of this run spent, from its journal."""
    events, _ = read_events(run_dir)
    times = [e["t"] for e in events if isinstance(e.get("t"), (int, float))]
    return max(times) - min(times) if times else 0.0


def mark_controller(run_dir: Path) -> None:
    me = psutil.Process()
    rundir.write_atomic(Path(run_dir) / CONTROLLER, json.dumps(
        {"pid": me.pid, "create_time": me.create_time(), "host": socket.gethostname()}))


def mark_live(run_dir: Path, markers: list[str]) -> None:
    rundir.write_atomic(Path(run_dir) / LIVE, json.dumps({"markers": markers}))
