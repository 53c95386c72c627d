"""The knob table: what each knob means per device kind, and its default candidates.

Each device kind (``cpu``, ``gpu``) has its own row per knob in `DOMAIN_RULES` and its meaning
in `Knob.meaning` (DESIGN.md, "The knobs"). On GPUs ``instances`` is MPS clients per GPU and
``thread_pct`` each client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; `autotune.launching.placement` turns
them into ranks and environment. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from autotune.hardware.host import Machine
from autotune.launching import placement

ORDER = ("batch_size", "workers", "thread_pct", "instances", "bucket_mb", "prefetch",
         "persistent", "pin_memory", "host_threads", "pin")
# DataLoader knobs torch takes only with workers: without, they have no effect (dropped)
WITH_WORKERS = ("prefetch", "persistent")
PREFETCH = (2, 4, 8)  # batches each worker loads ahead; torch's default is 2
ALIASES = {"threads": "thread_pct"}  # --space/--fix may give threads per rank instead of a share
BUCKET_MB = (1, 5, 10, 25, 50, 100)
DDP_DEFAULT_BUCKET_MB = placement.DDP_DEFAULT_BUCKET_MB
# MPS shares per client: few, since the search has few probes; AccDP's wins came at 2-4 clients
# of ~30% each.
GPU_THREAD_PCT = (25, 50, 75, 100)
GPU_MAX_INSTANCES = 4
# Host threads per GPU rank: 0 is the rule (torchrun's: one each when a host has several ranks,
# torch's own for one), the others a count. Peers that co-locate ranks under MPS found the host
# side decides as much as the GPU's: ranks need their own cores (`pin`), and threads to use them.
GPU_HOST_THREADS = (0, 2, 4)
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
         {"cpu": "per-rank DataLoader batch size", "gpu": "per-rank DataLoader batch size"}),
    Knob("workers", "DataLoader worker processes", "linear", 0,
         {"cpu": "DataLoader num_workers per rank", "gpu": "DataLoader num_workers per rank"}),
    Knob("thread_pct", "each rank's share of its device, in %", "linear", 100,
         {"cpu": "torch/OpenMP threads per rank = max(1, cores x pct / 100)",
          "gpu": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each rank (MPS client)"}),
    Knob("instances", "data-parallel ranks per host or per GPU", "linear", 1,
         {"cpu": "ranks per host, torchrun-style env, gloo",
          "gpu": "ranks (MPS clients) per GPU; co-located ranks use gloo"}),
    Knob("bucket_mb", "DDP gradient bucket size, MB", "geometric", DDP_DEFAULT_BUCKET_MB,
         {"cpu": "DDP bucket_cap_mb (gloo)",
          "gpu": "DDP bucket_cap_mb, HOROVOD_FUSION_THRESHOLD"}),
    Knob("prefetch", "batches each DataLoader worker loads ahead", "geometric", 2,
         {"cpu": "DataLoader prefetch_factor (with workers)",
          "gpu": "DataLoader prefetch_factor (with workers)"}),
    Knob("persistent", "DataLoader workers kept between epochs (0 or 1)", "linear", 0,
         {"cpu": "DataLoader persistent_workers (with workers)",
          "gpu": "DataLoader persistent_workers (with workers)"}),
    Knob("pin_memory", "batches in page-locked host memory (0 or 1)", "linear", 0,
         {"gpu": "DataLoader pin_memory: faster, asynchronous copies to the GPU"}),
    Knob("host_threads", "torch/OpenMP threads of each GPU rank (0: torchrun's rule)", "linear",
         0, {"gpu": "OMP_NUM_THREADS and the like per rank; 0: one each when a host has "
                    "several ranks (torchrun's rule), torch's own for one"}),
    Knob("pin", "each rank on cores of its own (0 or 1)", "linear", 0,
         {"cpu": "disjoint cores per rank (its DataLoader workers inherit them)",
          "gpu": "disjoint cores per rank: the host's cores split evenly over its ranks"}),
)}


def knobs_text(knobs: Mapping | None) -> str:
    """``batch_size=64 workers=2``: a config as a person reads it, in its own order; a float
    without trailing zeros; ``(script defaults)`` for no knobs."""
    if not knobs:
        return "(script defaults)"
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in knobs.items())


@dataclass(frozen=True)
class Baseline:
    """What the script uses by itself, from the baseline probe (None: unknown or absent)."""

    batch_size: int | None = None
    workers: int | None = None
    threads: int | None = None  # None: torch's default, all cores
    distributed: bool = False  # the script initialised torch.distributed
    own_ranks: bool = False  # ...in processes it started itself (torch.multiprocessing.spawn)
    own_world: int = 0  # ...and how many: torch's world size (Lightning's devices=2: 2); 0: none
    bucket_mb: float | None = None
    peak_rss_bytes: int = 0
    cuda_peak_bytes: int = 0  # the largest rank's torch.cuda.max_memory_allocated; 0: no CUDA
    alone_why: str = ""  # not distributed: what showed it (a two-rank probe), for the note
    prefetch: int | None = None  # the first DataLoader's prefetch_factor (with workers)
    persistent: int | None = None  # ...its persistent_workers, 0 or 1
    pin_memory: int | None = None  # ...its pin_memory, 0 or 1

    @classmethod
    def from_seen(cls, seen: Mapping, *, peak_rss_bytes: int = 0, cuda_peak_bytes: int = 0,
                  placeholder_values: Mapping[str, int] = ()) -> Baseline:
        """From `TrialResult.seen`; placeholder values win (the script saw those)."""
        given = dict(placeholder_values)
        threads = seen.get("threads")
        own = bool(seen.get("backend") and seen.get("started_by_script"))
        return cls(batch_size=_int_or_none(given.get("batch_size", seen.get("batch_size"))),
                   workers=_int_or_none(given.get("workers", seen.get("workers"))),
                   threads=_int_or_none(given.get("threads", threads)),
                   distributed=bool(seen.get("backend")),
                   own_ranks=own, own_world=int(seen.get("world_size") or 0) if own else 0,
                   bucket_mb=seen.get("bucket_mb"), peak_rss_bytes=int(peak_rss_bytes or 0),
                   cuda_peak_bytes=int(cuda_peak_bytes or 0),
                   prefetch=_int_or_none(given.get("prefetch", seen.get("prefetch"))),
                   persistent=_int_or_none(given.get("persistent", seen.get("persistent"))),
                   pin_memory=_int_or_none(given.get("pin_memory", seen.get("pin_memory"))))


def _int_or_none(v) -> int | None:
    return None if v is None or isinstance(v, bool) else int(v)


# -- thread share -----------------------------------------------------------------------------
threads_per_rank = placement.threads_per_rank  # the one share -> threads rule lives with placement


def pct_for_threads(threads: int, cores: int) -> int:
    """The smallest whole share that gives ``threads`` threads: `threads_per_rank` (the one
    rule, in `autotune.launching.placement`) inverts it on hosts of up to 100 cores."""
    return min(100, max(1, math.ceil(100 * threads / cores - 1e-9)))


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


def bucket_candidates(low_mb: float, high_mb: float, own_mb: int) -> tuple[int, ...]:
    """``bucket_mb`` candidates from measured bounds: the powers of two in [low, high] (whole
    MB), plus the script's own bucket (DDP's default, 25, when it sets none)."""
    values, p = set(), 1
    while p <= high_mb:
        if p >= low_mb:
            values.add(p)
        p *= 2
    return _with(values, own_mb)


def _batch_size_within(base: int, peak_bytes: int, free_bytes: int) -> tuple[int, ...]:
    hi = base * 8
    if peak_bytes and free_bytes:
        # Pessimistic: memory grows in proportion to the batch.
        hi = min(hi, max(base, int(base * MEMORY_HEADROOM * free_bytes / peak_bytes)))
    return _with(geometric(max(1, base // 4), hi), base)


def _cpu_batch_size(m: Machine, b: Baseline) -> tuple[int, ...]:
    if b.batch_size is None:
        return ()
    return _batch_size_within(b.batch_size, b.peak_rss_bytes, m.mem_available_bytes)


def _gpu_batch_size(m: Machine, b: Baseline) -> tuple[int, ...]:
    """Bounded by GPU memory when the baseline used CUDA; a script that stayed on the CPU of a
    GPU host is bounded by host memory as on CPU."""
    if b.batch_size is None:
        return ()
    if not b.cuda_peak_bytes:
        return _cpu_batch_size(m, b)
    return _batch_size_within(b.batch_size, b.cuda_peak_bytes, m.gpu_mem_available_bytes)


def _cpu_workers(m: Machine, b: Baseline) -> tuple[int, ...]:
    if b.workers is None:
        return ()
    return _with(linear(0, min(m.cores, 8)), b.workers)


def _cpu_thread_pct(m: Machine, b: Baseline) -> tuple[int, ...]:
    counts = set(geometric(1, m.cores))
    if b.threads:
        counts.add(min(b.threads, m.cores))
    return tuple(sorted({pct_for_threads(t, m.cores) for t in counts}))


def _gpu_thread_pct(m: Machine, b: Baseline) -> tuple[int, ...]:
    return GPU_THREAD_PCT


def _cpu_instances(m: Machine, b: Baseline) -> tuple[int, ...]:
    return linear(1, max(1, min(m.cores, 4))) if b.distributed else (1,)


def _gpu_instances(m: Machine, b: Baseline) -> tuple[int, ...]:
    return linear(1, GPU_MAX_INSTANCES) if b.distributed else (1,)


def _gpu_host_threads(m: Machine, b: Baseline) -> tuple[int, ...]:
    """Searched where ranks may share a GPU (MPS, a distributed script): the rule and counts
    that fit the cores of the host's ranks at their most."""
    if not (m.mps and b.distributed):
        return ()
    most = max(1, m.cores // max(1, m.gpus or 1))
    return tuple(v for v in GPU_HOST_THREADS if v <= most)


def _gpu_pin(m: Machine, b: Baseline) -> tuple[int, ...]:
    """Disjoint cores per rank, where ranks may share a GPU and the host has a core for each."""
    if not (m.mps and b.distributed) or m.cores < 2 * max(1, m.gpus or 1):
        return ()
    return (0, 1)


def _bucket_mb(m: Machine, b: Baseline) -> tuple[int, ...]:
    own = int(b.bucket_mb) if b.bucket_mb else None
    if m.bucket_mb_range is not None:
        return bucket_candidates(*m.bucket_mb_range, own or DDP_DEFAULT_BUCKET_MB)
    return _with(BUCKET_MB, own)


# The input pipeline's finer knobs (seed 004) are searched by default where the script's own
# DataLoader has workers, the pipeline they tune; elsewhere --space adds them (a search over
# workers=0 scripts would otherwise grow several times for knobs most of its configs drop).
def _prefetch(m: Machine, b: Baseline) -> tuple[int, ...]:
    return _with(PREFETCH, b.prefetch) if b.workers else ()


def _persistent(m: Machine, b: Baseline) -> tuple[int, ...]:
    return (0, 1) if b.workers else ()


def _pin_memory(m: Machine, b: Baseline) -> tuple[int, ...]:
    """Only where batches go to a GPU: a script that used CUDA."""
    return (0, 1) if b.workers and b.cuda_peak_bytes else ()


# (knob, device kind) -> default candidates. A new device kind adds its rows here. Why a knob
# is left out or fixed (no DataLoader, no torch.distributed, no MPS) is `space.build`'s note.
DOMAIN_RULES: dict[tuple[str, str], Callable[[Machine, Baseline], tuple[int, ...]]] = {
    ("batch_size", "cpu"): _cpu_batch_size,
    ("workers", "cpu"): _cpu_workers,
    ("thread_pct", "cpu"): _cpu_thread_pct,
    ("instances", "cpu"): _cpu_instances,
    ("bucket_mb", "cpu"): _bucket_mb,
    ("batch_size", "gpu"): _gpu_batch_size,
    ("workers", "gpu"): _cpu_workers,
    ("thread_pct", "gpu"): _gpu_thread_pct,
    ("instances", "gpu"): _gpu_instances,
    ("bucket_mb", "gpu"): _bucket_mb,
    ("prefetch", "cpu"): _prefetch,
    ("prefetch", "gpu"): _prefetch,
    ("persistent", "cpu"): _persistent,
    ("persistent", "gpu"): _persistent,
    ("pin_memory", "gpu"): _pin_memory,
    ("host_threads", "gpu"): _gpu_host_threads,
    ("pin", "gpu"): _gpu_pin,
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


def _gpu_shared(domains: Mapping[str, tuple[int, ...]], baseline: Mapping[str, int],
                cores: int) -> list[dict[str, int]]:
    """Two MPS clients at half the GPU each: where AccDP's gains on one GPU typically began
    (seed 000), and a move `one_at_a_time` never makes (it moves one knob at a time)."""
    if 2 not in domains.get("instances", ()) or "thread_pct" not in domains:
        return []
    nearest = min(domains["thread_pct"], key=lambda v: (abs(v - 50), v))
    return [{"instances": 2, "thread_pct": nearest}]


# device kind -> extra starting configs (changes to the baseline) worth measuring first.
DESIGN_RULES: dict[str, Callable[[Mapping[str, tuple[int, ...]], Mapping[str, int], int],
                                 list[dict[str, int]]]] = {
    "cpu": _cpu_balanced,
    "gpu": _gpu_shared,
}
