"""Every process the kit starts, and the check that none outlives it.

Each child gets ``GPU_PROOF_RUN=<marker>`` in its environment and its own session, so it and
everything it starts (autotune's ranks, their DataLoader workers, an MPS daemon and its server)
can be found by the marker and stopped as a group: TERM, a grace, KILL. `leftovers` scans
``/proc`` for processes that still carry the marker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MARKER_ENV = "GPU_PROOF_RUN"


@dataclass(frozen=True)
class Ran:
    """How one command ended; ``output`` is its stdout and stderr, interleaved."""

    argv: tuple[str, ...]
    returncode: int | None
    duration_s: float
    timed_out: bool
    output: str
    log_path: str

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output.rstrip().splitlines()[-lines:])


def start(argv, *, env, cwd, log_path: Path, stdin_text: str | None = None) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            list(argv), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            start_new_session=True)


def stop(popen: subprocess.Popen, *, grace_s: float = 10.0) -> int | None:
    """TERM the process's group, wait ``grace_s``, KILL it; its exit code."""
    if popen.poll() is None:
        _signal_group(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(popen.pid, signal.SIGKILL)  # stragglers of the group, even if it exited
    try:
        return popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


def _signal_group(pid: int, sig: int) -> None:
    send(pid, sig, group=True)


def run(argv, *, env, cwd, timeout_s: float, log_path: Path,
        stdin_text: str | None = None) -> Ran:
    """Run ``argv`` to its end or ``timeout_s`` (then stop its group); how it ended."""
    t0 = time.monotonic()
    popen = start(argv, env=env, cwd=cwd, log_path=log_path, stdin_text=stdin_text)
    timed_out = False
    try:
        if stdin_text is not None:
            try:
                popen.stdin.write(stdin_text.encode())
                popen.stdin.close()
            except BrokenPipeError:
                pass  # it ended without reading: its exit code and output say why
        popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        code = stop(popen, grace_s=10.0) if timed_out or popen.poll() is None else popen.wait()
    return Ran(tuple(map(str, argv)), code, time.monotonic() - t0, timed_out,
               log_path.read_text(errors="replace"), str(log_path))


def _state(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return text.rsplit(")", 1)[1].split()[0]


def leftovers(marker: str) -> list[dict]:
    """Live processes (not zombies, not this one) whose environment carries ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if needle not in environ:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        pid = int(entry.name)
        if _state(pid) not in ("Z", "X", "gone"):
            found.append({"pid": pid, "cmdline": cmdline[:300]})
    return found


def sweep(marker: str, *, grace_s: float = 5.0) -> list[dict]:
    """Stop whatever still carries ``marker`` (TERM, grace, KILL); what was found."""
    found = leftovers(marker)
    for p in found:
        send(p["pid"], signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_state(p["pid"]) not in ("Z", "X", "gone")
                                              for p in found):
        time.sleep(0.1)
    for p in found:
        send(p["pid"], signal.SIGKILL)
    return found


def send(pid: int, sig: int, *, group: bool = False) -> None:
    """A signal to a process (or its group) that may be gone already or not ours."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int | None) -> bool:
    return pid is not None and _state(pid) not in ("Z", "X", "gone")
