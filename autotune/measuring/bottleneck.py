"""AccDP's bottleneck analysis (seed 000) as a pure function of three probe results.

``synthetic`` replays cached batches (no input pipeline): the compute ceiling. ``io`` drains the
loader without training: the input ceiling. The bound is the lower of the two; ``full`` against
the bound says how much is left on the table and which side to work on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from probes.protocol import Mode

NOISE_REL = 0.10  # differences under this are within the machine's noise


@dataclass(frozen=True)
class Verdict:
    bottleneck: str  # "io" | "compute" | "balanced" | "unknown"
    bound_samples_per_s: float
    full_share_of_bound: float  # full / bound
    text: str

    def to_dict(self) -> dict:
        """As ``probe.json``, the ``probe_verdict`` event and a recipe hold it."""
        return {"bottleneck": self.bottleneck, "bound_samples_per_s": self.bound_samples_per_s,
                "full_share_of_bound": self.full_share_of_bound, "text": self.text}


def decide(full: float | None, synthetic: float | None, io: float | None,
           parts=None, why_none: Mapping[Mode, str] | None = None) -> Verdict:
    """Verdict from the three throughputs (None or 0 where a mode failed); ``parts``, the full
    mode's `autotune.measuring.breakdown.Breakdown`, names the share that binds; ``why_none``,
    per mode that gave nothing, how its probe ended (its outcome, reason and log)."""
    if not synthetic or not io:
        why_none = why_none or {}
        missing = [m.value + (f" ({why_none[m]})" if why_none.get(m) else "")
                   for m, v in ((Mode.SYNTHETIC, synthetic), (Mode.IO, io)) if not v]
        return Verdict("unknown", 0.0, 0.0,
                       f"no verdict: the {' and '.join(missing)} probe gave no throughput"
                       + (f"; {parts.advice()}" if parts is not None else ""))
    bound = min(synthetic, io)
    share = (full or 0.0) / bound
    ratio = io / synthetic
    if abs(ratio - 1) <= NOISE_REL:
        kind = "balanced"
        head = (f"balanced: input ({io:.1f}/s) and compute ({synthetic:.1f}/s) ceilings are "
                f"within noise of each other")
    elif io < synthetic:
        kind = "io"
        head = (f"I/O-bound: the input pipeline delivers {io:.1f} samples/s, the model could "
                f"train on {synthetic:.1f}/s ({synthetic / io:.1f}x); more DataLoader workers or "
                f"cheaper decoding should help")
    else:
        kind = "compute"
        head = (f"compute-bound: the model trains at most {synthetic:.1f} samples/s, the input "
                f"could feed {io:.1f}/s ({io / synthetic:.1f}x); threads, batch size or more "
                f"instances should help")
    tail = (f"; full run reaches {share:.0%} of the bound ({bound:.1f}/s)" if full
            else "; the full probe gave no throughput")
    if parts is not None:
        tail += f"; {parts.advice()}"
    return Verdict(kind, bound, share, head + tail)
