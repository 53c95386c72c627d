"""The confirmation's statistic, pure: rounds summarized, a speed-up's interval, the verdict.

No processes, clocks or Optuna here, so each rule is tested on plain numbers; the search's own
rules (pruning, the first design, convergence) are `autotune.tuning.search_rules`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from autotune.measuring.steady import t975

MIN_GAIN_REL = 0.03  # a winner must beat the baseline by more than this, whatever the intervals
# One config's throughput between separate processes, as a share (DESIGN.md, Measuring: ~10%);
# what a speed-up measured in one round of two processes cannot see from inside either.
PROCESS_NOISE_REL = 0.10


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
    # the probes' own intervals over the rounds, the spread between rounds left out: a
    # speed-up's interval takes that spread from the paired per-round ratios instead, where
    # a load that slowed both configs of a round cancels
    own_half: float | None = None  # None: ci_half


def summarize(ms: Sequence[Measured]) -> Summary:
    """Mean over rounds; the interval is the wider of the spread between rounds (separate
    processes) and the probes' own intervals (kept apart as ``own_half``)."""
    n = len(ms)
    if n == 0:
        return Summary(0.0, math.inf, 0)
    mean = sum(m.samples_per_s for m in ms) / n
    within = math.sqrt(sum(m.ci_half ** 2 for m in ms)) / n
    between = 0.0
    if n >= 2:
        sd = math.sqrt(sum((m.samples_per_s - mean) ** 2 for m in ms) / (n - 1))
        between = t975(n - 1) * sd / math.sqrt(n) if n >= 3 else sd
    return Summary(mean, max(within, between), n, within)


# -- the claim's interval: 95%, corrected for picking the best of several --------------------
LEVEL = 0.95  # the claim's confidence, over every candidate the confirmation measured together
KEPT = "kept the script's defaults: "  # how a reason that keeps them begins
# Interleaved rounds a switch needs: one round shows no spread between processes. One round
# decides alone only where the spread was measured elsewhere and, taken at its upper bound, it
# still cannot explain the gain (`decide`'s ``one_round_rel``): minGPT's shape moves ~1% between
# processes, and a second round of its batch 256 against 32 (~90 s) was the probe of 256 a
# five-minute budget lacked.
MIN_ROUNDS = 2
# The rounds' own degrees of freedom under which the script's config in two processes is
# pooled with their spread (`_spread`): two rounds, whose t quantile alone is 15.9 at 96%.
POOL_UNDER_DOF = 2
# Rounds a budget keeps for the confirmation at the least. Two rounds leave the per-round
# spread one degree of freedom: with two candidates the t quantile is 25.5, and at 5% between
# rounds only a gain past ~2.4x clears 1.0 (nanoGPT's batch 64 won both rounds by 1.31x and
# 1.26x and read 0.83x-1.98x). Three rounds bring it to 6.2 (~20% at that spread).
PLANNED_ROUNDS = 3
MAX_ROUNDS_NEEDED = 30  # beyond this many rounds, "more rounds" is no advice


def level_for(candidates: int) -> float:
    """The confidence of each candidate's interval so that all ``candidates`` hold together at
    `LEVEL` (Bonferroni: 1 - 0.05/k). Picking the best of k noisy candidates favours one whose
    noise ran high; the wider interval pays for that choice. Bonferroni rather than Šidák
    (1 - 0.95^(1/k)): the two differ in the fourth digit at k <= 4, and Bonferroni holds
    whatever the candidates' correlation (they share the baseline's rounds)."""
    return 1 - (1 - LEVEL) / max(1, candidates)


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (``p`` in (0.5, 1)) for whole degrees of freedom: the exact CDF
    (Abramowitz & Stegun 26.7.3-4) inverted by bisection; the normal's beyond 200 dof."""
    if dof < 1:
        return math.inf
    if dof > 200:
        return NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, dof) < p:
        hi *= 2
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, dof) < p else (lo, mid)
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _t_cdf(t: float, dof: int) -> float:
    theta = math.atan(t / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof % 2:  # odd
        term, total = 1.0, 1.0 if dof > 1 else 0.0
        for k in range(1, (dof - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + (s * math.cos(theta) * total if dof > 1 else 0.0))
    else:
        term, total = 1.0, 1.0
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + a / 2


def _z(level: float) -> float:
    return NormalDist().inv_cdf((1 + level) / 2)


def claim_text(speedup: float, low: float, high: float) -> str:
    """``1.062x (0.981x-1.149x)``: the speed-up and its interval as a claim, never rounded up:
    the low end and the point rounded down, the high end up, to three digits."""
    def down(x):
        return f"{math.floor(x * 1000) / 1000:.3f}x"
    up = f"{math.ceil(high * 1000) / 1000:.3f}x" if math.isfinite(high) else "inf"
    return f"{down(speedup)} ({down(low)}-{up})"


def interval_words(candidates: int, looks: int = 1) -> str:
    """How the interval was made, for the reason: its level and the correction (for the
    candidates, and for the looks a confirmation planned: `decide`'s ``looks``)."""
    k = max(1, candidates) * max(1, looks)
    if k <= 1:
        return "95% interval"
    over = " and ".join([*([f"{candidates} candidates"] if candidates > 1 else []),
                         *([f"{looks} looks"] if looks > 1 else [])])
    return f"95% interval over {over} ({level_for(k) * 100:g}% each, Bonferroni)"


@dataclass(frozen=True)
class Decision:
    winner: str
    kept_baseline: bool
    speedup: float  # winner over baseline, both from the confirmation rounds
    winner_summary: Summary
    baseline_summary: Summary
    noise_rel: float
    reason: str
    # the 95% interval of ``speedup`` (`speedup_interval`, corrected for the candidates);
    # (1, 1) when the baseline was kept
    speedup_low: float = 1.0
    speedup_high: float = 1.0
    rounds: int = 0  # interleaved rounds the winner (or the best candidate) and baseline shared
    # kept the baseline: interleaved rounds that would show the best candidate's gain if it held
    # (None: not computable from one round, or no number of rounds would)
    rounds_needed: int | None = None
    candidates: int = 1  # candidates the interval is corrected for
    candidate: str = ""  # kept the baseline: the best candidate, and its measured speed-up
    candidate_speedup: float = 1.0
    looks: int = 1  # the looks the confirmation planned, which the interval is corrected for


@dataclass(frozen=True)
class Choice:
    """A config the confirmation judged against the baseline: its raw figures over the rounds
    and the claim (`decide`); the baseline's own knobs when it kept them. The batch-keeping
    alternative of a winner that changes the job's global batch is one."""

    knobs: Mapping[str, int]
    samples_per_s: float
    ci_half: float
    speedup: float = 1.0
    speedup_low: float = 1.0  # the claim's interval (corrected for the candidates confirmed)
    speedup_high: float = 1.0
    kept_baseline: bool = True
    reason: str = ""

    def to_dict(self) -> dict:
        """As ``summary.json``, the ``best`` event and a recipe's [keep_batch] hold it (an
        end of the interval that is not finite: null)."""
        return {"knobs": dict(self.knobs), "samples_per_s": self.samples_per_s,
                "ci_half": self.ci_half, "speedup": self.speedup,
                "speedup_low": self.speedup_low if math.isfinite(self.speedup_low) else None,
                "speedup_high": self.speedup_high if math.isfinite(self.speedup_high)
                else None, "kept_baseline": self.kept_baseline, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping) -> Choice:
        def num(name: str, missing: float) -> float:
            return missing if d.get(name) is None else float(d[name])

        return cls({k: int(v) for k, v in d["knobs"].items()}, float(d["samples_per_s"]),
                   float(d["ci_half"]), num("speedup", 1.0), num("speedup_low", 0.0),
                   num("speedup_high", math.inf), bool(d.get("kept_baseline", True)),
                   str(d.get("reason") or ""))


Slices = Sequence[float | None]  # one probe's slice rates in turns, in the order they ran


def paired_half(rounds: Sequence[tuple[Slices, Slices]], level: float) -> float | None:
    """Half-width, in log terms at ``level``, of a candidate's mean log speed-up from inside
    the rounds that took turns (``rounds``: each round's slice rates, candidate and baseline;
    `autotune.measuring.alternate` runs slice i of each in cycle i, the order reversed each
    cycle, A B B A). Two cycles in a row are one unit, the mean of their two log ratios: a
    drift across the cycles raises one cycle's ratio and lowers the next one's, which single
    slices would count as spread and the pair cancels. The t-interval of all units of all
    rounds; None with fewer than three."""
    units = []
    for cand, base in rounds:
        logs = [math.log(c / b) if c and b and c > 0 and b > 0 else None
                for c, b in zip(cand, base)]
        units += [(x + y) / 2 for x, y in zip(logs[0::2], logs[1::2])
                  if x is not None and y is not None]
    return _between_half(units, level) if len(units) >= 3 else None


def speedup_interval(speedup: float, pairs: Sequence[tuple[float, float]],
                     winner: Summary, base: Summary, *,
                     candidates: int = 1,
                     process_rel: float = PROCESS_NOISE_REL,
                     paired: Sequence[tuple[Slices, Slices]] | None = None,
                     level: float | None = None,
                     prior: Sequence[float] = ()) -> tuple[float, float]:
    """The interval of ``speedup`` that holds when the two configs are run again, in new
    processes, at `level_for` ``candidates`` (95% for one): from the spread of the per-round
    ratios (``pairs``: winner, baseline) when there are two rounds or more, never narrower than
    the probes' own intervals; from one round, the probes' intervals widened by the spread
    between processes (``process_rel``: measured by `autotune.tuning.spread`, else the assumed
    `PROCESS_NOISE_REL`) for each of the two processes.

    Rounds that took turns (``paired``: each round's slice rates, winner and baseline) floor
    the interval at the paired slices' own (`paired_half`) instead of the probes' own: each
    probe's interval holds the machine's drift from slice to slice, which fell on both alike.
    ``level``: the interval's confidence as given (`autotune.tuning.race`'s looks), instead of
    `level_for` ``candidates``. ``prior``: log ratios of the same config in two processes
    (`autotune.tuning.spread.ProcessSpread.pair_logs`), pooled with the rounds' spread
    (`_between_half`)."""
    level = level_for(candidates) if level is None else level
    z = _z(level)
    within = math.hypot(_own_rel(winner), _own_rel(base)) * z / 1.96  # the probes' 95% -> level
    half = math.log1p(within) if math.isfinite(within) else math.inf
    inside = paired_half(paired, level) if paired else None
    if inside is not None:
        half = inside
    logs = [math.log(w / b) for w, b in pairs if w > 0 and b > 0]
    if len(logs) >= 2:
        half = max(half, _between_half(logs, level, prior))
    else:
        one = math.hypot(within, z * math.sqrt(2) * process_rel)
        half = math.log1p(one) if math.isfinite(one) else math.inf
    if not math.isfinite(half):
        return 0.0, math.inf
    return speedup * math.exp(-half), speedup * math.exp(half)


def _between_half(logs: Sequence[float], level: float, prior: Sequence[float] = ()) -> float:
    """Half-width, in log terms, of the mean per-round log ratio at ``level``, from the
    rounds' spread (`_spread`)."""
    sd, dof = _spread(logs, prior)
    return t_quantile((1 + level) / 2, dof) * sd / math.sqrt(len(logs))


def _spread(logs: Sequence[float], prior: Sequence[float] = ()) -> tuple[float, int]:
    """The standard deviation of a round's log ratio, and its degrees of freedom, from the
    rounds' ``logs`` (two or more).

    ``prior``: log ratios whose true value is known to be 0 (the script's own config measured
    in two processes, one after another), each one more degree of freedom of that spread,
    pooled with the rounds' own (a pooled variance) while those have fewer than
    `POOL_UNDER_DOF`: two rounds alone leave the t quantile one degree of freedom (15.9 at
    96%), and with one such pair two (4.8). Two configs in two new processes differ by what
    two processes of one config differ by, and more where one ran in a drift the other
    missed, which rounds taking turns take away: so the pair errs wide. From three rounds on
    the rounds' own spread stands alone, which a wide pair would only widen."""
    n = len(logs)
    m = sum(logs) / n
    ss = sum((x - m) ** 2 for x in logs)
    if _pools(n, len(prior)):
        ss += sum(p * p for p in prior)
    dof = _dof(n, len(prior))
    return math.sqrt(ss / dof), dof


def _pools(rounds: int, pairs: int) -> bool:
    """Whether ``rounds`` pool their spread with ``pairs`` of one config's processes
    (`_spread`): while their own degrees of freedom are under `POOL_UNDER_DOF`."""
    return pairs > 0 and rounds - 1 < POOL_UNDER_DOF


def _dof(rounds: int, pairs: int) -> int:
    """The degrees of freedom of ``rounds``' spread, the pairs pooled where `_pools` says."""
    return rounds - 1 + (pairs if _pools(rounds, pairs) else 0)


def rounds_needed(speedup: float, logs: Sequence[float], within: float, candidates: int, *,
                  min_gain_rel: float = MIN_GAIN_REL, level: float | None = None,
                  prior: Sequence[float] = ()) -> int | None:
    """The fewest interleaved rounds whose interval would lie above 1.0 if the gain and the
    spread seen held (the spread of the per-round log ratios ``logs`` and the probes' own
    relative interval ``within``, both narrowing as 1/sqrt(rounds)); None from fewer than two
    rounds, for a gain under ``min_gain_rel``, or beyond `MAX_ROUNDS_NEEDED`. ``level``: the
    interval's confidence as given, instead of `level_for` ``candidates``. ``prior``: as
    `_between_half`'s, pooled with the rounds' spread."""
    if len(logs) < 2 or speedup - 1 <= min_gain_rel:
        return None
    now = len(logs)
    sd, _ = _spread(logs, prior)
    return _fewest_rounds(math.log(speedup), sd, within * math.sqrt(now),
                          level_for(candidates) if level is None else level,
                          start=max(now + 1, MIN_ROUNDS), prior_dof=len(prior))


def _fewest_rounds(gain: float, sd: float, within_one: float, level: float, *,
                   start: int, prior_dof: int = 0) -> int | None:
    """The fewest rounds from ``start`` whose interval of the log speed-up ``gain`` lies above
    0: the t-interval of rounds spread ``sd`` apart (with ``prior_dof`` more degrees of
    freedom where `_spread` pools its pairs), and the probes' own relative interval
    ``within_one`` of one round; both narrow as 1/sqrt(rounds). None beyond
    `MAX_ROUNDS_NEEDED`."""
    for n in range(start, MAX_ROUNDS_NEEDED + 1):
        w = math.log1p(within_one * _z(level) / 1.96 / math.sqrt(n))
        t = t_quantile((1 + level) / 2, _dof(n, prior_dof))
        if gain > max(w, t * sd / math.sqrt(n)):
            return n
    return None


def gain_of(best: float, best_ci: float, base: float, base_ci: float
            ) -> tuple[float, float] | None:
    """A config's speed-up over the baseline from one figure of each (samples/s or a score,
    with 95% half-widths), and their own relative intervals together: what
    `rounds_planned` plans from. None when either figure is not positive."""
    if best <= 0 or base <= 0:
        return None
    return best / base, math.hypot(best_ci / best, base_ci / base)


def one_round_half(within: float, one_round_rel: float, candidates: int) -> float:
    """Half-width, in log terms, of a speed-up measured in one round of two new processes at
    `level_for` ``candidates``: the probes' own relative interval ``within`` (95%) and, for each
    of the two processes, the spread between processes at its upper bound
    (``one_round_rel``: `autotune.tuning.spread.upper_rel`)."""
    z = _z(level_for(candidates))
    one = math.hypot(within * z / 1.96, z * math.sqrt(2) * one_round_rel)
    return math.log1p(one) if math.isfinite(one) else math.inf


def rounds_planned(speedup: float, process_rel: float, within: float, candidates: int, *,
                   min_gain_rel: float = MIN_GAIN_REL,
                   one_round_rel: float | None = None, prior_dof: int = 0) -> int | None:
    """The rounds a confirmation plans for a gain the search measured, before any round runs:
    the fewest whose interval would lie above 1.0 if the gain held, each round's log ratio
    spread as two new processes do (``process_rel`` each: sqrt(2) of it, more than a round's
    ratio shows, since a round's load moves both of its configs) and the probes' own relative
    interval were ``within``. Fixed before the rounds, so the decision still looks once. One
    round where ``one_round_rel`` (the spread's upper bound, when measured) lets one decide
    (`one_round_half`). ``prior_dof``: the pairs of one config's processes the rounds' spread
    will be pooled with (`_between_half`). None for a gain under ``min_gain_rel`` (nothing to
    show) or beyond `MAX_ROUNDS_NEEDED`."""
    if speedup - 1 <= min_gain_rel:
        return None
    if one_round_rel is not None and \
            math.log(speedup) > one_round_half(within, one_round_rel, candidates):
        return 1
    return _fewest_rounds(math.log(speedup), math.sqrt(2) * math.log1p(process_rel), within,
                          level_for(candidates), start=MIN_ROUNDS, prior_dof=prior_dof)


def decide(results: Mapping[str, Sequence[Measured | None]], baseline: str, *,
           min_gain_rel: float = MIN_GAIN_REL, candidates: int | None = None,
           min_rounds: int = MIN_ROUNDS, process_rel: float = PROCESS_NOISE_REL,
           one_round_rel: float | None = None,
           slices: Mapping[str, Sequence[Slices | None]] | None = None,
           looks: int = 1, level: float | None = None, words: str = "",
           prior: Sequence[float] = ()) -> Decision:
    """Pick the winner of the interleaved re-measurement; the baseline unless the gain is
    beyond doubt.

    ``results[name][i]`` is round i's measurement (None where the probe failed). The candidate
    with the best mean replaces the baseline only when it was measured beside it in at least
    ``min_rounds`` rounds, its mean gain exceeds ``min_gain_rel``, and the low end of its
    speed-up's interval (`speedup_interval` at `level_for` ``candidates``: by default every
    entry but the baseline, since the best of them was picked) lies above 1.0.
    ``process_rel``: the spread between processes a one-round interval allows for.
    ``one_round_rel``: that spread at its upper bound, where it was measured
    (`autotune.tuning.spread.upper_rel`); with it one round switches when even that spread
    cannot explain the gain (`one_round_half`), and the claim's interval allows for it.
    ``slices``: where the rounds took turns, each entry's slice rates per round
    (`speedup_interval`'s ``paired``). ``looks``: the looks the confirmation planned at its
    rounds, the 5% shared among them as among the candidates, so that together they hold it.
    ``level``: each candidate's interval at this confidence instead (`autotune.tuning.race`
    shares the 5% among its looks itself), said in the reason as ``words``. ``prior``: log
    ratios of the script's own config in two processes, pooled with the rounds' spread
    (`_between_half`).
    """
    k = candidates if candidates is not None else max(1, len(results) - 1)
    at = k * max(1, looks)  # the level's correction: candidates and looks alike
    base_ms = [m for m in results.get(baseline, ()) if m is not None]
    base = summarize(base_ms)
    summaries = {n: summarize([m for m in ms if m is not None])
                 for n, ms in results.items() if n != baseline}
    summaries = {n: s for n, s in summaries.items() if s.rounds}
    if not base.rounds:
        return Decision(baseline, True, 1.0, base, base, math.inf,
                        "the baseline could not be re-measured; nothing to compare against",
                        candidates=k)
    if not summaries:
        return Decision(baseline, True, 1.0, base, base, 0.0,
                        "no candidate survived re-measurement; keeping the script's defaults",
                        candidates=k)
    name = max(summaries, key=lambda n: summaries[n].samples_per_s)
    best = summaries[name]
    pairs = [(w.samples_per_s, b.samples_per_s)
             for w, b in zip(results[name], results[baseline])
             if w is not None and b is not None and b.samples_per_s > 0]
    paired = paired_slices(results, slices, name, baseline)
    speedup = best.samples_per_s / base.samples_per_s if base.samples_per_s else math.inf
    n = len(pairs)
    alone = n == 1 and one_round_rel is not None  # one round may decide: the spread is bounded
    low, high = speedup_interval(speedup, pairs, best, base, candidates=at,
                                 process_rel=one_round_rel if alone else process_rel,
                                 paired=paired, level=level, prior=prior)
    noise = max(min_gain_rel, 1 - low / speedup if speedup > 0 and math.isfinite(high)
                else math.inf)
    gain = f"{name} measured {speedup - 1:+.1%}"
    claim = f"{words or interval_words(k, looks)} of the speed-up " \
        f"{claim_text(speedup, low, high)}"
    if (n >= min_rounds or alone) and speedup - 1 > min_gain_rel and low > 1.0:
        over = (f"one interleaved round, beyond doubt even were processes "
                f"±{one_round_rel:.1%} apart (the upper bound of the spread measured between "
                f"them)" if n == 1 else f"{n} interleaved rounds, beyond doubt" +
                (" (their spread pooled with the script's own config measured twice)"
                 if _pools(n, len(prior)) else ""))
        return Decision(name, False, speedup, best, base, noise,
                        f"{gain} against the baseline over {over}: {claim}", low, high,
                        rounds=n, candidates=k, looks=looks)
    logs = [math.log(w / b) for w, b in pairs if w > 0 and b > 0]
    inside = paired_half(paired, LEVEL) if paired else None
    needed = rounds_needed(speedup, logs, math.expm1(inside) if inside is not None
                           else math.hypot(_own_rel(best), _own_rel(base)), at,
                           min_gain_rel=min_gain_rel, level=level, prior=prior)
    why = _kept_why(n, speedup, claim, needed, min_rounds=min_rounds, min_gain_rel=min_gain_rel,
                    one_round_rel=one_round_rel if alone else None)
    return Decision(baseline, True, 1.0, base, base, noise,
                    f"{KEPT}{gain}, not beyond doubt: {why}",
                    rounds=n, rounds_needed=needed, candidates=k, candidate=name,
                    candidate_speedup=speedup, looks=looks)


def paired_slices(results: Mapping[str, Sequence[Measured | None]],
                   slices: Mapping[str, Sequence[Slices | None]] | None, name: str,
                   baseline: str) -> list[tuple[Slices, Slices]] | None:
    """Where the rounds took turns: ``name``'s and the baseline's slice rates in each round
    that measured both; None unless every such round has both (`speedup_interval`'s
    ``paired``)."""
    if slices is None or name not in slices or baseline not in slices:
        return None
    both = [(ws, bs) for w, b, ws, bs in zip(results[name], results[baseline],
                                              slices[name], slices[baseline])
            if w is not None and b is not None and b.samples_per_s > 0]
    return both if all(ws and bs for ws, bs in both) else None


def _kept_why(n: int, speedup: float, claim: str, needed: int | None, *, min_rounds: int,
              min_gain_rel: float, one_round_rel: float | None) -> str:
    """Why `decide` keeps the baseline after ``n`` rounds of a candidate at ``speedup``
    (``claim``: its interval in words; ``needed``: the rounds that would show it, if any;
    ``one_round_rel``: given where one round could have decided alone)."""
    if n < min_rounds:
        return (f"{'one interleaved round' if n == 1 else f'{n} interleaved rounds'} "
                f"({claim}): a switch needs {min_rounds} rounds at least, to see the spread "
                f"between processes" +
                (f" (one decides alone only when the gain is beyond processes "
                 f"±{one_round_rel:.1%} apart, the upper bound of the spread measured between "
                 f"them)" if one_round_rel is not None else ""))
    if speedup - 1 <= min_gain_rel:
        return (f"{speedup - 1:+.1%} is not above the {min_gain_rel:.0%} a switch needs "
                f"({claim}); more rounds would not change that")
    return (f"the {claim} holds 1.0 over {n} rounds; " +
            (f"about {needed} rounds would show the gain if it held"
             if needed else "the spread between rounds is too wide for more rounds to show it"))


def _own_rel(s: Summary) -> float:
    """The probes' own relative interval: a config's spread between rounds is not its part of
    a paired ratio's (`speedup_interval` takes that from the ratios)."""
    own = s.ci_half if s.own_half is None else s.own_half
    return own / s.samples_per_s if s.samples_per_s > 0 else math.inf


def decide_pair(first: Mapping[str, Sequence[Measured | None]],
                second: Mapping[str, Sequence[Measured | None]], baseline: str, *,
                min_gain_rel: float = MIN_GAIN_REL, candidates: int | None = None,
                process_rel: float = PROCESS_NOISE_REL) -> Decision:
    """Two objectives at once (samples/s, samples/J): a candidate wins when `decide` declares it
    the winner on one of them and, on the other, its mean is not below the baseline's by more
    than that objective's noise. The speed-up and its interval are the first objective's, at
    `level_for` ``candidates`` (default: every entry but the baseline)."""
    k = candidates if candidates is not None else max(1, len(first) - 1)
    d = (decide(first, baseline, min_gain_rel=min_gain_rel, candidates=k,
                process_rel=process_rel),
         decide(second, baseline, min_gain_rel=min_gain_rel, candidates=k,
                process_rel=process_rel))
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
        low, high = speedup_interval(speedup, pairs, s1, base1, candidates=k,
                                     process_rel=process_rel)
        gains = (speedup - 1, ratio - 1) if i == 0 else (ratio - 1, won.speedup - 1)
        return Decision(name, False, speedup, s1, base1, won.noise_rel,
                        f"{name}: {gains[0]:+.1%} samples/s and {gains[1]:+.1%} samples/J "
                        f"against the baseline over {won.rounds} interleaved rounds; "
                        f"{('samples/s', 'samples/J')[i]} beyond doubt, "
                        f"{('samples/J', 'samples/s')[i]} not worse beyond its noise; "
                        f"{interval_words(k)} of the speed-up "
                        f"{claim_text(speedup, low, high)}", low, high,
                        rounds=won.rounds, candidates=k)
    why = d[0].reason.removeprefix(KEPT) if d[0].kept_baseline else ""
    return Decision(baseline, True, 1.0, base1, base1, d[0].noise_rel,
                    f"{KEPT}no candidate was better beyond doubt on samples/s or samples/J "
                    f"without being worse on the other" + (f" (samples/s: {why})" if why else ""),
                    rounds=d[0].rounds, rounds_needed=d[0].rounds_needed, candidates=k,
                    candidate=d[0].candidate, candidate_speedup=d[0].candidate_speedup)
