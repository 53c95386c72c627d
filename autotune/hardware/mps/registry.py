"""The controller's MPS daemons: stopping all on every exit path, stale reaping.

Process-wide state, kept in one module: the daemons this process started (stopped by `stop_all`,
registered with ``atexit``; SIGTERM/SIGHUP unwind like an exception so it runs), and
`reap_stale`, which stops daemons left by a controller that was killed before it could. A daemon
registers itself here as it starts; this module only calls its ``stop``, so it imports nothing
of `autotune.hardware.mps.daemon` (which holds the one daemon the whole run shares).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import threading
from collections.abc import Mapping
from pathlib import Path

from autotune.hardware import proc
from autotune import LaunchError
from autotune.hardware.mps.config import DIR_PREFIX, LOG_ENV, OWNER_FILE, PID_FILE, PIPE_ENV
from autotune.hardware.mps.process import alive, same_process_alive, send_signal, wait_gone

log = logging.getLogger(__name__)

# -- stopping on every exit path ------------------------------------------------------------------
_live: list = []  # the `MpsDaemon`s started and not stopped yet
_live_lock = threading.Lock()
_guarded = False


def register(daemon) -> None:
    """Track a starting `MpsDaemon` so `stop_all` stops it; installs the exit hooks once."""
    global _guarded
    with _live_lock:
        _live.append(daemon)
        if not _guarded:
            _guarded = True
            atexit.register(stop_all)
    _install_signal_handlers()


def unregister(daemon) -> None:
    """Forget a daemon that stopped (or never started)."""
    with _live_lock:
        if daemon in _live:
            _live.remove(daemon)


def stop_all() -> None:
    """Stop every daemon this process started (registered with ``atexit``)."""
    with _live_lock:
        daemons = list(reversed(_live))
    for daemon in daemons:
        try:
            daemon.stop()
        except Exception as exc:  # noqa: BLE001 - the next one must still be stopped
            log.warning("stopping MPS daemon failed: %s", exc)


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


def _install_signal_handlers() -> None:
    """SIGTERM/SIGHUP unwind like an exception (so ``finally`` and ``atexit`` run), unless
    someone else already handles them. Only possible from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _exit_on_signal)


# -- daemons of dead controllers ------------------------------------------------------------------
def reap_stale(base_dir: str, *, binary: str | None, env: Mapping[str, str]) -> list[str]:
    """Stop daemons left by controllers that died without stopping them (SIGKILL, power loss).

    Looks only at our own private directories whose owner process is gone.
    """
    reaped = []
    try:
        entries = list(Path(base_dir).glob(DIR_PREFIX + "*"))
    except OSError:
        return reaped
    for root in entries:
        try:
            if root.stat().st_uid != os.getuid():
                continue
            owner = json.loads((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if same_process_alive(owner.get("pid"), owner.get("create_time")):
            continue
        pid_file = root / "pipe" / PID_FILE
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and alive(pid) and binary is not None:
            denv = dict(env)
            denv[PIPE_ENV], denv[LOG_ENV] = str(root / "pipe"), str(root / "log")
            try:
                proc.run_command([binary], env=denv, input_text="quit\n", timeout_s=10.0,
                                 marker=f"autotune-mps-{root.name}")
            except LaunchError:
                pass
            if not wait_gone(pid, 5.0):
                send_signal(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(str(root))
        log.warning("stopped an MPS daemon left behind by a dead controller (%s)", root)
    return reaped
