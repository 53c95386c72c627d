"""The device sampler: a thread that appends ``device_sample`` events to the run's journal.

CPU per core, memory, and the run's own processes (ranks and their DataLoader workers) through
psutil; GPUs through `autotune.nvml` when that module exists and reports devices. A reading that
fails is left out, never raised: sampling must not slow or fail the run.
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path

import psutil

from autotune.journal import Journal

INTERVAL_S = 2.0
RANK_MARK = "probes.boot"  # in the argv of every Python rank (autotune.launch.rank_argv)


def run_processes(root_pid: int | None = None) -> tuple[int, int, list[int]]:
    """(ranks, loader workers, pids of the ranks) among the descendants of ``root_pid``.

    Ranks are the processes running the boot runner (or, for other commands, the direct
    children); loader workers are the children of ranks.
    """
    try:
        root = psutil.Process(root_pid or os.getpid())
        desc = root.children(recursive=True)
    except psutil.Error:
        return 0, 0, []
    ranks = []
    for p in desc:
        try:
            if any(RANK_MARK == a or a.endswith(RANK_MARK) for a in p.cmdline()[:4]):
                ranks.append(p.pid)
        except psutil.Error:
            continue
    if not ranks:
        ranks = [p.pid for p in desc if _ppid(p) == root.pid]
    rank_set = set(ranks)
    workers = sum(1 for p in desc if _ppid(p) in rank_set and p.pid not in rank_set)
    return len(ranks), workers, ranks


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


class GpuSource:
    """GPU readings through `autotune.nvml`, imported lazily; empty when it is absent or fails.

    Expects ``autotune.nvml.sample_gpus(pids)`` -> list of dicts with the ``device_sample``
    ``gpus`` fields (index, name, util_pct, mem_used_bytes, mem_total_bytes, power_w, ranks).
    """

    def __init__(self):
        self._fn = None
        self._tried = False

    def sample(self, pids: list[int]) -> list[dict]:
        if not self._tried:
            self._tried = True
            try:
                mod = importlib.import_module("autotune.nvml")
                self._fn = getattr(mod, "sample_gpus", None)
            except Exception:  # absent, or no driver: no GPU panel
                self._fn = None
        if self._fn is None:
            return []
        try:
            gpus = self._fn(pids)
            return [dict(g) for g in gpus or [] if isinstance(g, dict)]
        except Exception:
            self._fn = None  # a backend that failed once is not asked again
            return []


def sample(gpu: GpuSource | None = None, root_pid: int | None = None) -> dict:
    """One ``device_sample`` event's fields."""
    fields: dict = {"cpu_pct": [], "mem_used_bytes": None, "mem_total_bytes": None,
                    "gpus": [], "workers": None, "ranks": None}
    try:
        fields["cpu_pct"] = [round(c, 1) for c in psutil.cpu_percent(percpu=True)]
    except Exception:
        pass
    try:
        mem = psutil.virtual_memory()
        fields["mem_used_bytes"] = int(mem.total - mem.available)
        fields["mem_total_bytes"] = int(mem.total)
    except Exception:
        pass
    ranks, workers, pids = run_processes(root_pid)
    fields["ranks"], fields["workers"] = ranks, workers
    if gpu is not None:
        fields["gpus"] = gpu.sample(pids)
    return fields


class Sampler(threading.Thread):
    """Appends a ``device_sample`` to the journal every ``interval_s`` until `stop`."""

    def __init__(self, run_dir: Path, *, interval_s: float = INTERVAL_S):
        super().__init__(name="autotune-sampler", daemon=True)
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self.cpu_s = 0.0  # this thread's own CPU time, for the bench
        self._stop_event = threading.Event()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=timeout_s)

    def run(self) -> None:
        import time
        try:
            journal = Journal(self.run_dir)
            gpu = GpuSource()
            psutil.cpu_percent(percpu=True)  # the first call only starts the interval
            while not self._stop_event.wait(self.interval_s):
                journal.emit("device_sample", **sample(gpu))
                self.cpu_s = time.thread_time()
        except Exception:  # the run goes on without device samples
            return
