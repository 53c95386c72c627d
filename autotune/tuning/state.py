"""The run directory of a tuning run, for ``--resume``: state file, summary, controller, orphans.

``tune.json`` holds the `TuneState` (settings, baseline, space, what the probes taught, how far
the search got), written by `save` alone; ``summary.json`` the `TuneReport`, written by
`write_summary` alone; ``controller.json`` the controller's pid (a live controller is never
resumed under); ``live.json`` the markers of the probe in flight, so a resume can stop what a
``kill -9``-ed controller left running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


from autotune.hardware import proc
from autotune.store import controller as controllers, rundir
from autotune import Note, UsageError
from autotune.store import jsontext
from autotune.store.events import Event, RunKind
from autotune.store.journal import read_events
from autotune.tuning.learned import Learned
from autotune.tuning.records import (AllreduceTiming, BaselineRecord, RanksProbe, TuneReport,
                                     TuneSettings)
from autotune.tuning.space import Space
from autotune.tuning.payback import minutes  # noqa: F401  (callers import it from here)

STATE = "tune.json"
SUMMARY = "summary.json"
# ``tune.json``'s shape; one of another version is refused on --resume, never half read.
# 2: what the probes taught (`Learned`), typed allreduce timing and two-rank probe.
STATE_VERSION = 2
CONTROLLER = controllers.CONTROLLER
LIVE = "live.json"


@dataclass(frozen=True)
class TuneState:
    """What a tuning run has settled so far; a resume starts from it."""

    kind: RunKind  # tune | wrap
    settings: TuneSettings
    run_id: str  # the run directory's name and a random part: unique on a shared storage
    run_command: tuple[str, ...]  # the full run's command, as the user typed it
    run_cwd: str  # where the full run starts
    warm_start: Mapping[str, int] | None = None  # a matching recipe's knobs, tried early
    space: Space | None = None  # None until the baseline is measured
    baseline: BaselineRecord | None = None
    allreduce: AllreduceTiming | None = None  # None: bucket_mb not searched, or not yet
    # the two-rank probe that showed the script data-parallel (`baseline.discover_ranks`)
    ranks_probe: RanksProbe | None = None
    learned: Learned = Learned()  # what the probes taught: timing, paces, facts, notes
    enqueued: bool = False  # the baseline and the initial design are queued in the study
    combined: bool = False  # the one-at-a-time moves that paid off are queued, joined
    # the smaller batch neighbour's hold is settled: queued, or held for the walk's end
    smaller_settled: bool = False

    def __post_init__(self):
        object.__setattr__(self, "kind", RunKind(self.kind))  # a kind given as its text

    @classmethod
    def new(cls, settings: TuneSettings, run_dir: Path, *, kind: RunKind = RunKind.TUNE,
            run_command: Sequence[str] | None = None, run_cwd: str | None = None,
            warm_start: Mapping[str, int] | None = None) -> TuneState:
        # Two tuners started in the same second on one script get run directories of the same
        # name on their own hosts; on a shared study they must still tell their trials apart.
        run_id = f"{Path(run_dir).name}-{secrets.token_hex(4)}"
        return cls(kind, settings, run_id, tuple(run_command or settings.command),
                   run_cwd or settings.cwd, dict(warm_start) if warm_start else None)

    def learn(self, cfg: Mapping, knobs: Mapping, result) -> TuneState:
        """With a probe of ``cfg`` learned (`Learned.after`)."""
        return dataclasses.replace(self, learned=self.learned.after(cfg, knobs, result))

    def noted(self, note: Note) -> TuneState:
        """With ``note`` kept for the report (`Learned.noted`)."""
        return dataclasses.replace(self, learned=self.learned.noted(note))

    def to_dict(self) -> dict:
        """Keys of what is not settled yet are left out, as ever."""
        d = {"version": STATE_VERSION, "kind": self.kind, "settings": self.settings.to_dict(),
             "run_id": self.run_id, "run_command": list(self.run_command),
             "run_cwd": self.run_cwd,
             "warm_start": dict(self.warm_start) if self.warm_start else None,
             "space": self.space and self.space.to_dict(),
             "baseline": self.baseline and self.baseline.to_dict(),
             "allreduce": self.allreduce and self.allreduce.to_dict(),
             "ranks_probe": self.ranks_probe and self.ranks_probe.to_dict(),
             "learned": self.learned.to_dict(), "enqueued": self.enqueued,
             "combined": self.combined, "smaller_settled": self.smaller_settled}
        return {k: v for k, v in d.items() if v is not None and v is not False}

    @classmethod
    def from_dict(cls, d: Mapping) -> TuneState:
        """Raises ValueError for a ``tune.json`` of another version."""
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"its format is version {d.get('version', 1)}, this autotune "
                             f"reads version {STATE_VERSION}; start a new tuning, or resume "
                             f"with the autotune that began it")
        s = TuneSettings.from_dict(d["settings"])
        return cls(kind=RunKind(d.get("kind", "tune")), settings=s, run_id=d.get("run_id", ""),
                   run_command=tuple(d.get("run_command") or s.command),
                   run_cwd=d.get("run_cwd") or s.cwd,
                   warm_start=dict(d["warm_start"]) if d.get("warm_start") else None,
                   space=Space.from_dict(d["space"]) if d.get("space") else None,
                   baseline=BaselineRecord.from_dict(d["baseline"]) if d.get("baseline")
                   else None,
                   allreduce=AllreduceTiming.from_dict(d["allreduce"]) if d.get("allreduce")
                   else None,
                   ranks_probe=RanksProbe.from_dict(d["ranks_probe"]) if d.get("ranks_probe")
                   else None,
                   learned=Learned.from_dict(d.get("learned") or {}),
                   enqueued=bool(d.get("enqueued")), combined=bool(d.get("combined")),
                   smaller_settled=bool(d.get("smaller_settled")))


def save(run_dir: Path, state: TuneState) -> None:
    """The one writer of ``tune.json``, atomically."""
    rundir.write_atomic(Path(run_dir) / STATE, json.dumps(state.to_dict(), indent=2, default=str))


def write_summary(run_dir: Path, report: TuneReport, recipe_path: Path | None = None) -> dict:
    """The one writer of ``summary.json`` (the tuner's, then again naming the recipe once it is
    saved), atomically; returns what it wrote."""
    out = report.to_dict(recipe_path)
    rundir.write_atomic(Path(run_dir) / SUMMARY, jsontext.dumps(out, indent=2))
    return out


def load_state(run_dir: Path) -> TuneState:
    path = Path(run_dir) / STATE
    try:
        return TuneState.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(f"--resume: {run_dir} holds no {STATE}: not a tune or wrap run "
                         f"directory") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--resume: cannot read {path}: {exc}") from None


def check_not_running(run_dir: Path, flag: str = "--resume") -> None:
    """Refuse to control a run whose controller is still alive: two commands never both
    control one run."""
    c = controllers.controller(run_dir)
    if c is not None and c.here and c.alive():
        raise UsageError(f"{flag}: the run in {run_dir} is still going (pid {c.pid}); "
                         f"stop it first ('autotune stop {Path(run_dir).name}') or watch it "
                         f"with 'autotune monitor {Path(run_dir).name}'")


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
        if e.get("event") == Event.RUN_STARTED and start is not None:
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


def mark_controller(run_dir: Path) -> None:
    controllers.mark_controller(run_dir)


def mark_live(run_dir: Path, markers: list[str]) -> None:
    rundir.write_atomic(Path(run_dir) / LIVE, json.dumps({"markers": markers}))
