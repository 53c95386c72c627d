"""The MPS daemon's life against the fake nvidia-cuda-mps-control (documented protocol)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from autotune.hardware import mps
from fakes import fake_cuda
from fakes.gpu_host import MPS_CONTROL, ROOT


@pytest.fixture
def base_dir():
    path = tempfile.mkdtemp(prefix="atm", dir="/tmp")  # short: the daemon needs short paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv(mps.BINARY_ENV, str(MPS_CONTROL))
    monkeypatch.delenv(mps.KEEP_ENV, raising=False)
    return dict(os.environ)


def wait_until(predicate, what, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def daemon_alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_start_command_verify_stop(env, base_dir, monkeypatch):
    monkeypatch.setenv(mps.KEEP_ENV, "1")  # keep control.log to read it afterwards
    daemon = mps.MpsDaemon(env=env, base_dir=base_dir).start()
    try:
        assert daemon_alive(daemon.pid)
        assert len(str(daemon.pipe_dir)) <= mps.MAX_DIR_CHARS
        assert (daemon.pipe_dir / mps.PID_FILE).read_text().strip() == str(daemon.pid)
        assert daemon.server_list() == []
        for key, value in mps.client_env(daemon, 40).items():
            monkeypatch.setenv(key, value)
        client = fake_cuda.connect()  # what the CUDA driver does at cuInit
        assert client is not None
        check = daemon.verify(lambda: {os.getpid()}, expected=1, timeout_s=10)
        assert check.ok and check.clients == (os.getpid(),) and len(check.servers) == 1
        client.close()
    finally:
        daemon.stop()
    assert not daemon_alive(daemon.pid)
    log = daemon.control_log.read_text()
    for command in ("get_server_list", f"get_client_list {check.servers[0]}", "quit"):
        assert f"Cmd:{command}\n" in log
    assert log.rstrip().endswith("Exit")
    assert daemon.commands[0] == "get_server_list" and daemon.commands[-1] == "quit"
    assert not (daemon.pipe_dir / mps.PID_FILE).exists()
    daemon.stop()  # idempotent


def test_verify_says_when_ranks_run_without_mps(env, base_dir, monkeypatch):
    with mps.MpsDaemon(env=env, base_dir=base_dir) as daemon:
        check = daemon.verify(lambda: {os.getpid()}, expected=1, timeout_s=0.3, interval_s=0.1)
        assert not check.ok and "no MPS server" in check.text and "without MPS" in check.text
        for key, value in mps.client_env(daemon, None).items():
            monkeypatch.setenv(key, value)
        client = fake_cuda.connect()
        try:
            check = daemon.verify(lambda: {os.getpid(), 1}, expected=2, timeout_s=0.3,
                                  interval_s=0.1)
            assert not check.ok and "only 1 of 2" in check.text
        finally:
            client.close()
    assert not daemon_alive(daemon.pid)
    assert not Path(daemon.root).exists()  # private dirs removed


def test_refuses_paths_the_daemon_would_silently_fail_on(env):
    long_base = "/tmp/" + "d" * 90
    with pytest.raises(mps.MpsError, match="over 87"):
        mps.MpsDaemon(env=env, base_dir=long_base).start()
    assert not Path(long_base).exists()


def test_silent_start_failure_is_reported(env, base_dir, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL_START", "1")
    daemon = mps.MpsDaemon(env=dict(os.environ), base_dir=base_dir, start_timeout_s=1.0)
    with pytest.raises(mps.MpsError, match="did not start.*control.log"):
        daemon.start()
    assert list(Path(base_dir).iterdir()) == []


def test_unknown_command_is_refused(env, base_dir):
    with mps.MpsDaemon(env=env, base_dir=base_dir) as daemon:
        with pytest.raises(mps.MpsError, match="bogus_command"):
            daemon.control("bogus_command")


def test_missing_binary(tmp_path, base_dir):
    env = {"PATH": str(tmp_path)}
    assert mps.find_binary(env) is None
    assert not mps.available(env)[0] and "not found" in mps.available(env)[1]
    with pytest.raises(mps.MpsError, match="not found"):
        mps.MpsDaemon(env=env, base_dir=base_dir).start()


def test_a_control_path_that_is_not_executable_is_named(tmp_path, base_dir):
    """AUTOTUNE_MPS_CONTROL set to something that cannot run: say so, not 'not found on PATH'."""
    wrong = tmp_path / "nvidia-cuda-mps-control.txt"
    wrong.write_text("not a program\n")
    env = {"PATH": str(tmp_path), mps.BINARY_ENV: str(wrong)}
    ok, why = mps.available(env)
    assert not ok and str(wrong) in why and "not an executable file" in why
    with pytest.raises(mps.MpsError, match="is not an executable file"):
        mps.MpsDaemon(env=env, base_dir=base_dir).start()


def test_client_env_checks_the_share():
    assert mps.client_env(None, 25) == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    with pytest.raises(ValueError, match="thread_pct"):
        mps.client_env(None, 0)


HOLDER = """
import sys, time
from autotune.hardware import mps
d = mps.MpsDaemon(base_dir=sys.argv[1]).start()
print(d.pid, flush=True)
time.sleep(120)
"""


def _holder(env, base_dir):
    child_env = dict(env, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, base_dir], env=child_env,
                         stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    return p, pid


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_controller_signal_stops_the_daemon(env, base_dir, sig):
    p, pid = _holder(env, base_dir)
    assert daemon_alive(pid)
    p.send_signal(sig)
    assert p.wait(timeout=30) == 128 + sig
    wait_until(lambda: not daemon_alive(pid), "the daemon to go")
    assert list(Path(base_dir).iterdir()) == []


def test_daemon_of_a_killed_controller_is_reaped_by_the_next(env, base_dir):
    p, pid = _holder(env, base_dir)
    p.kill()  # SIGKILL: no handler can run, the daemon stays
    p.wait(timeout=30)
    assert daemon_alive(pid)
    with mps.MpsDaemon(env=env, base_dir=base_dir) as daemon:
        wait_until(lambda: not daemon_alive(pid), "the stale daemon to go")
        assert [p.name for p in Path(base_dir).iterdir()] == [daemon.root.name]
