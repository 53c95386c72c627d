"""The confirmation's rounds: how long each entry's probe is (what the planner,
`autotune.tuning.confirm_plan`, is given of each entry: `plan_entries`), whether a round's
probes can take turns on the machine at all, and running the rounds planned (`remeasure`);
`autotune.tuning.confirm.finish` plans with these and decides on what the rounds measured.

Where it can (`turns_refused`), a round starts every config's processes and lets them take
turns on the machine in slices (`autotune.measuring.alternate`), so that its drift falls on
each alike; else the round interleaves whole probes (A B C A B C)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune import Note
from autotune.hardware.host import host_gpus
from autotune.measuring import alternate
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.outcome import Outcome
from autotune.tuning import confirm_plan, decision, objective, spread as spreads
from autotune.tuning.confirm_plan import TURN_MEASURE_SHARE
from autotune.tuning.prober import Prober
from autotune.tuning.records import Known
from autotune.tuning.state import TuneState
from autotune.store.events import Event

CONFIRM_TARGET_REL = 0.02  # tight enough that a confirmation probe measures its whole window
# A probe one after another measures on past its window, by this share of it at most, while
# its figure has no interval yet (`autotune.measuring.probe_state.TrialSpec.overtime_s`).
OVERTIME_SHARE = 0.5


@dataclass(frozen=True)
class Round:
    """What the search measured of an entry, standing in for its confirmation rounds."""

    samples_per_s: float
    ci_half: float
    energy: EnergyPerSample | None = None


@dataclass(frozen=True)
class EarlierRound:
    """One round of a finished confirmation, as its journal kept it (its ``confirmation``
    event): what a resume that extends the confirmation judges beside its new rounds."""

    samples_per_s: float
    ci_half: float
    energy: EnergyPerSample | None = None
    slice_rates: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Earlier:
    """A finished tuning's confirmation, read back from its journal (`earlier_rounds`): the
    entries it judged, the baseline first, and each one's rounds in order (None: a probe that
    measured nothing). ``tune --resume RUN --confirm-rounds N`` adds N rounds to these."""

    entries: tuple[tuple[str, dict], ...]
    rounds: Mapping[str, tuple[EarlierRound | None, ...]]
    last_round: int  # the highest round number used: the new rounds are numbered after it
    # candidates that entered its race: those judged, and a runner-up its choosing round
    # dropped (0: those judged)
    candidates: int = 0

    @property
    def count(self) -> int:
        return max((len(r) for r in self.rounds.values()), default=0)


def earlier_rounds(events: Sequence[Mapping]) -> Earlier | None:
    """The confirmation the journal's last ``best`` was decided on: its rounds (a round that
    chose between the best and the runner-up among them, the race's first), each round the
    last one written under its number (a session interrupted mid-confirmation wrote rounds
    that a later one re-ran), for the entries the last session confirmed, and how many
    candidates entered it. None when it had no rounds."""
    last_best = max((i for i, e in enumerate(events) if e.get("event") == Event.BEST),
                    default=None)
    if last_best is None:
        return None
    confirmations = [e for e in events[:last_best] if e.get("event") == Event.CONFIRMATION]
    if not confirmations:
        return None
    last_round = max(int(e.get("round") or 0) for e in confirmations)
    final = [e for e in confirmations if int(e.get("round") or 0) == last_round]
    names = list(dict.fromkeys(["baseline", *(str(e["trial"]) for e in final)]))
    by: dict[tuple[str, int], Mapping] = {}
    knobs: dict[str, dict] = {}
    for e in confirmations:
        if str(e.get("trial")) in names:
            by[(str(e["trial"]), int(e.get("round") or 0))] = e
            knobs[str(e["trial"])] = dict(e.get("knobs") or {})
    if "baseline" not in knobs:
        return None

    def kept(e: Mapping) -> EarlierRound | None:
        rate = e.get("samples_per_s")
        if not isinstance(rate, (int, float)) or rate <= 0:
            return None
        slices = e.get("slice_rates")
        half = e.get("ci_half")  # null: its probe ended without an interval, as live
        return EarlierRound(float(rate), math.inf if half is None else float(half),
                            slice_rates=tuple(slices) if slices else None)

    # by round number, None where an entry had no probe (one past the runner-up in a round
    # that chose between the best two)
    numbers = sorted({r for _, r in by})
    rounds = {n: tuple(kept(by[(n, r)]) if (n, r) in by else None for r in numbers)
              for n in names}
    entered = {str(e["trial"]) for e in confirmations} - {"baseline"}
    return Earlier(tuple((n, knobs[n]) for n in names if n in knobs), rounds, last_round,
                   len(entered))


def entry_probe_s(prober: Prober, state: TuneState, known: Mapping[tuple, Known],
                  cfg: Mapping) -> float:
    """What a probe of ``cfg`` takes: what its own probes took where the run measured it (the
    search's probe of it; for the script's own config, the shorter of the baseline's and its
    repeat's), else as fitted (`Prober.probe_s`). With ``--seconds``, that length, or the
    config's own when longer.

    A config's own probe sees what no fit from the baseline does: a larger batch's first batch
    can come far later (nanoGPT's shape evaluates before step 0: 10 s at batch 64, 5 s at 12),
    and a confirmation probe cut short of it measures its warm-up. A fit can also see what the
    config does not need: a baseline slow to tighten (34 s of measuring on nanoGPT's shape,
    where its repeat and the search's probes were tight after 3-10 s) stretches every fitted
    probe, and confirmation probes of that length left one round in a 5-minute budget."""
    space = state.space
    own = known.get(space.key(cfg))
    took = [own.probe_s] if own is not None and own.probe_s > 0 else []
    if space.key(cfg) == space.key(space.baseline):
        measured = state.learned.spread
        took += [side.duration_s for side in (measured.first, measured.second)
                 if side is not None and side.samples_per_s > 0 and side.duration_s > 0] \
            if measured is not None else []
    fitted = prober.probe_s(state, *space.trial_knobs(cfg))
    if state.settings.seconds:  # the user's length, or the config's own when it took longer
        return max([fitted, *took])
    return min(took) if took else fitted


def probe_windows(prober: Prober, state: TuneState, known: Mapping[tuple, Known],
                  cfgs) -> list[float]:
    """Each config's confirmation probe (`Prober.confirm_probe_s` of its own search probe,
    `entry_probe_s`: a config with longer steps or a later first batch measures longer)."""
    return [prober.confirm_probe_s(state, entry_probe_s(prober, state, known, c)) for c in cfgs]


def turns_refused(prober: Prober, scorer: objective.Scorer,
                  env: Mapping[str, str] | None = None,
                  known: Mapping[tuple, Known] | None = None) -> str:
    """Why a round's probes cannot take turns on the machine (`alternate`); "" when they can:
    ranks this host starts, on its CPU, measured for a score that needs no energy counter, of
    a script no search probe in ``known`` saw end on its own (`ended_in_search`)."""
    if not prober.takes_turns:
        return "this run's probes are stand-ins that cannot take turns"
    if not prober.launcher.local:
        return f"{prober.launcher.kind} starts the ranks, and a held engine does not hold them"
    if host_gpus(os.environ if env is None else env):
        return "a held CUDA process keeps its GPU memory, so two configs may not fit at once"
    if scorer.objective.uses_energy:
        return "the host's energy counters would count every config's turns together"
    return ended_in_search(known or {})


def ended_in_search(known: Mapping[tuple, Known]) -> str:
    """Why a script that ends on its own within a probe cannot be measured in turns ("" where
    no search probe saw it end): in turns each process runs alone to warm up first, then in
    `alternate.MIN_SLICES` slices or more, and it needs batches left for all of them. README's
    image-classifier example at one epoch (64 batches, about 6 s) ended in every round's
    warm-up and first slices, so no round had a figure and the race kept the defaults against
    a +52% found; one after another, each probe has a figure from the span before its end, as
    the search's had."""
    ended = sum(1 for k in known.values() if k.outcome is Outcome.ENDED)
    if not ended:
        return ""
    return (f"the script ended on its own in {ended} search probe(s), too soon to take turns "
            f"(each probe warms up alone, then runs {alternate.MIN_SLICES} slices or more)")


def plan_entries(prober: Prober, state: TuneState, known: Mapping[tuple, Known],
                 entries: Sequence[tuple[str, Mapping]]) -> list[confirm_plan.Entry]:
    """The planner's view of ``entries``: each one's confirmation probe at full length
    (`probe_windows`), its search probe's length (`entry_probe_s`: the shortest a short budget
    cuts it to) and its pace as fitted to the script (`Prober.pace`)."""
    cfgs = [c for _, c in entries]
    windows = probe_windows(prober, state, known, cfgs)
    return [confirm_plan.Entry(name, w, entry_probe_s(prober, state, known, c),
                               prober.pace(state, *state.space.trial_knobs(c)))
            for (name, c), w in zip(entries, windows)]


# A round's figure whose probe ended before its estimate had an interval of its own (too few
# windows: the window was cut to the budget) takes its search figure's relative interval,
# widened by this: that probe measured less than the one whose interval it borrows. Without
# it the figure weighs nothing: minGPT's shape under 5m read batch 256 at +74.5% in its one
# round, its baseline's 9 steps gave no interval, and the defaults were kept.
BORROWED_WIDEN = math.sqrt(2)


def own_intervals(results: Mapping[str, list], searched) -> dict[str, list]:
    """Pure: ``results`` (each entry's round figures) where a figure without an interval of its
    own carries its entry's search figure's (``searched(name)``: a `Round`), relatively, times
    `BORROWED_WIDEN`; every other figure as it is. An entry whose search figure has no interval
    either lends none."""
    out: dict[str, list] = {}
    for name, rs in results.items():
        lend = searched(name)
        rel = lend.ci_half / lend.samples_per_s \
            if lend.samples_per_s > 0 and math.isfinite(lend.ci_half) else None
        out[name] = [Round(r.samples_per_s, BORROWED_WIDEN * rel * r.samples_per_s, r.energy)
                     if rel is not None and r is not None and r.samples_per_s > 0
                     and not math.isfinite(r.ci_half) else r for r in rs]
    return out


def borrowed(results: Mapping[str, list]) -> list[tuple[str, int]]:
    """Pure: (entry, round index) of each figure without an interval of its own."""
    return [(name, i) for name, rs in results.items() for i, r in enumerate(rs)
            if r is not None and r.samples_per_s > 0 and not math.isfinite(r.ci_half)]


def one_round_rel(measured: spreads.ProcessSpread,
                  pairs: Mapping[str, tuple[Round, object]]) -> float | None:
    """The spread between processes at its upper bound (`spreads.upper_rel`), for one round to
    decide alone: the script's own config in its two search processes, and each candidate's
    search probe against its round's (``pairs``: name -> (searched, the round's result or
    None)), two more processes of one config. A candidate picked for a reading that ran high
    only widens it."""
    rels = [measured.between_rel]
    for searched, r in pairs.values():
        if r is not None:
            rels.append(spreads.pair_rel(searched.samples_per_s, searched.ci_half,
                                         r.samples_per_s, r.ci_half))
    return spreads.upper_rel(rels)


def remeasure(prober: Prober, state: TuneState, entries, rounds: int,
              windows: Mapping[str, float], *, turns: bool = False,
              deadline: float | None = None, first: int = 1, chooses: bool = False
              ) -> tuple[TuneState, dict[str, list]]:
    """``rounds`` rounds of ``entries``, numbered from ``first``: taking turns, or one probe
    after another (interleaved), each measuring on past its window (`OVERTIME_SHARE` of it at
    most) while its figure has no interval yet. A round that ``chooses`` between candidates
    (`autotune.tuning.confirm.select_candidate`, the race's first) says so in its events."""
    if turns:
        return _remeasure_in_turns(prober, state, entries, rounds, windows, deadline, first,
                                   chooses)
    space = state.space
    cfgs = dict(entries)
    results: dict[str, list] = {name: [] for name in cfgs}  # the probes' results, or None
    for rnd, name in decision.interleave(list(cfgs), rounds):
        rnd += first - 1
        cfg = cfgs[name]
        label = f"confirm{rnd}-{name}"
        window_s = windows[name]
        spec = prober.spec(state, *space.trial_knobs(cfg), label, max_s=window_s,
                           min_measure_s=0.6 * window_s, target_rel=CONFIRM_TARGET_REL,
                           overtime_s=OVERTIME_SHARE * window_s)
        state, r = prober.probe(state, spec, label=label, number=None, cfg=cfg, events=False)
        results[name].append(r if r.ok else None)
        prober.emit(Event.CONFIRMATION, round=rnd, trial=name, knobs=cfg,
                    samples_per_s=r.samples_per_s if r.ok else None,
                    ci_half=r.ci_half if r.ok else None, outcome=r.outcome.value,
                    reason=r.reason, **({"chooses": True} if chooses else {}))
        if not r.ok:
            prober.tell(Note.warning(f"confirmation round {rnd}, {name}: {r.outcome.value}: "
                                     f"{r.reason}"))
    return state, results


def _remeasure_in_turns(prober: Prober, state: TuneState, entries, rounds: int,
                        windows: Mapping[str, float], deadline: float | None = None,
                        first: int = 1, chooses: bool = False
                        ) -> tuple[TuneState, dict[str, list]]:
    """Each round's probes started together and taking turns on the machine in slices
    (`autotune.measuring.alternate`), so that its drift falls on every entry alike; each
    probe measures for the `TURN_MEASURE_SHARE` of its window a sequential probe would take.
    A round is not started past ``deadline`` (the budget's end, on the prober's clock) by the
    time the longest round so far took: a script's start-up may make a round cost more than
    the windows it was planned at."""
    space = state.space
    cfgs = dict(entries)
    names = list(cfgs)
    measure_s = TURN_MEASURE_SHARE * sum(windows.values()) / len(windows)
    results: dict[str, list] = {name: [] for name in cfgs}
    longest = 0.0
    for rnd in range(first, first + rounds):
        now = prober.clock.monotonic()
        if deadline is not None and rnd > first and now + longest > deadline:
            prober.tell(Note.warning(
                f"confirmation: {rnd - first} of {rounds} rounds fit in the budget (a round "
                f"took up to {longest:.0f} s, {max(deadline - now, 0):.0f} s were left)"))
            break
        order = names if rnd % 2 else names[::-1]  # who warms up first, in turn
        specs = [(cfgs[name], prober.spec(state, *space.trial_knobs(cfgs[name]),
                                          f"confirm{rnd}-{name}", max_s=windows[name],
                                          min_measure_s=measure_s,
                                          target_rel=CONFIRM_TARGET_REL))
                 for name in order]
        state, got = prober.probe_turns(state, specs, measure_s=measure_s)
        longest = max(longest, prober.clock.monotonic() - now)
        for name, r in zip(order, got):
            results[name].append(r if r.ok else None)
            prober.emit(Event.CONFIRMATION, round=rnd, trial=name, knobs=cfgs[name],
                        samples_per_s=r.samples_per_s if r.ok else None,
                        ci_half=r.ci_half if r.ok else None, outcome=r.outcome.value,
                        reason=r.reason, slice_rates=list(r.slice_rates),
                        **({"chooses": True} if chooses else {}))
            if not r.ok:
                prober.tell(Note.warning(f"confirmation round {rnd}, {name}: "
                                         f"{r.outcome.value}: {r.reason}"))
    return state, results


def slice_rates(results: Mapping[str, list]) -> dict[str, list]:
    """Where the rounds took turns, each entry's probes' slice rates, which pair across
    configs (`decision.paired_half`); ``results`` holds `TrialResult`s, the search's `Round`s
    (an entry no round measured) or None."""
    return {name: [getattr(r, "slice_rates", None) or None for r in rs]
            for name, rs in results.items()
            if any(getattr(r, "slice_rates", None) for r in rs)}
