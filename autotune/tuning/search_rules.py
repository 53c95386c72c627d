"""The search's pure rules: known-infeasible configs, pruning, the first design, convergence.

No processes, clocks or Optuna here, so each rule is tested on plain numbers; the confirmation's
statistic is `autotune.tuning.decision`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.tuning.decision import MIN_GAIN_REL

PRUNE_MARGIN_REL = 0.10  # a probe is pruned when its upper bound is this far under the best


# -- out of memory --------------------------------------------------------------------------
def oom_blocks(cfg: Mapping[str, int], ooms: Sequence[Mapping[str, int]]) -> Mapping | None:
    """The OOM config that rules ``cfg`` out, if any.

    Memory grows with the per-rank batch and with the ranks on a host, so a config with at least
    the batch size and at least the ranks of one that ran out of memory is not tried again.
    """
    for oom in ooms:
        if "batch_size" not in oom or "batch_size" not in cfg:
            continue
        if cfg["batch_size"] >= oom["batch_size"] and \
                cfg.get("instances", 1) >= oom.get("instances", 1):
            return oom
    return None


# -- pruning ----------------------------------------------------------------------------------
def cannot_reach(samples_per_s: float, ci_half: float, bar: float | None,
                 *, margin_rel: float = PRUNE_MARGIN_REL) -> bool:
    """True when the upper end of a probe's interval stays clearly under ``bar``.

    ``bar`` is the best so far, taken at the low end of its own interval
    (`autotune.tuning.study.best_floor`). The margin covers what an interval inside one process cannot
    see: processes differ by ~10% here (docs: DESIGN.md, Measuring).
    """
    if not bar or bar <= 0 or math.isinf(ci_half) or math.isnan(ci_half):
        return False
    return samples_per_s + ci_half < bar * (1 - margin_rel)


# -- initial design -------------------------------------------------------------------------
def combine(baseline: Mapping[str, int], base_value: float,
            moves: Sequence[tuple[Mapping[str, int], float | None]], *,
            min_gain_rel: float = MIN_GAIN_REL) -> dict[str, int] | None:
    """The baseline with every one-knob move that beat it by more than ``min_gain_rel``.

    ``moves`` are (config, samples/s or None) of one-at-a-time probes; of two moves of the same
    knob that both paid off, the better one. None when moves of fewer than two knobs paid off
    (one alone is already measured).
    """
    out = dict(baseline)
    won: set[str] = set()
    # the better moves last: of two moves of one knob (the batch's neighbours), the better stands
    paid = sorted(((value, i, cfg) for i, (cfg, value) in enumerate(moves)
                   if value is not None and value > base_value * (1 + min_gain_rel)),
                  key=lambda m: (m[0], -m[1]))
    for _, _, cfg in paid:
        changed = {k: v for k, v in cfg.items() if baseline.get(k) != v}
        out.update(changed)
        won.update(changed)
    return out if len(won) >= 2 else None


# -- convergence ----------------------------------------------------------------------------
@dataclass
class Convergence:
    """Stop when the best has not improved by more than ``rel`` over ``patience`` probes."""

    patience: int = 6
    rel: float = 0.03
    min_trials: int = 6
    best: float = 0.0
    since_best: int = 0
    seen: int = 0

    def update(self, value: float | None) -> bool:
        """Feed one measured probe (None for one without a throughput); True: converged."""
        self.seen += 1
        if value is not None and value > self.best * (1 + self.rel):
            self.best = value
            self.since_best = 0
        else:
            self.since_best += 1
        return self.seen >= self.min_trials and self.since_best >= self.patience
