"""NVML read directly through ``pynvml`` (nvidia-ml-py), apart from autotune's own reader.

Every call goes through `Nvml.get`, which gives None for an NVML error, a function this
``pynvml`` lacks, or no NVML at all, so a reading never stops the kit. `Sampler` polls one GPU
in a thread while a configuration runs: utilisation, memory, power, and the energy counter.
"""

from __future__ import annotations

import statistics
import threading
import time


class Nvml:
    """The initialised ``pynvml`` module, or the reason there is none (`why`)."""

    def __init__(self):
        self.lib = None
        self.why = ""
        self.lock = threading.Lock()
        try:
            import pynvml
        except ImportError as exc:
            self.why = f"pynvml (nvidia-ml-py) is not importable: {exc}"
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError_* or a broken library (OSError)
            self.why = f"nvmlInit failed: {exc} ({type(exc).__name__})"
            return
        self.lib = pynvml

    @property
    def ok(self) -> bool:
        return self.lib is not None

    def get(self, fn: str, *args):
        if self.lib is None or not hasattr(self.lib, fn):
            return None
        try:
            with self.lock:
                return getattr(self.lib, fn)(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: no reading
            return None

    def handle(self, index: int):
        return self.get("nvmlDeviceGetHandleByIndex", index)

    def module_facts(self) -> dict:
        """Which pynvml this is: a file path, and whether it says it is a test fake."""
        lib = self.lib
        return {"pynvml_file": getattr(lib, "__file__", None),
                "pynvml_fake": bool(getattr(lib, "FAKE", False)) if lib else None}

    def devices(self) -> list[dict]:
        out = []
        for index in range(self.get("nvmlDeviceGetCount") or 0):
            h = self.handle(index)
            mem = self.get("nvmlDeviceGetMemoryInfo", h)
            out.append({"index": index, "name": _text(self.get("nvmlDeviceGetName", h)),
                        "uuid": _text(self.get("nvmlDeviceGetUUID", h)),
                        "mem_total_bytes": getattr(mem, "total", None),
                        "compute_mode": self.get("nvmlDeviceGetComputeMode", h),
                        "processes": self.pids("nvmlDeviceGetComputeRunningProcesses", index),
                        **self.reading(index)})
        return out

    def reading(self, index: int) -> dict:
        h = self.handle(index)
        util = self.get("nvmlDeviceGetUtilizationRates", h)
        mem = self.get("nvmlDeviceGetMemoryInfo", h)
        power = self.get("nvmlDeviceGetPowerUsage", h)
        return {"util_pct": getattr(util, "gpu", None),
                "mem_used_bytes": getattr(mem, "used", None),
                "power_w": None if power is None else power / 1000.0}

    def energy_j(self, index: int) -> float | None:
        """The GPU's energy counter (Volta and later), in joules."""
        mj = self.get("nvmlDeviceGetTotalEnergyConsumption", self.handle(index))
        return None if mj is None else mj / 1000.0

    def pids(self, fn: str, index: int) -> list[int] | None:
        """Pids in one of NVML's process lists (compute, MPS compute); None when unreadable."""
        procs = self.get(fn, self.handle(index))
        return None if procs is None else sorted({int(p.pid) for p in procs})

    def mps_pids(self, index: int) -> list[int] | None:
        return self.pids("nvmlDeviceGetMPSComputeRunningProcesses", index)


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Sampler:
    """Poll one GPU every ``interval_s`` until stopped; summarise the later part of the run."""

    def __init__(self, nvml: Nvml, index: int, *, interval_s: float = 0.5):
        self.nvml, self.index, self.interval_s = nvml, index, interval_s
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-proof-sampler", daemon=True)
        self.t0 = self.t1 = 0.0
        self.energy0 = self.energy1 = None

    def __enter__(self) -> Sampler:
        self.t0 = time.monotonic()
        self.energy0 = self.nvml.energy_j(self.index)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.t1 = time.monotonic()
        self.energy1 = self.nvml.energy_j(self.index)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self.nvml.reading(self.index)))
            self._stop.wait(self.interval_s)

    def summary(self) -> dict:
        """Means over the second half of the run (start-up left out), the energy of all of it."""
        return summarise(self.samples, self.t0, self.t1, self.energy0, self.energy1)


def summarise(samples, t0: float, t1: float, energy0, energy1) -> dict:
    """Pure: readings ``[(t, {util_pct, mem_used_bytes, power_w})]`` -> one summary."""
    half = t0 + (t1 - t0) / 2
    late = [r for t, r in samples if t >= half] or [r for _, r in samples]

    def values(key):
        return [r[key] for r in late if r.get(key) is not None]

    util, power = values("util_pct"), values("power_w")
    mem = [r["mem_used_bytes"] for _, r in samples if r.get("mem_used_bytes") is not None]
    energy = (energy1 - energy0) if energy0 is not None and energy1 is not None else None
    return {"samples": len(samples), "util_pct_mean": statistics.fmean(util) if util else None,
            "mem_used_bytes_max": max(mem) if mem else None,
            "power_w_mean": statistics.fmean(power) if power else None,
            "energy_j": energy, "wall_s": t1 - t0}
