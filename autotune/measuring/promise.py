"""The full run against the recipe's promise. Pure.

A recipe says what its knobs gave in the confirmation: samples/s with a 95% interval, and where
the time went. The full run reports its own rate every few seconds (``fullrun_progress``). When
the run stays below the promise's interval for a sustained stretch, that is said once, with the
part that moved: the data wait grew, another part grew, other programs loaded the machine, or
the run is not on the machine the recipe was tuned on. At the end the whole run's rate is held
against the promise the same way.

A run on another world (other ranks, other hosts) than the recipe's is not held to its figure:
samples/s summed over ranks is not comparable across worlds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.measuring.breakdown import LABELS, Breakdown

SUSTAIN_S = 30.0  # below the interval this long, report after report, is a shortfall
PART_MOVED = 0.10  # a part's share this much larger than in the recipe is "the part that moved"
FOREIGN_MOVED_CORES = 0.5  # foreign load this large is named as a cause


@dataclass(frozen=True)
class Promise:
    """What the recipe promised the run: ``samples_per_s`` with its 95% interval, where the
    winner's time went (part -> share), and why the run may differ (a fingerprint difference,
    "" when the machine is the recipe's)."""

    samples_per_s: float
    ci_half: float
    shares: Mapping[str, float]
    differs: str = ""

    @property
    def low(self) -> float:
        return self.samples_per_s - self.ci_half

    def describe(self) -> str:
        return f"{self.samples_per_s:.1f} ± {self.ci_half:.1f} samples/s"


@dataclass(frozen=True)
class Reading:
    """One progress report of the full run."""

    t: float  # seconds, any clock
    samples_per_s: float
    breakdown: Breakdown | None = None
    foreign_cores: float | None = None  # other programs' load over the report's span


def moved(promise: Promise, reading: Reading) -> str:
    """The part that moved, in words: the largest part that grew past `PART_MOVED` over the
    recipe's share, foreign load, a different machine; "" when nothing here explains it."""
    causes = []
    if reading.breakdown is not None and promise.shares:
        grown = sorted(((reading.breakdown.share(p) - promise.shares.get(p, 0.0), p)
                        for p in reading.breakdown.shares), reverse=True)
        if grown and grown[0][0] >= PART_MOVED:
            part = grown[0][1]
            causes.append(f"{LABELS.get(part, part)} grew from "
                          f"{promise.shares.get(part, 0.0):.0%} to "
                          f"{reading.breakdown.share(part):.0%} of each step")
    if reading.foreign_cores is not None and reading.foreign_cores >= FOREIGN_MOVED_CORES:
        causes.append(f"other programs used {reading.foreign_cores:.1f} cores")
    if promise.differs:
        causes.append(f"this is not the machine the recipe was tuned on ({promise.differs})")
    return "; ".join(causes)


class PromiseWatch:
    """Folds the full run's reports; `see` returns a message the first time the run has stayed
    below the promise's interval for `SUSTAIN_S`, and `verdict` says how the whole run did."""

    def __init__(self, promise: Promise, *, sustain_s: float = SUSTAIN_S):
        self.promise = promise
        self.sustain_s = sustain_s
        self._below_since: float | None = None
        self._said = False

    def see(self, reading: Reading) -> str | None:
        if reading.samples_per_s >= self.promise.low:
            self._below_since = None
            return None
        if self._below_since is None:
            self._below_since = reading.t
        if self._said or reading.t - self._below_since < self.sustain_s:
            return None
        self._said = True
        why = moved(self.promise, reading)
        return (f"the full run gives {reading.samples_per_s:.1f} samples/s, below the "
                f"recipe's {self.promise.describe()} for "
                f"{reading.t - self._below_since:.0f} s" + (f": {why}" if why else
                                                            ": no part of the step moved"))

    def verdict(self, samples_per_s: float, breakdown: Breakdown | None = None) -> str:
        """The whole run against the promise, in one line."""
        p = self.promise
        if samples_per_s >= p.low:
            where = "within" if samples_per_s <= p.samples_per_s + p.ci_half else "above"
            return (f"the full run gave {samples_per_s:.1f} samples/s, {where} the recipe's "
                    f"{p.describe()}")
        why = moved(p, Reading(0.0, samples_per_s, breakdown))
        return (f"the full run gave {samples_per_s:.1f} samples/s, below the recipe's "
                f"{p.describe()} ({samples_per_s / p.samples_per_s:.0%} of it)"
                + (f": {why}" if why else ""))
