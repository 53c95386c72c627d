"""Energy a probe spends, read from the hardware's counters: joules per sample.

- GPUs: NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since
  the driver loaded; Volta and newer) of the GPUs the probe's ranks use; where a GPU does not
  support it, its power draw sampled at every poll and integrated (trapezoids).
- CPU: Linux powercap's RAPL package domains (``/sys/class/powercap/intel-rapl:N/energy_uj``,
  microjoules, wrapping at ``max_energy_range_uj``; AMD's RAPL shows there too). Their subdomains
  (``intel-rapl:N:M``: cores, DRAM) are parts of the package and are not added again. The
  package is the whole socket: other programs' work is in it too (the foreign load says how
  much there was).

Where a counter cannot be read, the reading is None and the meter says why ("unavailable: ...").
`EnergyMeter.read` is called at each poll of the probe; `EnergyMeter.per_sample` gives joules
per sample over the span the throughput estimate stands on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.hardware import nvml
from autotune.measuring import series

RAPL_ROOT = Path("/sys/class/powercap")


class Rapl:
    """The host's RAPL package counters, summed, with wrap-around undone."""

    def __init__(self, root: Path = RAPL_ROOT):
        self.domains: list[tuple[Path, float]] = []  # (energy_uj path, its range)
        self.why = ""
        self._last: dict[Path, int] = {}
        self._total_uj = 0.0
        if not root.is_dir():
            self.why = f"{root} does not exist (no RAPL driver here: a VM, or not an x86 host)"
            return
        for d in sorted(root.glob("intel-rapl:*")):
            if d.name.count(":") != 1:  # a subdomain (cores, DRAM) is inside its package
                continue
            path = d / "energy_uj"
            try:
                raw = int(path.read_text())
                top = float((d / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as exc:
                self.why = f"{path} is not readable ({getattr(exc, 'strerror', None) or exc}); " \
                           f"reading it may need root"
                continue
            self.domains.append((path, top))
            self._last[path] = raw
        if self.domains:
            self.why = ""
        elif not self.why:
            self.why = f"no RAPL package domain under {root}"

    def read(self) -> float | None:
        """Joules the packages used since this object was made; None when unavailable."""
        if not self.domains:
            return None
        for path, top in self.domains:
            try:
                raw = int(path.read_text())
            except (OSError, ValueError):
                return None
            last = self._last[path]
            self._total_uj += raw - last if raw >= last else top - last + raw  # wrapped
            self._last[path] = raw
        return self._total_uj / 1e6


class Gpus:
    """The energy of some GPUs: NVML's counter where supported, else power integrated."""

    def __init__(self, indices: list[int]):
        self.indices = sorted(set(indices))
        self.counter = {i: nvml.energy_j(i) is not None for i in self.indices}
        self._start = {i: nvml.energy_j(i) for i in self.indices if self.counter[i]}
        self._power: dict[int, tuple[float, float]] = {}  # index -> (t, watts) of the last poll
        self._integrated = dict.fromkeys(self.indices, 0.0)
        ok, why = nvml.available()
        sampled = [i for i in self.indices if not self.counter[i]]
        if not self.indices:
            self.why, self.source = "no GPU in use", ""
        elif not ok:
            self.why, self.source = why, ""
        elif sampled and any(nvml.power_w(i) is None for i in sampled):
            self.why, self.source = "NVML reads neither energy nor power of every GPU in use", ""
        else:
            self.why = ""
            self.source = "NVML energy counter" if not sampled else \
                "NVML power, sampled" if len(sampled) == len(self.indices) else \
                "NVML energy counter and sampled power"

    def read(self, now: float) -> float | None:
        """Joules the GPUs used since this object was made; None when unavailable."""
        if self.why:
            return None
        total = 0.0
        for i in self.indices:
            if self.counter[i]:
                j = nvml.energy_j(i)
                if j is None:
                    return None
                total += j - self._start[i]
                continue
            w = nvml.power_w(i)
            if w is None:
                return None
            if i in self._power:
                t0, w0 = self._power[i]
                self._integrated[i] += (now - t0) * (w0 + w) / 2
            self._power[i] = (now, w)
            total += self._integrated[i]
        return total


UNAVAILABLE = "unavailable: "  # how `EnergyPerSample.to_dict` writes a source that could not be read


@dataclass(frozen=True)
class EnergyPerSample:
    """Joules per sample over a probe's measured span; None where not readable. Each side has
    its source ("NVML energy counter", "RAPL package energy"), or "" and why it had none."""

    gpu_j: float | None
    cpu_j: float | None
    gpu_source: str
    cpu_source: str
    gpu_why: str = ""  # why no GPU source (no GPU in use, NVML missing...)
    cpu_why: str = ""  # why no CPU package source (no RAPL here, not readable...)

    @property
    def total_j(self) -> float | None:
        """GPU + CPU package joules per sample, each where it was readable; None when neither
        gave a positive reading."""
        total = sum(j for j in (self.gpu_j, self.cpu_j) if j is not None)
        return total if total > 0 else None

    def why(self) -> str:
        """Why a side has no joules, in the meter's words ("GPU: ...; CPU package: ...")."""
        return "; ".join(f"{label}: {source or why or 'unavailable'}"
                         for label, _, source, why in self._sides())

    def describe(self) -> str:
        """Joules per sample by source, or why a source is unavailable."""
        return "; ".join(f"{label} {j:.3g} J ({self._shown(source, why)})" if j is not None else
                         f"{label} {self._shown(source, why) or 'unavailable'}"
                         for label, j, source, why in self._sides())

    def _sides(self):
        return (("GPU", self.gpu_j, self.gpu_source, self.gpu_why),
                ("CPU package", self.cpu_j, self.cpu_source, self.cpu_why))

    @staticmethod
    def _shown(source: str, why: str) -> str:
        return source or (UNAVAILABLE + why if why else "")

    def to_dict(self) -> dict:
        return {"gpu_j_per_sample": self.gpu_j, "cpu_j_per_sample": self.cpu_j,
                "gpu": self._shown(self.gpu_source, self.gpu_why),
                "cpu": self._shown(self.cpu_source, self.cpu_why)}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> EnergyPerSample | None:
        """From `to_dict`'s shape (the journal, a study, ``tune.json``); None for none."""
        if not d:
            return None

        def side(key: str) -> tuple[float | None, str, str]:
            j = d.get(f"{key}_j_per_sample")
            text = str(d.get(key) or "")
            source, why = ("", text[len(UNAVAILABLE):]) if text.startswith(UNAVAILABLE) else \
                (text, "")
            return (float(j) if isinstance(j, (int, float)) else None), source, why

        (gj, gs, gw), (cj, cs, cw) = side("gpu"), side("cpu")
        return cls(gj, cj, gs, cs, gw, cw)


class EnergyMeter:
    """Both counters, read at a probe's polls."""

    def __init__(self, gpu_indices: list[int], *, rapl_root: Path | None = None):
        self.rapl = Rapl(rapl_root or Path(os.environ.get("AUTOTUNE_RAPL_ROOT", RAPL_ROOT)))
        self.gpus = Gpus(gpu_indices)
        self.trail: list[tuple[float, float | None, float | None]] = []

    def read(self, now: float) -> None:
        if self.rapl.domains or not self.gpus.why:
            self.trail.append((now, self.gpus.read(now), self.rapl.read()))

    def per_sample(self, start_t: float, end_t: float, samples: float) -> EnergyPerSample:
        return EnergyPerSample(self._between(1, start_t, end_t, samples),
                               self._between(2, start_t, end_t, samples),
                               self.gpus.source,
                               "RAPL package energy" if self.rapl.domains else "",
                               gpu_why="" if self.gpus.source else self.gpus.why,
                               cpu_why="" if self.rapl.domains else self.rapl.why)

    def _between(self, col: int, start_t: float, end_t: float, samples: float) -> float | None:
        pts = [(row[0], row[col]) for row in self.trail if row[col] is not None]
        if samples <= 0 or len(pts) < 2 or pts[0][0] > start_t + 1.0 or pts[-1][0] < end_t - 1.0:
            return None
        # the power over the part of the span the readings cover (they come at the polls, and
        # the last may be a poll before the span's end), over the whole span
        watts = series.span_rate(pts, start_t, end_t)
        return None if watts is None else watts * (end_t - start_t) / samples
