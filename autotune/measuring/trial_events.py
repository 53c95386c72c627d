"""The ``trial_*`` events of one probe, written in one place.

A tuning stage's probe (`autotune.tuning.prober.Prober.probe`) and ``autotune probe``'s modes
journal the same story: started, progress while it measures, finished. `TrialEvents` writes
it, so every probe's events have one shape whoever ran it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.measuring.result import TrialResult
from autotune.store.events import Event
from autotune.store.journal import Journal
from probes.protocol import Mode


@dataclass(frozen=True)
class TrialEvents:
    """The events of the probe named ``trial`` (``baseline``, ``trial-3``, ``probe-io``):
    ``number`` is its study trial's (None outside the search), ``mode`` its probe mode."""

    journal: Journal
    trial: str
    number: int | None
    mode: Mode
    _last: list = field(default_factory=list, compare=False, repr=False)  # the last estimate

    def __post_init__(self):
        object.__setattr__(self, "mode", Mode(self.mode))  # a mode given as its text

    def started(self, knobs: Mapping) -> None:
        self.journal.emit(Event.TRIAL_STARTED, trial=self.trial, number=self.number,
                          knobs=dict(knobs), mode=self.mode)

    def progress(self, estimate) -> None:
        """A live estimate: anything with ``samples_per_s``, ``ci_half`` and ``measured_s``;
        one that says nothing new (the count stood still since the last) is not written."""
        said = (estimate.samples_per_s, estimate.ci_half, estimate.measured_s)
        if self._last and self._last[-1] == said:
            return
        self._last[:] = [said]
        self.journal.emit(Event.TRIAL_PROGRESS, trial=self.trial,
                          samples_per_s=estimate.samples_per_s, ci_half=estimate.ci_half,
                          measured_s=estimate.measured_s)

    def finished(self, result: TrialResult) -> None:
        self.journal.emit(Event.TRIAL_FINISHED, trial=self.trial, number=self.number,
                          mode=self.mode, result=result)
