"""``autotune monitor`` as a separate process: finished runs, live runs, Ctrl-C, the latest run."""

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


from autotune.store.journal import Journal

JOURNALS = Path(__file__).parent / "data" / "journals"
ESC = "\x1b"


def autotune(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "autotune", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


class Lines:
    """Collects a stream's lines in a thread so a test can wait for one with a deadline."""

    def __init__(self, stream):
        self.q, self.seen = queue.Queue(), []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            self.q.put(line.rstrip("\n"))

    def wait_for(self, needle, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"{needle!r} not seen in {timeout_s} s; saw {self.seen}")


def copy_run(tmp_path, name) -> Path:
    run_dir = tmp_path / "runs" / name
    run_dir.mkdir(parents=True)
    shutil.copy(JOURNALS / f"{name}.jsonl", run_dir / "events.jsonl")
    return run_dir


def test_monitor_on_a_finished_run_prints_it_and_exits_0(tmp_path):
    run_dir = copy_run(tmp_path, "tune_mixed")
    p = autotune("monitor", str(run_dir))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert ESC not in out  # a pipe gets plain lines
    lines = out.splitlines()
    assert lines[0].endswith("run started: autotune wrap train.py (budget 10:00, up to 8 trials)")
    assert lines[-1].endswith("run ended: exit code 0")
    assert any(ln.endswith("trial #4 pruned: interval 100.2-140.4 cannot reach the best 301.7")
               for ln in lines)
    # device samples are summarised, not one line every 2 s
    device = [ln for ln in lines if " device: " in ln]
    assert 1 <= len(device) < sum(1 for _ in open(run_dir / "events.jsonl")
                                  if '"device_sample"' in _)


def test_monitor_follows_a_live_run_until_it_ends(tmp_path):
    run_dir = tmp_path / "runs" / "live"
    run_dir.mkdir(parents=True)
    journal = Journal(run_dir)
    journal.emit("run_started", kind="tune", command=["train.py"], cwd=".")
    p = autotune("monitor", "--plain", str(run_dir))
    try:
        out = Lines(p.stdout)
        out.wait_for("run started: autotune tune train.py")
        journal.emit("trial_started", trial="trial-0", number=0, knobs={"workers": 2},
                     mode="full")
        out.wait_for("trial #0 started: workers=2")
        assert p.poll() is None  # still following
        journal.emit("run_ended", exit_code=0)
        out.wait_for("run ended: exit code 0")
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


def test_ctrl_c_detaches_cleanly(tmp_path):
    run_dir = tmp_path / "runs" / "live"
    run_dir.mkdir(parents=True)
    Journal(run_dir).emit("run_started", kind="tune", command=["train.py"], cwd=".")
    p = autotune("monitor", "--plain", str(run_dir))
    try:
        Lines(p.stdout).wait_for("run started")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
        assert "detached from" in p.stderr.read()
    finally:
        p.kill()
        p.wait()


def test_monitor_without_run_dir_takes_the_latest_run(tmp_path):
    old = copy_run(tmp_path, "tune_mixed")
    copy_run(tmp_path, "probe_io_bound")
    os.utime(old, (time.time() - 100, time.time() - 100))
    p = autotune("monitor", "--runs-dir", str(tmp_path / "runs"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "run started: autotune probe ok.py" in out and "wrap" not in out


def test_monitor_with_no_runs_is_a_one_line_usage_error(tmp_path):
    p = autotune("monitor", "--runs-dir", str(tmp_path / "none"))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2
    assert err.startswith("ERROR: no runs under ") and len(err.strip().splitlines()) == 1


def test_a_run_whose_controller_died_is_not_followed_forever(tmp_path):
    run_dir = copy_run(tmp_path, "tune_2gpu")  # device samples, then silence, no run_ended
    old = time.time() - 3600
    os.utime(run_dir / "events.jsonl", (old, old))
    p = autotune("monitor", str(run_dir))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0
    assert "trial #1 started" in out
    assert err.startswith("WARNING: ") and "most likely killed" in err
    assert "HINT: 'autotune tune --resume RUN_DIR'" in err
