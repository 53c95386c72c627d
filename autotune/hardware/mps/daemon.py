"""`MpsDaemon`: one private MPS control daemon, started, sent commands, and stopped.

The only place ``nvidia-cuda-mps-control`` is run for a daemon of ours (through `autotune.hardware.proc`).
A daemon gets its own short private directories, registers with `autotune.hardware.mps.registry` as it
starts so it is stopped on every exit path of the controller, and stops with ``quit``, then TERM,
then KILL. Checking that the ranks really are its clients lives in `autotune.hardware.mps.verify`.
Also here: what a client needs in its environment (`client_env`) and the one daemon the whole
run shares (`shared`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import psutil

from autotune.hardware import proc
from autotune import LaunchError
from autotune.hardware.mps import registry
from autotune.hardware.mps.config import (BINARY, BINARY_ENV, DIR_ENV, DIR_PREFIX, KEEP_ENV,
                                          LOG_ENV, OWNER_FILE, PID_FILE, PIPE_ENV, THREAD_PCT_ENV,
                                          MpsError, check_dir, find_binary)
from autotune.hardware.mps.process import alive, parse_pids, send_signal, wait_gone
from autotune.hardware.mps.verify import MpsCheck, wait_for_clients

log = logging.getLogger(__name__)


class MpsDaemon:
    """One private MPS control daemon. Spec apart from state: nothing runs until `start`."""

    def __init__(self, *, binary: str | None = None, base_dir: str | None = None,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 15.0,
                 command_timeout_s: float = 10.0):
        self.env = dict(os.environ if env is None else env)
        self.binary = binary or find_binary(self.env)
        self.base_dir = base_dir or self.env.get(DIR_ENV) or "/tmp"
        self.start_timeout_s = start_timeout_s
        self.command_timeout_s = command_timeout_s
        self.root: Path | None = None
        self.pid: int | None = None
        self.commands: list[str] = []  # every command we sent, in order
        self._lock = threading.RLock()
        self._stopped = False

    @property
    def pipe_dir(self) -> Path:
        return self._require_root() / "pipe"

    @property
    def log_dir(self) -> Path:
        return self._require_root() / "log"

    @property
    def control_log(self) -> Path:
        return self.log_dir / "control.log"

    def _require_root(self) -> Path:
        if self.root is None:
            raise MpsError("the MPS daemon has not been started")
        return self.root

    def _daemon_env(self) -> dict[str, str]:
        env = dict(self.env)
        env[PIPE_ENV] = str(self.pipe_dir)
        env[LOG_ENV] = str(self.log_dir)
        return env

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> MpsDaemon:
        """Start the daemon and wait until it answers; raises `MpsError` saying where to look."""
        with self._lock:
            if self.pid is not None:
                return self
            if self.binary is None:
                explicit = self.env.get(BINARY_ENV)
                raise MpsError(f"{BINARY_ENV}={explicit!r} is not an executable file; point it "
                               f"at {BINARY} or unset it" if explicit else
                               f"{BINARY} not found on PATH; install the NVIDIA compute "
                               f"utilities or set {BINARY_ENV}")
            check_dir(Path(self.base_dir) / (DIR_PREFIX + "x" * 8) / "pipe",
                      "MPS pipe directory")
            registry.reap_stale(self.base_dir, binary=self.binary, env=self.env)
            self.root = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=self.base_dir))
            for sub in (self.pipe_dir, self.log_dir):
                check_dir(sub, "MPS directory")
                sub.mkdir(mode=0o700)
            me = psutil.Process()
            (self.root / OWNER_FILE).write_text(json.dumps(
                {"pid": me.pid, "create_time": me.create_time()}))
            registry.register(self)
            try:
                result = proc.run_command([self.binary, "-d"], env=self._daemon_env(),
                                          timeout_s=self.command_timeout_s,
                                          marker=f"autotune-mps-{self.root.name}")
                if result.returncode != 0:
                    raise MpsError(f"'{self.binary} -d' exited {result.returncode}: "
                                   f"{(result.stderr or result.stdout).strip()[-500:]}")
                self.pid = self._wait_for_pid()
                self.control("get_server_list")  # answers: the daemon is up and ours
            except BaseException:
                self._cleanup_failed_start()
                raise
            log.info("MPS control daemon %s started (pipe %s)", self.pid, self.pipe_dir)
            return self

    def _wait_for_pid(self) -> int:
        pid_file = self.pipe_dir / PID_FILE
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                pid = int(pid_file.read_text().strip())
                if psutil.pid_exists(pid):
                    return pid
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise MpsError(f"the MPS control daemon did not start: no {PID_FILE} in {self.pipe_dir} "
                       f"after {self.start_timeout_s:g} s; see {self.control_log}"
                       f"{_tail_hint(self.control_log)}")

    def _cleanup_failed_start(self) -> None:
        if self.pid is not None:
            self.stop()
            return
        registry.unregister(self)
        if self.root is not None and os.environ.get(KEEP_ENV) != "1":
            shutil.rmtree(self.root, ignore_errors=True)

    def control(self, command: str) -> str:
        """Send one command to the daemon; its answer. A refused command raises `MpsError`."""
        with self._lock:
            self.commands.append(command)
            result = proc.run_command([self._require_binary()], env=self._daemon_env(),
                                      input_text=command + "\n",
                                      timeout_s=self.command_timeout_s,
                                      marker=f"autotune-mps-{self._require_root().name}")
        if result.returncode != 0:
            raise MpsError(f"MPS command {command!r} failed (exit {result.returncode}): "
                           f"{(result.stderr + result.stdout).strip()[-300:]}; "
                           f"see {self.control_log}")
        return result.stdout

    def _require_binary(self) -> str:
        if self.binary is None:
            raise MpsError(f"{BINARY} not found")
        return self.binary

    def server_list(self) -> list[int]:
        return parse_pids(self.control("get_server_list"))

    def client_list(self, server_pid: int) -> list[int]:
        return parse_pids(self.control(f"get_client_list {server_pid}"))

    def clients(self) -> dict[int, list[int]]:
        """Server pid -> client pids, as the daemon reports them now."""
        return {server: self.client_list(server) for server in self.server_list()}

    def verify(self, pids: Callable[[], Collection[int]], *, expected: int,
               timeout_s: float = 60.0, still_running: Callable[[], bool] = lambda: True,
               interval_s: float = 1.0) -> MpsCheck:
        """Wait until ``expected`` of our processes are clients of an MPS server, or say why not.

        See `autotune.hardware.mps.verify.wait_for_clients`.
        """
        return wait_for_clients(self.clients, pids, expected=expected,
                                control_log=self.control_log, timeout_s=timeout_s,
                                still_running=still_running, interval_s=interval_s)

    def running(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """``quit``; if the daemon is still there after ``timeout_s``, TERM, then KILL. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            registry.unregister(self)
            pid, root = self.pid, self.root
            if pid is not None and alive(pid):
                try:
                    self.control("quit")
                except (MpsError, LaunchError) as exc:
                    log.warning("MPS quit failed: %s", exc)
                if not wait_gone(pid, timeout_s):
                    log.warning("MPS daemon %s ignored quit; terminating it", pid)
                    send_signal(pid, signal.SIGTERM)
                    if not wait_gone(pid, 3.0):
                        send_signal(pid, signal.SIGKILL)
                        wait_gone(pid, 3.0)
            if root is not None:
                proc.sweep_marker(f"autotune-mps-{root.name}")
                if os.environ.get(KEEP_ENV) != "1":
                    shutil.rmtree(root, ignore_errors=True)
            if pid is not None:
                log.info("MPS control daemon %s stopped", pid)

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def client_env(daemon: MpsDaemon | None, thread_pct: float | None) -> dict[str, str]:
    """What one MPS client needs in its environment: the daemon's dirs and its thread share."""
    env = {}
    if daemon is not None:
        env[PIPE_ENV] = str(daemon.pipe_dir)
        env[LOG_ENV] = str(daemon.log_dir)
    if thread_pct is not None:
        if not 0 < float(thread_pct) <= 100:
            raise ValueError(f"0 < thread_pct <= 100 must hold, but got {thread_pct}")
        env[THREAD_PCT_ENV] = f"{float(thread_pct):g}"
    return env


def _tail_hint(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return " (no control.log was written)"
    return ":\n" + "\n".join(lines) if lines else " (control.log is empty)"


# -- one daemon per controller ----------------------------------------------------------------
_shared: MpsDaemon | None = None
_shared_lock = threading.Lock()


def shared(env: Mapping[str, str] | None = None) -> MpsDaemon:
    """The controller's MPS daemon, started on first use and kept for the whole run.

    Trials come and go; starting a daemon per trial would cost seconds each. It is stopped at
    controller exit (see `autotune.hardware.mps`) or by `stop_shared`.
    """
    global _shared
    with _shared_lock:
        current = _shared
    if current is not None and current.running():
        return current
    daemon = MpsDaemon(env=env).start()
    with _shared_lock:
        _shared = daemon
    return daemon


def stop_shared() -> None:
    global _shared
    with _shared_lock:
        daemon, _shared = _shared, None
    if daemon is not None:
        daemon.stop()
