"""``-d``/``--detach`` for ``tune``, ``wrap`` and ``run``: the controller as a daemon.

The command the user typed starts ``python -m autotune`` with the same arguments in a session of
its own (`autotune.hardware.proc.start_daemon`: no controlling terminal, stdin from /dev/null),
its output appended to a file beside the runs, and waits for the handshake: once the daemon has
written its run's journal start and its controller file, it moves that file into its run
directory (``output.log``), writes the run directory's path on a pipe and closes it. The command
then prints the run's id and how to follow, stop and report it, and exits 0. A daemon that ends
before the handshake (a usage error, a missing script) has its output shown and its exit code
returned. The daemon ignores SIGHUP, and takes SIGINT (``autotune stop``) as Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time
from pathlib import Path

from autotune import AutotuneError, UsageError
from autotune.hardware import proc
from autotune.store import rundir

ENV_DETACHED = "AUTOTUNE_DETACHED"  # "<fd>:<output path>": set for the daemon only
READY_TIMEOUT_S = 120.0  # the daemon's start: parsing, the fingerprint, the run directory
_handshake: tuple[int, Path] | None = None  # the daemon's side, until `ready`


def add_detach_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--detach", action="store_true",
                   help="run the controller in the background, detached from this terminal "
                        "(it goes on when the terminal closes); prints the run's id; follow it "
                        "with 'autotune logs -f ID', stop it with 'autotune stop ID'")


def is_daemon() -> bool:
    return _handshake is not None


def become_daemon() -> bool:
    """The daemon's side, at start-up: take the handshake from the environment (so the ranks do
    not inherit it), ignore SIGHUP, take SIGINT as Ctrl-C even when started from a shell that
    ignores it, and flush every output line. False where this process is no daemon."""
    global _handshake
    value = os.environ.pop(ENV_DETACHED, "")
    fd_text, _, path = value.partition(":")
    if not fd_text.isdigit() or not path:
        return False
    _handshake = (int(fd_text), Path(path))
    try:
        os.set_inheritable(int(fd_text), False)
    except OSError:
        _handshake = None
        return False
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass
    return True


def ready(run_dir: Path) -> None:
    """The daemon has started its run (journal and controller file written): its output goes
    to the run directory from now on, and the command that started it is told where."""
    global _handshake
    if _handshake is None:
        return
    fd, temp = _handshake
    _handshake = None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    _adopt_output(temp, Path(run_dir) / rundir.OUTPUT)
    try:
        os.write(fd, f"{Path(run_dir).resolve()}\n".encode())
    except OSError:
        pass  # the command that started us is gone; the run goes on
    finally:
        os.close(fd)


def _adopt_output(temp: Path, target: Path) -> None:
    """Move the output written so far to ``target``; a resumed run's log is appended to."""
    if not target.exists():
        try:
            os.rename(temp, target)
            return
        except OSError:
            pass
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return  # the output stays where it was
    try:
        with open(temp, "rb") as f:
            os.write(fd, f.read())
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        temp.unlink(missing_ok=True)
    except OSError:
        pass
    finally:
        os.close(fd)


def start(args, argv: list[str]) -> int:
    """The user's side of ``-d``: start the daemon, wait for its handshake, say where it is."""
    if os.environ.get("SLURM_JOB_ID"):
        raise UsageError(f"-d: refused inside a Slurm job ({os.environ['SLURM_JOB_ID']}): the "
                         f"batch job already outlives the terminal; run without -d")
    root = Path(args.runs_dir).expanduser() if getattr(args, "runs_dir", None) else \
        rundir.runs_root()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise rundir.write_error(root, exc) from None
    temp = root / f".starting-{os.getpid()}-{time.time_ns()}.log"
    read_fd, write_fd = os.pipe()
    env = dict(os.environ)
    env[ENV_DETACHED] = f"{write_fd}:{temp}"
    project = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (project, env.get("PYTHONPATH", "")) if p)
    try:
        daemon = proc.start_daemon((sys.executable, "-m", "autotune", *argv), env=env,
                                   cwd=os.getcwd(), output_path=temp, pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
    try:
        said = _wait_ready(read_fd, daemon, READY_TIMEOUT_S)
    finally:
        os.close(read_fd)
    if said:
        return _started(Path(said), daemon.pid, args)
    return _failed(daemon, temp)


def _wait_ready(fd: int, daemon, timeout_s: float) -> str:
    """What the daemon wrote on the pipe before closing it (its run directory), or ""."""
    deadline = time.monotonic() + timeout_s
    got = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.5)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            got += chunk
            if got.endswith(b"\n"):
                break
    else:
        try:
            os.killpg(daemon.pid, signal.SIGTERM)  # it would run on, with nobody told of it
        except ProcessLookupError:
            pass
    return got.decode(errors="replace").strip()


def _failed(daemon, temp: Path) -> int:
    try:
        code = daemon.wait(timeout=30)
    except Exception:  # noqa: BLE001 - a daemon that does not end: killed, said so below
        try:
            os.killpg(daemon.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = daemon.wait()
    try:
        sys.stderr.write(temp.read_text(errors="replace"))
        temp.unlink()
    except OSError:
        pass
    if code == 0:
        raise AutotuneError("the detached controller ended before it started a run "
                            "(nothing to detach from)")
    if code < 0 or code >= 128:
        raise AutotuneError(f"the detached controller did not start within "
                            f"{READY_TIMEOUT_S:.0f} s, or was killed (exit code {code})")
    return code


def _started(run_dir: Path, pid: int, args) -> int:
    where = f" --runs-dir {args.runs_dir}" if getattr(args, "runs_dir", None) else ""
    rid = run_dir.name
    print(f"run {rid} started, detached (controller pid {pid})\n"
          f"  directory: {run_dir}\n"
          f"  list:      autotune ps{where}\n"
          f"  follow:    autotune logs -f {rid}{where}   (or: autotune monitor {rid}{where})\n"
          f"  stop:      autotune stop {rid}{where}\n"
          f"  report:    autotune report {rid}{where}", flush=True)
    return 0
