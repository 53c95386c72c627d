"""Tuning that pays for itself: how long the full run will be, what share of it tuning may take,
and what the winner saves over it. Pure.

The run's length comes from the script's own arguments and what the baseline saw: epochs
(``--epochs 90``) over the dataset's length when its DataLoader knows it, or optimizer steps
(``--max_steps 5000``) times the script's own global batch. At the baseline's throughput that
is the run's projected time; without ``--budget`` (or ``--trials``) tuning gets `SHARE` of it,
at least `MIN_BUDGET_S`, at most `MAX_BUDGET_S` and never more than the run itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from autotune.launching import script_flags

SHARE = 0.1  # of the projected run, what tuning may take when no budget is given
MIN_BUDGET_S = 180.0  # ...but no less than this (a baseline and a few probes), unless the
# run itself is shorter
MAX_BUDGET_S = 900.0  # ...nor more (90 epochs of a real job would give hours): --budget says more


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
    return min(run_s, MAX_BUDGET_S, max(SHARE * run_s, MIN_BUDGET_S))


def budget_text(budget_s: float, run_s: float) -> str:
    """Where a default budget came from and how to set another: one line, said before the
    search starts."""
    if run_s <= MIN_BUDGET_S:
        return (f"tuning budget {minutes(budget_s)}, the whole projected run: a run this short "
                f"cannot pay for tuning; --budget TIME or --trials N tunes anyway")
    share = f"{SHARE:.0%} of the projected run ({duration(run_s)})"
    if budget_s >= MAX_BUDGET_S and SHARE * run_s > MAX_BUDGET_S:
        why = f"{share} is {duration(SHARE * run_s)}, capped at {minutes(MAX_BUDGET_S)}"
    elif budget_s <= MIN_BUDGET_S and SHARE * run_s < MIN_BUDGET_S:
        why = f"{share} is {duration(SHARE * run_s)}, raised to the least, " \
              f"{minutes(MIN_BUDGET_S)}"
    else:
        why = share
    return f"tuning budget {minutes(budget_s)}: {why}; --budget TIME sets another"


def default_text(trials: int) -> str:
    """What a tuning without --budget or --trials will take, said before its baseline."""
    return (f"no --budget: once the baseline has run, tuning takes {SHARE:.0%} of the full run "
            f"when the script's arguments give its length (--epochs, --max-steps; at least "
            f"{minutes(MIN_BUDGET_S)}, at most {minutes(MAX_BUDGET_S)}), else {trials} "
            f"probes; --budget TIME sets one")


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


def minutes(s: float) -> str:
    """``6m12s``, ``3m``, ``12s``: a budget, as ``--budget`` takes it."""
    m, s = divmod(int(s), 60)
    return f"{m}m{s:02d}s" if m and s else f"{m}m" if m else f"{s}s"


def duration(s: float) -> str:
    """``3h 05m``, ``12m 40s``, ``45s``."""
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"
