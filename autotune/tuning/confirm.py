"""The end of a tuning run: confirm the best configs against the baseline, then declare a winner.

The best two configs of the search and the baseline are re-measured in separate processes,
round after round (`autotune.tuning.confirm_rounds`: each probe's length, rounds that take
turns on the machine where they can), as a race (`autotune.tuning.race`) that looks after
every round, drops the configs the rounds show behind and stops once the leader is shown over
the baseline, within the rounds the plan holds (`autotune.tuning.confirm_plan`). Variance
lives between processes and over time more than within one window, so this, not a longer
single window, is what makes the decision robust; `autotune.tuning.decision.decide` keeps the
baseline unless the gain is real.
Configs are compared on their score (`autotune.tuning.objective`); with throughput and energy
together, the one candidate is the Pareto front's pick, and `decision.decide_pair` judges it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotune import Note
from autotune.measuring import alternate, bottleneck
from autotune.tuning import decision, objective, race
from autotune.tuning.confirm_entries import candidates, essential, pareto_points
from autotune.tuning.confirm_plan import (
    ConfirmPlan, Lineup, Stretch, needed_rounds, plan_confirmation, plan_lineup)
from autotune.tuning.confirm_rounds import (
    BORROWED_WIDEN, Earlier, Round, borrowed, ended_in_search, one_round_rel, own_intervals,
    plan_entries, probe_windows, remeasure, slice_rates, turns_refused)
from autotune.tuning.decision import KEPT, MIN_ROUNDS, Choice, Measured
from autotune.tuning.prober import Prober
from autotune.tuning.race import Look, Race
from autotune.tuning.records import BaselineRecord, Known, Scored, TuneSettings
from autotune.tuning.spread import ProcessSpread
from autotune.tuning.space import Space
from autotune.tuning.state import TuneState, minutes
from autotune.store.events import Event
from probes.protocol import Mode


@dataclass(frozen=True)
class Confirmed:
    """The winner against the baseline, as re-measured, and the decision's reason; the run's
    state with what the confirmation's probes taught."""

    best: Scored
    baseline: Scored
    speedup: float
    kept_baseline: bool
    reason: str
    verdict: bottleneck.Verdict | None = None  # with --verdict: the winner's bottleneck
    speedup_low: float = 1.0  # the speed-up's 95% interval (`decision.speedup_interval`)
    speedup_high: float = 1.0
    best_score: objective.Score | None = None  # the winner's score over the rounds, its parts
    baseline_score: objective.Score | None = None
    front: tuple[objective.Point, ...] = ()  # throughput,energy: the search's Pareto front
    picked: str = ""  # the front's pick (`objective.pick`)
    state: TuneState | None = None
    # a winner that changes the job's global batch: the fastest confirmed config that keeps it
    keep_batch: Choice | None = None
    rounds: int = 0  # interleaved rounds the decision stood on
    candidates: int = 1  # candidates confirmed beside the baseline


def select_candidate(prober: Prober, state: TuneState, known: Mapping[tuple, Known],
                     entries: list[tuple[str, dict]], scorer: objective.Scorer
                     ) -> tuple[TuneState, list[tuple[str, dict]], dict[str, list]]:
    """The race's first round, in turns, of the baseline, the best and the runner-up
    (``entries[:3]``), after which one of the two candidates is dropped: the entries the race
    goes on with (the baseline, the one of the two that this round and the search's own probes
    together put ahead (`runner_lead`), and any entry past the runner-up) and that round's
    results of those it measured, which the race judges with its later rounds. Both candidates
    entered the race, so its intervals are two candidates' (`decision.level_for`) whichever
    stays: that pays for a choice made on the round's own figures.

    Under a budget, where rounds take turns, this comes before keeping the runner-up or
    leaving it out, neither of which is safe where the search's own probes, one after another,
    ranked its top two on the machine's drift: nanoGPT's 5m kept it and lost a +17.8% gain to
    two candidates' 97.5% (run 4), and so did word_lm's 5m, +18.9% over three rounds; nanoGPT's
    5m left it out and confirmed a best that read 330 right after the baseline's 244, +3.4% in
    the rounds, beside a runner-up that was the grid's best (run 5). A round in turns ranks the
    two on the same stretch of the machine, and costs what half a round of three does more
    than one of two: in the time of three rounds of all three entries, it and three rounds of
    two judge four rounds at two candidates' 98% (t 4.5 over three degrees of freedom, over the
    square root of 4), where three rounds of three judge at t 7.0 over the square root of 3.
    Before it counted, it judged nothing, and the rounds after it one candidate at 96%: nanoGPT's
    5m read its best +15.9%, +6.9% and +21.9% over three rounds in turns and judged only the
    last two (0.78x-1.64x)."""
    three = dict(entries[:3])
    best_name, runner_name = list(three)[1:]
    prober.tell(Note.info(
        f"confirmation: round 1 chooses between {best_name} and {runner_name} (the search's "
        f"best two), taking turns with the baseline; the race goes on with the one chosen, "
        f"and judges this round with its others"))
    windows = probe_windows(prober, state, known, list(three.values()))
    state, got = remeasure(prober, state, entries[:3], 1, dict(zip(three, windows)),
                           turns=True, chooses=True)
    scores = {name: _scored(scorer, three[name], got[name][0])
              for name in (best_name, runner_name)}
    searched = {name: _scored(scorer, three[name], _searched(known, state, three[name]))
                for name in (best_name, runner_name)}
    spread_seen = state.learned.spread
    process_rel = spread_seen.process_rel() if spread_seen is not None \
        else decision.PROCESS_NOISE_REL
    lead = runner_lead(scores[best_name], scores[runner_name], searched[best_name],
                       searched[runner_name], process_rel)
    base = got["baseline"][0]

    def said(name: str) -> str:
        r = got[name][0]
        if r is None:
            return f"{name} gave no figure"
        vs = f" ({r.samples_per_s / base.samples_per_s - 1:+.1%} over the baseline)" \
            if base is not None and base.samples_per_s > 0 else ""
        return f"{name} {r.samples_per_s:.1f} samples/s{vs}"

    chosen = runner_name if lead is not None and lead > 0 else best_name
    other = runner_name if chosen == best_name else best_name
    weighed = ""
    if lead is not None and math.isfinite(lead):
        weighed = (f"; this round and the search's probes, each weighed by its precision (the "
                   f"search's, one after another, also by the ±{process_rel:.1%} processes "
                   f"differ by), put {chosen} ahead by {math.exp(abs(lead)) - 1:.1%}")
    overruled = chosen == best_name and scores[runner_name] is not None and \
        scores[best_name] is not None and scores[runner_name].value is not None and \
        scores[best_name].value is not None and scores[runner_name].value > scores[best_name].value
    what = f"chose {said(chosen)} over {said(other)}{weighed}" if not overruled else (
        f"read {said(runner_name)} and {said(best_name)}{weighed}: the search's order stands")
    state = prober.note(state, Note.info(
        f"confirmation: round 1 {what}; the race goes on with {chosen} and the baseline, "
        f"judging this round with its others, at two candidates' level (both entered it)"))
    return state, [entries[0], (chosen, three[chosen]), *entries[3:]], \
        {name: got[name] for name in ("baseline", chosen)}


def runner_lead(best: objective.Score | None, runner: objective.Score | None,
                best_searched: objective.Score | None, runner_searched: objective.Score | None,
                process_rel: float) -> float | None:
    """The runner-up's lead over the search's best (a log ratio; above 0: the runner-up is
    ahead) from the choosing round (`select_candidate`) and the search's own probes together,
    each weighed by its precision (the inverse of its variance). The round's two figures ran
    in turns, on the same stretch of the machine: their own intervals say how precise they are.
    The search's two ran one after another, each in its own process: their intervals and the
    spread between processes (``process_rel``, one standard deviation each) do. None where the
    runner-up gave no score in the round (the best stays); infinite where the best gave none.
    0 where neither says anything (the best stays).

    Taking the round alone where it was beyond both intervals, else the search's order, lost
    the grid's best twice. nanoGPT's 5m read batch 32 +16.6% over the baseline (± 5%) and 16
    +5.5% (± 15%) in the round, within their intervals, so the search's order stood on 312.7
    against 306.8 from probes minutes apart, whose script's own config read 22% apart in two
    processes; the race then kept the defaults at 0.93 of 32. Weighed, the round leads there.
    And where the search's probes are precise and its processes alike, they lead: word_lm's
    shape at 6m had its best, batch 64, at 2170 ± 80 and the runner-up, batch 32, at 1607 ± 96;
    the round read 32 at 2115 ± 228 and 64 at 2044 ± 438. Choosing 32 on that round alone kept
    the defaults at 0.86 of 64; weighed, 64 stays."""
    if runner is None or runner.value is None:
        return None
    if best is None or best.value is None:
        return math.inf
    parts = [p for p in (_log_lead(runner, best, 0.0),
                         _log_lead(runner_searched, best_searched, process_rel)) if p is not None]
    weights = [(d, 1.0 / max(var, 1e-12)) for d, var in parts if math.isfinite(var)]
    total = sum(w for _, w in weights)
    return sum(d * w for d, w in weights) / total if total > 0 else 0.0


def _searched(known: Mapping[tuple, Known], state: TuneState, cfg: Mapping) -> Round | None:
    """What the search measured of ``cfg``, None where it holds no answer for it."""
    k = known.get(state.space.key(cfg))
    return None if k is None else Round(k.value, k.ci_half, k.energy)


def _log_lead(a: objective.Score | None, b: objective.Score | None, process_rel: float
              ) -> tuple[float, float] | None:
    """``a``'s lead over ``b``, a log ratio, and its variance: both figures' own intervals
    (95%) and, for each, ``process_rel`` (one standard deviation) more. None where either has
    no positive score."""
    if a is None or b is None or a.value is None or b.value is None or a.value <= 0 or \
            b.value <= 0:
        return None
    var = sum((s.ci_half / 1.96 / s.value) ** 2 for s in (a, b)) + 2 * process_rel ** 2
    return math.log(a.value / b.value), var


def _probe_verdict(prober: Prober, state: TuneState, cfg: dict,
                   full: float) -> tuple[TuneState, bottleneck.Verdict]:
    space = state.space
    rates, why_none = {}, {}
    for mode in (Mode.SYNTHETIC, Mode.IO):
        label = f"verdict-{mode.value}"
        state, r = prober.probe(state, prober.spec(state, *space.trial_knobs(cfg), label,
                                                   mode=mode),
                                label=label, number=None, cfg=cfg)
        rates[mode] = r.samples_per_s if r.ok else None
        if not r.ok or not r.samples_per_s:
            why_none[mode] = f"{r.outcome.value}{': ' + r.reason if r.reason else ''}; " \
                             f"log: {r.log_path}"
    facts = state.learned.facts(cfg)
    v = bottleneck.decide(full, rates[Mode.SYNTHETIC], rates[Mode.IO],
                          facts.breakdown if facts is not None else None, why_none)
    prober.emit(Event.PROBE_VERDICT, verdict=v.to_dict())
    return state, v


def _scored(scorer: objective.Scorer, cfg: Mapping, r) -> objective.Score | None:
    """The score of one measurement (a `TrialResult` or a `Round`), None for none."""
    if r is None:
        return None
    return scorer.score(r.samples_per_s, r.ci_half, cfg, r.energy)


def _by_objective(scorer: objective.Scorer, cfgs: Mapping[str, Mapping],
                  results: Mapping[str, list]) -> list[dict[str, list]]:
    """Per objective, each entry's rounds as `Measured` scores (None where not scored):
    one objective, its score; two, samples/s then samples/J (its interval as wide,
    relatively, as the throughput's)."""
    scores = {n: [_scored(scorer, cfgs[n], r) for r in rs] for n, rs in results.items()}
    if not scorer.objective.multi:
        return [{n: [Measured(s.value, s.ci_half) if s and s.value is not None else None
                     for s in ss] for n, ss in scores.items()}]
    tp = {n: [Measured(s.samples_per_s, s.ci_half) if s and s.samples_per_j else None
              for s in ss] for n, ss in scores.items()}
    en = {n: [Measured(s.samples_per_j, s.ci_half / s.samples_per_s * s.samples_per_j)
              if s and s.samples_per_j and s.samples_per_s > 0 else None for s in ss]
          for n, ss in scores.items()}
    return [tp, en]


def _mean_score(scorer: objective.Scorer, cfg: Mapping, rs: list,
                summary: decision.Summary) -> objective.Score | None:
    """An entry's score over its rounds: the decision's mean, with its parts."""
    done = [r for r in rs if r is not None]
    if not done:
        return None
    raw = decision.summarize([Measured(r.samples_per_s, r.ci_half) for r in done])
    js = [objective.joules_per_sample(r.energy) for r in done]
    js = [j for j in js if j is not None]
    eff = scorer.efficiency(cfg)
    return objective.Score(summary.samples_per_s, summary.ci_half, raw.samples_per_s, eff,
                           scorer.noise_scale if eff is not None else None,
                           sum(js) / len(js) if js else None)


@dataclass(frozen=True)
class _Frame:
    """What every stage of one confirmation reads and none changes: the run's settings, space
    and baseline, the search's measurements, the scorer, every entry's config by name, and the
    spread between processes (as measured when the confirmation began)."""

    settings: TuneSettings
    space: Space
    baseline: BaselineRecord
    known: Mapping[tuple, Known]
    scorer: objective.Scorer
    cfgs: Mapping[str, dict]
    spread: ProcessSpread | None
    process_rel: float  # what one process adds to a figure's spread

    @classmethod
    def of(cls, state: TuneState, known: Mapping[tuple, Known], scorer: objective.Scorer,
           entries: list[tuple[str, dict]]) -> _Frame:
        spread = state.learned.spread
        return cls(state.settings, state.space, state.baseline, known, scorer, dict(entries),
                   spread,
                   spread.process_rel() if spread is not None else decision.PROCESS_NOISE_REL)

    @property
    def multi(self) -> bool:
        """Throughput and energy together (the Pareto front's pick), not one score."""
        return self.scorer.objective.multi

    @property
    def prior(self) -> tuple[float, ...]:
        """The script's own config in two processes, as a round against itself
        (`ProcessSpread.pair_logs`): pooled with the rounds' spread."""
        return self.spread.pair_logs() if self.spread is not None else ()

    def planning_rel(self) -> float:
        """The spread the rounds are planned on (`ProcessSpread.planning_rel`)."""
        return self.spread.planning_rel() if self.spread is not None else self.process_rel

    def needed(self, names, candidates: int, *, one_round_rel: float | None = None
               ) -> tuple[int | None, str]:
        """The rounds the search's best gain among ``names`` needs, and why
        (`confirm_plan.needed_rounds`): its best by score, as the search picks it."""
        def score(name: str) -> tuple[float, float] | None:
            s = _scored(self.scorer, self.cfgs[name], self.searched(name))
            return (s.value, s.ci_half) if s is not None and s.value is not None else None

        scores = [x for x in (score(n) for n in names if n != "baseline") if x is not None]
        best = max(scores, key=lambda x: x[0], default=None)
        return needed_rounds(best, score("baseline"), self.planning_rel(), candidates,
                             one_round_rel=one_round_rel, prior_dof=len(self.prior))

    def searched(self, name: str) -> Round:
        """What the search measured of an entry (the baseline: the mean of its two processes,
        if measured)."""
        key = self.space.key(self.cfgs[name])
        if name == "baseline" and key not in self.known:
            return Round(self.baseline.samples_per_s, self.baseline.ci_half,
                         self.baseline.energy)
        k = self.known[key]
        return Round(k.value, k.ci_half, k.energy)


@dataclass(frozen=True)
class _Lineup:
    """The entries the rounds judge, once a choosing round or the budget had its say."""

    entries: tuple[tuple[str, dict], ...]  # the baseline first
    left_s: float | None  # the budget left after any choosing round (None: no budget)
    refused: str = ""  # why the rounds cannot take turns on the machine; "" when they can
    # the round that chose between the best and the runner-up: its results of the entries
    # judged, the race's first round (None: no such round)
    chose: Mapping[str, list] | None = None
    # candidates that entered the race: those judged, those a choosing round dropped, and
    # an extended confirmation's (0: those judged)
    entered: int = 0

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.entries]

    @property
    def selected(self) -> int:
        """Rounds that chose between the best and the runner-up: 1 or 0."""
        return 1 if self.chose is not None else 0

    @property
    def candidates(self) -> int:
        """Candidates the race's intervals allow for (`decision.level_for`)."""
        return max(1, len(self.entries) - 1, self.entered)


@dataclass(frozen=True)
class _Run:
    """What the race measured and decided: each entry's figures, round after round (None
    where a probe measured nothing or the entry was out of the race; where none of its probes
    measured, or no round ran: the search's own, as one round), the rounds (an extended
    confirmation's earlier ones included), the entries none of them measured, the race's
    policy, its last look, and each entry's rounds as scores per objective (`_by_objective`)
    and as slices."""

    results: dict[str, list]
    rounds: int
    unmeasured: frozenset[str]
    policy: Race
    look: Look
    by: list[dict[str, list]]
    slices: dict[str, list]
    one_round_rel: float | None = None

    def judge(self, names: list[str]) -> decision.Decision:
        """``names`` (the baseline among them) judged on the same rounds, at the last look's
        level: the batch-keeping alternative's decision."""
        if self.policy.multi:
            return decision.decide_pair(*({n: b[n] for n in names} for b in self.by),
                                        "baseline", candidates=self.policy.candidates,
                                        process_rel=self.policy.process_rel)
        return self.policy.decide(self.by[0], self.slices, names, level=self.look.level,
                                  words=self.look.words, one_round_rel=self.one_round_rel)


def finish(prober: Prober, state: TuneState, known: Mapping[tuple, Known], *,
           left_s: float | None, stretch: Stretch = Stretch.NONE,
           scorer: objective.Scorer | None = None, earlier: Earlier | None = None) -> Confirmed:
    """Confirm the best two of ``known`` by ``scorer``'s score (throughput unless given)
    against the state's baseline within ``left_s`` of the budget (None: no budget), decide,
    and journal the ``best``. The rounds are a race (`autotune.tuning.race`): after each, a
    look drops what the rounds show behind, and stops once one is shown over the baseline.
    What is left of the budget buys more rounds as ``stretch`` says: all it holds, or those
    the search's best gain needs (`_Frame.needed`). With ``earlier`` (a finished
    confirmation, extended), its entries get the settings' rounds more, and the race judges
    its rounds and theirs together. The result holds the state with what its probes
    taught."""
    scorer = scorer or objective.Scorer(state.settings.objective)
    began = prober.clock.monotonic()
    entries = list(earlier.entries) if earlier else candidates(state.space, known, scorer)
    frame = _Frame.of(state, known, scorer, entries)
    state, lineup = _line_up(prober, state, frame, entries, left_s, earlier)
    state, plan = _plan_rounds(prober, state, frame, lineup, stretch)
    state, run = _race(prober, state, frame, lineup, plan, earlier)
    d = _settle(prober, frame, lineup, plan, run, began)
    return _declare(prober, state, frame, lineup, run, d)


def _line_up(prober: Prober, state: TuneState, frame: _Frame, entries: list[tuple[str, dict]],
             left_s: float | None, earlier: Earlier | None) -> tuple[TuneState, _Lineup]:
    """The entries the rounds judge, as the planner says (`confirm_plan.plan_lineup`): all of
    ``entries``, or under a budget, where the runner-up is not the batch-keeping alternative
    (`essential`) and no ``earlier`` confirmation is extended, a round in turns that chooses
    between the best and the runner-up (`select_candidate`), or the runner-up left out."""
    few = essential(frame.space, entries, known=frame.known, scorer=frame.scorer)
    refused = turns_refused(prober, frame.scorer, known=frame.known)
    if refused and refused == ended_in_search(frame.known):  # the script's doing: say so
        state = prober.note(state, Note.info(
            f"confirmation: the rounds run one probe after another: {refused}"))
    needed = None  # what two candidates' interval needs to show the search's best gain
    if not frame.multi and len(few) < len(entries) and left_s is not None:
        needed = frame.needed([n for n, _ in entries], len(entries) - 1)[0]
    lineup = plan_lineup(plan_entries(prober, state, frame.known, entries), len(few),
                         asked=frame.settings.confirm_rounds, left_s=left_s, needed=needed,
                         refused=refused, multi=frame.multi, extending=earlier is not None)
    if lineup is Lineup.CHOOSE:
        started = prober.clock.monotonic()
        state, kept, chose = select_candidate(prober, state, frame.known, entries,
                                              frame.scorer)
        left_s -= prober.clock.monotonic() - started
        return state, _Lineup(tuple(kept), left_s, refused, chose, len(entries) - 1)
    if lineup is Lineup.ESSENTIAL:
        dropped = entries[2][0]
        entries = few
        state = prober.note(state, Note.info(
            f"confirmation: the runner-up ({dropped}) is left out: under a budget its "
            f"probes buy rounds of the best and the baseline, which decide more than a "
            f"third config does"))
    return state, _Lineup(tuple(entries), left_s, refused,
                          entered=earlier.candidates if earlier else 0)


def _plan_rounds(prober: Prober, state: TuneState, frame: _Frame, lineup: _Lineup,
                 stretch: Stretch) -> tuple[TuneState, ConfirmPlan]:
    """The plan of the rounds (`confirm_plan.plan_confirmation`) for the entries lined up,
    within the budget left: each entry's probe as the run measured it (`plan_entries`), the
    rounds asked, those the search's best gain needs (`_Frame.needed`), and why the rounds
    may not take turns on this machine; what it decides is told."""
    entries, left_s = lineup.entries, lineup.left_s
    needed, why = None, ""  # the rounds the search's best gain needs (one may do)
    if not frame.multi and len(entries) > 1:
        needed, why = frame.needed(
            lineup.names, lineup.candidates,
            one_round_rel=frame.spread.upper_rel() if frame.spread is not None else None)
        if needed is not None and lineup.selected:  # the choosing round is one of them
            needed = max(1, needed - lineup.selected)
    plan = plan_confirmation(plan_entries(prober, state, frame.known, list(entries)),
                             asked=frame.settings.confirm_rounds, left_s=left_s,
                             budget_s=frame.settings.budget_s, stretch=stretch, needed=needed,
                             needed_why=why, multi=frame.multi, refused=lineup.refused)
    if len(entries) > 1 and plan.asked > 0 and not plan.remeasures:
        state = prober.note(state, Note.warning(
            f"confirmation: {plan.why}, and the speed-up's interval allows for new processes"))
    elif plan.remeasures and plan.refused and not lineup.refused:
        state = prober.note(state, Note.info(
            f"confirmation: the rounds run one probe after another: {plan.refused}"))
    return state, plan


def _announcement(lineup: _Lineup, plan: ConfirmPlan, earlier: Earlier | None) -> str:
    """What the planned rounds will measure and how, why they are more than asked, how the
    race looks at them, and what the plan costs."""
    rounds, asked, left_s = plan.rounds, plan.asked, lineup.left_s
    more = (f" ({rounds - asked} more than --confirm-rounds {asked}: {plan.why_more}; "
            f"{max(left_s or 0.0, 0.0):.0f} s of the budget were left)"
            if rounds > asked else "")
    if plan.most > rounds:
        more += (f"; should they not show the gain, the race goes on while the spread seen "
                 f"asks for more rounds, up to {plan.most}")
    how = (f"interleaved round(s) of {', '.join(f'{w:.0f}' for w in plan.windows)} s "
           f"probes" if not plan.turns else
           f"round(s), each starting every config's processes and letting them take "
           f"turns on the machine (held with SIGSTOP between slices of "
           f"{alternate.slice_for(plan.measure_s):.1f} s or more) until each ran "
           f"{plan.measure_s:.0f} s")
    if earlier is not None:
        more += f", after the {earlier.count} round(s) it had (judged with them)"
    elif lineup.selected:
        more += ", after round 1 (judged with it)"
    looks = ("; after every round a look drops a config the rounds show behind the leader, "
             "and stops once the leader is shown over the baseline"
             if len(lineup.entries) > 1 else "")
    return (f"confirming: {', '.join(lineup.names)}, {rounds} {how}{more}{looks}; about "
            f"{plan.cost_s:.0f} s planned")


def _policy(frame: _Frame, lineup: _Lineup, plan: ConfirmPlan, before: int) -> Race:
    """The race's policy for ``lineup`` under ``plan``, after ``before`` earlier rounds."""
    return Race(before + max(1, plan.rounds), before + max(1, plan.most), lineup.candidates,
                keeps=frozenset(n for n in lineup.names
                                if n == "baseline" or frame.space.keeps_batch(frame.cfgs[n])),
                multi=frame.multi, process_rel=frame.process_rel, prior=frame.prior)


def _race(prober: Prober, state: TuneState, frame: _Frame, lineup: _Lineup, plan: ConfirmPlan,
          earlier: Earlier | None) -> tuple[TuneState, _Run]:
    """Announce and run the race (`race.run`) within the budget left, after ``earlier``'s
    rounds or the round that chose between the best two (judged with its own): each round
    runs the entries still in it once (`remeasure`, one round, numbered on from the
    journal's); an entry none of them measured stands on the search's own figure. No
    re-measurement: the search's own figures, one round each, which cannot switch."""
    if earlier is not None:  # the rounds before the race's own, and the last one's number
        before, last, prior = earlier.count, earlier.last_round, \
            {n: list(rs) for n, rs in earlier.rounds.items()}
    else:
        before, last, prior = lineup.selected, lineup.selected, lineup.chose
    policy = _policy(frame, lineup, plan, before)
    names, cfgs = lineup.names, dict(lineup.entries)

    def score(results: Mapping[str, list]) -> tuple[list[dict[str, list]], dict[str, list]]:
        return (_by_objective(frame.scorer, frame.cfgs, own_intervals(results, frame.searched)),
                slice_rates(results))

    def one_round(results: Mapping[str, list]) -> float | None:
        if frame.spread is None or not frame.spread.measured or frame.multi:
            return None
        lent = own_intervals(results, frame.searched)
        return one_round_rel(frame.spread, {n: (frame.searched(n), lent[n][0])
                                            for n in names if n != "baseline"})

    if not plan.remeasures:
        results = {name: [frame.searched(name)] for name in names}
        by, slices = score(results)
        look = policy.look(by, slices, rounds=policy.planned, live=names, last=True)
        return state, _Run(results, 0, frozenset(), policy, look, by, slices)
    prober.tell(Note.info(_announcement(lineup, plan, earlier)))
    deadline = prober.clock.monotonic() + lineup.left_s if lineup.left_s is not None else None
    held = [state]

    def measure(number: int, live: list[str], share: float) -> dict[str, object]:
        if share < 1.0:
            prober.tell(Note.info(
                f"confirmation: round {number}'s probes are cut to {share:.0%} of their "
                f"length, to end within the budget left"))
        windows = {n: w * share for n, w in plan.window_of().items()}
        held[0], got = remeasure(prober, held[0], [(n, cfgs[n]) for n in live], 1, windows,
                                 turns=plan.turns, first=number)
        return {n: ms[0] for n, ms in got.items()}

    raced = race.run(policy, measure, score, names=names, clock=prober.clock,
                     deadline=deadline,
                     first=last + 1, earlier=prior, one_round=one_round)
    state = held[0]
    for drop in raced.dropped:
        state = prober.note(state, Note.info(
            f"confirmation: {drop.name} is out of the race after round {drop.round} "
            f"({drop.why}); the rounds after it measure the others"))
    if raced.rounds < plan.most or raced.rounds > plan.rounds:
        state = prober.note(state, Note.info(f"confirmation: the race stopped: {raced.stopped}"))
    return _settle_race(prober, state, frame, policy, raced, before, one_round)


def _settle_race(prober: Prober, state: TuneState, frame: _Frame, policy: Race,
                 raced: race.Raced, before: int, one_round) -> tuple[TuneState, _Run]:
    """The race's results, where an entry none of its rounds measured stands on the search's
    own figure (and the last look judges again with it)."""
    results, look = raced.results, raced.look
    unmeasured = frozenset(n for n, ms in results.items() if all(m is None for m in ms))
    for name in sorted(unmeasured, key=list(results).index):
        results[name] = [frame.searched(name)]  # nothing measured is never a figure
        state = prober.note(state, Note.warning(
            f"confirmation: no probe of {name} could be compared; using what the "
            f"search measured: {results[name][0].samples_per_s:.1f} ± "
            f"{results[name][0].ci_half:.1f} samples/s"))
    lent = own_intervals(results, frame.searched)
    for name, i in borrowed(results):
        if math.isfinite(lent[name][i].ci_half):
            state = prober.note(state, Note.info(
                f"confirmation: {name}'s figure of round {i + 1} has no interval of its own "
                f"(its probe ended before it had one); it takes its search figure's, widened "
                f"by {BORROWED_WIDEN:.2f}: {lent[name][i].samples_per_s:.1f} ± "
                f"{lent[name][i].ci_half:.1f} samples/s"))
    by = _by_objective(frame.scorer, frame.cfgs, lent)
    slices = slice_rates(results)
    total = before + raced.rounds
    bound = one_round(results) if total == 1 else None
    if unmeasured or look is None:
        out = {d.name for d in raced.dropped}
        look = policy.look(by, slices, rounds=max(total, 1),
                           live=[n for n in results if n not in out], last=True,
                           one_round_rel=bound)
    return state, _Run(results, total, unmeasured, policy, look, by, slices, bound)


def _settle(prober: Prober, frame: _Frame, lineup: _Lineup, plan: ConfirmPlan, run: _Run,
            began: float) -> decision.Decision:
    """The decision as it stands: the baseline kept where nothing else was confirmed, or where
    no round measured the baseline itself; a kept baseline's reason with what would decide
    (`_needs`, the budget left since ``began``)."""
    d = run.look.decided
    if len(lineup.entries) == 1:
        why = ("the Pareto front's pick is the script's own config" if frame.multi
               else "no other config completed a probe")
        return decision.Decision("baseline", True, 1.0, d.baseline_summary, d.baseline_summary,
                                 0.0, f"{KEPT}{why}")
    if "baseline" in run.unmeasured:
        # a speed-up is claimed only against a baseline measured in the same rounds: the
        # search's figure came from other processes at another time (another load, a step
        # that failed then and not now)
        return decision.Decision(
            "baseline", True, 1.0, d.baseline_summary, d.baseline_summary, 0.0,
            f"{KEPT}the baseline could not be re-measured in the confirmation's rounds (see "
            f"its probes' reasons above); no speed-up is claimed against a figure from other "
            f"rounds", rounds=0, candidates=run.policy.candidates)
    if d.kept_baseline:
        left_s = lineup.left_s
        spare = None if left_s is None else max(0.0, left_s - (prober.clock.monotonic() - began))
        d = dataclasses.replace(d, reason=_needs(d, run.rounds, plan.window_of(), frame.settings,
                                                 spare))
    return d


def _raw(frame: _Frame, results: Mapping[str, list], name: str) -> Scored:
    """The probes' own figures of an entry over the rounds, unscored."""
    r = decision.summarize([Measured(m.samples_per_s, m.ci_half)
                            for m in results[name] if m is not None])
    return Scored(frame.cfgs[name], r.samples_per_s, r.ci_half)


def _keep_batch(frame: _Frame, lineup: _Lineup, run: _Run, d: decision.Decision,
                base: Scored) -> Choice | None:
    """Beside a switch to a config that changes the job's global batch, the fastest confirmed
    config that keeps it, judged against the baseline on the same rounds (the baseline when
    no other keeps it); None otherwise."""
    space, cfgs = frame.space, frame.cfgs
    if d.kept_baseline or space.keeps_batch(cfgs[d.winner]):
        return None
    keepers = [n for n in lineup.names if n == "baseline" or space.keeps_batch(cfgs[n])]
    if len(keepers) == 1:
        return Choice(base.knobs, base.samples_per_s, base.ci_half,
                      reason=f"batch-keeping alternative: {KEPT}no other config the "
                             f"search measured trains with the script's own batch "
                             f"faster than they do")
    kd = run.judge(keepers)
    kept = _raw(frame, run.results, kd.winner)
    return Choice(kept.knobs, kept.samples_per_s, kept.ci_half, kd.speedup,
                  kd.speedup_low, kd.speedup_high, kd.kept_baseline,
                  f"batch-keeping alternative: {kd.reason}")


def _declare(prober: Prober, state: TuneState, frame: _Frame, lineup: _Lineup,
             run: _Run, d: decision.Decision) -> Confirmed:
    """Tell the decision ``d`` and the batch-keeping alternative, probe the winner's
    bottleneck with --verdict, and journal the best (`Event.BEST`)."""
    scorer, cfgs, names = frame.scorer, frame.cfgs, lineup.names
    results, k = run.results, run.policy.candidates
    best_cfg = cfgs[d.winner]
    winner, base = _raw(frame, results, d.winner), _raw(frame, results, "baseline")
    best_score = _mean_score(scorer, best_cfg, results[d.winner], d.winner_summary)
    base_score = _mean_score(scorer, cfgs["baseline"], results["baseline"], d.baseline_summary)
    prober.tell(Note.info(d.reason))
    keep = _keep_batch(frame, lineup, run, d, base)
    if keep is not None:
        prober.tell(Note.info(keep.reason))
    verdict = None
    if frame.settings.verdict:
        state, verdict = _probe_verdict(prober, state, best_cfg, winner.samples_per_s)
    prober.emit(Event.BEST, knobs=best_cfg, samples_per_s=winner.samples_per_s,
                ci_half=winner.ci_half, baseline_samples_per_s=base.samples_per_s,
                speedup=d.speedup, kept_baseline=d.kept_baseline, reason=d.reason,
                speedup_low=d.speedup_low, speedup_high=d.speedup_high,
                objective=scorer.objective.token,
                score=best_score.to_dict() if best_score else None,
                baseline_score=base_score.to_dict() if base_score else None,
                keep_batch=keep.to_dict() if keep else None, rounds=d.rounds, candidates=k)
    front = tuple(objective.front(pareto_points(frame.space, frame.known, scorer))) \
        if scorer.objective.multi else ()
    return Confirmed(winner, base, d.speedup, d.kept_baseline, d.reason, verdict,
                     d.speedup_low, d.speedup_high, best_score, base_score, front,
                     names[1] if scorer.objective.multi and len(names) > 1 else
                     "baseline" if scorer.objective.multi else "", state, keep, d.rounds,
                     max(1, k))


def _needs(d: decision.Decision, rounds: int, windows: Mapping[str, float],
           settings: TuneSettings, spare_s: float | None = None) -> str:
    """A kept baseline's reason, with what would let the confirmation decide: the rounds
    (`MIN_ROUNDS` at least, else what the spread seen asks for), the time they take, and the
    ``--confirm-rounds``/``--budget`` that would hold them (no larger budget where the one
    given had ``spare_s`` left for them: the rounds asked, not the budget, were short)."""
    reason = d.reason
    if rounds == 0:
        why = ("--confirm-rounds 0" if settings.confirm_rounds == 0 else
               "too little budget left for one")
        reason = (f"{KEPT}no confirmation round ran ({why}), and a switch needs "
                  f"{MIN_ROUNDS} interleaved rounds at least; the search measured "
                  f"{d.candidate or 'no candidate'}"
                  + (f" at {d.candidate_speedup - 1:+.1%}" if d.candidate else ""))
    # the rounds that measured both configs (a round whose probe failed gave no ratio)
    done = min(rounds, d.rounds) if rounds else 0
    need = MIN_ROUNDS if done < MIN_ROUNDS else d.rounds_needed
    if not need or not d.candidate or d.candidate_speedup - 1 <= decision.MIN_GAIN_REL:
        return reason
    round_s = sum(windows.values())
    more_s = (need - done) * round_s
    asks = [f"--confirm-rounds {need}"] if settings.confirm_rounds < need else []
    if settings.budget_s is not None and (spare_s is None or spare_s < more_s):
        asks.append(f"--budget {minutes(math.ceil((settings.budget_s + more_s) / 60) * 60)}")
    return (f"{reason}; {need} rounds of ~{round_s:.0f} s ({minutes(more_s)} more) would "
            f"decide" + (f": {' and '.join(asks)}" if asks else ""))
