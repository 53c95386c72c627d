"""The runs under a runs directory as ``autotune ps`` shows them: each one's state told from
its journal and whether its controller is alive.

A run's state never comes from a file that can go stale: the journal says what the run did,
and ``controller.json`` names the controller's pid and start time, which are checked against
the live process table (`autotune.store.controller`). `status_of` is the pure part: the folded
journal and the liveness in, a `Status` out.
"""

from __future__ import annotations

import enum
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.monitor.state import RunState, fold
from autotune.store import controller as controllers
from autotune.store.events import RunKind
from autotune.store.journal import read_events

# exit codes of a run stopped as asked: Ctrl-C, SIGTERM (`autotune stop`, kill), a hang-up,
# and SIGKILL (`autotune stop --kill`)
STOP_CODES = frozenset(128 + s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                         signal.SIGKILL))
STARTING_GRACE_S = 120.0  # a run directory without a controller yet, this young: starting


class Status(str, enum.Enum):
    """Where a run stands."""

    STARTING = "starting"
    TUNING = "tuning"
    CONFIRMING = "confirming"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"  # its controller died without writing its end

    def __str__(self) -> str:
        return self.value

    @property
    def live(self) -> bool:
        return self in (Status.STARTING, Status.TUNING, Status.CONFIRMING, Status.RUNNING)


def status_of(state: RunState, *, alive: bool | None, age_s: float) -> tuple[Status, int | None]:
    """A run's `Status` and exit code from its folded journal (`autotune.monitor.state`) and
    whether its controller lives (None: no controller written down yet, the run ``age_s``
    old)."""
    if state.ended:
        code = state.exit_code or 0
        if code == 0:
            return Status.FINISHED, 0
        return (Status.STOPPED if code in STOP_CODES else Status.FAILED), code
    if alive is False or (alive is None and age_s > STARTING_GRACE_S):
        return Status.LOST, None
    if state.fullrun is not None or (state.kind in (RunKind.RUN, RunKind.PROBE) and state.started_t):
        return Status.RUNNING, None
    if state.best is not None or state.confirmations:
        return Status.CONFIRMING, None
    if state.trials:
        return Status.TUNING, None
    return Status.STARTING, None


@dataclass(frozen=True)
class RunInfo:
    """One run as ``autotune ps`` shows it."""

    id: str
    path: Path
    command: str  # tune | wrap | run | probe
    script: str
    status: Status
    exit_code: int | None
    pid: int | None
    started: float | None  # unix time
    ended: float | None
    figure: str  # the best speed-up so far, or the full run's rate against its promise
    again_of: str = ""  # the run this one started again (`autotune run --again`)
    again_in: str = ""  # the run that started this one again

    @property
    def state_text(self) -> str:
        if self.status is Status.FAILED:
            return f"failed({self.exit_code})"
        return self.status.value

    def elapsed_s(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)

    def to_dict(self, now: float) -> dict:
        return {"id": self.id, "path": str(self.path), "command": self.command,
                "script": self.script, "state": self.status.value,
                "exit_code": self.exit_code, "pid": self.pid, "started": self.started,
                "ended": self.ended, "elapsed_s": round(self.elapsed_s(now), 1),
                "figure": self.figure, "again_of": self.again_of or None,
                "again_in": self.again_in or None}


def figure(state: RunState) -> str:
    """The best speed-up so far (tuning), or the full run's rate against its promise."""
    fr = state.fullrun
    if fr is not None and fr.samples_per_s is not None:
        rate = f"{fr.samples_per_s:.1f} samples/s"
        promised = fr.promised or (state.best or {}).get("samples_per_s")
        if isinstance(promised, (int, float)) and promised > 0:
            return f"{rate} ({fr.samples_per_s / promised:.0%} of the {promised:.1f} promised)"
        return rate
    best, base = state.best_row, state.baseline_samples_per_s
    if state.best and isinstance(state.best.get("speedup"), (int, float)):
        return f"{state.best['speedup']:.2f}x" + (" (defaults kept)"
                                                  if state.best.get("kept_baseline") else "")
    if best is not None and base:
        return f"best so far {best.samples_per_s / base:.2f}x"
    if best is not None and best.samples_per_s:
        return f"{best.samples_per_s:.1f} samples/s"
    return ""


def info(run_dir: Path, now: float | None = None) -> RunInfo:
    """``run_dir`` as `RunInfo`: its journal folded, its controller looked at."""
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    state = fold(read_events(run_dir)[0])
    ctl = controllers.controller(run_dir)
    try:
        age_s = now - run_dir.stat().st_mtime
    except OSError:
        age_s = 0.0
    status, code = status_of(state, alive=None if ctl is None else ctl.alive(), age_s=age_s)
    kind = state.kind.value if state.kind else _kind_from_name(run_dir.name)
    return RunInfo(id=run_dir.name, path=run_dir, command=kind,
                   script=state.script if state.command else "?", status=status,
                   exit_code=code, pid=ctl.pid if ctl else None,
                   started=state.started_t, ended=state.ended_t, figure=figure(state),
                   again_of=state.again_of, again_in=state.again_in)


def _kind_from_name(name: str) -> str:
    parts = name.split("-")
    return parts[2] if len(parts) > 2 else "?"


