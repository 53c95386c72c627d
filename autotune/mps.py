"""CUDA MPS: the control daemon's whole life, the one place ``nvidia-cuda-mps-control`` is run.

Facts from the NVIDIA MPS guide this module is built on:

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the background. It and its clients
  meet through ``CUDA_MPS_PIPE_DIRECTORY`` (default /tmp/nvidia-mps) and log to
  ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``: start-up, shutdown, every user command); the
  daemon writes ``nvidia-cuda-mps-control.pid`` in the pipe directory. We give every daemon its
  own short private directories, so ours never touches a system-wide one. Paths over ~87
  characters make the daemon fail *silently*: we refuse them up front.
* Commands go to the daemon on the stdin of ``nvidia-cuda-mps-control`` (``get_server_list``,
  ``get_client_list PID``, ``quit``...). ``quit`` terminates it.
* A CUDA client that cannot reach the daemon silently runs without MPS, so MPS is *verified*:
  every rank's pid must show up in ``get_client_list`` of a server (`MpsDaemon.verify`).
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in a client's environment limits the share of the GPU's
  threads its context may use (`client_env`).
* Clients should end before the daemon does: killing an unsynchronised client can hang a server.

A started daemon is stopped (``quit``, then TERM/KILL of its pid if it does not go) on every exit
path of the controller: `stop` / the context manager, ``atexit`` (normal exit, an uncaught
exception, Ctrl-C unwinding to the CLI), and SIGTERM/SIGHUP, which are turned into ``SystemExit``
when no other handler is installed. Only SIGKILL of the controller leaves a daemon behind;
the next start finds and stops it (`reap_stale`).

Controller settings (environment): ``AUTOTUNE_MPS_CONTROL`` (path of the executable),
``AUTOTUNE_MPS_DIR`` (where private directories go, default /tmp), ``AUTOTUNE_MPS_KEEP=1``
(keep the directories and ``control.log`` after the daemon stopped).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune import proc
from autotune.errors import LaunchError

log = logging.getLogger(__name__)

BINARY = "nvidia-cuda-mps-control"
BINARY_ENV = "AUTOTUNE_MPS_CONTROL"
DIR_ENV = "AUTOTUNE_MPS_DIR"
KEEP_ENV = "AUTOTUNE_MPS_KEEP"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PID_FILE = "nvidia-cuda-mps-control.pid"
OWNER_FILE = "autotune-owner.json"
DIR_PREFIX = "atmps-"
MAX_DIR_CHARS = 87


class MpsError(LaunchError):
    """The MPS daemon could not be started, reached or verified."""


def find_binary(env: Mapping[str, str] | None = None) -> str | None:
    """Path of ``nvidia-cuda-mps-control``: ``$AUTOTUNE_MPS_CONTROL``, else on ``PATH``."""
    env = os.environ if env is None else env
    explicit = env.get(BINARY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which(BINARY, path=env.get("PATH"))


def available(env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether this controller could run MPS here, and if not, why."""
    binary = find_binary(env)
    if binary is None:
        return False, (f"{BINARY} not found on PATH (it ships with the NVIDIA driver's compute "
                       f"utilities; or set {BINARY_ENV})")
    from autotune import nvml

    ok, why = nvml.available()
    if not ok:
        return False, f"no GPU for MPS: {why}"
    return True, ""


def check_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse a pipe/log directory the daemon would fail on without a word."""
    text = str(path)
    if len(text) > MAX_DIR_CHARS:
        raise MpsError(f"{what} {text!r} is {len(text)} characters long; the MPS daemon fails "
                       f"silently on paths over {MAX_DIR_CHARS}. Set {DIR_ENV} to a short "
                       f"directory such as /tmp")


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


@dataclass(frozen=True)
class MpsCheck:
    """Whether the MPS daemon really serves the ranks."""

    ok: bool
    servers: tuple[int, ...]
    clients: tuple[int, ...]  # our pids the servers list as clients
    expected: int
    text: str


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
                raise MpsError(f"{BINARY} not found on PATH; install the NVIDIA compute "
                               f"utilities or set {BINARY_ENV}")
            check_dir(Path(self.base_dir) / (DIR_PREFIX + "x" * 8) / "pipe",
                      "MPS pipe directory")
            reap_stale(self.base_dir, binary=self.binary, env=self.env)
            self.root = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=self.base_dir))
            for sub in (self.pipe_dir, self.log_dir):
                check_dir(sub, "MPS directory")
                sub.mkdir(mode=0o700)
            me = psutil.Process()
            (self.root / OWNER_FILE).write_text(json.dumps(
                {"pid": me.pid, "create_time": me.create_time()}))
            _register(self)
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
        _unregister(self)
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
        return _pids(self.control("get_server_list"))

    def client_list(self, server_pid: int) -> list[int]:
        return _pids(self.control(f"get_client_list {server_pid}"))

    def clients(self) -> dict[int, list[int]]:
        """Server pid -> client pids, as the daemon reports them now."""
        return {server: self.client_list(server) for server in self.server_list()}

    def set_default_thread_pct(self, pct: float) -> None:
        """Default active thread share for servers started from now on (the guide's command)."""
        self.control(f"set_default_active_thread_percentage {float(pct):g}")

    def verify(self, pids: Callable[[], Collection[int]], *, expected: int,
               timeout_s: float = 60.0, still_running: Callable[[], bool] = lambda: True,
               interval_s: float = 1.0) -> MpsCheck:
        """Wait until ``expected`` of our processes are clients of an MPS server, or say why not.

        ``pids()`` gives the processes of the ranks now (their trees change while they start).
        Clients connect only when they initialise CUDA, so this polls until ``timeout_s`` or
        until ``still_running()`` turns false.
        """
        deadline = time.monotonic() + timeout_s
        servers: list[int] = []
        ours: set[int] = set()
        while True:
            try:
                table = self.clients()
            except MpsError as exc:
                return MpsCheck(False, (), (), expected, f"MPS daemon did not answer: {exc}")
            servers = sorted(table)
            ours = {c for cs in table.values() for c in cs} & set(pids())
            if len(ours) >= expected:
                return MpsCheck(True, tuple(servers), tuple(sorted(ours)), expected,
                                f"MPS serves {len(ours)} rank(s) through server(s) "
                                f"{', '.join(map(str, servers))}")
            if time.monotonic() >= deadline or not still_running():
                break
            time.sleep(interval_s)
        if not servers:
            why = "no MPS server was started: no rank reached the daemon"
        else:
            why = f"only {len(ours)} of {expected} ranks are MPS clients"
        return MpsCheck(False, tuple(servers), tuple(sorted(ours)), expected,
                        f"{why}; those ranks run without MPS (check {PIPE_ENV} in their "
                        f"environment and {self.control_log})")

    def running(self) -> bool:
        return self.pid is not None and _alive(self.pid)

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """``quit``; if the daemon is still there after ``timeout_s``, TERM, then KILL. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            _unregister(self)
            pid, root = self.pid, self.root
            if pid is not None and _alive(pid):
                try:
                    self.control("quit")
                except (MpsError, LaunchError) as exc:
                    log.warning("MPS quit failed: %s", exc)
                if not _wait_gone(pid, timeout_s):
                    log.warning("MPS daemon %s ignored quit; terminating it", pid)
                    _signal(pid, signal.SIGTERM)
                    if not _wait_gone(pid, 3.0):
                        _signal(pid, signal.SIGKILL)
                        _wait_gone(pid, 3.0)
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


def _pids(text: str) -> list[int]:
    return [int(w) for w in text.split() if w.isdigit()]


def _tail_hint(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return " (no control.log was written)"
    return ":\n" + "\n".join(lines) if lines else " (control.log is empty)"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait for ``pid`` to end, reaping it when it is our child (we are a subreaper)."""
    try:
        p = psutil.Process(pid)
        p.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        return not _alive(pid)
    except psutil.Error:
        pass
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- stopping on every exit path ------------------------------------------------------------------
_live: list[MpsDaemon] = []
_live_lock = threading.Lock()
_guarded = False


def _register(daemon: MpsDaemon) -> None:
    global _guarded
    with _live_lock:
        _live.append(daemon)
        if not _guarded:
            _guarded = True
            atexit.register(stop_all)
    _install_signal_handlers()


def _unregister(daemon: MpsDaemon) -> None:
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


# -- one daemon per controller ----------------------------------------------------------------
_shared: MpsDaemon | None = None


def shared(env: Mapping[str, str] | None = None) -> MpsDaemon:
    """The controller's MPS daemon, started on first use and kept for the whole run.

    Trials come and go; starting a daemon per trial would cost seconds each. It is stopped at
    controller exit (see the module docstring) or by `stop_shared`.
    """
    global _shared
    with _live_lock:
        current = _shared
    if current is not None and current.running():
        return current
    daemon = MpsDaemon(env=env).start()
    with _live_lock:
        _shared = daemon
    return daemon


def stop_shared() -> None:
    global _shared
    with _live_lock:
        daemon, _shared = _shared, None
    if daemon is not None:
        daemon.stop()


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
        if _same_process_alive(owner.get("pid"), owner.get("create_time")):
            continue
        pid_file = root / "pipe" / PID_FILE
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None and _alive(pid) and binary is not None:
            denv = dict(env)
            denv[PIPE_ENV], denv[LOG_ENV] = str(root / "pipe"), str(root / "log")
            try:
                proc.run_command([binary], env=denv, input_text="quit\n", timeout_s=10.0,
                                 marker=f"autotune-mps-{root.name}")
            except LaunchError:
                pass
            if not _wait_gone(pid, 5.0):
                _signal(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
        reaped.append(str(root))
        log.warning("stopped an MPS daemon left behind by a dead controller (%s)", root)
    return reaped


def _same_process_alive(pid, create_time) -> bool:
    try:
        p = psutil.Process(int(pid))
        return abs(p.create_time() - float(create_time)) < 1e-3
    except (psutil.Error, TypeError, ValueError):
        return False
