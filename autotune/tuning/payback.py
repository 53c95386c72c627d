"""Tuning that pays for itself: how long the full run will be, what share of it tuning may take,
and what the winner saves over it. Pure.

The run's length comes from the script's own arguments and what the baseline saw: epochs
(``--epochs 90``) over the dataset's length when its DataLoader knows it, or optimizer steps
(``--max_steps 5000``) times the script's own global batch. At the baseline's throughput that
is the run's projected time; without ``--budget`` (or ``--trials``) tuning gets `SHARE` of it,
at least `MIN_BUDGET_S` and never more than the run itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from autotune.launching import script_flags

SHARE = 0.1  # of the projected run, what tuning may take when no budget is given
MIN_BUDGET_S = 180.0  # ...but no less than this (a baseline and a few probes), unless the
# run itself is shorter


@dataclass(frozen=True)
class RunLength:
    """The full run's samples, and how they were worked out."""

    samples: float
    how: str  # "--epochs 90 x 50,000 samples"

    def seconds_at(self, samples_per_s: float) -> float:
        return self.samples / samples_per_s if samples_per_s > 0 else float("inf")

    @classmethod
    def from_dict(cls, d: Mapping) -> RunLength:
        return cls(float(d["samples"]), str(d["how"]))


def project(args: Sequence[str], seen: Mapping, global_batch: int | None) -> RunLength | None:
    """The run's length from the script's arguments (``args``, the script's own) and the
    baseline's ``seen`` facts; None when neither says it."""
    flags = script_flags.run_length(args)
    dataset = seen.get("dataset_len")
    if "epochs" in flags and isinstance(dataset, int) and dataset > 0:
        n, typed = flags["epochs"]
        return RunLength(float(n * dataset), f"{typed} x {dataset:,} samples")
    if "steps" in flags and global_batch:
        n, typed = flags["steps"]
        return RunLength(float(n * global_batch), f"{typed} x {global_batch} samples a step")
    return None


def budget_for(run_s: float) -> float:
    """The tuning budget for a run of ``run_s`` seconds (see the module's docstring)."""
    return min(run_s, max(SHARE * run_s, MIN_BUDGET_S))


@dataclass(frozen=True)
class Payback:
    """What tuning cost and what the winner is projected to save over the run."""

    tuning_s: float
    run: RunLength
    baseline_run_s: float
    best_run_s: float

    @property
    def saving_s(self) -> float:
        return self.baseline_run_s - self.best_run_s

    def text(self) -> str:
        verdict = "pays for itself" if self.saving_s > self.tuning_s else "does not pay for itself"
        return (f"tuning cost {duration(self.tuning_s)}, projected saving "
                f"{duration(max(0.0, self.saving_s))} over the run ({self.run.how}: "
                f"{duration(self.baseline_run_s)} at the script's own settings, "
                f"{duration(self.best_run_s)} with the winner): tuning {verdict}")

    def to_dict(self) -> dict:
        """The ``payback`` event's fields and ``summary.json``'s ``payback``."""
        return {**asdict(self), "saving_s": self.saving_s, "text": self.text()}

    @classmethod
    def from_dict(cls, d: Mapping) -> Payback:
        return cls(float(d["tuning_s"]), RunLength.from_dict(d["run"]),
                   float(d["baseline_run_s"]), float(d["best_run_s"]))


def payback(tuning_s: float, run: RunLength, baseline_rate: float,
            best_rate: float) -> Payback:
    return Payback(tuning_s, run, run.seconds_at(baseline_rate), run.seconds_at(best_rate))


def duration(s: float) -> str:
    """``3h 05m``, ``12m 40s``, ``45s``."""
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"
