"""The machine the controller runs on: its cores, its GPUs, and what the search space needs of it.

The one rule for which cores and GPUs are ours (affinity; NVML under ``CUDA_VISIBLE_DEVICES``),
used by placement, the fingerprint, the allreduce probe and the space alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.hardware import nvml


@dataclass(frozen=True)
class Gpu:
    """A GPU as NVML lists it."""

    index: int
    uuid: str
    name: str = ""


@dataclass(frozen=True)
class Machine:
    """What the space needs to know about the host (`autotune.hardware.fingerprint.machine` reads it).

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


def host_cores() -> list[int]:
    """The cores this controller may use (its affinity, which cgroups and taskset narrow)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


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
