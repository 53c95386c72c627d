"""What a tuning run's probes taught it, kept in its state (``tune.json``) so that a resume goes
on from there instead of starting over.

- the script's timing from the baseline and the paces of later probes: every probe's limits
  are fitted to them (`autotune.tuning.fitting`);
- each config's last probe measured in full mode: the report's facts of the winner and the
  baseline (``probes`` in ``summary.json``) and the memory fit (`autotune.tuning.memory`);
- what autotune did to a config (its probes' notes: a backend replaced, a flag kept);
- what fitted search probes really took against what they were expected to take, which the
  budget plan counts (`autotune.tuning.fitting.cost_factor`);
- the script's own config probed twice, in two processes: the spread between processes
  (`autotune.tuning.spread`), measured once a run;
- what the run told the user, for the report.

Frozen: a probe's answer gives a new `Learned` (`Learned.after`); the stages hand it on inside
the `autotune.tuning.state.TuneState`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune import Note, NoteKind
from autotune.tuning import fitting
from autotune.tuning.spread import ProcessSpread
from autotune.tuning.records import ProbeFacts
from probes.protocol import Mode


def config_key(cfg: Mapping) -> tuple:
    """A config as a key of what was learned of it."""
    return tuple(sorted((k, int(v)) for k, v in cfg.items()))


@dataclass(frozen=True)
class ProbeRecord:
    """A config's last probe measured in full mode: what it told beyond its throughput, and
    the peak memory the memory fit stands on."""

    cfg: Mapping[str, int]
    facts: ProbeFacts
    peak_rss_bytes: int = 0  # the probe's processes on this host, all ranks
    cuda_peak_bytes: int = 0  # the largest rank's CUDA allocations; 0: no CUDA
    ranks_seen: int = 0

    @classmethod
    def of(cls, cfg: Mapping, result) -> ProbeRecord:
        """From a measured probe's `autotune.measuring.result.TrialResult`."""
        return cls(dict(cfg), ProbeFacts(breakdown=result.breakdown,
                                         core_s_per_sample=result.core_s_per_sample,
                                         gpu_s_per_sample=result.gpu_s_per_sample,
                                         energy=result.energy),
                   int(result.peak_rss_bytes), int(result.cuda_peak_bytes),
                   int(result.ranks_seen))

    def to_dict(self) -> dict:
        return {"cfg": dict(self.cfg), "facts": self.facts.to_dict(),
                "peak_rss_bytes": self.peak_rss_bytes, "cuda_peak_bytes": self.cuda_peak_bytes,
                "ranks_seen": self.ranks_seen}

    @classmethod
    def from_dict(cls, d: Mapping) -> ProbeRecord:
        return cls(dict(d["cfg"]), ProbeFacts.from_dict(d["facts"]),
                   int(d.get("peak_rss_bytes", 0)), int(d.get("cuda_peak_bytes", 0)),
                   int(d.get("ranks_seen", 0)))


@dataclass(frozen=True)
class Learned:
    """What the run's probes taught so far (see the module's docstring)."""

    timing: fitting.ScriptTiming | None = None  # None before the baseline (or it never settled)
    paces: tuple[fitting.Pace, ...] = ()  # steps seen in probes since, by their knobs
    last: Mapping[tuple, ProbeRecord] = field(default_factory=dict)  # by `config_key`
    config_notes: Mapping[tuple, tuple[str, ...]] = field(default_factory=dict)  # by key
    notes: tuple[Note, ...] = ()  # what the run told the user, for the report
    told_busy: bool = False  # the hint that foreign load spoils probes is told once a run
    costs: tuple[fitting.Cost, ...] = ()  # fitted search probes: expected and real time
    spread: ProcessSpread | None = None  # None: not yet measured, nor decided against

    def costed(self, expected_s: float, actual_s: float) -> Learned:
        """With one more fitted search probe's expected and real time (`fitting.cost_factor`)."""
        return dataclasses.replace(self, costs=(*self.costs[-(fitting.COST_WINDOW - 1):],
                                                fitting.Cost(expected_s, actual_s)))

    def after(self, cfg: Mapping, knobs: Mapping, result) -> Learned:
        """With a probe of ``cfg`` (run with the rank ``knobs``) and its `TrialResult`: its
        pace, its notes, and itself when it measured in full mode."""
        paces, said = self.paces, dict(self.config_notes)
        if result.ok and result.step_s > 0 and knobs.get("batch_size"):
            paces = (*paces, fitting.Pace(int(knobs["batch_size"]), int(knobs.get("threads") or 0),
                                          result.step_s,
                                          # one rank's start; several start slower
                                          # (`fitting.RANKS_START_FACTOR` adds that)
                                          result.first_s if int(knobs.get("instances") or 1) == 1
                                          else 0.0, result.warmup_s))
        told = tuple(str(n) for n in result.notes if n.kind is not NoteKind.WARNING)
        if told:  # what autotune did to this config (a backend replaced, a flag kept)
            said[config_key(cfg)] = told
        return dataclasses.replace(self, paces=paces, config_notes=said).measured(cfg, result)

    def measured(self, cfg: Mapping, result) -> Learned:
        """With ``result`` as the last measurement of ``cfg`` when it measured (the baseline's
        is kept under the space's config too, which names all its knobs). A probe without a
        breakdown of its step (one that took turns on the machine: its held spans are no part
        of a step) keeps the one an earlier probe of the config gave: the verdict and the report
        name the winner's binding share from it."""
        if not result.ok or result.mode is not Mode.FULL:
            return self
        key = config_key(cfg)
        record, before = ProbeRecord.of(cfg, result), self.last.get(key)
        if record.facts.breakdown is None and before is not None and \
                before.facts.breakdown is not None:
            record = dataclasses.replace(record, facts=dataclasses.replace(
                record.facts, breakdown=before.facts.breakdown))
        return dataclasses.replace(self, last={**self.last, key: record})

    def of(self, cfg: Mapping) -> ProbeRecord | None:
        """The last measured probe of ``cfg``, or None."""
        return self.last.get(config_key(cfg))

    def facts(self, cfg: Mapping) -> ProbeFacts | None:
        r = self.of(cfg)
        return r.facts if r is not None else None

    def notes_of(self, cfg: Mapping) -> tuple[str, ...]:
        """What the last probe of ``cfg`` that said something said of it."""
        return self.config_notes.get(config_key(cfg), ())

    def noted(self, note: Note) -> Learned:
        """With ``note`` kept for the report, once: a resumed run that tells it again (what its
        space holds, say) does not report it twice."""
        if note in self.notes:
            return self
        return dataclasses.replace(self, notes=(*self.notes, note))

    def to_dict(self) -> dict:
        return {"timing": self.timing.to_dict() if self.timing else None,
                "paces": [dataclasses.asdict(p) for p in self.paces],
                "last": [r.to_dict() for r in self.last.values()],
                "config_notes": [{"cfg": dict(k), "notes": list(v)}
                                 for k, v in self.config_notes.items()],
                "notes": [n.to_dict() for n in self.notes], "told_busy": self.told_busy,
                "costs": [dataclasses.asdict(c) for c in self.costs],
                "spread": self.spread and self.spread.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping) -> Learned:
        last = [ProbeRecord.from_dict(r) for r in d.get("last", ())]
        return cls(timing=fitting.ScriptTiming.from_dict(d["timing"]) if d.get("timing")
                   else None,
                   paces=tuple(fitting.Pace(int(p["batch_size"]), int(p["threads"]),
                                            float(p["step_s"]), float(p.get("first_s", 0.0)),
                                            None if p.get("warmup_s") is None
                                            else float(p["warmup_s"]))
                               for p in d.get("paces", ())),
                   last={config_key(r.cfg): r for r in last},
                   config_notes={config_key(c["cfg"]): tuple(c["notes"])
                                 for c in d.get("config_notes", ())},
                   notes=tuple(Note.from_dict(n) for n in d.get("notes", ())),
                   told_busy=bool(d.get("told_busy")),
                   costs=tuple(fitting.Cost(float(c["expected_s"]), float(c["actual_s"]))
                               for c in d.get("costs", ())),
                   spread=ProcessSpread.from_dict(d.get("spread")))
