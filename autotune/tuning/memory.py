"""Memory by batch size: a line through what the probes measured, and the batches that fit. Pure.

Seed 003 charts memory against batch size: a fixed part (weights, optimizer state, the
framework) and a part that grows with the batch (activations). Fitted by least squares to the
peak memory of one rank at two or more batch sizes, it tells the largest batch that fits, where
one peak scaled in proportion to the batch (all of it taken as growing) would understate it.
The memory is the host's resident set on CPU and ``torch.cuda.max_memory_allocated`` on GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HEADROOM = 0.9  # of the memory available, what a batch may plan to use


@dataclass(frozen=True)
class MemoryFit:
    """Peak memory of one rank = ``fixed_bytes + per_sample_bytes x batch``."""

    fixed_bytes: float
    per_sample_bytes: float
    points: tuple[tuple[int, float], ...]  # (per-rank batch, peak bytes of one rank)
    kind: str  # "host" (resident set) or "gpu" (CUDA allocations)

    @classmethod
    def of(cls, points: Iterable[tuple[int, float]], kind: str) -> MemoryFit | None:
        """Least squares over ``points``; None without two distinct batch sizes. A slope that
        comes out negative (noise over a flat curve) is taken as flat."""
        pts = tuple(sorted((int(b), float(m)) for b, m in points if b > 0 and m > 0))
        if len({b for b, _ in pts}) < 2:
            return None
        n = len(pts)
        mb = sum(b for b, _ in pts) / n
        mm = sum(m for _, m in pts) / n
        sxx = sum((b - mb) ** 2 for b, _ in pts)
        slope = max(0.0, sum((b - mb) * (m - mm) for b, m in pts) / sxx)
        return cls(mm - slope * mb, slope, pts, kind)

    def at(self, batch: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch

    def max_batch(self, available_bytes: float, ranks: int = 1) -> int | None:
        """The largest per-rank batch whose ``ranks`` ranks fit in `HEADROOM` of
        ``available_bytes`` (all of the device's or host's memory the ranks share); None when
        memory does not grow with the batch (no limit from here)."""
        if self.per_sample_bytes <= 0:
            return None
        room = HEADROOM * available_bytes / max(1, ranks) - self.fixed_bytes
        return max(0, int(room // self.per_sample_bytes))

    def describe(self) -> str:
        where = "GPU memory" if self.kind == "gpu" else "host memory"
        return (f"{where} per rank: {_mb(self.fixed_bytes)} + {_mb(self.per_sample_bytes)} per "
                f"sample (fitted to {len(self.points)} probes at batch "
                f"{', '.join(str(b) for b in sorted({b for b, _ in self.points}))})")

    def to_dict(self) -> dict:
        return {"fixed_bytes": self.fixed_bytes, "per_sample_bytes": self.per_sample_bytes,
                "points": [list(p) for p in self.points], "kind": self.kind}

    @classmethod
    def from_dict(cls, d: Mapping) -> MemoryFit:
        return cls(float(d["fixed_bytes"]), float(d["per_sample_bytes"]),
                   tuple((int(b), float(m)) for b, m in d["points"]), str(d["kind"]))


@dataclass(frozen=True)
class MemoryAdvice:
    """A fit, and the largest per-rank batch whose ``ranks`` ranks fit in what is free."""

    fit: MemoryFit
    available_bytes: float  # free on the host (or the GPU) when the tuning ended
    ranks: int
    max_batch: int | None  # None: memory does not grow with the batch

    @classmethod
    def of(cls, fit: MemoryFit, available_bytes: float, ranks: int) -> MemoryAdvice:
        return cls(fit, available_bytes, ranks, fit.max_batch(available_bytes, ranks))

    @property
    def text(self) -> str:
        if self.max_batch is None:
            return f"{self.fit.describe()}; it does not grow with the batch"
        who = f"{self.ranks} ranks" if self.ranks > 1 else "one rank"
        return (f"{self.fit.describe()}; batches up to {self.max_batch} per rank fit {who} in "
                f"{HEADROOM:.0%} of the {self.available_bytes / 2**30:.1f} GB free")

    def to_dict(self) -> dict:
        """The ``memory_fit`` event's fields and ``summary.json``'s ``memory``."""
        return {**self.fit.to_dict(), "available_bytes": self.available_bytes,
                "ranks": self.ranks, "max_batch": self.max_batch, "text": self.text}

    @classmethod
    def from_dict(cls, d: Mapping) -> MemoryAdvice:
        return cls(MemoryFit.from_dict(d), float(d["available_bytes"]), int(d["ranks"]),
                   None if d.get("max_batch") is None else int(d["max_batch"]))


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB" if abs(n) < 2**30 else f"{n / 2**30:.2f} GB"


def rank_points(results: Iterable[tuple[Mapping, object]]) -> tuple[list, str]:
    """(per-rank batch, one rank's peak) from ``(config, TrialResult)`` pairs of measured
    probes, and which memory it is: GPU memory where the probes used CUDA, else the host's."""
    pairs = [(cfg, r) for cfg, r in results
             if cfg.get("batch_size") and getattr(r, "ranks_seen", 0)]
    if any(r.cuda_peak_bytes for _, r in pairs):
        return [(int(cfg["batch_size"]), float(r.cuda_peak_bytes))
                for cfg, r in pairs if r.cuda_peak_bytes], "gpu"
    return [(int(cfg["batch_size"]), r.peak_rss_bytes / r.ranks_seen)
            for cfg, r in pairs if r.peak_rss_bytes], "host"
