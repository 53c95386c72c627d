"""The run directory of a tuning run, for ``--resume``: state file, controller, orphans.

``tune.json`` holds the `TuneState` (settings, baseline, space, how far the search got),
written by `save` alone; ``controller.json`` the controller's pid (a live controller is never
resumed under); ``live.json`` the markers of the probe in flight, so a resume can stop what a
``kill -9``-ed controller left running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.hardware import proc
from autotune.store import rundir
from autotune import UsageError
from autotune.store.journal import read_events
from autotune.tuning.records import BaselineRecord, TuneSettings
from autotune.tuning.space import Space

STATE = "tune.json"
CONTROLLER = "controller.json"
LIVE = "live.json"


@dataclass(frozen=True)
class TuneState:
    """What a tuning run has settled so far; a resume starts from it."""

    kind: str  # tune | wrap
    settings: TuneSettings
    run_id: str  # the run directory's name and a random part: unique on a shared storage
    run_command: tuple[str, ...]  # the full run's command, as the user typed it
    run_cwd: str  # where the full run starts
    warm_start: Mapping[str, int] | None = None  # a matching recipe's knobs, tried early
    space: Space | None = None  # None until the baseline is measured
    baseline: BaselineRecord | None = None
    allreduce: Mapping | None = None  # {"result": AllreduceResult dict} or {"error": why}
    # the two-rank probe that showed the script data-parallel (`baseline.discover_ranks`):
    # {"knobs", "samples_per_s", "ci_half", "energy", "noise"}, the study's first two-rank trial
    ranks_probe: Mapping | None = None
    # how the script moved in the baseline (`autotune.tuning.fitting.ScriptTiming`, as a dict)
    timing: Mapping | None = None
    enqueued: bool = False  # the baseline and the initial design are queued in the study
    combined: bool = False  # the one-at-a-time moves that paid off are queued, joined

    @classmethod
    def new(cls, settings: TuneSettings, run_dir: Path, *, kind: str = "tune",
            run_command: Sequence[str] | None = None, run_cwd: str | None = None,
            warm_start: Mapping[str, int] | None = None) -> TuneState:
        # Two tuners started in the same second on one script get run directories of the same
        # name on their own hosts; on a shared study they must still tell their trials apart.
        run_id = f"{Path(run_dir).name}-{secrets.token_hex(4)}"
        return cls(kind, settings, run_id, tuple(run_command or settings.command),
                   run_cwd or settings.cwd, dict(warm_start) if warm_start else None)

    def to_dict(self) -> dict:
        """Keys of what is not settled yet are left out, as ever."""
        d = {**dataclasses.asdict(self), "settings": self.settings.to_dict(),
             "run_command": list(self.run_command), "space": self.space and self.space.to_dict(),
             "baseline": self.baseline and self.baseline.to_dict()}
        return {k: v for k, v in d.items() if v is not None and v is not False}

    @classmethod
    def from_dict(cls, d: Mapping) -> TuneState:
        s = TuneSettings.from_dict(d["settings"])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in names}, "settings": s,
                      "kind": d.get("kind", "tune"), "run_id": d.get("run_id", ""),
                      "run_command": tuple(d.get("run_command") or s.command),
                      "run_cwd": d.get("run_cwd") or s.cwd,
                      "space": Space.from_dict(d["space"]) if d.get("space") else None,
                      "baseline": BaselineRecord.from_dict(d["baseline"]) if d.get("baseline")
                      else None})


def save(run_dir: Path, state: TuneState) -> None:
    """The one writer of ``tune.json``, atomically."""
    rundir.write_atomic(Path(run_dir) / STATE, json.dumps(state.to_dict(), indent=2, default=str))


def load_state(run_dir: Path) -> TuneState:
    path = Path(run_dir) / STATE
    try:
        return TuneState.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(f"--resume: {run_dir} holds no {STATE}: not a tune or wrap run "
                         f"directory") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read {path}: {exc}") from None


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
    """Wall time the earlier controllers of this run spent, from its journal: each from its
    ``run_started`` to its last event (the time between them, the run stopped, not counted)."""
    events, _ = read_events(run_dir)
    spent, start, last = 0.0, None, None
    for e in events:
        if not isinstance(e.get("t"), (int, float)):
            continue
        if e.get("event") == "run_started" and start is not None:
            spent += last - start
            start = None
        start = e["t"] if start is None else start
        last = e["t"]
    return spent + (last - start if start is not None else 0.0)


def check_budget(run_dir: Path, budget_s: float | None) -> None:
    """Refuse to resume a run whose time budget is already spent."""
    spent = spent_s(run_dir)
    if budget_s is not None and spent >= budget_s:
        raise UsageError(f"--resume: budget {minutes(budget_s)} already spent "
                         f"({minutes(spent)}); give a larger --budget to go on")


def minutes(s: float) -> str:
    """``6m12s``, ``3m``, ``12s``."""
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s" if m and s else f"{m}m" if m else f"{s}s"


def mark_controller(run_dir: Path) -> None:
    me = psutil.Process()
    rundir.write_atomic(Path(run_dir) / CONTROLLER, json.dumps(
        {"pid": me.pid, "create_time": me.create_time(), "host": socket.gethostname()}))


def mark_live(run_dir: Path, markers: list[str]) -> None:
    rundir.write_atomic(Path(run_dir) / LIVE, json.dumps({"markers": markers}))
