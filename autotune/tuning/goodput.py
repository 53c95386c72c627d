"""Goodput: throughput times statistical efficiency, from the gradient noise scale. Pure.

The noise scale ``B_noise`` is measured by the probes (`autotune.measuring.noise`: McCandlish
et al. 2018, appendix A, from each data-parallel rank's gradient and the ranks' average; a
probe's ``TrialResult.noise``). At one rank a step has no second batch: the search takes the
noise scale from a data-parallel trial of the same study (the tuner's two-rank probe).

Pollux (Qiao et al., OSDI'21) scores a batch size M by its statistical efficiency against the
batch M0 the script was tuned for, ``(B_noise + M0) / (B_noise + M)``: a sample at a batch far
above the noise scale teaches less. Goodput is throughput times that efficiency.
"""

from __future__ import annotations

from autotune.measuring.noise import NoiseScale

__all__ = ["NoiseScale", "efficiency", "goodput"]  # NoiseScale: measured, kept here too


def efficiency(batch: float, batch0: float, noise_scale: float) -> float:
    """Pollux's statistical efficiency of a global batch ``batch`` against ``batch0``."""
    return (noise_scale + batch0) / (noise_scale + batch)


def goodput(samples_per_s: float, batch: float, batch0: float, noise_scale: float) -> float:
    """Throughput in samples that teach as much as ``batch0``'s would."""
    return samples_per_s * efficiency(batch, batch0, noise_scale)
