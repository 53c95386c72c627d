"""What one probe measured, and how it ended: `TrialResult`, as the trial returns it and as the
journal and the study store it (`TrialResult.to_dict` / `TrialResult.from_dict`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune import Note
from autotune.measuring import series
from autotune.measuring.breakdown import Breakdown
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from probes.protocol import Mode


@dataclass(frozen=True)
class TrialResult:
    """What one probe measured, and how it ended."""

    outcome: Outcome
    reason: str
    samples_per_s: float
    ci_half: float
    source: series.Source  # how throughput was counted
    steps_per_s: float
    measured_s: float
    warmup_s: float
    paused_s: float
    duration_s: float
    peak_rss_bytes: int
    cuda_peak_bytes: int
    foreign_cores: float  # other programs' CPU load while it measured (`foreign_load`)
    exit_code: int | None
    log_path: str
    log_tail: str
    seen: dict  # what the script asked for: {"batch_size": .., "workers": .., ...}
    notes: tuple[Note, ...] = ()
    knobs: Mapping[str, float] = field(default_factory=dict)
    mode: Mode = Mode.FULL
    # autotune ended it (its window ran out, or it was pruned or hung); False when the script
    # ended by itself or a rank failed first. A no-signal probe that was stopped may measure
    # given more time; one whose script ended will not.
    stopped: bool = False

    @property
    def ok(self) -> bool:
        """It measured a figure to use as is: OK, or ENDED (`Outcome.usable`)."""
        return self.outcome.usable

    foreign_limit_cores: float = FOREIGN_CORES_LIMIT
    counted_samples_per_s: float = 0.0  # with source "metric": autotune's own count, to compare
    # The span the estimate stands on, in time.monotonic() of this host (ranks on this host
    # share that clock, so a script's own timestamps can be compared).
    window_start_t: float = 0.0
    window_end_t: float = 0.0
    # How the script moves (`autotune.tuning.fitting`): launch to its first batch or step, and
    # one rank's time per batch (or step) while it progressed; 0 when never seen.
    first_s: float = 0.0
    step_s: float = 0.0
    # Where the time went over the measured span (`autotune.measuring.breakdown`); None when
    # it could not be told.
    breakdown: Breakdown | None = None
    # What a sample costs over the measured span: CPU seconds of the trial's processes on this
    # host (ranks, their DataLoader workers), and GPUs held x wall time; 0 when not known (ranks
    # on other hosts; no GPU).
    core_s_per_sample: float = 0.0
    gpu_s_per_sample: float = 0.0
    ranks_seen: int = 0  # training processes that reported (peak_rss_bytes is their sum)
    hosts: tuple[str, ...] = ()  # the host names they reported from, sorted
    # joules per sample over the measured span, and where they come from
    # (`autotune.measuring.energy`); None when no span was measured
    energy: EnergyPerSample | None = None
    # the gradient noise scale (`autotune.measuring.noise`), or why it could not be told; None
    # when no span was measured
    noise: NoiseEstimate | None = None
    # CPU time no program carries over the same span, in cores (`foreign_load.Unowned`): the
    # kernel's interrupt work and the hypervisor's steal; reported, not judged
    kernel_cores: float = 0.0
    steal_cores: float = 0.0
    # taking turns (`autotune.measuring.alternate`): each slice's samples/s in the order it
    # ran, None where too few batches ended in it; a confirmation pairs them across configs
    slice_rates: tuple[float | None, ...] = ()
    # the measuring time of the estimate that ended it as tight (its final estimate, over
    # all it measured until its ranks stopped, may read wider); 0 when none ended it so
    tight_s: float = 0.0

    @property
    def foreign_flagged(self) -> bool:
        return self.foreign_cores > self.foreign_limit_cores

    def to_dict(self) -> dict:
        """As the journal's ``trial_finished`` and ``probe.json`` hold it."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["outcome"] = self.outcome.value
        d["mode"] = self.mode.value
        d["notes"] = [n.to_dict() for n in self.notes]
        d["knobs"] = dict(self.knobs)
        d["hosts"] = list(self.hosts)
        d["slice_rates"] = list(self.slice_rates)
        for name in ("breakdown", "energy", "noise"):
            d[name] = d[name].to_dict() if d[name] is not None else None
        d["foreign_flagged"] = self.foreign_flagged
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> TrialResult:
        """From `to_dict`'s shape. Notes of earlier journals were text: "WARNING: ..." is a
        warning, any other an info. A field a journal lacks (one of an older autotune, a
        partial record) reads as nothing measured (`UNMEASURED`)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**UNMEASURED, **{k: v for k, v in d.items() if k in names},
                      "outcome": Outcome(d["outcome"]), "mode": Mode(d.get("mode", "full")),
                      "source": series.Source(d.get("source") or "none"),
                      "notes": tuple(map(note_of, d.get("notes") or ())),
                      "knobs": dict(d.get("knobs") or {}),
                      "hosts": tuple(d.get("hosts") or ()),
                      "slice_rates": tuple(d.get("slice_rates") or ()),
                      "breakdown": Breakdown.from_dict(d.get("breakdown")),
                      "energy": EnergyPerSample.from_dict(d.get("energy")),
                      "noise": NoiseEstimate.from_dict(d.get("noise"))})


# What `TrialResult.from_dict` reads for a field without a default that a record lacks.
UNMEASURED = {"reason": "", "samples_per_s": 0.0, "ci_half": 0.0, "steps_per_s": 0.0,
              "measured_s": 0.0, "warmup_s": 0.0, "paused_s": 0.0, "duration_s": 0.0,
              "peak_rss_bytes": 0, "cuda_peak_bytes": 0, "foreign_cores": 0.0,
              "exit_code": None, "log_path": "", "log_tail": "", "seen": {}}


def note_of(raw: Mapping | str) -> Note:
    """A note as `Note.to_dict` wrote it, or as text (journals before typed notes)."""
    if isinstance(raw, str):
        prefix = "WARNING: "
        return Note.warning(raw[len(prefix):]) if raw.startswith(prefix) else Note.info(raw)
    return Note.from_dict(raw)
