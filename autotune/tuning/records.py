"""Plain records of a tuning run: its settings, its scores, what the study knows, its report.

Each record that is saved (``tune.json``) or reported (``summary.json``) turns into JSON by its
own ``to_dict`` and back by ``from_dict``; nothing reads our own results back by string keys.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune import Note
from autotune.measuring import allreduce
from autotune.measuring.bottleneck import Verdict
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT
from autotune.measuring.outcome import Outcome
from autotune.measuring.series import Source
from autotune.tuning import study as studies
from autotune.tuning.decision import Choice
from autotune.tuning.memory import MemoryAdvice
from autotune.tuning.objective import THROUGHPUT, Objective, Point, Score
from autotune.tuning.payback import Payback
from autotune.tuning.space import Range, Space, parse_fix, parse_space
from autotune.tuning.spread import ProcessSpread
from autotune.tuning.space.parse import parse_values

DEFAULT_TRIALS = 20


@dataclass(frozen=True)
class TuneSettings:
    """Everything a tuning run needs; saved in ``tune.json`` so a resume uses the same."""

    command: tuple[str, ...]
    cwd: str
    # one probe, start-up included; None: fitted to the script (`autotune.tuning.fitting`)
    seconds: float | None = None
    trials: int | None = None  # probes, baseline included
    budget_s: float | None = None  # the whole run, confirmation included
    confirm_rounds: int = 3
    confirm_s: float | None = None  # one confirmation probe (default 1.5 x seconds, or fitted)
    ranges: Mapping[str, Range] = field(default_factory=dict)  # --space, by knob
    fixed: Mapping[str, Range] = field(default_factory=dict)  # --fix, by knob
    # --baseline: the script's own values of knobs it takes as placeholders, by placeholder name
    baseline_values: Mapping[str, int] = field(default_factory=dict)
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
    recipe_dir: str | None = None  # where the recipe goes, an absolute path
    objective: Objective = THROUGHPUT  # --objective: what the search maximises

    @property
    def max_trials(self) -> int | None:
        if self.trials is None and self.budget_s is None:
            return DEFAULT_TRIALS
        return self.trials

    @property
    def min_measure_s(self) -> float:
        return min(5.0, 0.4 * self.seconds) if self.seconds else 5.0

    @property
    def confirm_probe_s(self) -> float | None:
        """One confirmation probe, as given (None: fitted to each config)."""
        return self.confirm_s or (1.5 * self.seconds if self.seconds else None)

    def to_dict(self) -> dict:
        """For ``tune.json``: the parsed flags as the tokens they parse back from."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in _PARSED}
        out.update(command=list(self.command),
                   space_tokens=[r.token for r in self.ranges.values()],
                   fix_tokens=[r.token for r in self.fixed.values()],
                   baseline_tokens=[f"{k}={v}" for k, v in self.baseline_values.items()],
                   objective=self.objective.token)
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> TuneSettings:
        names = {f.name for f in dataclasses.fields(cls)} - _PARSED
        return cls(**{**{k: v for k, v in d.items() if k in names},
                      "command": tuple(d["command"])},
                   ranges=parse_space(d.get("space_tokens", ())),
                   fixed=parse_fix(d.get("fix_tokens", ())),
                   baseline_values=parse_values(d.get("baseline_tokens", ())),
                   objective=Objective.parse(d.get("objective") or THROUGHPUT.token))


_PARSED = {"ranges", "fixed", "baseline_values", "objective"}  # in ``tune.json`` as tokens


@dataclass(frozen=True)
class Scored:
    knobs: Mapping[str, int]
    samples_per_s: float
    ci_half: float

    def to_dict(self) -> dict:
        return {"knobs": dict(self.knobs), "samples_per_s": self.samples_per_s,
                "ci_half": self.ci_half}


@dataclass(frozen=True)
class BaselineRecord(Scored):
    """The baseline probe's answer, with how it counted and what the script used."""

    source: Source | None = None  # None: not known (a record written without one)
    seen: Mapping = field(default_factory=dict)
    breakdown: Breakdown | None = None  # where its time went
    energy: EnergyPerSample | None = None  # joules per sample
    noise: NoiseEstimate | None = None  # gradient noise scale, or why its probe had none

    def __post_init__(self):
        # given as its text ("": not known)
        object.__setattr__(self, "source", Source(self.source) if self.source else None)

    def to_dict(self) -> dict:
        """As ``tune.json`` holds it: each measured value in its own ``to_dict`` shape."""
        return {"knobs": dict(self.knobs), "samples_per_s": self.samples_per_s,
                "ci_half": self.ci_half, "source": self.source.value if self.source else "",
                "seen": dict(self.seen),
                **{name: _dict_of(getattr(self, name)) for name in _MEASURED}}

    @classmethod
    def from_dict(cls, d: Mapping) -> BaselineRecord:
        return cls(dict(d["knobs"]), float(d["samples_per_s"]), float(d["ci_half"]),
                   Source(d["source"]) if d.get("source") else None,
                   dict(d.get("seen") or {}),
                   **{name: kind.from_dict(d.get(name)) for name, kind in _MEASURED.items()})


@dataclass(frozen=True)
class RanksProbe:
    """The two-rank probe that showed the script data-parallel (`baseline.discover_ranks`):
    the study's first two-rank trial."""

    knobs: Mapping[str, int]
    samples_per_s: float
    ci_half: float
    energy: EnergyPerSample | None = None  # joules per sample, where a counter read them
    noise: NoiseEstimate | None = None  # gradient noise scale (`autotune.measuring.noise`)

    def to_dict(self) -> dict:
        return {"knobs": dict(self.knobs), "samples_per_s": self.samples_per_s,
                "ci_half": self.ci_half, "energy": self.energy and self.energy.to_dict(),
                "noise": self.noise and self.noise.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> RanksProbe:
        return cls(dict(d["knobs"]), float(d["samples_per_s"]), float(d["ci_half"]),
                   EnergyPerSample.from_dict(d.get("energy")),
                   NoiseEstimate.from_dict(d.get("noise")))


@dataclass(frozen=True)
class AllreduceTiming:
    """The allreduce timing that bounds ``bucket_mb``: its result, or why it failed (a bound
    for one knob never fails the tuning)."""

    result: allreduce.AllreduceResult | None = None
    error: str = ""

    @property
    def bucket_mb_range(self) -> tuple[float, float] | None:
        """(low, high) MB for ``bucket_mb``; None when the timing failed."""
        return allreduce.bucket_range(self.result) if self.result is not None else None

    def to_dict(self) -> dict:
        """``{"result": ...}`` or ``{"error": why}``: the ``allreduce`` event's fields."""
        return {"result": self.result.to_dict()} if self.result is not None else \
            {"error": self.error}

    @classmethod
    def from_dict(cls, d: Mapping) -> AllreduceTiming:
        if d.get("result") is not None:
            return cls(allreduce.parse(d["result"]))
        return cls(error=str(d.get("error") or "unknown"))


@dataclass(frozen=True)
class TunedOn:
    """Where a recipe was tuned: the nodes its ranks spanned, and the link between its ranks as
    the allreduce timing measured it. A recipe used on another number of nodes carries its
    per-node knobs over; its bucket was tuned for this link (`commands.run` flags it)."""

    nodes: int = 1
    busbw_gbps: float | None = None  # the allreduce's peak bus bandwidth; None: not measured
    link: str = ""  # that measurement in words ("" : none)

    @classmethod
    def of(cls, nodes: int, timing: AllreduceTiming | None) -> TunedOn:
        r = timing.result if timing is not None else None
        if r is None:
            return cls(nodes=nodes)
        peak = max(p.busbw_gbps for p in r.points)
        where = f"across {nodes} nodes" if nodes > 1 else "on one host"
        return cls(nodes=nodes, busbw_gbps=peak,
                   link=f"{r.backend} allreduce of {r.world_size} ranks {where}: peak bus "
                        f"bandwidth {peak:.3g} GB/s")

    def to_dict(self) -> dict:
        """The recipe's [tuned_on] table."""
        out: dict = {"nodes": self.nodes}
        if self.busbw_gbps is not None:
            out["busbw_gbps"] = float(self.busbw_gbps)
        if self.link:
            out["link"] = self.link
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> TunedOn:
        bw = d.get("busbw_gbps")
        return cls(nodes=int(d.get("nodes", 1)), busbw_gbps=None if bw is None else float(bw),
                   link=str(d.get("link", "")))

    def text(self) -> str:
        return (f"{self.nodes} node(s)" + (f", {self.link}" if self.link else
                                           ", the link between ranks not measured"))


@dataclass(frozen=True)
class ProbeFacts:
    """What a config's probe told beyond its throughput: where the time goes
    (`autotune.measuring.breakdown`) and what a sample costs."""

    breakdown: Breakdown | None = None
    core_s_per_sample: float = 0.0  # CPU seconds of its processes on this host
    gpu_s_per_sample: float = 0.0  # GPUs held x wall time
    energy: EnergyPerSample | None = None  # joules per sample (`autotune.measuring.energy`)

    def to_dict(self) -> dict:
        """As ``summary.json`` holds it."""
        return {"breakdown": _dict_of(self.breakdown),
                "core_s_per_sample": self.core_s_per_sample,
                "gpu_s_per_sample": self.gpu_s_per_sample, "energy": _dict_of(self.energy)}

    @classmethod
    def from_dict(cls, d: Mapping) -> ProbeFacts:
        return cls(Breakdown.from_dict(d.get("breakdown")),
                   float(d.get("core_s_per_sample", 0.0)), float(d.get("gpu_s_per_sample", 0.0)),
                   EnergyPerSample.from_dict(d.get("energy")))


# The measured values a record keeps, each read back by its own ``from_dict``.
_MEASURED = {"breakdown": Breakdown, "energy": EnergyPerSample, "noise": NoiseEstimate}


def _dict_of(value) -> dict | None:
    return value.to_dict() if value is not None else None


class Stop(enum.Enum):
    """Why a search stopped."""

    TRIALS = "trials"  # --trials probes done
    BUDGET = "budget"  # the time budget (its search part) spent
    EXHAUSTED = "exhausted"  # every config of the space answered
    DUPLICATES = "duplicates"  # the sampler keeps proposing configs already measured
    CONVERGED = "converged"  # no gain for a while


@dataclass(frozen=True)
class StopReason:
    """A search's stop rule and the numbers its text names."""

    rule: Stop
    count: int = 0  # TRIALS: the trials; EXHAUSTED: the space's configs; CONVERGED: patience
    rel: float = 0.0  # CONVERGED: the gain that counts
    reserved: bool = False  # BUDGET: the rest of the budget is kept for the confirmation

    @property
    def text(self) -> str:
        if self.rule is Stop.TRIALS:
            return f"{self.count} trials done"
        if self.rule is Stop.BUDGET:
            return "time budget spent" + (" (the rest is kept for the confirmation)"
                                          if self.reserved else "")
        if self.rule is Stop.EXHAUSTED:
            return f"all {self.count} configs of the space measured"
        if self.rule is Stop.DUPLICATES:
            return "converged: the sampler keeps proposing configs already measured"
        return f"converged: no gain above {self.rel:.0%} in the last {self.count} trials"

    def __str__(self) -> str:
        return self.text


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
    stop_reason: StopReason | None  # None: the study ended without a stop rule
    source: str
    verdict: Verdict | None = None
    notes: tuple[Note, ...] = ()
    best_notes: tuple[str, ...] = ()  # what the winner's probes said of it
    speedup_low: float = 1.0  # the speed-up's 95% interval over the confirmation rounds
    speedup_high: float = 1.0
    one_rank_samples_per_s: float = 0.0  # the best one-rank config's (0: none measured)
    memory: MemoryAdvice | None = None  # memory by batch; None: too few probes to fit
    payback: Payback | None = None  # None: the run's length is unknown
    # what the last probes of the winner and the baseline told beyond throughput
    best_probe: ProbeFacts | None = None
    baseline_probe: ProbeFacts | None = None
    objective: str = "throughput"  # --objective's token; ``speedup`` is the gain in its score
    # the winner's and the baseline's scores and their parts (not for throughput)
    best_score: Score | None = None
    baseline_score: Score | None = None
    objective_note: str = ""  # how the score was made (B_noise's source, a fallback)
    # throughput,energy: the Pareto front, fastest first, and the name of its pick
    pareto: tuple[Point, ...] = ()
    picked: str = ""
    # a winner that changes the job's global batch: the fastest config confirmed that keeps it
    # (the baseline's knobs when none was faster beyond doubt); None: the winner keeps it
    keep_batch: Choice | None = None
    tuned_on: TunedOn = TunedOn()  # the nodes and the link it was tuned on
    rounds: int = 0  # interleaved confirmation rounds the decision stood on
    candidates: int = 1  # candidates confirmed beside the baseline (the interval's correction)
    process_noise: ProcessSpread | None = None  # the spread between processes, or why unmeasured

    @property
    def batch_note(self) -> str:
        """What the winner does to the job's global batch ("" when it keeps the script's)."""
        if self.kept_baseline or self.space is None:
            return ""
        return self.space.batch_note(self.best.knobs)

    @property
    def scaling_efficiency(self) -> float | None:
        """The winner's throughput over N times the best one-rank throughput, for a winner of
        N > 1 ranks (per host on CPU, per GPU on GPUs); None otherwise."""
        n = int(self.best.knobs.get("instances", 1))
        if n <= 1 or self.one_rank_samples_per_s <= 0:
            return None
        return self.best.samples_per_s / (n * self.one_rank_samples_per_s)

    @property
    def best_breakdown(self) -> Breakdown | None:
        return self.best_probe.breakdown if self.best_probe else None

    @property
    def baseline_breakdown(self) -> Breakdown | None:
        return self.baseline_probe.breakdown if self.baseline_probe else None

    @property
    def scored(self) -> bool:
        """Whether the report carries scores (any objective but throughput)."""
        return self.objective != THROUGHPUT.token

    def to_dict(self, recipe_path: Path | None = None) -> dict:
        """``summary.json``; with ``recipe_path`` once the recipe is saved."""
        out = {"run_dir": str(self.run_dir),
               "baseline": Scored.to_dict(self.baseline),
               "best": Scored.to_dict(self.best), "speedup": self.speedup,
               "speedup_interval": [self.speedup_low, self.speedup_high],
               "confirm_rounds": self.rounds, "candidates": self.candidates,
               "tuned_on": self.tuned_on.to_dict(),
               "process_noise": self.process_noise.to_dict() if self.process_noise else None,
               "keep_batch": self.keep_batch.to_dict() if self.keep_batch else None,
               "kept_baseline": self.kept_baseline, "reason": self.reason,
               "trials": self.trials_measured, "trials_total": self.trials_total,
               "stop_reason": self.stop_reason.text if self.stop_reason else "",
               "source": self.source, "space": self.space.to_dict(),
               "verdict": self.verdict.to_dict() if self.verdict else None,
               "notes": [n.text for n in self.notes], "best_notes": list(self.best_notes),
               "scaling_efficiency": self.scaling_efficiency,
               "memory": self.memory.to_dict() if self.memory else None,
               "batch_note": self.batch_note,
               "payback": self.payback.to_dict() if self.payback else None,
               "objective": self.objective,
               "score": {"best": self.best_score.to_dict() if self.best_score else None,
                         "baseline": self.baseline_score.to_dict() if self.baseline_score
                         else None} if self.scored else None,
               "objective_note": self.objective_note,
               "pareto": [{**p.to_dict(), "picked": p.name == self.picked} for p in self.pareto],
               "probes": {"best": self.best_probe.to_dict() if self.best_probe else None,
                          "baseline": self.baseline_probe.to_dict() if self.baseline_probe
                          else None}}
        if recipe_path is not None:
            out["recipe"] = str(recipe_path)
        return out



@dataclass(frozen=True)
class Known:
    """A config the study has an answer for."""

    number: int
    outcome: Outcome  # as the probe ended (`autotune.tuning.study.outcome_of`)
    value: float
    ci_half: float
    cfg: Mapping[str, int]
    energy: EnergyPerSample | None = None  # its probe's joules per sample
    # what its search probe took, start-up included (s); 0: not known (the baseline's record,
    # a study written before it was kept)
    probe_s: float = 0.0

    @property
    def infeasible(self) -> bool:
        return not (self.outcome.usable or self.outcome == Outcome.PRUNED)

    @classmethod
    def of_trial(cls, t) -> Known | None:
        """The answer a finished study trial holds in its user attrs, or None: not tried for an
        OOM, spoiled by foreign load, a replay of another trial, or interrupted (failed)."""
        attrs = studies.attrs_of(t)
        if not attrs.knobs or attrs.outcome is None or attrs.not_tried or \
                attrs.duplicate_of is not None or t.state.name == "FAIL":
            return None
        sps = attrs.samples_per_s
        if sps is None:  # ``t.value`` raises for a multi-objective trial: its first value
            sps = (t.values or [0.0])[0]
        return cls(t.number, attrs.outcome, float(sps), float(attrs.ci_half or 0.0),
                   dict(attrs.knobs), EnergyPerSample.from_dict(attrs.energy),
                   float(attrs.probe_s or 0.0))
