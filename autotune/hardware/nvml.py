"""NVIDIA devices through NVML (``nvidia-ml-py``, module ``pynvml``): the one place NVML is called.

Every call goes through `_call`, which initialises NVML on first use and turns every
``pynvml.NVMLError`` into the sentinel `NA` (``None``), so a reading never raises: a monitor
keeps running when a GPU drops off or a field is not supported. Without a driver (no
``libnvidia-ml.so.1``: ``NVMLError_LibraryNotFound``; driver not loaded:
``NVMLError_DriverNotLoaded``) everything reports "no devices" and `available` says why.

API (all cheap after the first call, safe from any thread, never raising)::

    available() -> (bool, why)          # why is "" when available
    driver_version() -> str | None
    devices() -> list[DeviceInfo]       # index, name, uuid, memory, utilisation, power, pids
    sample() -> list[dict]              # keys: index, name, util_pct, mem_used_bytes,
                                        #       mem_total_bytes, power_w, pids
    energy_j(index) -> float | None     # the total energy counter (Volta and newer), joules
    power_w(index) -> float | None      # power draw now, watts
    shutdown()                          # release NVML (it is re-initialised on next use)

Units are in the names: bytes, percent, watts (NVML reports milliwatts).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)

NA = None  # the sentinel a reading returns when NVML cannot give it

_lock = threading.RLock()
_state: dict = {"pid": None, "lib": None, "ok": False, "why": "not initialised yet"}

# Hints for the errors that mean "no usable NVML here", by pynvml error class name.
_WHY = {
    "NVMLError_LibraryNotFound": "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver "
                                 "is installed on this machine",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded (is there a GPU? "
                                 "try nvidia-smi)",
    "NVMLError_NoPermission": "no permission to talk to the NVIDIA driver (/dev/nvidia*)",
    "NVMLError_LibRmVersionMismatch": "NVML library and kernel driver versions differ "
                                      "(reboot or reload the driver)",
}


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as NVML sees it; a field NVML could not read is `NA` (None)."""

    index: int
    name: str | None
    uuid: str | None
    mem_total_bytes: int | None
    mem_used_bytes: int | None
    util_pct: float | None
    power_w: float | None
    pids: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["pids"] = list(self.pids)
        return d


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _ensure() -> object | None:
    """The initialised pynvml module, or None (with `_state["why"]` saying why)."""
    with _lock:
        if _state["pid"] == os.getpid():
            return _state["lib"] if _state["ok"] else None
        _state.update(pid=os.getpid(), lib=None, ok=False)
        try:
            import pynvml
        except ImportError:
            _state["why"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            name = type(exc).__name__
            _state["why"] = _WHY.get(name, f"NVML initialisation failed: {exc} ({name})")
            return None
        except OSError as exc:  # a broken library that loads but cannot be called
            _state["why"] = f"NVML could not be loaded: {exc}"
            return None
        _state.update(lib=pynvml, ok=True, why="")
        return pynvml


def _call(fn: str, *args, default=NA):
    """Call ``pynvml.<fn>(*args)``; NVML errors (and a missing function) give ``default``."""
    lib = _ensure()
    if lib is None:
        return default
    func = getattr(lib, fn, None)
    if func is None:
        return default
    try:
        return func(*args)
    except lib.NVMLError as exc:
        log.debug("NVML %s failed: %s (%s)", fn, exc, type(exc).__name__)
        return default


def available() -> tuple[bool, str]:
    """Whether NVML answers, and if not, why (one sentence a user can act on)."""
    lib = _ensure()
    if lib is None:
        return False, _state["why"]
    count = _call("nvmlDeviceGetCount", default=0)
    if not count:
        return False, "NVML works but reports no GPU"
    return True, ""


def driver_version() -> str | None:
    return _text(_call("nvmlSystemGetDriverVersion"))


def device_count() -> int:
    return int(_call("nvmlDeviceGetCount", default=0) or 0)


def _pids(handle) -> tuple[int, ...]:
    pids: list[int] = []
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
               "nvmlDeviceGetMPSComputeRunningProcesses"):
        for p in _call(fn, handle, default=[]) or []:
            pid = getattr(p, "pid", None)
            if pid is not None and pid not in pids:
                pids.append(int(pid))
    return tuple(pids)


def _device(index: int) -> DeviceInfo | None:
    handle = _call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return None
    mem = _call("nvmlDeviceGetMemoryInfo", handle)
    util = _call("nvmlDeviceGetUtilizationRates", handle)
    power_mw = _call("nvmlDeviceGetPowerUsage", handle)
    return DeviceInfo(
        index=index, name=_text(_call("nvmlDeviceGetName", handle)),
        uuid=_text(_call("nvmlDeviceGetUUID", handle)),
        mem_total_bytes=int(mem.total) if mem is not None else NA,
        mem_used_bytes=int(mem.used) if mem is not None else NA,
        util_pct=float(util.gpu) if util is not None else NA,
        power_w=power_mw / 1000.0 if power_mw is not None else NA,
        pids=_pids(handle))


def devices() -> list[DeviceInfo]:
    """Every GPU NVML lists, in NVML (PCI bus) order; empty without a driver."""
    out = []
    for i in range(device_count()):
        info = _device(i)
        if info is not None:
            out.append(info)
    return out


def sample() -> list[dict]:
    """One reading per GPU for the monitor (`device_sample` journal event), never raising."""
    keys = ("index", "name", "util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "pids")
    return [{k: v for k, v in d.to_dict().items() if k in keys} for d in devices()]


def energy_j(index: int) -> float | None:
    """Energy GPU ``index`` has consumed since the driver was loaded, in joules (NVML's total
    energy counter, in millijoules: Volta and newer); `NA` where it is not supported."""
    handle = _call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return NA
    mj = _call("nvmlDeviceGetTotalEnergyConsumption", handle)
    return mj / 1000.0 if mj is not None else NA


def power_w(index: int) -> float | None:
    """GPU ``index``'s power draw now, in watts; `NA` where it is not supported."""
    handle = _call("nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return NA
    mw = _call("nvmlDeviceGetPowerUsage", handle)
    return mw / 1000.0 if mw is not None else NA


def shutdown() -> None:
    """Release NVML; the next call initialises it again."""
    with _lock:
        lib, ok = _state["lib"], _state["ok"]
        _state.update(pid=None, lib=None, ok=False, why="not initialised yet")
        if lib is not None and ok:
            try:
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass
