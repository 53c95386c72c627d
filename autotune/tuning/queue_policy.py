"""What the search queues next, and why: the policy apart from the study. Pure.

The search (`autotune.tuning.search`) asks these rules after each trial and queues what they
return in its Optuna study; nothing here touches the study, a clock or a file. The rules:

- the initial design, less the moves held back (`held_back`): those the baseline's breakdown
  says cannot pay, and the script's smaller batch neighbour while the larger is not measured;
- the smaller neighbour released once the larger did not pay beyond what processes differ by
  (`release_smaller`), every held move once the batch walk has nowhere to go (`release_held`);
- the batch walk along the baseline's line (`walk`);
- the one-at-a-time moves that paid off, joined (`combine`);
- the moves pruned before the spread between processes was measured, queued again where that
  spread shows the pruning misjudged them (`misjudged`);
- under a budget, once nothing new is left to probe, the pruned config that came nearest the
  best, queued again while the budget holds its probe (`second_look`).

Each returns `Queued` entries (a config, the design tag the study keeps, what the user is
told) or nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.measuring.outcome import Outcome
from autotune.tuning import decision, search_rules
from autotune.tuning.space import knobs_text

if TYPE_CHECKING:  # types only: the records module reads the study, which this never does
    from autotune.measuring.breakdown import Breakdown
    from autotune.tuning.objective import Score
    from autotune.tuning.records import Known
    from autotune.tuning.space import Space

Config = dict[str, int]
Scorer = Callable[["Known"], "Score"]  # a known config's score, as the search judges it


@dataclass(frozen=True)
class Queued:
    """One config to queue: its design tag (the trial's ``design`` attribute) and what the user
    is told of it ("": nothing)."""

    cfg: Config
    design: str
    note: str = ""


@dataclass(frozen=True)
class Start:
    """The initial design as queued at the start, and what is said of it and of what waits."""

    queued: tuple[Queued, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Settle:
    """The smaller batch neighbour's hold, decided: queued (or not), and said why."""

    queued: Queued | None
    note: str


def moved(sp: Space, cfg: Mapping[str, int]) -> list[str]:
    """The knobs ``cfg`` moves from the baseline."""
    base = sp.canonical(sp.baseline)
    return [k for k, v in sp.canonical(cfg).items() if base.get(k) != v]


def off_batch(sp: Space, cfg: Mapping[str, int]) -> dict[str, int]:
    """Every knob of ``cfg`` but the per-rank batch, canonical."""
    return {k: v for k, v in sp.canonical(cfg).items() if k != "batch_size"}


def neighbours(sp: Space) -> tuple[Config, Config] | None:
    """The script's batch neighbours on the baseline's line, (smaller, larger), when the space
    holds both."""
    if "batch_size" not in sp.domains or "batch_size" not in sp.baseline:
        return None
    values = sp.domains["batch_size"]
    i = sp.index("batch_size", sp.baseline["batch_size"])
    if i == 0 or i + 1 >= len(values):
        return None
    return (sp.config({**sp.baseline, "batch_size": values[i - 1]}),
            sp.config({**sp.baseline, "batch_size": values[i + 1]}))


def held_back(sp: Space, parts: Breakdown | None, design: Sequence[Config]) -> list[Config]:
    """The configs of the initial design that wait (`release_held`, once the batch walk has
    nowhere to go):

    - those that move only knobs the baseline's breakdown says cannot pay
      (`Breakdown.most_gain` within `decision.MIN_GAIN_REL`: more workers for a script that
      waits 0.1% of its step for data). On minGPT's shape a 6m budget spent 21 s on
      workers=1 (data wait 0.1%) and had no room left for the walk's 128;
    - the script's smaller batch neighbour, while the larger is not measured, and for good
      once the larger pays beyond what processes differ by (`release_smaller`): a batch line
      that rises past the script's batch seldom rises below it too, and minGPT's 16 (26 s,
      pruned) was what the walk's 128 lacked at 6m.
    """
    if "batch_size" not in sp.domains:
        return []
    out = []
    pair = neighbours(sp)
    keys = {sp.key(c) for c in design}
    if pair is not None and all(sp.key(c) in keys for c in pair):
        out += [c for c in design if sp.key(c) == sp.key(pair[0])]
    if parts is None:
        return out
    for cfg in design:
        gains = [parts.most_gain(k) for k in moved(sp, cfg)]
        if gains and all(g is not None and g <= decision.MIN_GAIN_REL for g in gains):
            out.append(cfg)
    return out


def held_now(sp: Space, parts: Breakdown | None) -> list[Config]:
    """`held_back` of the initial design as the baseline has it (deterministic: a resumed run
    holds the same configs)."""
    return held_back(sp, parts, sp.initial_design(parts.moves() if parts else ()))


def start(sp: Space, parts: Breakdown | None) -> Start:
    """The initial design, first moving what binds the baseline (``parts``), less what is held
    back; and the notes that say what moves first and what waits."""
    first = parts.moves() if parts is not None else ()
    design = sp.initial_design(first)
    notes = []
    if first and design:
        moving = [n for n in first if n in sp.names]
        if moving:
            notes.append(f"the first probes move {', '.join(moving)}: what binds the baseline "
                         f"({parts.binding_group()})")
    held = held_back(sp, parts, design)
    queued = tuple(Queued(cfg, "initial") for cfg in design if cfg not in held)
    pair = neighbours(sp)
    for cfg in held:
        if pair is not None and sp.key(cfg) == sp.key(pair[0]):
            notes.append(f"{knobs_text(cfg)} held back until {knobs_text(pair[1])} is measured: "
                         f"if the larger batch pays, the smaller waits for the batch walk")
            continue
        gain = max(parts.most_gain(k) for k in moved(sp, cfg))
        notes.append(f"{knobs_text(cfg)} held back: what it moves can take back at most "
                     f"{gain:.1%} of the baseline's step ({parts.describe()}); it is probed once "
                     f"the batch walk has nowhere to go")
    return Start(queued, tuple(notes))


def release_smaller(sp: Space, parts: Breakdown | None, known: Mapping[tuple, Known],
                    ooms: Sequence[Mapping], score: Scorer, *, margin_rel: float,
                    in_study: Callable[[], set]) -> Settle | None:
    """The smaller batch neighbour (held back: `held_back`) queued once the larger is answered
    and did not pay beyond the pruning margin ``margin_rel`` (what processes of one config
    differ by); a larger that pays keeps it held until the batch walk has nowhere to go. None
    while it is not settled yet (or nothing is held); ``in_study``: the keys the study holds,
    asked only when the smaller would be queued."""
    pair = neighbours(sp)
    if pair is None:
        return None
    smaller, larger = pair
    if sp.key(smaller) not in {sp.key(c) for c in held_now(sp, parts)}:
        return None
    big, base = known.get(sp.key(larger)), known.get(sp.key(sp.baseline))
    if base is None or (big is None and not search_rules.oom_blocks(larger, ooms)):
        return None
    gain = None
    if big is not None and not big.infeasible:
        b, g = score(base).value, score(big).value
        gain = g / b - 1 if b and g is not None else None
    if gain is not None and gain > margin_rel:
        return Settle(None, f"{knobs_text(smaller)} stays held back: {knobs_text(larger)} beat "
                            f"the script's batch by {gain:+.1%}, beyond the {margin_rel:.0%} "
                            f"processes differ by; it is probed once the batch walk has nowhere "
                            f"to go")
    if sp.key(smaller) in in_study():
        return Settle(None, "")
    said = "failed" if gain is None else f"read {gain:+.1%}"
    return Settle(Queued(smaller, "initial"),
                  f"{knobs_text(smaller)} next: {knobs_text(larger)} {said} against the "
                  f"script's batch, not beyond the {margin_rel:.0%} processes differ by")


def release_held(sp: Space, parts: Breakdown | None, *, smaller_settled: bool,
                 in_study: Callable[[], set]) -> list[Queued]:
    """The held-back configs (`held_back`), queued once the batch walk has nowhere to go; none
    the study holds already (``in_study``), nor the smaller batch neighbour while its larger
    is not answered (not ``smaller_settled``)."""
    held = held_now(sp, parts)
    pair = neighbours(sp)
    if pair is not None and not smaller_settled:
        held = [c for c in held if sp.key(c) != sp.key(pair[0])]
    if not held:
        return []
    had = in_study()
    return [Queued(cfg, "held", f"{knobs_text(cfg)} next: the batch walk has nowhere to go, so "
                                f"the config held back is probed")
            for cfg in held if sp.key(cfg) not in had]


def walk(sp: Space, known: Mapping[tuple, Known], ooms: Sequence[Mapping], score: Scorer, *,
         rates: bool, blocked: Callable[[int], bool]) -> Queued | None:
    """One more per-rank batch along the baseline's line, in the direction that paid off
    (`Space.batch_walk`: one step, or where the step-time model says the gain ends when the
    scores are samples/s, ``rates``), else halfway to the largest (`Space.batch_far`); None
    when the walk has nowhere to go (or only to a batch an OOM rules out). ``blocked``: a batch
    a jump may not land on."""
    if "batch_size" not in sp.domains:
        return None
    line: dict[int, float | None] = {}
    others = off_batch(sp, sp.baseline)
    for k in known.values():
        if off_batch(sp, k.cfg) == others:
            line[int(sp.canonical(k.cfg)["batch_size"])] = \
                None if k.infeasible else score(k).value
    nxt = sp.batch_walk(line, min_gain_rel=decision.MIN_GAIN_REL, rates=rates, blocked=blocked)
    far = nxt is None
    if far:
        nxt = sp.batch_far(line, min_gain_rel=decision.MIN_GAIN_REL, blocked=blocked)
    if nxt is None or search_rules.oom_blocks(nxt, ooms):
        return None
    best = max((b for b, v in line.items() if v is not None), key=lambda b: line[b])
    steps = abs(sp.index("batch_size", nxt["batch_size"]) - sp.index("batch_size", best))
    if far:
        how = ("the batches measured read level, the larger neighbour with the best: "
               "halfway to the largest, where a gain that grows with the batch would show")
    elif steps == 1:
        how = "one step further the way the batch paid off"
    else:
        how = (f"{steps} steps past {best}: the step-time model fitted to the batches "
               f"measured sees the gain go on that far")
    return Queued(nxt, "batch-far" if far else "batch-walk", f"batch: {knobs_text(nxt)} next, {how}")


def combine(sp: Space, known: Mapping[tuple, Known], ooms: Sequence[Mapping],
            score: Scorer) -> tuple[bool, Queued | None]:
    """Once every one-at-a-time probe is answered (or ruled out by an OOM), the moves that paid
    off, joined: (answered, the joined config unless it is known already). A pruned move
    counts with its last estimate: it may trail the best and still beat the baseline."""
    moves = sp.one_at_a_time()
    base = known.get(sp.key(sp.baseline))
    answered = [known.get(sp.key(c)) for c in moves]
    if base is None or not all(a is not None or search_rules.oom_blocks(c, ooms)
                               for a, c in zip(answered, moves)):
        return False, None
    combo = search_rules.combine(sp.baseline, score(base).value or 0.0, [
        (c, score(a).value if a is not None and not a.infeasible else None)
        for c, a in zip(moves, answered)])
    if combo is not None and sp.key(combo) not in known:
        return True, Queued(combo, "combined")
    return True, None


def misjudged(sp: Space, known: Mapping[tuple, Known], score: Scorer, *,
              floor: float | None, margin_rel: float, counts: Mapping[tuple | None, int],
              waiting: set) -> list[Queued]:
    """The one-at-a-time moves pruned before the spread between processes was measured whose
    last estimate, against the bar ``floor`` and ``margin_rel`` it sets now (the baseline at
    the mean of its two processes), would not have been pruned: queued once more. Their
    pruning judged them against one figure of the script's config that a second process
    shows was off. nanoGPT's shape read its own config at 216.4, then 141.6; batch 16 at 166.3
    was pruned against the first, and the search never walked to the larger batches the grid
    finds best. Once per config: one the study holds twice (``counts``) or that waits in it
    (``waiting``) is not queued again (so a resumed run queues none anew)."""
    out = []
    for cfg in sp.one_at_a_time():
        key = sp.key(cfg)
        k = known.get(key)
        if k is None or k.outcome != Outcome.PRUNED or counts.get(key, 0) > 1 or key in waiting:
            continue
        s = score(k)
        if s.value is None or not math.isfinite(s.ci_half) or \
                search_rules.cannot_reach(s.value, s.ci_half, floor, margin_rel=margin_rel):
            continue
        out.append(Queued(cfg, "again", f"{knobs_text(cfg)} probed again: pruned at "
                                        f"{s.value:.1f} before the spread between processes "
                                        f"was measured, it is within the {margin_rel:.0%} "
                                        f"margin of the bar that spread sets ({floor:.1f})"))
    return out


# A pruned config whose last figure fell at most this far under the pruning bar is worth a
# second probe once nothing new is left: this machine's rate moves 10-30% between stretches of
# a minute, and one probe cut short in a slow stretch reads that far low.
SECOND_LOOK_REL = 0.20


def second_look(sp: Space, known: Mapping[tuple, Known], score: Scorer, *,
                floor: float | None, margin_rel: float, counts: Mapping[tuple | None, int],
                fits: Callable[[Config], bool]) -> Queued | None:
    """Under a budget, once the space is measured or the sampler proposes only configs
    measured, the pruned config whose last figure came nearest the pruning bar (``floor``
    less ``margin_rel``), within `SECOND_LOOK_REL` of it, whose probe the budget still holds
    (``fits``): queued once more, or None. A probe is pruned on a few seconds of one process,
    and the machine's drift can put those seconds in a slow stretch: word_lm's shape at 6m
    pruned batch 64, the grid's best, at 1524 ± 143 against a best of 1813 ± 55 (a bar of
    1705), stopped its search with the space measured at 196 s of 360, and kept the defaults at
    0.86 of 64. Its figure, not its interval's upper end, ranks a config: a probe pruned after
    two seconds has an interval wide enough to reach any bar. Once per config: one the study
    measured twice (``counts``, replays left out) is not queued again."""
    if not floor or floor <= 0:
        return None
    bar = floor * (1 - margin_rel)
    nearest: tuple[float, Config, float, float] | None = None
    for key, k in known.items():
        if k.outcome != Outcome.PRUNED or counts.get(key, 0) > 1:
            continue
        s = score(k)
        if s.value is None or not math.isfinite(s.ci_half):
            continue
        short = 1 - s.value / bar
        if short > SECOND_LOOK_REL or (nearest is not None and short >= nearest[0]) or \
                not fits(dict(k.cfg)):
            continue
        nearest = (short, dict(k.cfg), s.value, s.ci_half)
    if nearest is None:
        return None
    short, cfg, value, ci_half = nearest
    where = f"{short:.0%} under" if short > 0 else "above"
    return Queued(cfg, "again", f"{knobs_text(cfg)} probed again: nothing new is left to "
                                f"probe and the budget holds one more; it was pruned at "
                                f"{value:.1f} ± {ci_half:.1f}, {where} the bar of {bar:.1f}, "
                                f"on a few seconds that the machine's drift can make that "
                                f"slow")
