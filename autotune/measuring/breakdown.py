"""Where a probe's time went: each part of a step as a share of wall time, with an interval. Pure.

The meters send cumulative seconds per part (`probes.parts`: data, forward, backward, comm,
optimizer) with every tick. Over the span the throughput estimate stands on, a part's share is
what it grew by over the span's length, per rank, averaged over ranks; "other" is the rest of
the wall clock (``zero_grad``, logging, checkpoints, the script's own code between steps). The
interval comes from the same span cut into windows, by batch means (`steady.batch_means_ci`),
as the throughput's does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.measuring import steady
from probes import protocol
from probes.protocol import PARTS

ALL_PARTS = (*PARTS, "other")
LABELS = {"data": "data wait", "forward": "forward", "backward": "backward",
          "comm": "exposed comm", "optimizer": "optimizer", "other": "other"}
MIN_WINDOWS = 4
# What binds, in the terms a user acts on: the parts grouped, and the knobs that move each group
# (first the ones a search should try first).
GROUPS = {"data": ("data",), "comm": ("comm",), "compute": ("forward", "backward", "optimizer"),
          "other": ("other",)}
MOVES = {"data": ("workers", "batch_size"), "comm": ("bucket_mb", "instances"),
         "compute": ("thread_pct", "batch_size", "instances"), "other": ()}
ADVICE = {"data": "more DataLoader workers, so that loading overlaps compute",
          "comm": "a larger DDP bucket (fewer, larger allreduces) or fewer ranks",
          "compute": "threads, batch size or more instances",
          "other": "the script's own work between steps (logging, checkpoints), which no knob "
                   "here moves"}
DATA_WORTH = 0.15  # a data wait this large is named even when compute binds
# Knobs whose whole gain is the time of one group: more DataLoader workers can take back the
# data wait and nothing else (they only move loading off the training loop; on CPU they also
# take cores from it).
ONLY_MOVES = {"workers": "data"}

PartPoints = list[tuple[float, Mapping[str, float]]]  # (controller time, cumulative seconds)


@dataclass(frozen=True)
class Breakdown:
    """Shares of wall time by part of a step, each with its 95% half-width."""

    shares: Mapping[str, tuple[float, float]]
    ranks: int
    clock: str = "host"  # or "cuda-events": the device's time between events (`probes.parts`)

    def share(self, part: str) -> float:
        return self.shares.get(part, (0.0, 0.0))[0]

    def binding(self) -> str:
        """The part that takes most of the time."""
        return max(self.shares, key=lambda p: self.shares[p][0])

    def describe(self) -> str:
        text = ", ".join(f"{LABELS[p]} {s:.0%} ±{h * 100:.0f}" for p, (s, h) in
                         self.shares.items() if s >= 0.005 or p in ("data", "other"))
        return text + (" (GPU time from CUDA events)" if self.clock != "host" else "")

    def group(self, name: str) -> float:
        return sum(self.share(p) for p in GROUPS[name])

    def binding_group(self) -> str:
        """What takes most of the time: data, comm, compute or other."""
        return max(GROUPS, key=self.group)

    def most_gain(self, knob: str) -> float | None:
        """The most moving ``knob`` can speed a step up (0.02: 2%), when it acts on one group
        only (`ONLY_MOVES`): that group's time taken back whole, at the upper end of its share's
        interval; None for a knob that acts on more."""
        group = ONLY_MOVES.get(knob)
        if group is None:
            return None
        parts = [self.shares.get(p, (0.0, 0.0)) for p in GROUPS[group]]
        top = min(sum(s for s, _ in parts) + math.sqrt(sum(h * h for _, h in parts)), 1.0)
        return math.inf if top >= 1.0 else top / (1.0 - top)

    def moves(self) -> tuple[str, ...]:
        """The knobs worth moving first, for what binds (a data wait worth naming first)."""
        first = ("data",) if self.group("data") >= DATA_WORTH else ()
        out: list[str] = []
        for g in (*first, self.binding_group()):
            out += [k for k in MOVES[g] if k not in out]
        return tuple(out)

    def advice(self) -> str:
        """The share that binds and what moves it, in one clause."""
        g = self.binding_group()
        text = (f"{_group_label(g)} takes {self.group(g):.0%} of each step: "
                f"{ADVICE[g]} should move it")
        if g != "data" and self.group("data") >= DATA_WORTH:
            text += (f"; {self.group('data'):.0%} waits for data: {ADVICE['data']}")
        return text

    def short(self) -> str:
        """The parts that take a tenth of the time or more, largest first."""
        big = sorted((p for p, (s, _) in self.shares.items() if s >= 0.1),
                     key=lambda p: -self.shares[p][0])
        return ", ".join(f"{LABELS[p]} {self.shares[p][0]:.0%}" for p in big)

    def rounded_shares(self) -> dict[str, tuple[float, float]]:
        """The shares as they are written (the journal, a recipe): four decimals."""
        return {p: (round(s, 4), round(h, 4)) for p, (s, h) in self.shares.items()}

    def to_dict(self) -> dict:
        return {"shares": {p: list(sh) for p, sh in self.rounded_shares().items()},
                "ranks": self.ranks, "clock": self.clock}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> Breakdown | None:
        if not d or not d.get("shares"):
            return None
        return cls({p: (float(v[0]), float(v[1])) for p, v in d["shares"].items()},
                   int(d.get("ranks", 1)), str(d.get("clock", "host")))


@dataclass
class PartTrail:
    """One rank's cumulative part times as its ticks bring them, on the controller's clock
    (a probe and the full run alike). When the meter's sums switch clocks (host to CUDA
    events, `probes.parts`), the trail starts over: the two do not add up."""

    points: PartPoints = field(default_factory=list)
    clock: str = "host"

    def add(self, msg: Mapping, t: float) -> None:
        """Take one tick ``msg`` received at ``t`` (controller time); one without part times
        adds nothing."""
        parts = msg.get(protocol.TICK_PARTS)
        if not isinstance(parts, dict):
            return
        clock = msg.get(protocol.TICK_PARTS_CLOCK, "host")
        if clock != self.clock:
            self.points, self.clock = [], clock
        self.points.append((t, parts))


def from_trails(trails: Sequence[PartTrail], start_t: float, end_t: float, *,
                windows: int) -> Breakdown | None:
    """`from_ticks` over the ranks' trails, on the device's clock where any rank has it."""
    clock = next((tr.clock for tr in trails if tr.clock != "host"), "host")
    return from_ticks([tr.points for tr in trails], start_t, end_t, windows=windows, clock=clock)


def _window_shares(points: PartPoints, edges: Sequence[float]) -> list[dict[str, float]]:
    """Per window between consecutive ``edges``: each part's share of the window."""
    series = {p: [(t, parts.get(p, 0.0)) for t, parts in points] for p in PARTS}
    out = []
    for a, b in zip(edges, edges[1:]):
        w = {p: (steady.interp(series[p], b) - steady.interp(series[p], a)) / (b - a)
             for p in PARTS}
        w["other"] = max(0.0, 1.0 - sum(w.values()))
        out.append(w)
    return out


def from_ticks(per_rank: Sequence[PartPoints], start_t: float, end_t: float, *,
               windows: int, clock: str = "host") -> Breakdown | None:
    """The shares over ``[start_t, end_t]`` (the estimate's span, controller clock), cut into
    ``windows`` for the interval; None when no rank's points cover the span."""
    ranks = [sorted(pts, key=lambda p: p[0]) for pts in per_rank if len(pts) >= 2]
    if not ranks or end_t <= start_t:
        return None
    # the ticks bound what is known: a span they cover less than half of tells nothing
    lo, hi = max(start_t, *(pts[0][0] for pts in ranks)), min(end_t, *(pts[-1][0] for pts in ranks))
    if hi - lo < 0.5 * (end_t - start_t):
        return None
    start_t, end_t = lo, hi
    n = max(windows, MIN_WINDOWS)
    edges = [start_t + (end_t - start_t) * k / n for k in range(n + 1)]
    per = [_window_shares(pts, edges) for pts in ranks]
    shares = {}
    for part in ALL_PARTS:
        xs = [sum(r[k][part] for r in per) / len(per) for k in range(n)]
        whole = [(_at(pts, end_t, part) - _at(pts, start_t, part)) / (end_t - start_t)
                 for pts in ranks] if part != "other" else None
        mean = sum(whole) / len(whole) if whole is not None else sum(xs) / n
        # a part's sum may step back a little between ticks (a two-rank DDP toy's backward
        # read -0.3% over a probe's span, and the recipe holding it could not be read back):
        # a share of wall time is never below 0
        shares[part] = (max(0.0, mean), steady.batch_means_ci(xs))
    rest = max(0.0, 1.0 - sum(shares[p][0] for p in PARTS))
    shares["other"] = (rest, shares["other"][1])
    return Breakdown(shares, len(ranks), clock)


def _at(points: PartPoints, t: float, part: str) -> float:
    return steady.interp([(u, parts.get(part, 0.0)) for u, parts in points], t)


def _group_label(group: str) -> str:
    return {"data": "the data wait", "comm": "exposed communication",
            "compute": "compute (forward, backward, optimizer)", "other": "the rest"}[group]
