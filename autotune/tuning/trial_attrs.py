"""What a study trial records beside its value: one typed record, its schema checked. Pure.

A trial of the search's Optuna study keeps what the search learned of it in its user
attributes (``user_attrs``), a dict Optuna stores as JSON and hands back as it is. `TrialAttrs`
is that dict as one frozen record: `TrialAttrs.to_attrs` refuses a key outside `SCHEMA` or a
value of another type than the key's (a writer cannot invent an attribute the readers do not
know), and `TrialAttrs.of` reads only the keys it knows, each of its type; a value of another
type (a study written by another autotune) reads as not recorded, never half read. The keys
are the names studies have always used, so studies of earlier versions still read, their
outcome tags included (`LEGACY_OUTCOMES`). `autotune.tuning.study` writes and reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.measuring.outcome import Outcome

NUMBER = (int, float)

# key -> the types its value may have (bool is not a number here: JSON keeps them apart)
SCHEMA: dict[str, tuple[type, ...]] = {
    "run": (str,),  # the tuner's run id: a resumed run touches only its own trials
    "knobs": (dict,),  # the config, knob -> value
    "baseline": (bool,),  # the script's own config, measured before the search
    "ranks_probe": (bool,),  # the two-rank probe of the baseline stage, added as answered
    "warm_start": (bool,),  # a matching recipe's config, tried early
    "design": (str,),  # why it was queued: initial | held | batch-walk | batch-far | ...
    "outcome": (str,),  # an `Outcome` value (or a tag of `LEGACY_OUTCOMES`)
    "not_tried": (bool,),  # a known OOM ruled the config out: answered without a probe
    "samples_per_s": NUMBER,
    "ci_half": NUMBER,
    "score_ci_half": NUMBER,  # the score's interval (goodput scales it with the value)
    "energy": (dict,),  # `EnergyPerSample.to_dict`
    "reason": (str,),
    "probe_s": NUMBER,  # what its probe took, start-up included
    "noise": (dict,),  # `NoiseEstimate.to_dict`
    "duplicate_of": (int,),  # the trial whose answer it repeats
    "interrupted": (bool,),  # its controller stopped (Ctrl-C, killed): re-run on --resume
    "retry_of": (int,),  # the interrupted trial it re-runs
}

# What studies written before typed outcomes recorded instead of one: a failure of any kind
# ("failed": its kind is lost, read as a crash) and an OOM-ruled-out config.
LEGACY_OUTCOMES = {"failed": Outcome.CRASHED, "oom-skipped": Outcome.OOM}


def _typed(key: str, value) -> bool:
    kinds = SCHEMA[key]
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def check(attrs: Mapping) -> dict:
    """``attrs`` as a dict, once every key is in `SCHEMA` and every value of its key's type.

    Raises:
        ValueError: a key outside the schema, or a value of another type.
    """
    unknown = sorted(set(attrs) - set(SCHEMA))
    if unknown:
        raise ValueError(f"trial attributes must be among {', '.join(SCHEMA)}, but got "
                         f"{', '.join(unknown)}")
    wrong = [f"{k}={v!r}" for k, v in attrs.items() if not _typed(k, v)]
    if wrong:
        raise ValueError(f"trial attributes must have their schema's types, but got "
                         f"{', '.join(wrong)}")
    return dict(attrs)


@dataclass(frozen=True)
class TrialAttrs:
    """A trial's user attributes, typed; a field left at its default is not recorded."""

    run: str | None = None
    knobs: Mapping[str, int] | None = None
    baseline: bool = False
    ranks_probe: bool = False
    warm_start: bool = False
    design: str | None = None
    outcome: Outcome | None = None
    not_tried: bool = False
    samples_per_s: float | None = None
    ci_half: float | None = None
    score_ci_half: float | None = None
    energy: Mapping | None = None
    reason: str | None = None
    probe_s: float | None = None
    noise: Mapping | None = None
    duplicate_of: int | None = None
    interrupted: bool = False
    retry_of: int | None = None

    def to_attrs(self) -> dict:
        """The user attributes to write: the fields given, checked (`check`)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            if f.name == "outcome":
                value = Outcome(value).value
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return check(out)

    @classmethod
    def of(cls, attrs: Mapping) -> TrialAttrs:
        """From a trial's user attributes: the keys of `SCHEMA`, each of its type (another
        reads as not recorded); an outcome tag of an earlier version as `LEGACY_OUTCOMES`
        says, an unknown one as none."""
        known = {k: v for k, v in attrs.items() if k in SCHEMA and _typed(k, v)}
        raw = known.pop("outcome", None)
        outcome = LEGACY_OUTCOMES.get(raw) if raw in LEGACY_OUTCOMES else \
            next((o for o in Outcome if o.value == raw), None)
        not_tried = bool(known.pop("not_tried", False)) or raw == "oom-skipped"
        return cls(**known, outcome=outcome, not_tried=not_tried)
