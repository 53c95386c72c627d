"""Recipes: the winning knobs of a tuning run as a TOML file, with what they were measured on.

A recipe is read with `tomllib` and written with `tomli_w`, atomically. Loading validates
everything a later run relies on; a file that is not TOML, lacks a field, has a value of the wrong
type or an unknown ``schema_version`` raises `RecipeError` naming the file and the field (exit 2).

Layout (schema version 1)::

    schema_version = 1
    name = "train-cpu2-amd-epyc"
    created = "2026-11-21T23:59:00Z"
    autotune_version = "0.1.0"
    [script]       path, args, sha256
    [knobs]        batch_size, workers, thread_pct, instances, bucket_mb (those that were tuned)
    [result]       samples_per_s, ci_half, baseline_samples_per_s, baseline_ci_half, speedup,
                   speedup_low and speedup_high (its 95% interval), core_s_per_sample and
                   gpu_s_per_sample (what a sample cost the winner, when measured),
                   batch_note (when the winner changes the job's global batch: by how much,
                   and what that asks of the learning rate), payback_note (tuning's cost
                   against the saving projected over the run, when its length is known),
                   kept_baseline, trials, source, reason, notes (what the winner's probes
                   said of it, e.g. a backend autotune replaced)
    [baseline]     the script's own knobs
    [keep_batch]   only when the winner changes the job's global batch: the fastest config
                   confirmed that keeps it (the script's own knobs when none was faster beyond
                   doubt), as [keep_batch.knobs], with its samples_per_s, ci_half, speedup,
                   speedup_low and speedup_high, kept_baseline and reason; ``autotune run
                   --recipe --keep-batch`` runs it (a recipe without it keeps the batch
                   already, or predates it)
    [verdict]      bottleneck, text, bound_samples_per_s (only when known)
    [breakdown]    where the winner's time goes: data, forward, backward, comm, optimizer,
                   other, each [share of wall time, its 95% half-width] (only when measured)
    [job]          global_batch (only when tuned with --global-batch: a run on another number
                   of hosts or GPUs divides it again over its own world)
    [objective]    name (--objective; a recipe without the table was tuned for throughput),
                   note (how the score was made), the winner's score and its parts:
                   efficiency and noise_scale (goodput), j_per_sample and samples_per_j
                   (energy), the baseline's baseline_j_per_sample; front (throughput,energy:
                   the Pareto front, one line per config, the pick marked)
    [tuned_on]     nodes (the hosts its ranks spanned), busbw_gbps and link (the allreduce
                   timing between its ranks, when measured): a run on another number of nodes
                   carries the per-node knobs over and flags the bucket and the global batch
    [fingerprint]  cpu_model, cores, gpu_names, gpu_count, gpu_driver, torch_version,
                   script_sha256, args
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune import __version__
from autotune.measuring.breakdown import ALL_PARTS
from autotune.hardware import fingerprint
from autotune.store import rundir
from autotune.tuning import decision, objective, space
from autotune.tuning.records import TunedOn
from autotune import RecipeError

SCHEMA_VERSION = 1
DEFAULT_DIR = "recipes"

_OBJECTIVE = f"one of {', '.join(objective.CHOICES)}"  # the kind of [objective] name
_KNOB_TABLE = "a table of knobs, each a whole number >= 0"  # [keep_batch.knobs]
# Every field a recipe may hold: section ("" for the top level) -> field -> (kind, required).
# A section marked None is a table whose every value has that kind ([knobs], [baseline]).
_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"schema_version": ("int", True), "name": ("str", True), "created": ("str", False),
         "autotune_version": ("str", False)},
    "script": {"path": ("str", True), "args": ("list of str", True), "sha256": ("str", True)},
    "result": {"samples_per_s": ("int or float", True), "ci_half": ("int or float", True),
               "baseline_samples_per_s": ("int or float", True),
               "baseline_ci_half": ("int or float", False), "speedup": ("int or float", True),
               "kept_baseline": ("bool", True), "speedup_low": ("int or float", False),
               "speedup_high": ("int or float", False), "trials": ("int", False),
               "batch_note": ("str", False), "payback_note": ("str", False),
               "core_s_per_sample": ("int or float", False),
               "gpu_s_per_sample": ("int or float", False),
               "source": ("str", False),
               "reason": ("str", False), "notes": ("list of str", False)},
    "verdict": {"bottleneck": ("str", False), "text": ("str", False),
                "bound_samples_per_s": ("int or float", False),
                "full_share_of_bound": ("int or float", False)},
    "job": {"global_batch": ("a whole number >= 1", False)},
    "keep_batch": {"knobs": (_KNOB_TABLE, True), "samples_per_s": ("int or float", True),
                   "ci_half": ("int or float", True), "speedup": ("int or float", True),
                   "speedup_low": ("int or float", False),
                   "speedup_high": ("int or float", False), "kept_baseline": ("bool", True),
                   "reason": ("str", False)},
    "objective": {"name": (_OBJECTIVE, False), "note": ("str", False),
                  "score": ("int or float", False), "efficiency": ("int or float", False),
                  "noise_scale": ("int or float", False),
                  "j_per_sample": ("int or float", False),
                  "samples_per_j": ("int or float", False),
                  "baseline_j_per_sample": ("int or float", False),
                  "front": ("list of str", False)},
    "tuned_on": {"nodes": ("a whole number >= 1", False), "busbw_gbps": ("int or float", False),
                 "link": ("str", False)},
    "breakdown": {part: ("a [share, half-width] pair", False) for part in ALL_PARTS},
    "fingerprint": {"cpu_model": ("str", True), "cores": ("int", True),
                    "gpu_names": ("list of str", True), "gpu_count": ("int", True),
                    "gpu_driver": ("str", False), "torch_version": ("str", True),
                    "script_sha256": ("str", True), "args": ("list of str", True)},
}
_REQUIRED_TABLES = ("script", "result", "fingerprint", "knobs")
_ANY = {"knobs": "a whole number >= 0", "baseline": "a whole number >= 0"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_KINDS = {
    "int": _is_int, "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
    "int or float": lambda v: _is_int(v) or isinstance(v, float),
    "list of str": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
    _OBJECTIVE: lambda v: v in objective.CHOICES,
    "a whole number >= 0": lambda v: _is_int(v) and v >= 0,
    "a whole number >= 1": lambda v: _is_int(v) and v >= 1,
    _KNOB_TABLE: lambda v: isinstance(v, dict) and all(
        k in space.KNOBS and _is_int(x) and x >= 0 for k, x in v.items()),
    "a [share, half-width] pair": lambda v: isinstance(v, list) and len(v) == 2 and all(
        (_is_int(a) or isinstance(a, float)) and 0 <= a <= 10 for a in v),
}


@dataclass(frozen=True)
class Recipe:
    name: str
    knobs: Mapping[str, int]
    samples_per_s: float
    ci_half: float
    baseline_samples_per_s: float
    speedup: float
    kept_baseline: bool
    fingerprint: fingerprint.Fingerprint
    script_path: str
    script_args: tuple[str, ...] = ()
    baseline_ci_half: float = 0.0
    baseline_knobs: Mapping[str, int] = field(default_factory=dict)
    trials: int = 0
    source: str = ""
    reason: str = ""
    verdict: Mapping | None = None
    created: str = ""
    autotune_version: str = __version__
    path: Path | None = None  # where it was loaded from or saved to
    # the speed-up's 95% interval over the confirmation rounds (`decision.speedup_interval`)
    speedup_low: float | None = None
    speedup_high: float | None = None
    global_batch: int | None = None  # the job's batch, kept whatever the world
    notes: tuple[str, ...] = ()  # what the winner's probes said of it (a backend replaced, ...)
    breakdown: Mapping[str, tuple[float, float]] | None = None  # part -> (share, half-width)
    batch_note: str = ""  # what the winner does to the job's global batch ("" : nothing)
    payback_note: str = ""  # tuning's cost against the projected saving ("": run unknown)
    core_s_per_sample: float = 0.0  # what a sample cost the winner (0: not measured)
    gpu_s_per_sample: float = 0.0
    objective: str = "throughput"  # --objective it was tuned for
    # the [objective] table beyond its name: note, score, efficiency, noise_scale,
    # j_per_sample, samples_per_j, baseline_j_per_sample, front (None: throughput, nothing more)
    objective_parts: Mapping | None = None
    # the winner changes the job's global batch: the fastest confirmed config that keeps it
    keep_batch: decision.Choice | None = None
    tuned_on: TunedOn = TunedOn()  # the nodes and link it was tuned on (old recipes: 1, unknown)

    def keeping_batch(self) -> Recipe:
        """This recipe with its [keep_batch] config as its knobs and figures (what ``run
        --keep-batch`` launches); itself when it has none (its knobs keep the job's batch
        already). A recipe whose knobs change the batch and that has no [keep_batch] (saved
        before there was one) is a `RecipeError`."""
        k = self.keep_batch
        if k is None:
            if self.batch_note and not self.global_batch:
                raise _fail(self.path or Path(f"{self.name}.toml"),
                            "its knobs change the job's global batch and it holds no "
                            "[keep_batch] config (saved by an older autotune); tune again, "
                            "or with --global-batch")
            return self
        return dataclasses.replace(
            self, knobs=dict(k.knobs), samples_per_s=k.samples_per_s, ci_half=k.ci_half,
            speedup=k.speedup, kept_baseline=k.kept_baseline, reason=k.reason,
            speedup_low=k.speedup_low, speedup_high=k.speedup_high, batch_note="", notes=(),
            breakdown=None, verdict=None, core_s_per_sample=0.0, gpu_s_per_sample=0.0,
            keep_batch=None)

    def run_knobs(self, cores: int, gpus: int | None = None,
                  hosts: int | None = None) -> tuple[dict[str, float], int]:
        """Knobs for the ranks of a run on ``hosts`` hosts of ``cores`` cores and ``gpus`` GPUs
        each (None: as many as the recipe was tuned on).

        ``thread_pct`` keeps the meaning it was tuned with where it can: tuned on GPUs and run
        on GPUs, each rank's MPS share; otherwise (a GPU recipe on a host without GPUs, or a CPU
        recipe anywhere) the CPU meaning, a share of the cores turned into threads. A recipe
        with a global batch divides it over the run's world (instances x GPUs x hosts) when
        ``hosts`` is given; a world that does not divide it is a `RecipeError`.
        """
        here = self.fingerprint.gpu_count if gpus is None else gpus
        device = "gpu" if self.fingerprint.gpu_count and here else "cpu"
        devices = space.job_devices(device, here, hosts or 1)
        world = self.knobs.get("instances", 1) * devices
        keep = self.global_batch if hosts is not None else None
        if keep and keep % world:
            raise _fail(self.path or Path(f"{self.name}.toml"),
                        f"its global batch of {keep} does not divide over this run's {world} "
                        f"ranks ({self.knobs.get('instances', 1)} instances x {devices} "
                        f"devices); run on a world that divides it, or tune again here")
        return space.rank_knobs(self.knobs, cores=cores, device=device, global_batch=keep,
                                devices=devices)

    def to_toml(self) -> dict:
        doc = {"schema_version": SCHEMA_VERSION, "name": self.name,
               "created": self.created or _now(), "autotune_version": self.autotune_version,
               "script": {"path": self.script_path, "args": list(self.script_args),
                          "sha256": self.fingerprint.script_sha256},
               "knobs": {k: int(v) for k, v in self.knobs.items()},
               "result": {"samples_per_s": float(self.samples_per_s),
                          "ci_half": float(self.ci_half),
                          "baseline_samples_per_s": float(self.baseline_samples_per_s),
                          "baseline_ci_half": float(self.baseline_ci_half),
                          "speedup": float(self.speedup), "kept_baseline": self.kept_baseline,
                          "trials": int(self.trials), "source": self.source,
                          "reason": self.reason},
               "baseline": {k: int(v) for k, v in self.baseline_knobs.items()},
               "fingerprint": self.fingerprint.to_dict()}
        if self.notes:
            doc["result"]["notes"] = list(self.notes)
        if self.speedup_low is not None and self.speedup_high is not None and \
                math.isfinite(self.speedup_high):
            doc["result"]["speedup_low"] = float(self.speedup_low)
            doc["result"]["speedup_high"] = float(self.speedup_high)
        if self.verdict:
            doc["verdict"] = {k: v for k, v in self.verdict.items() if v is not None}
        if self.global_batch:
            doc["job"] = {"global_batch": int(self.global_batch)}
        for name in ("batch_note", "payback_note"):
            if getattr(self, name):
                doc["result"][name] = getattr(self, name)
        for name in ("core_s_per_sample", "gpu_s_per_sample"):
            if getattr(self, name):
                doc["result"][name] = float(getattr(self, name))
        if self.keep_batch is not None:
            doc["keep_batch"] = {name: v for name, v in self.keep_batch.to_dict().items()
                                 if v is not None}
        doc["tuned_on"] = self.tuned_on.to_dict()
        if self.breakdown:
            doc["breakdown"] = {p: [float(v) for v in sh] for p, sh in self.breakdown.items()}
        if self.objective != "throughput" or self.objective_parts:
            parts = {k: v for k, v in (self.objective_parts or {}).items()
                     if v is not None and v != "" and v != []}
            doc["objective"] = {"name": self.objective, **{
                k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in parts.items()}}
        return doc


def _maybe_float(value) -> float | None:
    return None if value is None else float(value)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def recipe_name(script: str, fp: fingerprint.Fingerprint) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(script).stem)[:40] or "script"
    return f"{stem}-{fingerprint.hardware_slug(fp)}"


def save(recipe: Recipe, recipe_dir: Path) -> Path:
    """Write ``<recipe_dir>/<name>.toml`` atomically; returns the path."""
    recipe_dir = Path(recipe_dir)
    recipe_dir.mkdir(parents=True, exist_ok=True)
    path = recipe_dir / f"{recipe.name}.toml"
    import tomli_w  # only writing needs it: reading recipes works without

    rundir.write_atomic(path, tomli_w.dumps(recipe.to_toml()))
    return path


def _fail(path: Path, what: str) -> RecipeError:
    return RecipeError(f"recipe {path}: {what}")


def _check(doc: dict, path: Path) -> None:
    """Every field of `_FIELDS` and every value of [knobs] and [baseline]: present when required,
    of its kind when present; the first one that is not names the file and the field."""
    version = doc.get("schema_version")
    if _is_int(version) and version != SCHEMA_VERSION:
        raise _fail(path, f"unknown schema_version {version} (this autotune reads "
                          f"{SCHEMA_VERSION}); re-tune or upgrade autotune")
    for section in (*_FIELDS, *_ANY):
        table = doc if not section else doc.get(section)
        if table is None and section not in _REQUIRED_TABLES:
            continue
        if table is None:
            raise _fail(path, f"missing table [{section}]")
        if not isinstance(table, dict):
            raise _fail(path, f"[{section}] must be a table")
        where = f"[{section}]" if section else "top level"
        fields = _FIELDS.get(section) or {name: (_ANY[section], False) for name in table}
        for name, (kind, required) in fields.items():
            label = f"{section}.{name}" if section else name
            if section == "knobs" and name not in space.KNOBS:
                raise _fail(path, f"unknown knob '{label}'; knobs: {', '.join(space.ORDER)}")
            if name not in table:
                if required:
                    raise _fail(path, f"missing field '{label}' ({where})")
                continue
            if not _KINDS[kind](table[name]):
                raise _fail(path, f"field '{label}' must be {kind}, got {table[name]!r}")


def load(path: Path | str) -> Recipe:
    """Read and validate one recipe; `RecipeError` (exit 2) on anything unusable."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"recipe {path} not found; 'autotune recipes list' shows the saved "
                          f"ones") from None
    except OSError as exc:
        raise _fail(path, f"cannot read it: {exc.strerror}") from None
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _fail(path, f"not valid TOML: {exc}") from None
    _check(doc, path)
    result, fp = doc["result"], doc["fingerprint"]
    baseline, verdict = doc.get("baseline", {}), doc.get("verdict")
    return Recipe(
        name=doc["name"], knobs=dict(doc["knobs"]), samples_per_s=float(result["samples_per_s"]),
        ci_half=float(result["ci_half"]),
        baseline_samples_per_s=float(result["baseline_samples_per_s"]),
        speedup=float(result["speedup"]), kept_baseline=result["kept_baseline"],
        fingerprint=fingerprint.Fingerprint.from_dict(fp), script_path=doc["script"]["path"],
        script_args=tuple(doc["script"]["args"]),
        baseline_ci_half=float(result.get("baseline_ci_half", 0.0)),
        baseline_knobs=dict(baseline),
        trials=int(result.get("trials", 0)), source=str(result.get("source", "")),
        reason=str(result.get("reason", "")), verdict=verdict,
        created=str(doc.get("created", "")),
        autotune_version=str(doc.get("autotune_version", "")), path=path,
        global_batch=doc.get("job", {}).get("global_batch"),
        speedup_low=_maybe_float(result.get("speedup_low")),
        speedup_high=_maybe_float(result.get("speedup_high")),
        notes=tuple(result.get("notes", ())),
        batch_note=str(result.get("batch_note", "")),
        payback_note=str(result.get("payback_note", "")),
        core_s_per_sample=float(result.get("core_s_per_sample", 0.0)),
        gpu_s_per_sample=float(result.get("gpu_s_per_sample", 0.0)),
        breakdown={p: (float(v[0]), float(v[1])) for p, v in doc["breakdown"].items()}
        if doc.get("breakdown") else None,
        objective=str(doc.get("objective", {}).get("name", "throughput")),
        objective_parts={k: v for k, v in doc["objective"].items() if k != "name"}
        if doc.get("objective") else None,
        keep_batch=decision.Choice.from_dict(doc["keep_batch"]) if doc.get("keep_batch")
        else None,
        tuned_on=TunedOn.from_dict(doc.get("tuned_on", {})))


def listing(recipe_dir: Path) -> list[tuple[Path, Recipe | RecipeError]]:
    """Every ``*.toml`` in the directory, loaded, or the error that loading it gave."""
    out: list[tuple[Path, Recipe | RecipeError]] = []
    for path in sorted(Path(recipe_dir).glob("*.toml")):
        try:
            out.append((path, load(path)))
        except RecipeError as exc:
            out.append((path, exc))
    return out


def warm_start_candidate(recipe_dir: Path, command: tuple[str, ...],
                         fp: fingerprint.Fingerprint) -> tuple[Recipe | None, str]:
    """The recipe for this script on this hardware, if its fingerprint matches; and why not.

    Arguments may differ (a longer run of the same script); hardware, torch and the script's
    contents must not.
    """
    path = Path(recipe_dir) / f"{recipe_name(command[0], fp)}.toml"
    if not path.is_file():
        return None, ""
    try:
        recipe = load(path)
    except RecipeError as exc:
        return None, f"not warm-starting: {exc}"
    differences = fingerprint.diff(fp, recipe.fingerprint,
                                   fields=(*fingerprint.HARDWARE, *fingerprint.SOFTWARE,
                                           *fingerprint.SCRIPT))
    if differences:
        return None, (f"not warm-starting from {path}: its fingerprint differs ("
                      f"{fingerprint.describe(differences)})")
    return recipe, f"warm start: trying {path}'s knobs first"
