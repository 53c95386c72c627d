"""The controller dying (kill -9, a closed terminal) leaves no process of the run behind, even
when it dies before a rank has reached it."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from autotune.launching.rank_command import PROJECT_ROOT
from conftest import SCRIPTS, trial_processes
from probes import meter, protocol

pytestmark = pytest.mark.slow


def copy_scripts(tmp_path):
    for name in ("_tiny.py", "ok.py", "hang.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)


def run_processes(tmp_path):
    """Live processes whose command line names this test's private copy of the scripts."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if str(tmp_path) in cmd and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def poll(cond, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False


def start_controller(tmp_path, script, *args):
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "probe", "--plain", "--seconds", "120",
         "--modes", "full", str(tmp_path / script), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def ranks_started(tmp_path):
    return any("probes.boot" in " ".join(p.cmdline()) for p in run_processes(tmp_path))


@pytest.mark.parametrize("script, args", [("ok.py", ()), ("hang.py", ("--after", "5"))])
def test_kill_9_of_controller_leaves_nothing(tmp_path, script, args):
    copy_scripts(tmp_path)
    ctl = start_controller(tmp_path, script, *args)
    try:
        assert poll(lambda: ranks_started(tmp_path), 60), "the probe never started"
        time.sleep(3)  # let it train (or hang) for a while
        ctl.send_signal(signal.SIGKILL)
        ctl.wait(10)
        # A rank stops at its next batch; a hung one ends its group after a grace period.
        assert poll(lambda: not run_processes(tmp_path), 40), \
            f"left behind: {[p.cmdline() for p in run_processes(tmp_path)]}"
    finally:
        for p in run_processes(tmp_path):
            p.kill()
        if ctl.poll() is None:
            ctl.kill()


def test_sighup_of_controller_cleans_up_and_says_so(tmp_path):
    copy_scripts(tmp_path)
    ctl = start_controller(tmp_path, "ok.py")
    try:
        assert poll(lambda: ranks_started(tmp_path), 60), "the probe never started"
        ctl.send_signal(signal.SIGHUP)
        _, err = ctl.communicate(timeout=60)
        assert ctl.returncode == 128 + signal.SIGHUP
        assert "SIGHUP" in err.decode()
        assert "Traceback" not in err.decode()
        assert not run_processes(tmp_path)
    finally:
        for p in run_processes(tmp_path):
            p.kill()
        if ctl.poll() is None:
            ctl.kill()


def refused_addr() -> str:
    """A loopback address nobody listens at: a collector whose process has ended."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_controller_gone_only_when_its_process_on_this_host_has_ended():
    host = socket.gethostname()
    assert meter.controller_gone(f"{host}:{ended_pid()}")
    assert not meter.controller_gone(f"{host}:{os.getpid()}")
    assert not meter.controller_gone(f"another-{host}:{ended_pid()}")  # cannot be told
    assert not meter.controller_gone("") and not meter.controller_gone(f"{host}:x")
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not yet reaped
    try:
        assert poll(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30)
        assert meter.controller_gone(f"{host}:{zombie.pid}")
    finally:
        zombie.wait()


# How a rank whose controller has ended leaves: at its next batch (0), or, when the script
# has not reached one within the grace (`probes.meter.ORPHAN_GRACE_S`: a loaded CI worker once
# still started its loader's worker then), by the TERM it sends its own process group.
STOPPED = (0, -signal.SIGTERM)


def closing_addr() -> tuple[str, socket.socket]:
    """A loopback address that accepts a connection and closes it at once, unanswered: a
    controller killed while its rank connected (the CI once saw a rank run on so)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}", server


def test_a_rank_whose_controller_ended_while_it_connected_leaves(tmp_path):
    copy_scripts(tmp_path)
    addr, server = closing_addr()
    marker = f"t{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), protocol.ENV_ADDR: addr,
           protocol.ENV_TOKEN: "00", protocol.ENV_TRIAL: marker,
           protocol.ENV_CONTROLLER: f"{socket.gethostname()}:{ended_pid()}"}
    rank = subprocess.Popen([sys.executable, "-m", "probes.boot", str(tmp_path / "ok.py"),
                             "--steps", "1000000000", "--workers", "1"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = rank.communicate(timeout=120)
        assert rank.returncode in STOPPED, err[-2000:]
        assert "has ended; stopping this run" in err, err[-2000:]
        assert poll(lambda: not trial_processes(marker), 30), trial_processes(marker)
    finally:
        server.close()
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)


@pytest.mark.parametrize("ended", [True, False])
def test_a_rank_whose_controller_ended_before_it_connected_leaves(tmp_path, ended):
    """The controller killed while its rank still starts: the rank finds nobody at the address.
    If the controller's process has ended the rank stops, loader workers and all; if it still
    runs (a network fault, say) the script carries on unmeasured."""
    copy_scripts(tmp_path)
    controller = ended_pid() if ended else os.getpid()
    marker = f"t{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), protocol.ENV_ADDR: refused_addr(),
           protocol.ENV_TOKEN: "00", protocol.ENV_TRIAL: marker,
           protocol.ENV_CONTROLLER: f"{socket.gethostname()}:{controller}"}
    steps = "1000000000" if ended else "200"  # never ends by itself, or soon
    rank = subprocess.Popen([sys.executable, "-m", "probes.boot", str(tmp_path / "ok.py"),
                             "--steps", steps, "--workers", "1"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # it ends its own process group
    try:
        _, err = rank.communicate(timeout=120)
        assert rank.returncode in (STOPPED if ended else (0,)), err[-2000:]
        if ended:
            assert "has ended; stopping this run" in err, err[-2000:]
        else:
            assert "the script runs unmeasured" in err and "stopping" not in err, err[-2000:]
        assert poll(lambda: not trial_processes(marker), 30), trial_processes(marker)
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
