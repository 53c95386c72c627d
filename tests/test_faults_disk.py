"""Issue 13: a full disk, at the start of a tune and in the middle of one, on a real small tmpfs.

What the user sees is one ``ERROR:`` line naming the path and "disk full", exit 1; the journal
stays whole lines; ``--resume`` (once there is room again) retries the trial that was cut off.
Needs root to mount a tmpfs; skipped where that is not allowed.
"""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from autotune import AutotuneError
from autotune.store.journal import Journal
from autotune.tuning import study as studies
from conftest import SCRIPTS, autotune, live_children

TOY = str(SCRIPTS / "tune_toy.py")
OK = str(SCRIPTS / "ok.py")
QUIET = ["--plain", "--foreign-limit", "1000"]


@pytest.fixture
def disk(tmp_path):
    path = tmp_path / "disk"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield path
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk, leave_bytes=0):
    """Take the disk's free space but ``leave_bytes``; the filler file's path."""
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    st = os.statvfs(disk)
    left = st.f_bavail * st.f_frsize - leave_bytes
    with open(filler, "wb", buffering=0) as f:
        try:
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))
        except OSError:
            pass
    return filler


def one_error(p, *words):
    errors = [line for line in p.stderr.splitlines() if line.startswith("ERROR:")]
    assert p.returncode == 1, p.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    for w in words:
        assert w in errors[0], errors[0]
    assert "--storage" not in errors[0]
    return errors[0]


def journal_lines(run_dir):
    data = (run_dir / "events.jsonl").read_bytes()
    assert not data or data.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_a_journal_line_is_written_whole_or_not_at_all(disk):
    journal = Journal(disk)
    journal.emit("run_started", kind="tune", command=["train.py"], cwd=".")
    fill(disk)
    size = (disk / "events.jsonl").stat().st_size
    with pytest.raises(AutotuneError, match="events.jsonl: disk full"):
        journal.emit("trial_finished", trial="t", number=None, mode="full",
                     result={"log_tail": "x" * 200_000})
    assert (disk / "events.jsonl").stat().st_size == size
    assert [e["event"] for e in journal_lines(disk)] == ["run_started"]


def test_a_full_disk_at_the_start_is_one_line_before_any_probe(tmp_path, disk):
    fill(disk)
    t0 = time.monotonic()
    p = autotune("tune", *QUIET, "--trials", "2", "--seconds", "4", "--runs-dir",
                 str(disk / "runs"), "--recipe-dir", str(tmp_path / "recipes"), "--", OK,
                 cwd=tmp_path, timeout=120)
    one_error(p, str(disk / "runs"), "events.jsonl", "disk full")
    assert time.monotonic() - t0 < 60


def test_a_study_that_cannot_be_created_is_the_disk_not_storage_and_no_probe_runs(tmp_path,
                                                                                  disk):
    fill(disk, leave_bytes=40 * 1024)  # room for the journal and tune.json, not a study
    p = autotune("tune", *QUIET, "--trials", "2", "--seconds", "4", "--runs-dir",
                 str(disk / "runs"), "--recipe-dir", str(tmp_path / "recipes"), "--", OK,
                 cwd=tmp_path, timeout=120)
    one_error(p, "study", "disk full")
    run_dir = next((disk / "runs").iterdir())
    assert not [e for e in journal_lines(run_dir) if e["event"] == "trial_started"]


@pytest.mark.slow
def test_a_disk_filling_up_mid_trial_stops_cleanly_and_resume_retries_it(tmp_path, disk):
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(disk / "runs"))
    cmd = [sys.executable, "-m", "autotune", "tune", *QUIET, "--trials", "3", "--seconds", "6",
           "--confirm-rounds", "0", "--seed", "3", "--space", "batch_size=8:32", "--fix",
           "threads=1", "--recipe-dir", str(tmp_path / "recipes"), "--", TOY, "--work", "1"]
    controller = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    run_dir, filler = None, None
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            runs = list((disk / "runs").glob("*")) if (disk / "runs").exists() else []
            if runs and any(e["event"] == "trial_started" and e["trial"].startswith("trial-")
                            for e in journal_lines(runs[0])):
                run_dir = runs[0]
                break
            assert controller.poll() is None, controller.stderr.read()
            time.sleep(0.2)
        assert run_dir is not None, "no trial started within the deadline"
        filler = fill(disk)
        out, err = controller.communicate(timeout=120)
    finally:
        if controller.poll() is None:
            controller.kill()
    one_error(subprocess.CompletedProcess(cmd, controller.returncode, out, err), "disk full")
    journal_lines(run_dir)  # every line whole
    assert live_children() == []

    filler.unlink()
    p = autotune("tune", "--resume", str(run_dir), "--plain", cwd=tmp_path, timeout=240,
                 env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "re-running interrupted trial(s)" in p.stderr
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    retried = [t for t in h.trials() if t.user_attrs.get("retry_of") is not None]
    assert retried and all(t.state.is_finished() for t in retried)
    assert not h.trials(states=(studies.TrialState.RUNNING,))
    assert list((tmp_path / "recipes").glob("*.toml"))
