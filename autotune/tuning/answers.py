"""What the search's study has answered so far: every config measured, and what follows.

`Answers` is the search's ledger: the answer of each config by key (`Known`), the configs that
ran out of memory, the probes this run measured, the scores the convergence rule saw, the
noise-scale readings. The search (`autotune.tuning.search`) adds to it as trials finish; its
queueing policy (`autotune.tuning.queue_policy`) and budget (`autotune.tuning.search_budget`)
read it. A finished trial is read through its typed record (`autotune.tuning.trial_attrs`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from autotune.tuning import objective, search_rules, spread
from autotune.tuning import study as studies
from autotune.tuning.records import Known
from autotune.tuning.space import Space


@dataclass
class Answers:
    """The search's ledger over ``space``, scored by ``scorer``."""

    space: Space
    scorer: objective.Scorer
    known: dict[tuple, Known] = field(default_factory=dict)
    ooms: list[dict] = field(default_factory=list)
    measured: int = 0  # probes this run took in the search (and earlier controllers of it)
    duplicate_streak: int = 0  # proposals in a row of configs answered already
    convergence: search_rules.Convergence = field(default_factory=search_rules.Convergence)
    fed: list[tuple[int | None, float | None]] = field(default_factory=list)  # as it saw them
    learned: set[int] = field(default_factory=set)  # study trials whose answer is in `known`
    noises: list[NoiseEstimate] = field(default_factory=list)

    def score(self, k: Known) -> objective.Score:
        return self.scorer.score(k.value, k.ci_half, k.cfg, k.energy)

    def feed(self, number: int | None, value: float | None) -> None:
        """One measured probe's score to the convergence rule, kept so that a revised figure
        (`pool_baseline`) can be fed again in its place."""
        self.fed.append((number, value))
        self.convergence.update(value)

    def add(self, key: tuple, known: Known) -> None:
        """A config answered here; one that ran out of memory rules out larger batches."""
        self.known[key] = known
        if known.outcome == Outcome.OOM:
            self.ooms.append(dict(known.cfg))

    def learn(self, t: studies.FrozenTrial) -> tuple | None:
        """Take a finished trial's answer into `known`; its key, or None when it has none."""
        if not t.state.is_finished():
            return None  # still running (here or in another tuner): not an answer yet
        self.learned.add(t.number)
        noise = NoiseEstimate.from_dict(studies.attrs_of(t).noise)
        if noise is not None:  # a resumed run (or another tuner) measured B_noise
            self.noises.append(noise)
        known = Known.of_trial(t)
        if known is None:
            return None
        key = self.space.key(known.cfg)
        self.add(key, known)
        return key

    def rebuild(self, trials: list[studies.FrozenTrial]) -> None:
        """What the study already knows (a resumed run): no finished trial is measured again."""
        for t in trials:
            key = self.learn(t)
            if key is not None and not studies.attrs_of(t).baseline:
                self.measured += 1
                k = self.known[key]
                self.feed(k.number, self.score(k).value if k.outcome.usable else None)

    def blocked_count(self) -> int:
        """Configs of the space ruled out by an OOM and not measured."""
        sp = self.space
        return sum(1 for cfg in sp.configs()
                   if sp.key(cfg) not in self.known and search_rules.oom_blocks(cfg, self.ooms))

    def pool_baseline(self, measured: spread.ProcessSpread,
                      revised: dict[int, float]) -> None:
        """From its second process on, the script's own config stands at the mean of its two
        figures wherever the search judges a move against it: the batch walk, the joined moves,
        the confirmation's candidates and the pruner's bar (``revised``: trial number -> the
        lower end of its interval). Its interval is at least half their difference: two
        processes cannot say more. (The study keeps the first figure as the trial's value,
        which Optuna never changes; its sampler sees that one.) A first figure that was a lucky
        high no longer hides a real gain: nanoGPT's shape read 202.6 then 179.0 samples/s, and
        a move 5% above their mean stood 1% below the first."""
        key = self.space.key(self.space.baseline)
        k = self.known.get(key)
        if k is None or measured.first is None or measured.second is None:
            return
        a, b = measured.first, measured.second
        value = (a.samples_per_s + b.samples_per_s) / 2
        ci_half = max(math.hypot(a.ci_half, b.ci_half) / 2,
                      abs(a.samples_per_s - b.samples_per_s) / 2)
        pooled = dataclasses.replace(k, value=value, ci_half=ci_half)
        self.known[key] = pooled
        score = self.score(pooled)
        revised[k.number] = score.value - score.ci_half
        # the convergence rule counts gains over the mean too: nanoGPT's shape read its
        # baseline at 144.0 then 129.7, and a batch at 144.5 (+5.6% on the mean) counted as no
        # gain over the first; the search converged six probes in with most of its budget left
        self.convergence = search_rules.Convergence()
        self.fed = [(n, score.value if n == k.number else v) for n, v in self.fed]
        for _, v in self.fed:
            self.convergence.update(v)
