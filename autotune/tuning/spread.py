"""Noise where it arises: the spread inside one probe against the spread between processes.

A probe's interval (``ci_half``) sees how its own steps scatter. It cannot see what differs
between two processes of the same config: start-up, what the allocator and the threads settled
on, another program's load at the time. The search measures that part early, by probing the
script's own config a second time in a new process, interleaved with the first candidates
(`Repeat`), and `ProcessSpread` splits the difference of the two into what their own intervals
explain and the rest, the spread between processes. The pruning margin and a one-round speed-up
interval use it (`ProcessSpread.margin_rel`, `ProcessSpread.process_rel`) instead of the
assumed `autotune.tuning.decision.PROCESS_NOISE_REL`, and a spread larger than the probes'
own is explained by what differed (foreign load, start-up, warm-up) where the probes show it.

Pure: numbers in, numbers and words out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.tuning import decision, search_rules

MIN_CONFIGS = 4  # a search expected to see fewer configs spends no probe on a repeat
BETWEEN_FLOOR = 0.01  # below this, processes are as alike as this VM's clock can tell
BETWEEN_CAP = 0.30  # one pair past this says something broke, not how processes differ
MARGIN_FLOOR = 0.03  # a pruning margin never under this: the decision's own minimum gain
MARGIN_CAP = 0.25
FOREIGN_DIFFERS_CORES = 0.3  # two probes whose foreign load differs this much were not alike
STARTUP_DIFFERS = 1.5  # one start-up this many times the other's
# A spread measured from a pair or two is itself uncertain: one pair of processes gives one
# degree of freedom, and the true spread may be many times what it showed. Where one round is
# to decide alone (`upper_rel`), the spread is taken at its 90% upper bound: sd x sqrt(dof /
# the chi-square's 10% quantile at dof), these quantiles.
UPPER_LEVEL = 0.90
# Planning rounds takes the spread at its median instead: one pair's squared difference over
# twice the variance is chi-square with one degree of freedom, whose median is 0.455, so the
# pair's reading is under the true spread two times in three; sqrt(1 / 0.455) makes it
# median-unbiased (`ProcessSpread.planning_rel`).
MEDIAN_FACTOR = 1.4826
_CHI2_LOW = {1: 0.015791, 2: 0.210721, 3: 0.584374, 4: 1.063623, 5: 1.610308, 6: 2.204131}


@dataclass(frozen=True)
class Side:
    """One of the two probes of the same config: its figure and what may explain it."""

    samples_per_s: float
    ci_half: float  # 95%
    foreign_cores: float = 0.0
    first_s: float = 0.0  # launch to its first step
    warmup_s: float = 0.0  # warm-up left out of its window
    measured_s: float = 0.0
    steal_cores: float = 0.0  # the hypervisor's steal while it measured
    duration_s: float = 0.0  # what the probe took, start-up included

    @property
    def rel_sd(self) -> float:
        """Its own interval as one standard deviation, a share of its figure."""
        if self.samples_per_s <= 0 or not math.isfinite(self.ci_half):
            return math.inf
        return self.ci_half / 1.96 / self.samples_per_s

    @classmethod
    def of(cls, result) -> Side:
        """From a measured probe's `autotune.measuring.result.TrialResult`."""
        return cls(float(result.samples_per_s), float(result.ci_half),
                   float(result.foreign_cores), float(result.first_s), float(result.warmup_s),
                   float(result.measured_s), float(result.steal_cores),
                   float(result.duration_s))

    def to_dict(self) -> dict:
        return {"samples_per_s": self.samples_per_s, "ci_half": self.ci_half,
                "foreign_cores": self.foreign_cores, "first_s": self.first_s,
                "warmup_s": self.warmup_s, "measured_s": self.measured_s,
                "steal_cores": self.steal_cores, "duration_s": self.duration_s}

    @classmethod
    def from_dict(cls, d: Mapping) -> Side:
        return cls(float(d["samples_per_s"]), float(d["ci_half"]),
                   float(d.get("foreign_cores", 0.0)), float(d.get("first_s", 0.0)),
                   float(d.get("warmup_s", 0.0)), float(d.get("measured_s", 0.0)),
                   float(d.get("steal_cores", 0.0)), float(d.get("duration_s", 0.0)))


@dataclass(frozen=True)
class ProcessSpread:
    """The same config measured in two processes (``first``, ``second``), or, with ``why`` and
    no second, why it was not (the assumed figure stands)."""

    first: Side | None = None
    second: Side | None = None
    why: str = ""  # what the spread is put down to, or why it was not measured

    @property
    def pending(self) -> bool:
        """The first process measured, the second neither measured nor decided against."""
        return self.first is not None and self.second is None and not self.why

    @property
    def measured(self) -> bool:
        """Both processes gave a figure and its interval: a probe cut short under load may give
        a figure whose interval is infinite, and no spread can be told from it."""
        return self.first is not None and self.second is not None and \
            math.isfinite(self.first.rel_sd) and math.isfinite(self.second.rel_sd)

    @property
    def differs_rel(self) -> float:
        """How far apart the two figures are, a share (log ratio)."""
        if not self.measured:
            return math.nan
        return abs(math.log(self.second.samples_per_s / self.first.samples_per_s))

    @property
    def within_rel(self) -> float:
        """The probes' own spread, one standard deviation of their figure, a share."""
        if not self.measured:
            return math.nan
        return math.hypot(self.first.rel_sd, self.second.rel_sd) / math.sqrt(2)

    @property
    def between_rel(self) -> float | None:
        """The spread between processes, one standard deviation, a share: the difference's
        variance less what the two probes' own intervals explain, shared by the two processes.
        None when not measured."""
        if not self.measured:
            return None
        d = self.differs_rel
        own = self.first.rel_sd ** 2 + self.second.rel_sd ** 2
        rest = max(0.0, d * d - own) / 2
        return min(BETWEEN_CAP, max(BETWEEN_FLOOR, math.sqrt(rest)))

    def process_rel(self) -> float:
        """What one process adds to a figure's spread: measured, else the assumed share."""
        b = self.between_rel
        return decision.PROCESS_NOISE_REL if b is None else b

    def planning_rel(self) -> float:
        """What one process adds to a round's ratio, for planning the confirmation's rounds
        (`autotune.tuning.decision.rounds_planned`): the two figures' whole difference, own
        intervals included (a confirmation probe carries its own noise into its round's ratio
        as much as what differs between processes), as one standard deviation of each, made
        median-unbiased (`MEDIAN_FACTOR`); never under `between_rel`. nanoGPT's shape read its
        own config 5.5% apart in two processes (±3.3% between them once their own intervals
        were taken off) and planned three rounds for a +19% gain; the rounds' ratios then
        spread ±9%, and four would have shown it. The assumed figure when not measured."""
        b = self.between_rel
        if b is None:
            return decision.PROCESS_NOISE_REL
        whole = self.differs_rel / math.sqrt(2) * MEDIAN_FACTOR
        return min(BETWEEN_CAP, max(b, whole))

    def margin_rel(self) -> float:
        """The pruning margin: a probe is pruned when its upper end stays this far under the
        best's low end. Two processes each carry the spread between processes."""
        b = self.between_rel
        if b is None:
            return search_rules.PRUNE_MARGIN_REL
        return min(MARGIN_CAP, max(MARGIN_FLOOR, math.sqrt(2) * b))

    def pair_logs(self) -> tuple[float, ...]:
        """The pair as a round of one config against itself: the log ratio of its two figures,
        whose true value is 0, which the confirmation pools with its rounds' spread
        (`autotune.tuning.decision._between_half`); none when not measured."""
        if not self.measured:
            return ()
        return (math.log(self.second.samples_per_s / self.first.samples_per_s),)

    def upper_rel(self) -> float | None:
        """The spread between processes at its `UPPER_LEVEL` upper bound from this one pair
        (`upper_rel`); None when not measured."""
        b = self.between_rel
        return None if b is None else upper_rel([b])

    def text(self) -> str:
        """One line for the user and the report."""
        if not self.measured:
            return (f"the spread between processes was not measured ({self.why}); "
                    f"{decision.PROCESS_NOISE_REL:.0%} is assumed")
        return (f"the script's own config started twice: {self.first.samples_per_s:.1f} and "
                f"{self.second.samples_per_s:.1f} samples/s ({self.differs_rel:.1%} apart, "
                f"their own intervals ±{1.96 * self.within_rel:.1%}); between processes "
                f"±{self.between_rel:.1%} (one s.d.): {self.why}; pruning margin "
                f"{self.margin_rel():.0%}")

    def to_dict(self) -> dict:
        return {"first": self.first and self.first.to_dict(),
                "second": self.second and self.second.to_dict(), "why": self.why,
                "measured": self.measured, "between_rel": self.between_rel,
                "within_rel": None if not self.measured else self.within_rel,
                "margin_rel": self.margin_rel(), "process_rel": self.process_rel(),
                "planning_rel": self.planning_rel()}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> ProcessSpread | None:
        if not d:
            return None
        return cls(Side.from_dict(d["first"]) if d.get("first") else None,
                   Side.from_dict(d["second"]) if d.get("second") else None,
                   str(d.get("why", "")))


def pair_rel(first: float, first_ci: float, second: float, second_ci: float) -> float | None:
    """The spread between processes one pair of figures of the same config shows (samples/s
    with 95% half-widths: `ProcessSpread.between_rel`); None where either is not positive."""
    if first <= 0 or second <= 0:
        return None
    return ProcessSpread(Side(first, first_ci), Side(second, second_ci)).between_rel


def upper_rel(pairs: Sequence[float]) -> float | None:
    """The spread between processes at its `UPPER_LEVEL` upper bound, from the spreads that
    pairs of processes of one config each showed (``pairs``: `ProcessSpread.between_rel`s,
    pooled as variances, one degree of freedom each). None from no pair. One pair at 1% gives
    7.96%, two at 1% give 3.08%: a round alone decides only a gain that even so wide a spread
    cannot explain (`autotune.tuning.decision.decide`)."""
    rels = [r for r in pairs if r is not None and math.isfinite(r)]
    if not rels:
        return None
    dof = min(len(rels), max(_CHI2_LOW))
    pooled = math.sqrt(sum(r * r for r in rels) / len(rels))
    return pooled * math.sqrt(dof / _CHI2_LOW[dof])


def measure(first: Side, second: Side) -> ProcessSpread:
    """The spread of two probes of the same config, with what it is put down to."""
    return ProcessSpread(first, second, explain(first, second))


def explain(first: Side, second: Side) -> str:
    """What makes two probes of the same config differ, as far as the probes show it."""
    s = ProcessSpread(first, second)
    if not s.measured:
        return "one of the two probes gave no figure, or none with an interval"
    if s.between_rel <= BETWEEN_FLOOR:
        return "no more than their own intervals explain"
    causes = []
    if abs(first.foreign_cores - second.foreign_cores) >= FOREIGN_DIFFERS_CORES:
        causes.append(f"other programs' load differed ({first.foreign_cores:.1f} and "
                      f"{second.foreign_cores:.1f} cores)")
    if abs(first.steal_cores - second.steal_cores) >= FOREIGN_DIFFERS_CORES:
        causes.append(f"the hypervisor's steal differed ({first.steal_cores:.1f} and "
                      f"{second.steal_cores:.1f} cores: other virtual machines)")
    starts = sorted(x for x in (first.first_s, second.first_s) if x > 0)
    if len(starts) == 2 and starts[1] > STARTUP_DIFFERS * starts[0]:
        causes.append(f"start-up differed ({first.first_s:.1f} s and {second.first_s:.1f} s "
                      f"to the first step)")
    short = [x for x in (first, second) if 0 < x.measured_s < 2 * x.warmup_s]
    if short:
        causes.append("a window barely longer than its warm-up (warm-up may be left in)")
    if causes:
        return "; ".join(causes)
    return "not foreign load, steal nor start-up: the processes themselves settle differently"


def worth_repeating(expected_configs: int | None) -> bool:
    """Whether a search expected to see ``expected_configs`` (None: no limit known) spends a
    probe on the repeat."""
    return expected_configs is None or expected_configs >= MIN_CONFIGS
