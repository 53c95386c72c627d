"""The controller dying (kill -9, a closed terminal) leaves no process of the run behind."""

import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import SCRIPTS

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
