"""What the confirmation re-measures, chosen from the search's answers: the baseline, the best
two by score (for two objectives, the Pareto front's pick), and where a winner would change
the job's global batch, the best config that keeps it (`candidates`); under a budget, without
a runner-up that only costs rounds (`essential`). Pure: the space, the answers and the scorer
in, named configs out. `autotune.tuning.confirm` runs what this picks; the search's budget
(`autotune.tuning.search_budget`) reserves time for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from autotune.tuning import objective
from autotune.tuning.records import Known
from autotune.tuning.space import Space


def pareto_points(space: Space, known: Mapping[tuple, Known],
                  scorer: objective.Scorer) -> list[objective.Point]:
    """Every measured config with both a throughput and samples/J."""
    base_key = space.key(space.baseline)
    out = []
    for k in known.values():
        spj = scorer.score(k.value, k.ci_half, k.cfg, k.energy).samples_per_j
        if k.outcome.usable and spj is not None:
            name = "baseline" if space.key(k.cfg) == base_key else f"trial-{k.number}"
            out.append(objective.Point(name, dict(k.cfg), k.value, spj))
    return out


def best(space: Space, known: Mapping[tuple, Known], scorer: objective.Scorer,
         n: int = 2, where: Callable[[Mapping[str, int]], bool] | None = None) -> list[Known]:
    """The ``n`` measured configs but the baseline (those ``where`` accepts) with the best
    scores, best first: what the confirmation re-measures beside the baseline (one
    objective)."""
    base_key = space.key(space.baseline)
    scored = [(scorer.score(k.value, k.ci_half, k.cfg, k.energy).value, k)
              for k in known.values() if k.outcome.usable and space.key(k.cfg) != base_key
              and (where is None or where(k.cfg))]
    return [k for v, k in sorted((x for x in scored if x[0] is not None),
                                 key=lambda x: -x[0])][:n]


def candidates(space: Space, known: Mapping[tuple, Known],
               scorer: objective.Scorer) -> list[tuple[str, dict]]:
    """What the confirmation re-measures: the baseline and the best two by score (for two
    objectives, the Pareto pick); when none of those keeps the job's global batch, also the
    best config that does, so that a winner that changes it has a measured alternative, unless
    the search measured it below the baseline (then the baseline is that alternative, and
    confirming it would only widen the winner's interval: word_lm's shape confirmed a thread
    cut at 0.6x beside the baseline in every round)."""
    entries = [("baseline", dict(space.baseline))]
    if scorer.objective.multi:
        p = objective.pick(pareto_points(space, known, scorer))
        entries += [(p.name, dict(p.cfg))] if p is not None and p.name != "baseline" else []
    else:
        entries += [(f"trial-{k.number}", dict(k.cfg)) for k in best(space, known, scorer)]
    if len(entries) > 1 and not any(space.keeps_batch(c) for _, c in entries[1:]):
        entries += [(f"trial-{k.number}", dict(k.cfg))
                    for k in best(space, known, scorer, 1, where=space.keeps_batch)
                    if _above_baseline(space, k.cfg, known, scorer)]
    return entries


def _above_baseline(space: Space, cfg: dict, known: Mapping[tuple, Known] | None,
                    scorer: objective.Scorer | None) -> bool:
    """Whether the search measured ``cfg`` above the baseline by score (True where it cannot
    tell: no values given, either not measured, or no score): the rule for a batch-keeping
    alternative beside a winner that changes the batch."""
    if known is None or scorer is None:
        return True
    k, base = known.get(space.key(cfg)), known.get(space.key(space.baseline))
    if k is None or base is None:
        return True
    bar = scorer.score(base.value, base.ci_half, base.cfg, base.energy).value
    if bar is None:
        return True
    v = scorer.score(k.value, k.ci_half, k.cfg, k.energy).value
    return v is not None and v > bar


def essential(space: Space, entries: list[tuple[str, dict]], *,
              known: Mapping[tuple, Known] | None = None,
              scorer: objective.Scorer | None = None) -> list[tuple[str, dict]]:
    """``entries`` (`candidates`) without the runner-up, unless it is the batch-keeping
    alternative (the only entry but the baseline that trains with the script's own batch,
    beside a best that does not) and, where ``known`` and ``scorer`` tell, the search measured
    it above the baseline: what a confirmation under a budget measures. One below the baseline
    leaves the baseline as the alternative: word_lm as it comes kept a thread cut at 0.65x in
    for batch 32's confirmation, and its search stopped at 71 s of 5m to keep time for it.
    A budget fixes the confirmation's time, and the runner-up's probes buy rounds of the best
    and the baseline instead, which decide far more: one candidate's interval at 95% over
    three degrees of freedom (t 3.2) against two candidates' at 97.5% over two (t 6.2).
    nanoGPT's shape lost a +20.7% switch to that (0.990x-1.473x over 3 rounds of three;
    1.052x-1.386x at one candidate)."""
    if len(entries) < 3:
        return list(entries)
    (_, best_cfg), (_, runner_cfg), extra = entries[1], entries[2], entries[3:]
    if space.keeps_batch(runner_cfg) and not space.keeps_batch(best_cfg) and \
            not any(space.keeps_batch(c) for _, c in extra) and \
            _above_baseline(space, runner_cfg, known, scorer):
        return list(entries)
    return [entries[0], entries[1], *extra]
