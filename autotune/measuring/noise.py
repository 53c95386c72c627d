"""The gradient noise scale of a probe, from its data-parallel ranks' gradient norms. Pure.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", appendix A): the squared
norm of a gradient averaged over a batch of B samples has expectation ``|G|^2 + S / B``, where G
is the true gradient and S the trace of the per-sample gradients' covariance. Two batch sizes
give both unknowns. Data-parallel training has them in every step: each rank's local gradient
is a batch of ``b`` samples, their average (what allreduce returns) a batch of ``n x b``.
Per step,

    |G|^2 ~ (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
    S     ~ (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)

with ``|g_small|^2`` the mean of the ranks' local squared norms. Each is unbiased and very
noisy; their means over many steps are divided (the ratio of means, as the paper does, not the
mean of ratios) to give the noise scale ``B_noise = S / |G|^2``.

The meters (`probes.noise`) send, with every tick, each rank's cumulative sums of
``|g_local|^2`` and ``|g_avg|^2`` over the steps they counted, the steps and the samples the
local gradients were taken over. `fold` takes what each rank's sums grew by over the probe's
measured span: ``|g_small|^2`` is the mean over ranks of their local sums per step, ``|g_big|^2``
the same of the averaged one (equal on every rank but for the span's edges), ``B_small`` the
rank's batch (its samples per step, else the samples per step the trial knows from the
script's arguments) and ``B_big`` the world's. The estimates are linear in the norms, so the
sums' means give the same ratio of means as adding the steps one by one.

At one rank there is no second batch inside a step: the result says so, and the search takes
the noise scale from a data-parallel trial of the same study (the tuner's two-rank probe
measures one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from probes.protocol import NOISE_FIELDS, Mode

NoisePoints = list[tuple[float, Mapping[str, float]]]  # (controller time, cumulative sums)

ONE_RANK = ("one rank: no second batch inside a step (the noise scale compares each rank's "
            "gradient with the ranks' average); the search takes it from a data-parallel "
            "trial of the same study, such as the tuner's two-rank probe")


@dataclass
class NoiseScale:
    """Running sums of the two per-step estimates; `value` is their ratio."""

    g2_sum: float = 0.0  # sum of per-step |G|^2 estimates
    s_sum: float = 0.0  # sum of per-step S estimates
    steps: int = 0

    def add(self, small_sq: float, big_sq: float, b_small: float, b_big: float, *,
            steps: int = 1) -> None:
        """``steps`` steps whose mean squared norm of gradients over ``b_small`` samples is
        ``small_sq`` and whose squared norm of their average over ``b_big`` samples is
        ``big_sq`` (``b_big > b_small``)."""
        if b_big <= b_small:
            raise ValueError(f"the large batch ({b_big}) must exceed the small one ({b_small})")
        self.g2_sum += steps * (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        self.s_sum += steps * (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        self.steps += steps

    @property
    def grad_sq(self) -> float | None:
        """The mean |G|^2 estimate per step."""
        return self.g2_sum / self.steps if self.steps else None

    @property
    def trace_cov(self) -> float | None:
        """The mean S estimate per step."""
        return self.s_sum / self.steps if self.steps else None

    @property
    def value(self) -> float | None:
        """B_noise = S / |G|^2, None until the sums say something (|G|^2 <= 0 is noise)."""
        if self.steps == 0 or self.g2_sum <= 0 or self.s_sum <= 0:
            return None
        return self.s_sum / self.g2_sum


@dataclass(frozen=True)
class NoiseEstimate:
    """A probe's noise scale (None with the reason when it could not be told)."""

    noise_scale: float | None
    steps: int = 0  # steps per rank the estimate stands on
    b_small: int = 0  # one rank's batch
    b_big: int = 0  # the world's: b_small x ranks
    ranks: int = 0
    grad_sq: float | None = None  # |G|^2, per step
    trace_cov: float | None = None  # S, the per-sample gradients' covariance trace
    skipped: int = 0  # per rank: synchronised backward passes not counted (not one batch's)
    reason: str = ""

    def to_dict(self) -> dict:
        d = {"noise_scale": self.noise_scale, "steps": self.steps, "b_small": self.b_small,
             "b_big": self.b_big, "ranks": self.ranks, "grad_sq": self.grad_sq,
             "trace_cov": self.trace_cov, "skipped": self.skipped}
        if self.reason:
            d["reason"] = self.reason
        return d

    @classmethod
    def from_dict(cls, d: Mapping | None) -> NoiseEstimate | None:
        """From `to_dict`'s shape (the journal, a study, ``tune.json``); None for none."""
        if not d:
            return None

        def number(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) else None

        return cls(number("noise_scale"), int(d.get("steps") or 0), int(d.get("b_small") or 0),
                   int(d.get("b_big") or 0), int(d.get("ranks") or 0), number("grad_sq"),
                   number("trace_cov"), int(d.get("skipped") or 0), str(d.get("reason") or ""))

    @property
    def measured(self) -> bool:
        """A positive noise scale was told."""
        return self.noise_scale is not None and self.noise_scale > 0

    def describe(self) -> str:
        """The gradient noise scale and what it stands on, or why there is none."""
        if self.noise_scale is None:
            return self.reason or "not measured"
        text = (f"B_noise {self.noise_scale:.3g} samples (from {self.steps} steps, {self.ranks} "
                f"ranks x {self.b_small} = {self.b_big} per step)")
        return text + (f"; {self.skipped} accumulated backward passes not counted"
                       if self.skipped else "")


def _zero() -> dict[str, float]:
    return dict.fromkeys(NOISE_FIELDS, 0.0)


def _grown(points: NoisePoints, start_t: float, end_t: float) -> dict[str, float] | None:
    """What a rank's sums grew by over the span: from its latest tick at or before ``start_t``
    (none yet: nothing counted, all zero) to its latest at or before ``end_t``."""
    pts = sorted(points, key=lambda p: p[0])
    before = [sums for t, sums in pts if t <= start_t]
    upto = [sums for t, sums in pts if t <= end_t]
    if not upto:
        return None
    a, b = (before[-1] if before else _zero()), upto[-1]
    return {k: float(b.get(k, 0.0)) - float(a.get(k, 0.0)) for k in NOISE_FIELDS}


def _per_rank(counts: Sequence[float]) -> int:
    return round(sum(counts) / len(counts)) if counts else 0


def fold(per_rank: Sequence[NoisePoints], start_t: float, end_t: float, *, world_size: int,
         samples_per_step: int | None = None, mode: Mode = Mode.FULL) -> NoiseEstimate:
    """The noise scale over ``[start_t, end_t]`` (the probe's measured span, controller clock)
    from each rank's cumulative sums (`probes.protocol.TICK_NOISE`)."""
    if world_size <= 1:
        return NoiseEstimate(None, ranks=1, reason=ONE_RANK)
    if mode is not Mode.FULL:
        return NoiseEstimate(None, ranks=world_size, reason=(
            f"{mode.value} mode: " + ("the same few batches replayed are not the data's noise"
                                      if mode is Mode.SYNTHETIC else "nothing trains")))
    reporting = [pts for pts in per_rank if pts]
    if not reporting:
        return NoiseEstimate(None, ranks=world_size, reason=(
            "no rank sent gradient norms: no DistributedDataParallel gradient went through "
            "autotune's communication hook (another data-parallel wrapper, or DDP's built-in "
            "C++ hook, trains unmeasured)"))
    if len(reporting) < world_size:
        return NoiseEstimate(None, ranks=world_size, reason=(
            f"only {len(reporting)} of {world_size} ranks sent gradient norms"))
    grown = [_grown(pts, start_t, end_t) for pts in reporting]
    if any(g is None or g["steps"] < 1 for g in grown):
        skipped = _per_rank([g["skipped"] for g in grown if g is not None])
        why = (f"; {skipped} synchronised backward passes added to an earlier one's gradient "
               f"(accumulation with an allreduce each time) and were not counted"
               if skipped else "")
        return NoiseEstimate(None, ranks=world_size, skipped=skipped,
                             reason="no rank counted a step within the measured span" + why)
    batches = [g["samples"] / g["steps"] if g["samples"] > 0 else samples_per_step
               for g in grown]
    if any(not b for b in batches):
        return NoiseEstimate(None, ranks=world_size, reason=(
            "a rank's batch size is unknown (no DataLoader batch was counted): pass "
            "--samples-per-step N, or put {batch_size} in the script's arguments"))
    b_small = sum(batches) / len(batches)
    b_big = sum(batches)
    small = sum(g["local_sq"] / g["steps"] for g in grown) / len(grown)
    big = sum(g["avg_sq"] / g["steps"] for g in grown) / len(grown)
    steps = _per_rank([g["steps"] for g in grown])
    est = NoiseScale()
    est.add(small, big, b_small, b_big, steps=steps)
    skipped = _per_rank([g["skipped"] for g in grown])
    reason = "" if est.value is not None else (
        f"the {steps} steps measured give no positive estimate (|G|^2 {est.grad_sq:.3g}, "
        f"S {est.trace_cov:.3g}): the true gradient is small beside its noise at this batch; "
        f"a longer probe, or larger batches, would tell")
    return NoiseEstimate(est.value, steps=steps, b_small=round(b_small), b_big=round(b_big),
                         ranks=world_size, grad_sq=est.grad_sq, trace_cov=est.trace_cov,
                         skipped=skipped, reason=reason)
