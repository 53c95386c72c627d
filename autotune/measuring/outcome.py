"""Trial outcomes and the pure rules that decide them from what a probe observed.

`classify` is the only place an ``(Outcome, reason)`` is made: the trial gathers everything that
decides it into one frozen `Observed` (how the ranks ended, what was counted, whether the search
pruned it, the foreign load, which attempt of a re-run series it is) and every later layer reads
the outcome it returns, never rewrites it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from probes.protocol import ErrorKind, Mode


class Outcome(str, Enum):
    OK = "ok"
    OOM = "oom"
    CRASHED = "crashed"
    HUNG = "hung"
    NO_SIGNAL = "no-signal"
    EXITED_EARLY = "exited-early"  # ended on its own before a steady span: no figure
    # Measured a steady span, then the script ended on its own (its data ran out, it exited):
    # the figure stands, as OK's does
    ENDED = "ended"
    PRUNED = "pruned"
    FOREIGN_LOAD = "foreign-load"  # measured, but under load that is not ours: not comparable

    @property
    def usable(self) -> bool:
        """Its figure is used as measured (compared, searched on, confirmed): OK or ENDED."""
        return self in USABLE


USABLE = frozenset({Outcome.OK, Outcome.ENDED})


@dataclass(frozen=True)
class Observed:
    """Everything the classification needs, gathered by the trial loop."""

    exit_code: int | None  # of the first rank that failed, or of rank 0; None: still ran
    stopped_by_us: bool  # we asked it to stop (probe over, or pruned)
    error_kind: ErrorKind | None = None  # from the meter; None: no error, or a kind unknown
    error_text: str = ""  # "Type: message"
    batches: int = 0
    steps: int = 0
    has_estimate: bool = False
    hung_s: float | None = None  # seconds without progress when declared hung
    ran_s: float = 0.0
    last_log_line: str = ""
    needs_batch_size: bool = False  # it stepped, but no DataLoader says how many samples a step is
    stalled_s: float = 0.0  # seconds without progress when the probe ended, after some progress
    step_s: float | None = None  # its observed seconds per batch (or step) while it progressed
    stalled_idle: bool = False  # its processes did next to no work over that stall: a wait
    # With --metric: why the metric gave no estimate (`series.metric_reason`), the reason of a
    # probe that measured nothing or ended early; "" without --metric.
    metric_reason: str = ""
    # The counted series behind a missing estimate: how long it spans (all ranks counting at
    # once) and how much of it stood still as pauses (left out of any figure).
    counted_s: float = 0.0
    paused_s: float = 0.0
    first_s: float | None = None  # seconds into the probe its first batch (or step) came
    io_without_loader: bool = False  # io mode, and no batch came through a DataLoader
    mode: Mode = Mode.FULL
    pruned: bool = False  # the search stopped it: its interval could not reach the best
    foreign_cores: float = 0.0  # CPU load of other programs during the probe, in cores
    foreign_limit_cores: float = float("inf")  # more than this: not comparable
    # Which attempt of a series the caller re-runs while foreign load spoils it (1 = first);
    # None: a probe nobody re-runs. ``last_attempt``: no re-run follows this one.
    attempt: int | None = None
    last_attempt: bool = True

    def __post_init__(self):
        # the meter's text, parsed once; a kind this autotune does not know is none it acts on
        kind = self.error_kind
        object.__setattr__(self, "error_kind", kind if kind is None or isinstance(
            kind, ErrorKind) else next((k for k in ErrorKind if k.value == kind), None))

    @property
    def foreign_flagged(self) -> bool:
        return self.foreign_cores > self.foreign_limit_cores


STALL_STEPS = 20  # no progress for this many of its own steps ...
STALL_MIN_S = 5.0  # ... and at least this long, when we end the probe: hung


def stalled(obs: Observed) -> bool:
    """It made progress, then made none for far longer than its own steps take, until we
    stopped it: hung, however short the probe (the hang threshold may be longer)."""
    return bool(obs.stopped_by_us and obs.step_s and (obs.batches or obs.steps)
                and obs.stalled_s > max(STALL_STEPS * obs.step_s, STALL_MIN_S))


def script_exit_code(exit_codes: list[int | None], *, own: int | None, stopped_by_us: bool,
                     stopped_clean: bool, error: bool) -> int | None:
    """The exit code a probe reports: the script's failure where there was one, else rank 0's
    (None when our own signal ended it).

    ``own``: the code of a rank that failed before we stopped anything, from its goodbye (an
    engine folds it into its own status) or from its process; it wins. ``stopped_clean``: every
    rank left on our stop request, or one was pulled out of a collective by a peer that left
    first (taking its parent, mp.spawn's say, down with it): a failing code after that is the
    stop's doing, as is a signal, unless a rank reported an ``error`` before the stop.
    """
    if own is not None:
        return own
    failing = next((c for c in exit_codes if c not in (0, None)), None)
    if stopped_by_us and failing is not None and (stopped_clean or failing < 0) and not error:
        failing = None  # our own TERM/KILL, not the script's failure
    if failing is not None:
        return failing
    code = exit_codes[0] if exit_codes else None
    if stopped_by_us and code is not None and code < 0:
        return None  # our own TERM/KILL at the end of the probe: the script had no say
    return code


def classify(obs: Observed) -> tuple[Outcome, str]:
    """(outcome, one-line reason). The reason is empty only for a plain OK.

    How the ranks ended decides first; then, over a result that could be
    compared: io mode with no DataLoader measured nothing, a pruned probe is PRUNED, and foreign
    load over the limit makes either FOREIGN_LOAD, never compared. A probe that gave no figure
    under such load stays NO_SIGNAL (there is nothing to set aside), and its reason names the
    load.
    """
    outcome, reason = _how_it_ended(obs)
    if obs.metric_reason and outcome in (Outcome.NO_SIGNAL, Outcome.EXITED_EARLY):
        reason = obs.metric_reason
    if obs.io_without_loader and outcome.usable:
        return Outcome.NO_SIGNAL, ("io mode drains a DataLoader, and the script fed no batch "
                                   "through one")
    if obs.pruned and outcome.usable:
        outcome, reason = Outcome.PRUNED, "its interval could not reach the best so far"
    if obs.foreign_flagged and outcome == Outcome.NO_SIGNAL:
        # no figure to set aside, but the load is the likelier cause than the script
        return outcome, (f"{reason}; {obs.foreign_cores:.2f} cores of CPU load from other "
                         f"programs slowed it meanwhile: re-run when the machine is quiet")
    if obs.foreign_flagged and (outcome.usable or outcome == Outcome.PRUNED):
        ended = f"; {reason}" if outcome == Outcome.ENDED else ""
        if obs.attempt is not None and obs.last_attempt:
            return Outcome.FOREIGN_LOAD, (f"{obs.foreign_cores:.2f} cores of CPU load from other "
                                          f"programs in {obs.attempt} attempt(s); not "
                                          f"compared{ended}")
        return Outcome.FOREIGN_LOAD, (f"{obs.foreign_cores:.2f} cores of CPU load from other "
                                      f"programs during the probe; not comparable, re-run when "
                                      f"the machine is quiet{ended}")
    return outcome, reason


def _ended_by_itself(obs: Observed) -> str:
    """How the script ended on its own, as a reason says it, where that end leaves what it
    measured standing; "" when it did not (we stopped it, or it failed).

    Exit 0, and an uncaught StopIteration (its data ran out: how a ``while True: next(it)``
    loop over a finite loader ends), in any mode. In synthetic mode also an exception or a
    non-zero exit: the script trained on replayed batches it would not see (and on epochs
    stretched to its real loader's pace), so what it does at the end is the mode's doing, not a
    failure of the config. An OOM and a signal are never an end.
    """
    if obs.stopped_by_us or obs.error_kind is ErrorKind.OOM or (obs.exit_code or 0) < 0:
        return ""
    if obs.error_kind is ErrorKind.STOP_ITERATION:
        return f"its data ran out: an uncaught {_exception(obs.error_text)}"
    if obs.exit_code == 0 and not obs.error_text:
        return "exit 0"
    if obs.mode is Mode.SYNTHETIC and (obs.error_text or obs.exit_code):
        how = obs.error_text or f"exit {obs.exit_code}"
        return f"{how}, on replayed batches"
    return ""


def _exception(error_text: str) -> str:
    """``Type: message`` without the colon of an empty message (StopIteration has none)."""
    return error_text.rstrip().rstrip(":") or "StopIteration"


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _how_it_ended(obs: Observed) -> tuple[Outcome, str]:
    """(outcome, reason) from how the ranks ended and what they were counted doing alone."""
    where = f" (last log line: {obs.last_log_line})" if obs.last_log_line else ""
    after = f"{obs.batches} batches" if obs.batches else f"{obs.steps} steps"
    if obs.error_kind is ErrorKind.OOM:
        return Outcome.OOM, f"out of memory: {obs.error_text}"
    if obs.exit_code == -signal.SIGKILL and not obs.stopped_by_us:
        return Outcome.OOM, "killed by SIGKILL from outside, most likely the kernel OOM killer"
    ended = _ended_by_itself(obs)
    if ended and obs.has_estimate:
        return Outcome.ENDED, (f"the script ended on its own ({ended}) after {after}; the figure "
                               f"is from the steady span before its end")
    ran_out = obs.error_kind is ErrorKind.STOP_ITERATION
    if ran_out and (obs.batches or obs.steps):
        return Outcome.EXITED_EARLY, (f"the script ended on its own ({ended}) after {after}, "
                                      f"before a steady-state estimate; give it more data or "
                                      f"make it run longer")
    if obs.error_text:
        return Outcome.CRASHED, (f"{_exception(obs.error_text)} before its first batch or step"
                                 if ran_out else obs.error_text)
    if obs.exit_code is not None and obs.exit_code != 0 and not obs.stopped_by_us:
        how = (f"killed by {_signal_name(obs.exit_code)}" if obs.exit_code < 0
               else f"exited with code {obs.exit_code}")
        return Outcome.CRASHED, how + where
    if obs.hung_s is not None:
        after = f"after {obs.batches} batches" if obs.batches else "before its first batch"
        return Outcome.HUNG, f"no progress for {obs.hung_s:.0f} s {after}"
    # A stall at the end is a hang when there is nothing else to go on, or when the processes
    # sat idle through it (a deadlock; a busy pause, an evaluation say, keeps its estimate).
    if stalled(obs) and (obs.stalled_idle or not obs.has_estimate):
        after = f"after {obs.batches} batches" if obs.batches else f"after {obs.steps} steps"
        return Outcome.HUNG, (f"no progress for {obs.stalled_s:.0f} s {after}, whose steps took "
                              f"{obs.step_s:.2g} s: a deadlock or a wait that never ended")
    if obs.has_estimate:
        return Outcome.OK, ""
    if obs.batches == 0 and obs.steps == 0:
        if obs.exit_code == 0 and not obs.stopped_by_us:
            return Outcome.NO_SIGNAL, "exited 0 without a single DataLoader batch or optimizer step"
        return Outcome.NO_SIGNAL, (f"ran {obs.ran_s:.0f} s without a DataLoader batch or "
                                   f"optimizer step; allow more --seconds if it starts slowly")
    if obs.batches == 0 and obs.needs_batch_size:
        return Outcome.NO_SIGNAL, (f"{obs.steps} optimizer steps but no DataLoader: put "
                                   f"{{batch_size}} in the script's args or pass --metric REGEX")
    if obs.exit_code == 0 and not obs.stopped_by_us:
        return Outcome.EXITED_EARLY, (f"the script ended on its own after {obs.batches} batches, "
                                      f"before a steady-state estimate; make it run longer")
    return Outcome.NO_SIGNAL, _why_no_estimate(obs)


def _why_no_estimate(obs: Observed) -> str:
    """Why batches came but no steady figure: pauses took the counted time, start-up took most
    of the probe, the ranks counted together too briefly, or there were simply too few."""
    got = f"{obs.batches} batches in {obs.ran_s:.0f} s"
    if obs.counted_s > 0 and obs.paused_s >= 0.5 * obs.counted_s:
        return (f"{got}, but the count stood still for {obs.paused_s:.1f} s of the "
                f"{obs.counted_s:.1f} s it ran (pauses are left out of the figure), leaving too "
                f"little steady time; on a busy machine allow more --seconds")
    if 0 < obs.counted_s < 0.5 * obs.ran_s and obs.first_s is not None \
            and obs.first_s >= 0.5 * obs.ran_s:
        return (f"{got}, but the first came {obs.first_s:.0f} s in (start-up took most of the "
                f"probe), leaving {obs.counted_s:.1f} s to measure; allow more --seconds")
    if 0 < obs.counted_s < 0.5 * obs.ran_s:
        return (f"{got}, but all ranks counted together for only {obs.counted_s:.1f} s (one "
                f"started or stopped late): too little to measure; allow more --seconds")
    return f"only {got}: too few to measure; allow more --seconds"


IDLE_CORES = 0.05  # the ranks' CPU, in cores, under which a standstill is a wait


def idle(cpu_s_used: float, over_s: float) -> bool:
    """The ranks did (next to) no work over ``over_s`` seconds: a wait, not a slow step."""
    return cpu_s_used < IDLE_CORES * over_s
