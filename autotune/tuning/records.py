"""Plain records of a tuning run: its settings, its scores and its report."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.tuning.space import Space
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT

DEFAULT_TRIALS = 20


@dataclass(frozen=True)
class TuneSettings:
    """Everything a tuning run needs; saved in ``tune.json`` so a resume uses the same."""

    command: tuple[str, ...]
    cwd: str
    seconds: float = 20.0  # one probe, start-up included
    trials: int | None = None  # probes, baseline included
    budget_s: float | None = None  # the whole run, confirmation included
    confirm_rounds: int = 2
    confirm_s: float | None = None  # one confirmation probe (default 1.5 x seconds)
    space_tokens: tuple[str, ...] = ()
    fix_tokens: tuple[str, ...] = ()
    baseline_tokens: tuple[str, ...] = ()  # values for placeholder knobs in the baseline
    global_batch: int | None = None
    samples_per_step: int | None = None
    foreign_limit_cores: float = FOREIGN_CORES_LIMIT
    foreign_retries: int = 2
    seed: int | None = None
    verdict: bool = False
    storage: str | None = None
    study_name: str | None = None
    launcher: str = "local"  # what starts the ranks: local | mpirun | srun
    hostfile: str | None = None  # mpirun's hosts, an absolute path

    @property
    def max_trials(self) -> int | None:
        if self.trials is None and self.budget_s is None:
            return DEFAULT_TRIALS
        return self.trials

    @property
    def min_measure_s(self) -> float:
        return min(5.0, 0.4 * self.seconds)

    @property
    def confirm_probe_s(self) -> float:
        return self.confirm_s or 1.5 * self.seconds

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> TuneSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v
                      for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Scored:
    knobs: Mapping[str, int]
    samples_per_s: float
    ci_half: float


@dataclass(frozen=True)
class TuneReport:
    run_dir: Path
    space: Space
    baseline: Scored
    best: Scored
    speedup: float
    kept_baseline: bool
    reason: str
    trials_measured: int
    trials_total: int
    stop_reason: str
    source: str
    verdict: Mapping | None = None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"run_dir": str(self.run_dir),
                "baseline": dataclasses.asdict(self.baseline),
                "best": dataclasses.asdict(self.best), "speedup": self.speedup,
                "kept_baseline": self.kept_baseline, "reason": self.reason,
                "trials": self.trials_measured, "trials_total": self.trials_total,
                "stop_reason": self.stop_reason, "source": self.source,
                "space": self.space.to_dict(), "verdict": self.verdict,
                "notes": list(self.notes)}


@dataclass
class Known:
    """A config the study has an answer for."""

    number: int
    outcome: str  # ok | oom | failed | pruned
    value: float
    ci_half: float
    cfg: dict

    @classmethod
    def of_trial(cls, t) -> Known | None:
        """The answer a finished study trial holds in its user attrs, or None: skipped for an
        OOM, spoiled by foreign load, a replay of another trial, or interrupted (failed)."""
        attrs = t.user_attrs
        cfg, outcome = attrs.get("knobs"), attrs.get("outcome")
        if not cfg or outcome not in ("ok", "oom", "failed", "pruned") or \
                attrs.get("duplicate_of") is not None or t.state.name == "FAIL":
            return None
        return cls(t.number, outcome, float(attrs.get("samples_per_s", t.value or 0.0)),
                   float(attrs.get("ci_half", 0.0)), dict(cfg))
