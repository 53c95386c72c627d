"""The device sampler: a thread that appends ``device_sample`` events to the run's journal.

CPU per core, memory, and the run's own processes (ranks and their DataLoader workers) through
psutil; GPUs through `autotune.hardware.nvml` when that module exists and reports devices. A reading that
fails is left out, never raised: sampling must not slow or fail the run.
"""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path

import psutil

from autotune.hardware import proc
from autotune.launching import rank_command
from autotune.store.journal import Journal
from autotune.store.events import Event

INTERVAL_S = 2.0
FIRST_AFTER_S = 0.5
RANK_MARK = rank_command.BOOT_MODULE  # in the argv of every Python rank (`rank_command.rank_argv`)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_processes(root_pid: int | None = None) -> tuple[int, int, list[int]]:
    """(ranks, loader workers, pids of the ranks) among the descendants of ``root_pid``.

    Ranks are the processes running the boot runner (or, for other commands, the direct
    children); loader workers are the children of ranks (forked ones carry the same argv).
    """
    try:
        root = psutil.Process(root_pid or os.getpid())
        desc = [p for p in proc.descendants(root) if _alive(p)]  # this tree's files only
    except psutil.Error:
        return 0, 0, []
    marked = set()
    for p in desc:
        try:
            if any(RANK_MARK == a or a.endswith(RANK_MARK) for a in p.cmdline()[:4]):
                marked.add(p.pid)
        except psutil.Error:
            continue
    # forked DataLoader workers share their rank's argv: a rank is a marked process whose
    # parent is not marked
    ranks = [p.pid for p in desc if p.pid in marked and _ppid(p) not in marked]
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
    """GPU readings through `autotune.hardware.nvml`, imported lazily; empty when it is absent or fails.

    Uses ``autotune.hardware.nvml.available()`` once and then ``autotune.hardware.nvml.sample()`` (dicts with
    index, name, util_pct, mem_used_bytes, mem_total_bytes, power_w, pids); the pids of our
    ranks become the ``ranks`` field (rank numbers from each rank's ``RANK``).
    """

    def __init__(self):
        self._sample = None
        self._tried = False
        self._rank_of: dict[int, int | None] = {}  # pid -> RANK, read once per process

    def _load(self) -> None:
        self._tried = True
        try:
            mod = importlib.import_module("autotune.hardware.nvml")
            ok, _why = mod.available()
            self._sample = mod.sample if ok else None
        except Exception:  # noqa: BLE001 - absent, or no driver: no GPU panel
            self._sample = None

    def rank_of(self, pid: int) -> int | None:
        if pid not in self._rank_of:
            try:
                value = psutil.Process(pid).environ().get("RANK")
                self._rank_of[pid] = int(value) if value is not None else None
            except (psutil.Error, ValueError):
                self._rank_of[pid] = None
        return self._rank_of[pid]

    def sample(self, rank_pids: list[int]) -> list[dict]:
        if not self._tried:
            self._load()
        if self._sample is None:
            return []
        try:
            gpus = [dict(g) for g in self._sample() or [] if isinstance(g, dict)]
        except Exception:  # noqa: BLE001 - a backend that failed once is not asked again
            self._sample = None
            return []
        mine = set(rank_pids)
        for g in gpus:
            pids = g.pop("pids", None) or []
            ranks = [self.rank_of(p) for p in pids if p in mine]
            g["ranks"] = sorted(r if r is not None else i for i, r in enumerate(ranks))
        return gpus


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
    """Appends a ``device_sample`` to the journal every ``interval_s`` until `stop`.

    Once `stop` returns, the thread appends nothing more, even if it is still inside a slow
    reading: the run's ``run_ended`` must stay its journal's last event."""

    def __init__(self, run_dir: Path, *, interval_s: float = INTERVAL_S):
        super().__init__(name="autotune-sampler", daemon=True)
        self.run_dir = Path(run_dir)
        self.interval_s = interval_s
        self.cpu_s = 0.0  # this thread's own CPU time, for the bench
        self._stop_event = threading.Event()
        self._writing = threading.Lock()  # held from the stop check to the end of an append

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop_event.set()
        with self._writing:  # an append under way ends; none starts after this
            pass
        if self.is_alive():
            self.join(timeout=timeout_s)

    def run(self) -> None:
        import time
        try:
            journal = Journal(self.run_dir)
            gpu = GpuSource()
            psutil.cpu_percent(percpu=True)  # the first call only starts the interval
            wait_s = min(FIRST_AFTER_S, self.interval_s)  # something to show early
            while not self._stop_event.wait(wait_s):
                fields = sample(gpu)
                with self._writing:
                    if self._stop_event.is_set():
                        break
                    journal.emit(Event.DEVICE_SAMPLE, **fields)
                self.cpu_s = time.thread_time()
                wait_s = self.interval_s
        except Exception:  # noqa: BLE001 - the run goes on without device samples
            return
        finally:
            self.cpu_s = time.thread_time()
