"""What the search maximises (``--objective``), each config's score, and the Pareto front. Pure.

- ``throughput``: samples/s, as measured (the default).
- ``goodput``: samples/s x Pollux's statistical efficiency of the config's global batch against
  the script's own (`autotune.tuning.goodput`), from the gradient noise scale B_noise a
  data-parallel probe measured. The efficiency is a constant of the config, so the probe's
  interval scales with it and pruning, convergence and the confirmation work on scores alike.
  Without B_noise the score is the throughput (the report says so).
- ``energy``: samples per joule, from the probe's joules per sample (GPU + CPU package where
  each is readable, `autotune.measuring.energy`). Its interval is taken as wide, relatively, as
  the throughput's: the span's joules are read exactly, its samples are what the interval is on.
- ``throughput,energy``: both, an Optuna multi-objective study; the winner is picked from the
  Pareto front by `pick`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autotune import UsageError
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.tuning import goodput
from autotune.tuning.space import global_batch, knobs_text

# The Pareto winner: the fastest config of the front whose samples/J is within this share of
# the front's most frugal one (a config that spends up to ~11% more energy per sample).
PICK_WITHIN_REL = 0.10


class Kind(enum.Enum):
    THROUGHPUT = "throughput"
    GOODPUT = "goodput"
    ENERGY = "energy"


CHOICES = ("throughput", "goodput", "energy", "throughput,energy")
_UNITS = {Kind.THROUGHPUT: "samples/s", Kind.GOODPUT: "goodput samples/s",
          Kind.ENERGY: "samples/J"}


@dataclass(frozen=True)
class Objective:
    """One objective, or throughput and energy together."""

    kinds: tuple[Kind, ...] = (Kind.THROUGHPUT,)

    @classmethod
    def parse(cls, text: str) -> Objective:
        """``throughput``, ``goodput``, ``energy`` or ``throughput,energy``; else `UsageError`."""
        token = ",".join(p.strip() for p in str(text).lower().split(","))
        if token not in CHOICES:
            raise UsageError(f"--objective: must be one of {', '.join(CHOICES)}, got {text!r}")
        return cls(tuple(Kind(p) for p in token.split(",")))

    @property
    def token(self) -> str:
        return ",".join(k.value for k in self.kinds)

    @property
    def multi(self) -> bool:
        return len(self.kinds) > 1

    @property
    def uses_energy(self) -> bool:
        return Kind.ENERGY in self.kinds

    @property
    def prunes(self) -> bool:
        """Probes are pruned on their running estimate: not for energy (no joules until the
        probe ends) nor for a multi-objective study (Optuna's ``report`` refuses those)."""
        return not self.uses_energy

    @property
    def unit(self) -> str:
        return " and ".join(_UNITS[k] for k in self.kinds)


THROUGHPUT = Objective()


def joules_per_sample(energy: EnergyPerSample | None) -> float | None:
    """GPU + CPU package joules per sample, each where it was readable; None when neither."""
    return energy.total_j if energy is not None else None


def energy_why(energy: EnergyPerSample | None) -> str:
    """Why a probe has no joules per sample, in the meter's words."""
    if energy is None:
        return "the probe measured no span to read energy over"
    return energy.why()


@dataclass(frozen=True)
class Score:
    """A config's score and its parts. ``value`` is what a single-objective search maximises
    (None: it cannot be scored, e.g. no energy reading); ``ci_half`` its 95% half-width."""

    value: float | None
    ci_half: float
    samples_per_s: float
    efficiency: float | None = None  # goodput: Pollux's factor against the script's batch
    noise_scale: float | None = None  # goodput: B_noise it used
    j_per_sample: float | None = None

    @property
    def samples_per_j(self) -> float | None:
        return 1.0 / self.j_per_sample if self.j_per_sample else None

    def to_dict(self) -> dict:
        return {"value": self.value, "ci_half": self.ci_half,
                "samples_per_s": self.samples_per_s, "efficiency": self.efficiency,
                "noise_scale": self.noise_scale, "j_per_sample": self.j_per_sample,
                "samples_per_j": self.samples_per_j}

    @classmethod
    def from_dict(cls, d: Mapping) -> Score:
        return cls(d.get("value"), float(d["ci_half"]), float(d["samples_per_s"]),
                   d.get("efficiency"), d.get("noise_scale"), d.get("j_per_sample"))


@dataclass(frozen=True)
class Scorer:
    """Scores configs for ``objective``. Goodput needs ``batch0`` (the script's own global
    batch) and ``noise_scale``; without either it scores throughput."""

    objective: Objective = THROUGHPUT
    batch0: int | None = None
    noise_scale: float | None = None
    devices: int = 1

    def efficiency(self, cfg: Mapping[str, int]) -> float | None:
        if Kind.GOODPUT not in self.objective.kinds or self.noise_scale is None or \
                not self.batch0:
            return None
        batch = global_batch(cfg, self.devices)
        return goodput.efficiency(batch, self.batch0, self.noise_scale) if batch else None

    def factor(self, cfg: Mapping[str, int]) -> float:
        """What throughput is multiplied by before any energy enters (goodput's efficiency)."""
        eff = self.efficiency(cfg)
        return 1.0 if eff is None else eff

    def score(self, samples_per_s: float, ci_half: float, cfg: Mapping[str, int],
              energy: EnergyPerSample | None = None) -> Score:
        eff = self.efficiency(cfg)
        j = joules_per_sample(energy)
        if self.objective.kinds == (Kind.ENERGY,):
            if not j or samples_per_s <= 0:
                return Score(None, ci_half, samples_per_s, j_per_sample=j)
            return Score(1.0 / j, ci_half / samples_per_s / j, samples_per_s, j_per_sample=j)
        f = 1.0 if eff is None else eff
        return Score(samples_per_s * f, ci_half * f, samples_per_s, eff,
                     self.noise_scale if eff is not None else None, j)

    def values(self, s: Score) -> list[float] | float | None:
        """What the study is told: the score, or (samples/s, samples/J) for the pair; None
        when it cannot be scored."""
        if self.objective.multi:
            return None if s.samples_per_j is None else [s.samples_per_s, s.samples_per_j]
        return s.value

    def failed(self) -> list[float] | float:
        """The study's value of an infeasible trial (its constraint marks it)."""
        return [0.0] * len(self.objective.kinds) if self.objective.multi else 0.0


def noise_of(noises: Iterable[NoiseEstimate | None]) -> tuple[float | None, int]:
    """(B_noise, its steps) from probes' noise readings: the one over the most steps."""
    best: tuple[float | None, int] = (None, 0)
    for n in noises:
        if n is None or not n.measured:
            continue
        if best[0] is None or n.steps > best[1]:
            best = (n.noise_scale, n.steps)
    return best


@dataclass(frozen=True)
class Point:
    """One measured config in the (samples/s, samples/J) plane."""

    name: str
    cfg: Mapping[str, int]
    samples_per_s: float
    samples_per_j: float

    def dominates(self, other: Point) -> bool:
        return (self.samples_per_s >= other.samples_per_s and
                self.samples_per_j >= other.samples_per_j and
                (self.samples_per_s > other.samples_per_s or
                 self.samples_per_j > other.samples_per_j))

    def to_dict(self) -> dict:
        return {"name": self.name, "knobs": dict(self.cfg), "samples_per_s": self.samples_per_s,
                "samples_per_j": self.samples_per_j}

    @classmethod
    def from_dict(cls, d: Mapping) -> Point:
        return cls(str(d["name"]), dict(d["knobs"]), float(d["samples_per_s"]),
                   float(d["samples_per_j"]))


def front(points: Sequence[Point]) -> list[Point]:
    """The Pareto front (no other point is at least as good on both and better on one),
    fastest first."""
    return sorted((p for p in points if not any(q.dominates(p) for q in points)),
                  key=lambda p: (-p.samples_per_s, -p.samples_per_j))


def pick(points: Sequence[Point], *, within_rel: float = PICK_WITHIN_REL) -> Point | None:
    """The Pareto winner: the fastest point of the front whose samples/J is within
    ``within_rel`` of the front's best samples/J."""
    f = front(points)
    if not f:
        return None
    frugal = max(p.samples_per_j for p in f)
    return max((p for p in f if p.samples_per_j >= (1 - within_rel) * frugal),
               key=lambda p: p.samples_per_s)


def front_line(p: Point) -> str:
    return (f"{p.name} ({knobs_text(p.cfg)}): {p.samples_per_s:.1f} samples/s, "
            f"{p.samples_per_j:.3g} samples/J")
