"""Goodput: throughput times statistical efficiency, from the gradient noise scale. Pure.

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
mean of ratios) to give the noise scale ``B_noise = S / |G|^2``. At one rank there is no second
batch size inside a step: the same formula then takes two probes of different batch sizes.

Pollux (Qiao et al., OSDI'21) scores a batch size M by its statistical efficiency against the
batch M0 the script was tuned for, ``(B_noise + M0) / (B_noise + M)``: a sample at a batch far
above the noise scale teaches less. Goodput is throughput times that efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class NoiseScale:
    """Running sums of the two per-step estimates; `value` is their ratio."""

    g2_sum: float = 0.0  # sum of per-step |G|^2 estimates
    s_sum: float = 0.0  # sum of per-step S estimates
    steps: int = 0

    def add(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> None:
        """One step: the mean squared norm of gradients over ``b_small`` samples, and the
        squared norm of their average over ``b_big`` samples (``b_big > b_small``)."""
        if b_big <= b_small:
            raise ValueError(f"the large batch ({b_big}) must exceed the small one ({b_small})")
        self.g2_sum += (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        self.s_sum += (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        self.steps += 1

    @property
    def value(self) -> float | None:
        """B_noise = S / |G|^2, None until the sums say something (|G|^2 <= 0 is noise)."""
        if self.steps == 0 or self.g2_sum <= 0 or self.s_sum <= 0:
            return None
        return self.s_sum / self.g2_sum


def efficiency(batch: float, batch0: float, noise_scale: float) -> float:
    """Pollux's statistical efficiency of a global batch ``batch`` against ``batch0``."""
    return (noise_scale + batch0) / (noise_scale + batch)


def goodput(samples_per_s: float, batch: float, batch0: float, noise_scale: float) -> float:
    """Throughput in samples that teach as much as ``batch0``'s would."""
    return samples_per_s * efficiency(batch, batch0, noise_scale)
