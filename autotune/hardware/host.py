"""The machine the ranks run on: its cores, its GPUs, and what the search space needs of it.

The one rule for which cores and GPUs are ours (affinity; NVML under ``CUDA_VISIBLE_DEVICES``;
inside a Slurm allocation, the allocation's CPUs per node: `node_cores`), used by placement,
the fingerprint, the allreduce probe and the space alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.hardware import nvml
from autotune.hardware.allocation import slurm_allocation


@dataclass(frozen=True)
class Gpu:
    """A GPU as NVML lists it."""

    index: int
    uuid: str
    name: str = ""


@dataclass(frozen=True)
class Machine:
    """What the space needs to know about a node (`autotune.hardware.fingerprint.machine` reads it).

    ``cores``: the cores one node gives us (`node_cores`: the allocation's CPUs per node inside
    Slurm, else our affinity). ``nodes``: the allocation's node count (1 outside one).
    ``ranks_per_node``: the most ranks a job step may start on a node of the allocation
    (`autotune.hardware.allocation.SlurmAllocation.ranks_per_node`); None outside an
    allocation, where ranks may oversubscribe the cores.
    ``device`` is "gpu" when a GPU is visible to us (NVML under ``CUDA_VISIBLE_DEVICES``).
    ``mps``/``mps_why``: whether ranks may share a GPU through CUDA MPS, and if not, why.
    ``bucket_mb_range``: (low, high) MB for ``bucket_mb`` measured on this host's ranks
    (`autotune.measuring.allreduce.bucket_range`); None: not measured, the conventional candidates.
    """

    cores: int
    mem_available_bytes: int = 0
    device: str = "cpu"
    gpus: int = 0
    gpu_mem_available_bytes: int = 0  # the least free memory among the visible GPUs
    mps: bool = False
    mps_why: str = ""
    bucket_mb_range: tuple[float, float] | None = None
    nodes: int = 1
    ranks_per_node: int | None = None


def host_cores() -> list[int]:
    """The cores this controller may use (its affinity, which cgroups and taskset narrow)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def node_cores(env: Mapping[str, str]) -> int:
    """How many cores a rank's node gives us: inside a Slurm allocation its CPUs per node (what
    a job step may ask for there, whatever the controller's host has), else our affinity."""
    alloc = slurm_allocation(env)
    if alloc is not None and alloc.node_cpus:
        return alloc.node_cpus
    return len(host_cores())


def host_gpus(env: Mapping[str, str]) -> list[Gpu]:
    """The GPUs NVML lists that ``CUDA_VISIBLE_DEVICES`` (if set) leaves, in its order."""
    gpus = [Gpu(index=d.index, uuid=d.uuid or str(d.index), name=d.name or "")
            for d in nvml.devices()]
    return visible_gpus(gpus, env.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(gpus: Sequence[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs a user's ``CUDA_VISIBLE_DEVICES`` leaves, in its order (indices, UUIDs or UUID
    prefixes, as CUDA accepts); all of them when it is unset. CUDA stops at the first entry it
    cannot match; so does this."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if not entry:
            break
        match = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        else:
            hits = [g for g in gpus if g.uuid.startswith(entry)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen
