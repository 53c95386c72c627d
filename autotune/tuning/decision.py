"""Pure decisions of the search: known-infeasible configs, convergence, the confirmation verdict.

No processes, clocks or Optuna here, so each rule is tested on plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.measuring.steady import t975

MIN_GAIN_REL = 0.03  # a winner must beat the baseline by more than this, whatever the intervals
# One config's throughput between separate processes, as a share (DESIGN.md, Measuring: ~10%);
# what a speed-up measured in one round of two processes cannot see from inside either.
PROCESS_NOISE_REL = 0.10
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

    ``moves`` are (config, samples/s or None) of one-at-a-time probes. None when fewer than two
    moves paid off (one alone is already measured).
    """
    out = dict(baseline)
    won = 0
    for cfg, value in moves:
        if value is None or value <= base_value * (1 + min_gain_rel):
            continue
        changed = {k: v for k, v in cfg.items() if baseline.get(k) != v}
        out.update(changed)
        won += 1
    return out if won >= 2 else None


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


# -- confirmation -----------------------------------------------------------------------------
def interleave(names: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """(round, name) in the order A B C A B C: each config once per round, rounds in turn."""
    return [(r, n) for r in range(1, rounds + 1) for n in names]


@dataclass(frozen=True)
class Measured:
    samples_per_s: float
    ci_half: float


@dataclass(frozen=True)
class Summary:
    """One config over the confirmation rounds."""

    samples_per_s: float
    ci_half: float
    rounds: int


def summarize(ms: Sequence[Measured]) -> Summary:
    """Mean over rounds; the interval is the wider of the spread between rounds (separate
    processes) and the probes' own intervals."""
    n = len(ms)
    if n == 0:
        return Summary(0.0, math.inf, 0)
    mean = sum(m.samples_per_s for m in ms) / n
    within = math.sqrt(sum(m.ci_half ** 2 for m in ms)) / n
    between = 0.0
    if n >= 2:
        sd = math.sqrt(sum((m.samples_per_s - mean) ** 2 for m in ms) / (n - 1))
        between = t975(n - 1) * sd / math.sqrt(n) if n >= 3 else sd
    return Summary(mean, max(within, between), n)


@dataclass(frozen=True)
class Decision:
    winner: str
    kept_baseline: bool
    speedup: float  # winner over baseline, both from the confirmation rounds
    winner_summary: Summary
    baseline_summary: Summary
    noise_rel: float
    reason: str
    # the 95% interval of ``speedup`` (`speedup_interval`); (1, 1) when the baseline was kept
    speedup_low: float = 1.0
    speedup_high: float = 1.0


def speedup_interval(speedup: float, pairs: Sequence[tuple[float, float]],
                     winner: Summary, base: Summary) -> tuple[float, float]:
    """A 95% interval for ``speedup`` that holds when the two configs are run again, in new
    processes: from the spread of the per-round ratios (``pairs``: winner, baseline) when there
    are two rounds or more, never narrower than the probes' own intervals; from one round, the
    probes' intervals widened by `PROCESS_NOISE_REL` for each of the two processes."""
    within = math.hypot(_rel(winner), _rel(base))
    half = math.log1p(within) if math.isfinite(within) else math.inf
    logs = [math.log(w / b) for w, b in pairs if w > 0 and b > 0]
    if len(logs) >= 2:
        m = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
        half = max(half, t975(len(logs) - 1) * sd / math.sqrt(len(logs)))
    else:
        one = math.hypot(within, 1.96 * math.sqrt(2) * PROCESS_NOISE_REL)
        half = math.log1p(one) if math.isfinite(one) else math.inf
    if not math.isfinite(half):
        return 0.0, math.inf
    return speedup * math.exp(-half), speedup * math.exp(half)


def decide(results: Mapping[str, Sequence[Measured | None]], baseline: str, *,
           min_gain_rel: float = MIN_GAIN_REL) -> Decision:
    """Pick the winner of the interleaved re-measurement; the baseline unless the gain is real.

    ``results[name][i]`` is round i's measurement (None where the probe failed). The best
    candidate wins only if it beat the baseline in every round both were measured, and its mean
    gain exceeds the noise: the larger of ``min_gain_rel``, the two intervals combined, and,
    with three rounds or more, the t-interval of the per-round ratios.
    """
    base_ms = [m for m in results.get(baseline, ()) if m is not None]
    base = summarize(base_ms)
    candidates = {n: summarize([m for m in ms if m is not None])
                  for n, ms in results.items() if n != baseline}
    candidates = {n: s for n, s in candidates.items() if s.rounds}
    if not base.rounds:
        return Decision(baseline, True, 1.0, base, base, math.inf,
                        "the baseline could not be re-measured; nothing to compare against")
    if not candidates:
        return Decision(baseline, True, 1.0, base, base, 0.0,
                        "no candidate survived re-measurement; keeping the script's defaults")
    name = max(candidates, key=lambda n: candidates[n].samples_per_s)
    best = candidates[name]
    pairs = [(w.samples_per_s, b.samples_per_s)
             for w, b in zip(results[name], results[baseline])
             if w is not None and b is not None and b.samples_per_s > 0]
    speedup = best.samples_per_s / base.samples_per_s if base.samples_per_s else math.inf
    noise = max(min_gain_rel, math.hypot(_rel(best), _rel(base)))
    if len(pairs) >= 3:
        logs = [math.log(w / b) for w, b in pairs if w > 0]
        if len(logs) >= 3:
            m = sum(logs) / len(logs)
            sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
            noise = max(noise, math.expm1(t975(len(logs) - 1) * sd / math.sqrt(len(logs))))
    every_round = bool(pairs) and all(w > b for w, b in pairs)
    if every_round and speedup - 1 > noise:
        low, high = speedup_interval(speedup, pairs, best, base)
        return Decision(name, False, speedup, best, base, noise,
                        f"{name} beat the baseline in every round by {speedup - 1:+.1%} on "
                        f"average, beyond the noise ({noise:.1%}); 95% interval of the "
                        f"speed-up {low:.2f}x-{high:.2f}x over {len(pairs)} round(s)",
                        low, high)
    why = ("it did not win every round" if not every_round
           else f"{speedup - 1:+.1%} is within the noise ({noise:.1%})")
    return Decision(baseline, True, 1.0, base, base, noise,
                    f"kept the script's defaults: the best candidate ({name}, "
                    f"{speedup - 1:+.1%}) is not clearly faster: {why}")


def _rel(s: Summary) -> float:
    return s.ci_half / s.samples_per_s if s.samples_per_s > 0 else math.inf


def decide_pair(first: Mapping[str, Sequence[Measured | None]],
                second: Mapping[str, Sequence[Measured | None]], baseline: str, *,
                min_gain_rel: float = MIN_GAIN_REL) -> Decision:
    """Two objectives at once (samples/s, samples/J): a candidate wins when `decide` declares it
    the winner on one of them and, on the other, its mean is not below the baseline's by more
    than that objective's noise. The speed-up and its interval are the first objective's."""
    d = (decide(first, baseline, min_gain_rel=min_gain_rel),
         decide(second, baseline, min_gain_rel=min_gain_rel))
    base1 = d[0].baseline_summary
    for i, (won, other, other_d) in enumerate(((d[0], second, d[1]), (d[1], first, d[0]))):
        if won.kept_baseline:
            continue
        name = won.winner
        o = summarize([m for m in other.get(name, ()) if m is not None])
        ob = other_d.baseline_summary
        if not o.rounds or ob.samples_per_s <= 0:
            continue
        ratio = o.samples_per_s / ob.samples_per_s
        if ratio < 1 - max(other_d.noise_rel, min_gain_rel):
            continue
        s1 = summarize([m for m in first.get(name, ()) if m is not None])
        pairs = [(w.samples_per_s, b.samples_per_s) for w, b in zip(first[name], first[baseline])
                 if w is not None and b is not None and b.samples_per_s > 0]
        speedup = s1.samples_per_s / base1.samples_per_s if base1.samples_per_s else math.inf
        low, high = speedup_interval(speedup, pairs, s1, base1)
        gains = (speedup - 1, ratio - 1) if i == 0 else (ratio - 1, won.speedup - 1)
        return Decision(name, False, speedup, s1, base1, won.noise_rel,
                        f"{name}: {gains[0]:+.1%} samples/s and {gains[1]:+.1%} samples/J "
                        f"against the baseline; {('samples/s', 'samples/J')[i]} beyond the "
                        f"noise in every round, {('samples/J', 'samples/s')[i]} not worse "
                        f"beyond its noise", low, high)
    return Decision(baseline, True, 1.0, base1, base1, d[0].noise_rel,
                    "kept the script's defaults: no candidate was clearly better on samples/s "
                    "or samples/J without being worse on the other")
