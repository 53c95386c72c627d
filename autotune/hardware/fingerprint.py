"""What a tuning result depends on: the host, the devices, torch, the script and its arguments.

A recipe stores the fingerprint of the run that made it; `diff` says what differs on another run.
GPU facts come from `autotune.hardware.nvml` (the one NVML choke point) and are absent without a driver.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata

import psutil

from autotune.hardware import host as hostinfo
from autotune.hardware.allocation import slurm_allocation

HARDWARE = ("cpu_model", "cores", "gpu_names", "gpu_count", "gpu_driver")
SOFTWARE = ("torch_version",)
SCRIPT = ("script_sha256",)


@dataclass(frozen=True)
class Fingerprint:
    cpu_model: str
    cores: int
    gpu_names: tuple[str, ...] = ()
    gpu_count: int = 0
    gpu_driver: str = ""
    torch_version: str = ""
    script_sha256: str = ""
    args: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gpu_names"] = list(self.gpu_names)
        d["args"] = list(self.args)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Fingerprint:
        return cls(cpu_model=str(d["cpu_model"]), cores=int(d["cores"]),
                   gpu_names=tuple(d.get("gpu_names", ())), gpu_count=int(d.get("gpu_count", 0)),
                   gpu_driver=str(d.get("gpu_driver", "")),
                   torch_version=str(d.get("torch_version", "")),
                   script_sha256=str(d.get("script_sha256", "")),
                   args=tuple(str(a) for a in d.get("args", ())))


def diff(a: Fingerprint, b: Fingerprint, *, fields: Sequence[str] | None = None) \
        -> list[tuple[str, object, object]]:
    """(field, a's value, b's value) for every field that differs."""
    names = fields or (*HARDWARE, *SOFTWARE, *SCRIPT, "args")
    return [(n, getattr(a, n), getattr(b, n)) for n in names if getattr(a, n) != getattr(b, n)]


def describe(differences: Sequence[tuple[str, object, object]], *, a: str = "here",
             b: str = "in the recipe") -> str:
    """``diff(here, recipe)`` as one line."""
    return "; ".join(f"{n}: {_short(x)} {a} vs {_short(y)} {b}" for n, x, y in differences)


def _short(v) -> str:
    if isinstance(v, str) and len(v) == 64 and re.fullmatch(r"[0-9a-f]+", v):
        return v[:12]
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v) or "(none)"
    return str(v) if v not in ("", None) else "(none)"


# -- reading the machine ------------------------------------------------------------------------
def cores(env: Mapping[str, str] | None = None) -> int:
    """The cores a node gives us (`autotune.hardware.host.node_cores`: the Slurm allocation's
    CPUs per node inside one, else our affinity)."""
    return hostinfo.node_cores(os.environ if env is None else env)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def gpus(env: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], str]:
    """(names of the GPUs we may use, driver version); empty without NVML or a driver.

    The GPUs are NVML's under ``CUDA_VISIBLE_DEVICES`` (`autotune.hardware.host.host_gpus`,
    the one rule): what the ranks see, what the tuner searches over and what a global batch is
    divided by, on the tuning run and on a later ``run`` alike.
    """
    try:
        from autotune.hardware import nvml

        ok, _why = nvml.available()
        if not ok:
            return (), ""
        visible = hostinfo.host_gpus(os.environ if env is None else env)
        return tuple(g.name or "unknown GPU" for g in visible), nvml.driver_version() or ""
    except Exception:  # noqa: BLE001 - a fingerprint never fails a run
        return (), ""


def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def file_sha256(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def current(command: Sequence[str]) -> Fingerprint:
    names, driver = gpus()
    return Fingerprint(cpu_model=cpu_model(), cores=cores(), gpu_names=names,
                       gpu_count=len(names), gpu_driver=driver, torch_version=torch_version(),
                       script_sha256=file_sha256(command[0]) if command else "",
                       args=tuple(command[1:]))


def machine(env: Mapping[str, str] | None = None) -> hostinfo.Machine:
    """What the search space needs about a node: cores, free memory, and the GPUs we may use
    (NVML under ``CUDA_VISIBLE_DEVICES``, as the ranks will see them), their least free memory,
    and whether CUDA MPS can share them. Without a driver or a visible GPU: a CPU machine.

    Inside a Slurm allocation the machine is the allocation (`autotune.hardware.allocation`):
    its CPUs per node, node count and ranks per node; memory and GPUs are this node's (the
    nodes of one allocation are taken to be alike)."""
    env = os.environ if env is None else env
    alloc = slurm_allocation(env)
    host = hostinfo.Machine(cores=cores(env), mem_available_bytes=psutil.virtual_memory().available,
                            nodes=alloc.node_count if alloc else 1,
                            ranks_per_node=alloc.ranks_per_node if alloc else None)
    try:
        from autotune.hardware import mps, nvml

        visible = {g.index for g in hostinfo.host_gpus(env)}
        devices = [d for d in nvml.devices() if d.index in visible]
        if not devices:
            return host
        free = [d.mem_total_bytes - d.mem_used_bytes for d in devices
                if d.mem_total_bytes is not None and d.mem_used_bytes is not None]
        ok, why = mps.available(env)
    except Exception:  # noqa: BLE001 - reading the machine never fails a run
        return host
    return replace(host, device="gpu", gpus=len(devices),
                   gpu_mem_available_bytes=max(0, min(free, default=0)), mps=ok, mps_why=why)


def hardware_slug(fp: Fingerprint) -> str:
    """Short name of the hardware for recipe file names: ``cpu2-intel-xeon-8375c``."""
    if fp.gpu_count:
        return f"{fp.gpu_count}x{_slug(fp.gpu_names[0])}"
    model = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$|\bprocessor\b|\d+-core", " ", fp.cpu_model.lower())
    return f"cpu{fp.cores}-{_slug(model)}".rstrip("-")


def _slug(text: str, most: int = 32) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:most].rstrip("-") or "unknown"


def summary(fp: Fingerprint) -> str:
    """One line for the monitor's header and the recipe listing."""
    gpu = f", {fp.gpu_count} x {fp.gpu_names[0]}" if fp.gpu_count else ""
    return f"{fp.cores} cores ({fp.cpu_model}){gpu}, torch {fp.torch_version or '?'}"
