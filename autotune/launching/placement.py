"""Pure: where each rank of one host runs, and what that puts in its environment.

The knobs ``instances`` and ``thread_pct`` mean different things by device (DESIGN.md, "The
knobs"):

* **CPU**: ``instances`` ranks per host; each gets ``max(1, floor(cores x thread_pct / 100))``
  torch/OMP threads (`threads_per_rank`; default: the cores split evenly), and with ``pin=1`` a
  disjoint set of cores (``AUTOTUNE_CPUS``, applied by `probes.ranks_env` in the rank before
  torch loads; its DataLoader workers inherit the same cores).
* **GPU**: ``instances`` ranks (MPS clients) per GPU, ranks placed in blocks (ranks 0..k-1 on the
  first GPU); ``thread_pct`` becomes ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the sum over a GPU
  may exceed 100). CPU threads follow torchrun's rule: one per rank where the host has several
  ranks, torch's own for one, unless the ``host_threads`` knob (``threads`` here) gives a count
  or the user's environment sets ``OMP_NUM_THREADS`` (their value stands, as under torchrun).
  With ``pin=1`` each rank gets the host's cores split evenly, disjoint.

Device selection. Every GPU rank gets ``CUDA_VISIBLE_DEVICES`` as GPU UUIDs (the MPS guide
recommends UUIDs: indices are remapped by the MPS server). When a GPU holds one rank, every rank
sees all the host's GPUs in NVML order and ``LOCAL_RANK`` indexes them, exactly as under
torchrun. When ranks share a GPU (instances > 1), each rank sees only its own GPU and gets
``LOCAL_RANK=0``, so a script that calls ``torch.cuda.set_device(LOCAL_RANK)`` or builds
``cuda:{LOCAL_RANK}`` lands on the right device; its position on the host is kept in
``AUTOTUNE_HOST_LOCAL_RANK``. The price: such a script sees every co-located rank as its
host's local rank 0 (all of them may, say, prepare the dataset).

Backend. NCCL >= 2.5 refuses two ranks on one GPU in one communicator ("Duplicate GPU
detected"), so co-located GPU ranks get ``AUTOTUNE_BACKEND_OVERRIDE=gloo``; the probes replace
an NCCL request with it and report that as a ``seen`` note.

Fusion buckets. ``bucket_mb`` reaches DDP through its constructor (`probes.intercept`) and
Horovod through ``HOROVOD_FUSION_THRESHOLD`` (bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.hardware.host import Gpu, visible_gpus
from probes import protocol

MPS_THREAD_PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
HOROVOD_FUSION_ENV = "HOROVOD_FUSION_THRESHOLD"
DDP_DEFAULT_BUCKET_MB = 25  # DDP's bucket_cap_mb when the script sets none
DEVICES = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Slot:
    """The place of one host-local rank."""

    local_rank: int  # position among the ranks of its host
    gpu: Gpu | None
    threads: int | None  # None: left to torch (a single CPU rank with no thread knob)
    cpus: tuple[int, ...]  # cores it is pinned to; empty: not pinned
    thread_pct: float | None  # GPU only: its MPS active thread percentage
    env: dict[str, str] = field(default_factory=dict)  # what this rank adds to its environment


@dataclass(frozen=True)
class Plan:
    """Where every rank of one host runs."""

    device: str  # "cpu" | "gpu"
    instances: int  # per GPU, or per host on CPU
    slots: tuple[Slot, ...]
    needs_mps: bool
    common_env: dict[str, str]  # the same for every rank
    notes: tuple[str, ...] = ()
    cores: int = 1  # how many cores the host gives its ranks
    # the threads are torchrun's rule, not a knob: thread variables the user set win over them
    threads_by_rule: bool = False

    @property
    def local_world_size(self) -> int:
        return len(self.slots)

    @property
    def threads(self) -> int | None:
        return self.slots[0].threads if self.slots else None

    @property
    def cpus_per_rank(self) -> int:
        """The CPUs each rank may hold without the host's ranks together holding more than its
        cores: its threads, at most the cores split evenly (an engine that counts CPUs, Slurm's
        ``--cpus-per-task``, refuses more); the even split when the threads are left to torch."""
        share = max(1, self.cores // max(1, self.local_world_size))
        return min(self.threads, share) if self.threads else share


def _number(knobs: Mapping[str, float], name: str) -> float | None:
    value = knobs.get(name)
    return None if value is None else float(value)


def threads_per_rank(thread_pct: float, cores: int) -> int:
    """Threads for one rank holding ``thread_pct`` % of ``cores``: ``max(1, floor(cores x pct /
    100))``. The one rule: the search space (`autotune.tuning.space.rank_knobs`), recipes and
    this placement all call it.

    Floor, not round: a share is what a rank may use, and on CPU oversubscribing the cores is
    what hurts most, so a rank never gets more threads than its share holds.
    """
    return max(1, math.floor(cores * thread_pct / 100 + 1e-9))


def pin_sets(cores: Sequence[int], ranks: int, threads: int) -> list[tuple[int, ...]]:
    """Cores for each rank: consecutive blocks of ``threads`` cores, disjoint while they fit,
    wrapping around (and so shared) when ``ranks x threads`` exceeds the cores."""
    if not cores:
        return [() for _ in range(ranks)]
    n = len(cores)
    per = min(threads, n)
    return [tuple(sorted({cores[(r * per + j) % n] for j in range(per)})) for r in range(ranks)]


def horovod_env(knobs: Mapping[str, float]) -> dict[str, str]:
    """``HOROVOD_FUSION_THRESHOLD`` in bytes from ``bucket_mb``; empty without the knob."""
    bucket_mb = _number(knobs, "bucket_mb")
    if not bucket_mb:
        return {}
    if bucket_mb < 0:
        raise ValueError(f"bucket_mb >= 0 must hold, but got {bucket_mb}")
    return {HOROVOD_FUSION_ENV: str(int(bucket_mb * 1024 * 1024))}


def plan(*, knobs: Mapping[str, float], instances: int, cores: Sequence[int],
         gpus: Sequence[Gpu] = (), device: str = "auto") -> Plan:
    """The placement of one host's ranks. ``cores``: the cores we may use (our affinity);
    ``gpus``: the GPUs to use, in the order ranks should fill them."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, but got {device!r}")
    if int(instances) != instances or instances < 1:
        raise ValueError(f"instances >= 1 (a whole number) must hold, but got {instances}")
    instances = int(instances)
    use_gpu = device == "gpu" or (device == "auto" and bool(gpus))
    if use_gpu and not gpus:
        raise ValueError("device 'gpu' was asked for, but no GPU was found")
    pct = _number(knobs, "thread_pct")
    if pct is not None and not 0 < pct <= 100:
        raise ValueError(f"0 < thread_pct <= 100 must hold, but got {pct}")
    explicit_threads = _number(knobs, "threads")
    pin = bool(_number(knobs, "pin"))
    common = horovod_env(knobs)
    if use_gpu:
        return _gpu_plan(instances, pct, explicit_threads, pin, cores, gpus, common)
    return _cpu_plan(instances, pct, explicit_threads, pin, cores, common)


def _cpu_plan(instances, pct, explicit_threads, pin, cores, common) -> Plan:
    n = max(1, len(cores))
    if explicit_threads:
        threads = max(1, int(explicit_threads))
    elif pct is not None:
        threads = threads_per_rank(pct, n)
    elif instances > 1:
        threads = max(1, n // instances)
    else:
        threads = None  # one rank, no thread knob: the script's own default (the baseline)
    notes = []
    if threads is not None and threads * instances > n:
        notes.append(f"{instances} ranks x {threads} threads oversubscribe {n} cores")
    cpus = pin_sets(cores, instances, threads or n) if pin else [() for _ in range(instances)]
    slots = []
    for r in range(instances):
        env = _rank_env(r, cpus[r])
        slots.append(Slot(local_rank=r, gpu=None, threads=threads, cpus=cpus[r],
                          thread_pct=None, env=env))
    return Plan(device="cpu", instances=instances, slots=tuple(slots), needs_mps=False,
                common_env=common, notes=tuple(notes), cores=n)


def _gpu_plan(instances, pct, explicit_threads, pin, cores, gpus, common) -> Plan:
    world = instances * len(gpus)
    n = max(1, len(cores))
    # torchrun's rule: one thread each where a host has several ranks, torch's own for one
    threads = max(1, int(explicit_threads)) if explicit_threads else 1 if world > 1 else None
    colocated = instances > 1
    needs_mps = colocated or (pct is not None and pct < 100)
    # pinned: each rank the host's cores split evenly (its loader workers run there too)
    cpus = pin_sets(cores, world, max(threads or 1, n // world)) if pin \
        else [() for _ in range(world)]
    all_uuids = ",".join(g.uuid for g in gpus)
    notes = []
    common = dict(common)
    if colocated:
        common[protocol.ENV_BACKEND_OVERRIDE] = "gloo"
        notes.append(f"{instances} ranks share each GPU: NCCL refuses two ranks on one GPU, "
                     f"so collectives use gloo")
    slots = []
    for r in range(world):
        gpu = gpus[r // instances]
        env = _rank_env(r, cpus[r])
        if colocated:
            env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
            env["LOCAL_RANK"] = "0"
        else:
            env["CUDA_VISIBLE_DEVICES"] = all_uuids
        if pct is not None:
            env[MPS_THREAD_PCT_ENV] = f"{pct:g}"
        slots.append(Slot(local_rank=r, gpu=gpu, threads=threads, cpus=cpus[r],
                          thread_pct=pct, env=env))
    return Plan(device="gpu", instances=instances, slots=tuple(slots), needs_mps=needs_mps,
                common_env=common, notes=tuple(notes), cores=n,
                threads_by_rule=not explicit_threads)


def rank_threads(plan: Plan, env: Mapping[str, str], thread_vars: Sequence[str]) -> int | None:
    """The threads each rank of ``plan`` is given, in an environment ``env``: None where they
    are left to torch, or to the user: torchrun's rule (`Plan.threads_by_rule`) yields to
    thread variables the user set, as torchrun does; a knob's count does not."""
    if not plan.threads:
        return None
    if plan.threads_by_rule and any(env.get(v) for v in thread_vars):
        return None
    return plan.threads


def _rank_env(host_local_rank: int, cpus: Sequence[int]) -> dict[str, str]:
    """What every rank's slot says, on CPU and GPU alike: its place on the host, its cores."""
    env = {protocol.ENV_HOST_LOCAL_RANK: str(host_local_rank)}
    if cpus:
        env[protocol.ENV_CPUS] = ",".join(map(str, cpus))
    return env
