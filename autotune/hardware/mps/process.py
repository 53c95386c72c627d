"""The daemon as an operating-system process: is its pid alive, wait for it, signal it.

Shared by `autotune.hardware.mps.daemon` (stopping our own daemon) and `autotune.hardware.mps.registry` (stopping
one a dead controller left behind). Every call tolerates a process that is already gone.
"""

from __future__ import annotations

import os

import psutil


def parse_pids(text: str) -> list[int]:
    """The pids in an answer of the daemon (``get_server_list``, ``get_client_list PID``)."""
    return [int(w) for w in text.split() if w.isdigit()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait for ``pid`` to end, reaping it when it is our child (we are a subreaper)."""
    try:
        p = psutil.Process(pid)
        p.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        return not alive(pid)
    except psutil.Error:
        pass
    return True


def send_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def same_process_alive(pid, create_time) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``create_time``."""
    try:
        p = psutil.Process(int(pid))
        return abs(p.create_time() - float(create_time)) < 1e-3
    except (psutil.Error, TypeError, ValueError):
        return False
