"""The journal's vocabulary: every event name a writer may emit, and each event's fields.

One place for what ``events.jsonl`` may hold. `Journal.emit` refuses a name outside `Event` and
fields outside the event's `FIELDS` entry (or without a required one), so a writer cannot invent
an event the readers do not know. The readers (`autotune.monitor.state`, `autotune.monitor.text`,
`autotune.monitor.view`, `autotune.report.html`) each declare, per `Event`, how they show it or
why they leave it out; their tests fail on a kind none of them has decided about.

On disk an event is ``{"t": <unix time>, "event": <Event value>, <fields>}``; the values are the
names journals have always used, so old run directories still replay. Readers never rely on a
field being there: a journal from an older autotune may lack one that is required now.
docs/internals.md ("Journal events") lists the same table; `tests/test_events.py` checks both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Event(str, enum.Enum):
    """What happened, as the journal names it."""

    RUN_STARTED = "run_started"
    TRIAL_STARTED = "trial_started"
    TRIAL_PROGRESS = "trial_progress"
    TRIAL_FINISHED = "trial_finished"
    TRIAL_PRUNED = "trial_pruned"
    ALLREDUCE = "allreduce"
    CONFIRMATION = "confirmation"
    PROBE_VERDICT = "probe_verdict"
    BEST = "best"
    PARETO = "pareto"
    PAYBACK = "payback"
    MEMORY_FIT = "memory_fit"
    BATCH_CHANGE = "batch_change"
    RECIPE_SAVED = "recipe_saved"
    FULLRUN_STARTED = "fullrun_started"
    FULLRUN_PROGRESS = "fullrun_progress"
    FULLRUN_NOTES = "fullrun_notes"
    FULLRUN_PROMISE = "fullrun_promise"
    FULLRUN_ENDED = "fullrun_ended"
    DEVICE_SAMPLE = "device_sample"
    RUN_ENDED = "run_ended"
    RUN_AGAIN = "run_again"

    def __str__(self) -> str:
        return self.value


class RunKind(str, enum.Enum):
    """Which command a run directory is of: ``run_started``'s ``kind``, ``tune.json``'s."""

    TUNE = "tune"
    WRAP = "wrap"
    PROBE = "probe"
    RUN = "run"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, text) -> RunKind | None:
        """``text`` as a `RunKind`; None for one this autotune does not know (or none)."""
        try:
            return cls(text)
        except ValueError:
            return None


@dataclass(frozen=True)
class Fields:
    """The fields of one event besides ``t`` and ``event``: those every writer gives, and those
    only some writers (or some outcomes) give."""

    required: tuple[str, ...]
    optional: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.required) | frozenset(self.optional)


FIELDS: dict[Event, Fields] = {
    Event.RUN_STARTED: Fields(
        ("kind", "command", "cwd"),
        ("space", "budget_s", "trials", "hardware", "resumed", "launcher", "objective", "modes",
         "recipe", "again_of")),
    Event.TRIAL_STARTED: Fields(("trial", "number", "knobs", "mode")),
    Event.TRIAL_PROGRESS: Fields(("trial", "samples_per_s", "ci_half", "measured_s")),
    Event.TRIAL_FINISHED: Fields(("trial", "number", "mode", "result")),
    Event.TRIAL_PRUNED: Fields(("trial", "number", "reason")),
    Event.ALLREDUCE: Fields(("candidates",), ("result", "error")),
    Event.CONFIRMATION: Fields(("round", "trial", "knobs", "samples_per_s", "ci_half", "outcome",
                                "reason"), ("slice_rates", "chooses")),
    Event.PROBE_VERDICT: Fields(("verdict",)),
    Event.BEST: Fields(("knobs", "samples_per_s", "ci_half", "baseline_samples_per_s", "speedup",
                        "kept_baseline", "reason", "speedup_low", "speedup_high", "objective",
                        "score", "baseline_score"), ("keep_batch", "rounds", "candidates")),
    Event.PARETO: Fields(("points", "front", "picked", "within_rel")),
    Event.PAYBACK: Fields(("tuning_s", "run", "baseline_run_s", "best_run_s", "saving_s",
                           "text")),
    Event.MEMORY_FIT: Fields(("fixed_bytes", "per_sample_bytes", "points", "kind",
                              "available_bytes", "ranks", "max_batch", "text")),
    Event.BATCH_CHANGE: Fields(("text",)),
    Event.RECIPE_SAVED: Fields(("path",)),
    Event.FULLRUN_STARTED: Fields(("command", "knobs", "instances", "launcher"),
                                  ("promised", "settings")),
    Event.FULLRUN_PROGRESS: Fields(("samples_per_s", "steps", "samples"), ("breakdown",)),
    Event.FULLRUN_NOTES: Fields(("notes", "mps_check")),
    Event.FULLRUN_PROMISE: Fields(("samples_per_s", "promised", "ci_half", "final", "below", "text"), ()),
    Event.FULLRUN_ENDED: Fields(("exit_code",), ("rank", "launcher_exit_code", "breakdown",
                                                "signal", "samples_per_s", "steady_s")),
    Event.DEVICE_SAMPLE: Fields(("cpu_pct", "mem_used_bytes", "mem_total_bytes", "gpus",
                                 "workers", "ranks")),
    Event.RUN_ENDED: Fields(("exit_code",), ("error",)),
    Event.RUN_AGAIN: Fields(("run",)),
}

def check(name: Event | str, fields: Mapping) -> Event:
    """``name`` as an `Event`, once ``fields`` are the event's own.

    Raises:
        ValueError: the name is not an `Event`, a required field is missing, or a field is not
            the event's (``t`` aside; ``event`` is never a field).
    """
    try:
        event = Event(name)
    except ValueError:
        raise ValueError(f"journal event must be one of {', '.join(e.value for e in Event)}, "
                         f"but got {name!r}") from None
    spec = FIELDS[event]
    missing = [f for f in spec.required if f not in fields]
    unknown = sorted(set(fields) - spec.names - {"t"})
    if missing or unknown:
        raise ValueError(f"journal event {event.value!r} takes {', '.join(spec.required)}"
                         + (f" (optional {', '.join(spec.optional)})" if spec.optional else "")
                         + f", but got {', '.join(sorted(fields)) or 'no fields'}"
                         + (f": missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    return event
