"""The kit's own MPS control daemon, run through ``nvidia-cuda-mps-control`` as the NVIDIA MPS
guide documents it, independent of autotune's.

``-d`` starts the daemon in the background; it and its clients meet in
``CUDA_MPS_PIPE_DIRECTORY`` and it logs to ``CUDA_MPS_LOG_DIRECTORY/control.log``; commands go
on the stdin of the binary run without arguments (``get_server_list``, ``get_client_list PID``,
``quit``). The pid file ``nvidia-cuda-mps-control.pid`` in the pipe directory says it is up.
Paths over ~87 characters make it fail silently, so its directories are short ones in /tmp.

Every daemon started here is stopped with ``quit`` (then TERM, then KILL) on every exit path:
`Daemon.stop`, ``atexit``, and SIGTERM/SIGHUP turned into ``SystemExit`` by the kit's entry.
"""

from __future__ import annotations

import atexit
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

from gpuproof import procs

BINARY = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PID_FILE = "nvidia-cuda-mps-control.pid"
MAX_DIR_CHARS = 87

_live: list[Daemon] = []


class MpsStartError(Exception):
    """The daemon did not start; the message says why and where to look."""


def find(env) -> str | None:
    return shutil.which(BINARY, path=env.get("PATH"))


def binary_kind(path: str | None) -> str | None:
    """``elf`` (what NVIDIA ships), ``script`` (``#!``: a wrapper or a test fake), or ``other``."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return None
    return "elf" if head == b"\x7fELF" else "script" if head[:2] == b"#!" else "other"


def parse_pids(text: str) -> list[int]:
    return [int(w) for w in re.findall(r"^\s*(\d+)\s*$", text, flags=re.M)]


def control(binary: str, env, command: str, *, timeout_s: float, log_path: Path) -> str:
    """One command to the daemon whose pipe directory ``env`` names; its answer."""
    ran = procs.run([binary], env=env, cwd="/", timeout_s=timeout_s, log_path=log_path,
                    stdin_text=command + "\n")
    if ran.returncode != 0 or ran.timed_out:
        raise MpsStartError(f"MPS command {command!r} failed (exit {ran.returncode}"
                            f"{', timed out' if ran.timed_out else ''}): {ran.tail(3)}")
    return ran.output


def clients_at(binary: str, env, pipe_dir: Path, *, log_dir: Path) -> dict[int, list[int]]:
    """Server pid -> client pids of a daemon the kit did not start (autotune's), by its pipe."""
    env = {**env, PIPE_ENV: str(pipe_dir)}
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = parse_pids(control(binary, env, "get_server_list", timeout_s=15,
                                 log_path=log_dir / "get_server_list.out"))
    return {s: parse_pids(control(binary, env, f"get_client_list {s}", timeout_s=15,
                                  log_path=log_dir / f"get_client_list-{s}.out"))
            for s in servers}


class Daemon:
    """One private daemon: `start`, `control`, `clients`, `stop`."""

    def __init__(self, binary: str, *, env, work: Path, start_timeout_s: float = 15.0,
                 command_timeout_s: float = 15.0):
        self.binary, self.env, self.work = binary, dict(env), work
        self.start_timeout_s, self.command_timeout_s = start_timeout_s, command_timeout_s
        self.root: Path | None = None
        self.pid: int | None = None
        self.commands: list[str] = []
        self.stopped: dict | None = None

    @property
    def pipe_dir(self) -> Path:
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def client_env(self, thread_pct: float | None) -> dict[str, str]:
        env = {PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}
        if thread_pct is not None:
            env[THREAD_PCT_ENV] = f"{float(thread_pct):g}"
        return env

    def _env(self) -> dict[str, str]:
        return {**self.env, **self.client_env(None)}

    def start(self) -> Daemon:
        self.root = Path(tempfile.mkdtemp(prefix="gpmps", dir="/tmp"))
        for sub in (self.pipe_dir, self.log_dir):
            if len(str(sub)) > MAX_DIR_CHARS:
                raise MpsStartError(f"{sub} is over {MAX_DIR_CHARS} characters")
            sub.mkdir(mode=0o700)
        _live.append(self)
        try:
            ran = procs.run([self.binary, "-d"], env=self._env(), cwd="/",
                            timeout_s=self.command_timeout_s, log_path=self.log_dir / "start.out")
            if ran.returncode != 0:
                raise MpsStartError(f"'{self.binary} -d' exited {ran.returncode}: "
                                    f"{ran.tail(5) or '(no output)'}")
            self.pid = self._wait_pid()
            self.control("get_server_list")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_pid(self) -> int:
        deadline = time.monotonic() + self.start_timeout_s
        pid_file = self.pipe_dir / PID_FILE
        while time.monotonic() < deadline:
            try:
                pid = int(pid_file.read_text().strip())
                if procs.alive(pid):
                    return pid
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise MpsStartError(f"'{self.binary} -d' exited 0 but no daemon came up: no {PID_FILE} "
                            f"in {self.pipe_dir} after {self.start_timeout_s:g} s (the daemon "
                            f"fails silently); control.log: {self.log_tail() or '(none written)'}")

    def control(self, command: str) -> str:
        """One command on the control shell's stdin; its answer, or `MpsStartError`."""
        self.commands.append(command)
        return control(self.binary, self._env(), command, timeout_s=self.command_timeout_s,
                       log_path=self.log_dir / f"cmd-{len(self.commands)}.out")

    def servers(self) -> list[int]:
        return parse_pids(self.control("get_server_list"))

    def clients(self) -> dict[int, list[int]]:
        return {s: parse_pids(self.control(f"get_client_list {s}")) for s in self.servers()}

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = (self.log_dir / "control.log").read_text(errors="replace")
        except (OSError, TypeError):
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self, *, timeout_s: float = 10.0) -> dict:
        """``quit``, then TERM, then KILL; what it took. Idempotent."""
        if self.stopped is not None:
            return self.stopped
        if self in _live:
            _live.remove(self)
        pid, how, quit_error = self.pid, "never started", None
        if pid is not None and procs.alive(pid):
            try:
                self.control("quit")
                how = "quit"
            except MpsStartError as exc:
                quit_error = str(exc)
            if not _wait_gone(pid, timeout_s):
                how = "TERM after quit failed" if quit_error else "TERM after quit was ignored"
                procs.send(pid, signal.SIGTERM)
                if not _wait_gone(pid, 3.0):
                    how = "KILL"
                    procs.send(pid, signal.SIGKILL)
                    _wait_gone(pid, 3.0)
        elif pid is not None:
            how = "already gone"
        self.stopped = {"pid": pid, "how": how, "quit_error": quit_error,
                        "gone": not procs.alive(pid), "commands": list(self.commands),
                        "control_log_tail": self.log_tail(8)}
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        return self.stopped


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while procs.alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_all() -> list[dict]:
    """Stop every daemon of this process that is still up (registered with ``atexit``)."""
    return [d.stop() for d in list(reversed(_live))]


atexit.register(stop_all)


def mps_processes() -> list[dict]:
    """Every MPS control daemon and server running here (by process name), whoever started it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if name.startswith("nvidia-cuda-mps") and procs.alive(int(entry.name)):
            found.append({"pid": int(entry.name), "name": name})
    return found


def foreign_daemons(marker: str) -> list[dict]:
    """MPS control daemons and servers running here that the kit did not start."""
    ours = {p["pid"] for p in procs.leftovers(marker)}
    return [p for p in mps_processes() if p["pid"] not in ours]
