"""Which knob mattered: parameter importance for the report.

From the run's Optuna study (``study.db`` in the run directory) when there is one and Optuna can
compute it (`autotune.tuning.study.importances`: Optuna enters there only); otherwise computed here from the journal's trials as the correlation ratio (eta
squared: the share of the throughput variance explained by grouping trials by the knob's value),
normalised to sum to 1. Never raises: no importance is an empty result with a reason.
"""

from __future__ import annotations

import logging
from pathlib import Path

STUDY_DB = "study.db"
MIN_TRIALS = 3


def from_trials(trials: list[tuple[dict, float]]) -> dict[str, float]:
    """Importance by knob from (knobs, samples_per_s) of successful trials; {} if too few."""
    if len(trials) < MIN_TRIALS:
        return {}
    ys = [y for _, y in trials]
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    if total <= 0:
        return {}
    knobs = sorted({k for knobs, _ in trials for k in knobs})
    raw = {}
    for knob in knobs:
        pairs = [(knobs_[knob], y) for knobs_, y in trials if knob in knobs_]
        if len({_key(v) for v, _ in pairs}) < 2:
            continue
        groups = _groups(pairs, max_groups=max(2, len(pairs) // 3))
        between = sum(len(g) * (sum(g) / len(g) - mean) ** 2 for g in groups if g)
        raw[knob] = between / total
    norm = sum(raw.values())
    if norm <= 0:
        return {}
    return dict(sorted(((k, v / norm) for k, v in raw.items()), key=lambda kv: -kv[1]))


def _key(value):
    return value if isinstance(value, (int, float, str)) else str(value)


def _groups(pairs, *, max_groups: int) -> list[list[float]]:
    """Throughputs grouped by knob value; numeric knobs with many values in quantile bins."""
    values = sorted({_key(v) for v, _ in pairs}, key=lambda v: (isinstance(v, str), v))
    numeric = all(isinstance(v, (int, float)) for v in values)
    if not numeric or len(values) <= max_groups:
        by = {}
        for v, y in pairs:
            by.setdefault(_key(v), []).append(y)
        return list(by.values())
    ordered = sorted(pairs, key=lambda p: p[0])
    size = len(ordered) / max_groups
    bins: list[list[float]] = [[] for _ in range(max_groups)]
    for i, (_, y) in enumerate(ordered):
        bins[min(max_groups - 1, int(i / size))].append(y)
    return bins


def from_study(run_dir: Path) -> tuple[dict[str, float], str]:
    """(importance, method) from ``study.db``; ({}, why not) when absent or not computable."""
    db = Path(run_dir) / STUDY_DB
    if not db.is_file():
        return {}, "no study.db in the run directory"
    try:
        from autotune.tuning import study  # Optuna's place; loaded only when there is a study

        return study.importances(study.sqlite_url(db), min_trials=MIN_TRIALS)
    except Exception as exc:  # noqa: BLE001 - a broken study must not break the report
        logging.getLogger(__name__).debug("study importance failed", exc_info=True)
        return {}, f"study.db unreadable: {type(exc).__name__}: {exc}"


def importance(run_dir: Path, trials: list[tuple[dict, float]]) -> tuple[dict[str, float], str]:
    """(importance by knob, how it was computed); the study first, the journal's trials next."""
    imp, why = from_study(run_dir)
    if imp:
        return imp, why
    imp = from_trials(trials)
    if imp:
        return imp, "correlation ratio over this run's successful trials"
    return {}, f"not enough successful trials with varied knobs (need {MIN_TRIALS})"
