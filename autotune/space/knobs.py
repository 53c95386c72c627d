"""The knob table: what each knob means per device kind, and its default candidates.

A device kind other than ``cpu`` (GPUs, issue 4) adds its own row per knob in `DOMAIN_RULES`
and its meaning in `Knob.meaning`, without touching the rest. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

ORDER = ("batch_size", "workers", "thread_pct", "instances", "bucket_mb")
ALIASES = {"threads": "thread_pct"}  # --space/--fix may give threads per rank instead of a share
BUCKET_MB = (1, 5, 10, 25, 50, 100)
DDP_DEFAULT_BUCKET_MB = 25
MEMORY_HEADROOM = 0.7  # share of available memory a batch-size guess may plan to use


@dataclass(frozen=True)
class Knob:
    """One system knob: what it is, per device kind, and its conventional default."""

    name: str
    help: str
    scale: str  # "geometric" (powers of two) or "linear"
    conventional: int  # baseline value when the script's own is unknown (placeholders)
    meaning: Mapping[str, str]  # device kind -> what the knob does there


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("batch_size", "per-rank batch size", "geometric", 32,
         {"cpu": "per-rank DataLoader batch size"}),
    Knob("workers", "DataLoader worker processes", "linear", 0,
         {"cpu": "DataLoader num_workers per rank"}),
    Knob("thread_pct", "share of the host's cores per rank, in %", "linear", 100,
         {"cpu": "torch/OpenMP threads per rank = max(1, cores x pct / 100)"}),
    Knob("instances", "data-parallel ranks per host", "linear", 1,
         {"cpu": "ranks per host, torchrun-style env, gloo"}),
    Knob("bucket_mb", "DDP gradient bucket size, MB", "geometric", DDP_DEFAULT_BUCKET_MB,
         {"cpu": "DDP bucket_cap_mb (gloo)"}),
)}


@dataclass(frozen=True)
class Machine:
    """What the space needs to know about the host."""

    cores: int
    mem_available_bytes: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class Baseline:
    """What the script uses by itself, from the baseline probe (None: unknown or absent)."""

    batch_size: int | None = None
    workers: int | None = None
    threads: int | None = None  # None: torch's default, all cores
    distributed: bool = False  # the script initialised torch.distributed
    bucket_mb: float | None = None
    peak_rss_bytes: int = 0

    @classmethod
    def from_seen(cls, seen: Mapping, *, peak_rss_bytes: int = 0,
                  placeholder_values: Mapping[str, int] = ()) -> Baseline:
        """From `TrialResult.seen`; placeholder values win (the script saw those)."""
        given = dict(placeholder_values)
        threads = seen.get("threads")
        return cls(batch_size=_int_or_none(given.get("batch_size", seen.get("batch_size"))),
                   workers=_int_or_none(given.get("workers", seen.get("workers"))),
                   threads=_int_or_none(given.get("threads", threads)),
                   distributed=bool(seen.get("backend")),
                   bucket_mb=seen.get("bucket_mb"), peak_rss_bytes=int(peak_rss_bytes or 0))


def _int_or_none(v) -> int | None:
    return None if v is None or isinstance(v, bool) else int(v)


# -- thread share -----------------------------------------------------------------------------
def threads_per_rank(thread_pct: float, cores: int) -> int:
    """Threads for one rank holding ``thread_pct`` % of ``cores``: max(1, cores x pct / 100)."""
    return max(1, round(cores * thread_pct / 100))


def pct_for_threads(threads: int, cores: int) -> int:
    return max(1, round(100 * threads / cores))


# -- candidate lists --------------------------------------------------------------------------
def geometric(lo: int, hi: int) -> tuple[int, ...]:
    """Powers of two strictly inside [lo, hi], plus both ends."""
    values = {lo, hi}
    p = 1
    while p < hi:
        if p > lo:
            values.add(p)
        p *= 2
    return tuple(sorted(values))


def linear(lo: int, hi: int, *, most: int = 9) -> tuple[int, ...]:
    """Every int in [lo, hi]; beyond ``most`` values, the ends and the powers of two between."""
    if hi - lo + 1 <= most:
        return tuple(range(lo, hi + 1))
    return geometric(lo, hi)


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _with(values: Iterable[int], extra: int | None) -> tuple[int, ...]:
    out = set(values)
    if extra is not None:
        out.add(int(extra))
    return tuple(sorted(out))


def _cpu_batch_size(m: Machine, b: Baseline) -> tuple[int, ...]:
    base = b.batch_size
    if base is None:
        return ()
    hi = base * 8
    if b.peak_rss_bytes and m.mem_available_bytes:
        # Pessimistic: memory grows in proportion to the batch.
        hi = min(hi, max(base, int(base * MEMORY_HEADROOM * m.mem_available_bytes
                                   / b.peak_rss_bytes)))
    return _with(geometric(max(1, base // 4), hi), base)


def _cpu_workers(m: Machine, b: Baseline) -> tuple[int, ...]:
    if b.workers is None:
        return ()
    return _with(linear(0, min(m.cores, 8)), b.workers)


def _cpu_thread_pct(m: Machine, b: Baseline) -> tuple[int, ...]:
    counts = set(geometric(1, m.cores))
    if b.threads:
        counts.add(min(b.threads, m.cores))
    return tuple(sorted({pct_for_threads(t, m.cores) for t in counts}))


def _cpu_instances(m: Machine, b: Baseline) -> tuple[int, ...]:
    return linear(1, max(1, min(m.cores, 4))) if b.distributed else (1,)


def _cpu_bucket_mb(m: Machine, b: Baseline) -> tuple[int, ...]:
    return _with(BUCKET_MB, int(b.bucket_mb) if b.bucket_mb else None)


# (knob, device kind) -> default candidates. A new device kind adds its rows here.
DOMAIN_RULES: dict[tuple[str, str], Callable[[Machine, Baseline], tuple[int, ...]]] = {
    ("batch_size", "cpu"): _cpu_batch_size,
    ("workers", "cpu"): _cpu_workers,
    ("thread_pct", "cpu"): _cpu_thread_pct,
    ("instances", "cpu"): _cpu_instances,
    ("bucket_mb", "cpu"): _cpu_bucket_mb,
}


def _cpu_balanced(domains: Mapping[str, tuple[int, ...]], baseline: Mapping[str, int],
                  cores: int) -> list[dict[str, int]]:
    """Loader workers and compute threads splitting the cores between them.

    On CPU both draw on the same cores, and oversubscription is what hurts most (one busy
    extra process made a 2-thread config 10-14x slower here): a config where workers plus
    threads fill the cores, no more, is worth measuring early.
    """
    if "workers" not in domains or "thread_pct" not in domains or cores < 2:
        return []
    per_rank = max(1, cores // max(1, baseline.get("instances", 1)))
    workers = [w for w in domains["workers"] if 1 <= w <= per_rank // 2]
    if not workers:
        return []
    w = max(workers)
    pct = pct_for_threads(per_rank - w, cores)
    nearest = min(domains["thread_pct"], key=lambda v: (abs(v - pct), v))
    return [{"workers": w, "thread_pct": nearest}]


# device kind -> extra starting configs (changes to the baseline) worth measuring first.
DESIGN_RULES: dict[str, Callable[[Mapping[str, tuple[int, ...]], Mapping[str, int], int],
                                 list[dict[str, int]]]] = {
    "cpu": _cpu_balanced,
}
