"""Fault matrix, journal: a torn line is skipped with one WARNING naming how many lines and where
(monitor and report), and a resumed run shows its last session's end, or that it has none."""

import os
import time

from autotune.monitor.state import fold
from autotune.store.journal import EVENTS, Journal, read_events
from conftest import autotune

TORN = b'{"t": 1.5, "event": "trial_sta\n'


def session(run_dir, *, t0, ended=None, samples=False):
    j = Journal(run_dir)
    j.emit("run_started", kind="tune", command=["train.py"], cwd="/tmp", t=t0)
    j.emit("trial_started", trial=f"trial-{t0}", number=0, knobs={"workers": 1}, mode="full",
           t=t0 + 1)
    if samples:
        j.emit("device_sample", cpu_pct=[1.0], mem_used_bytes=1, mem_total_bytes=2, gpus=[],
               workers=0, ranks=1, t=t0 + 2)
    if ended is not None:
        j.emit("run_ended", exit_code=ended, t=t0 + 3)


def torn_journal(run_dir) -> int:
    session(run_dir, t0=1000.0)
    path = run_dir / EVENTS
    at = path.stat().st_size
    with open(path, "ab") as f:
        f.write(TORN)
    Journal(run_dir).emit("run_ended", exit_code=0, t=1010.0)
    return at


def test_read_events_reports_where_it_skipped(tmp_path):
    at = torn_journal(tmp_path)
    skipped = []
    events, _ = read_events(tmp_path, skipped=skipped)
    assert [e["event"] for e in events] == ["run_started", "trial_started", "run_ended"]
    assert skipped == [at]
    # read on from an offset (as the monitor does): the offset is still the journal's
    skipped2 = []
    with open(tmp_path / EVENTS, "rb") as f:
        second_line = len(f.readline())
    read_events(tmp_path, offset=second_line, skipped=skipped2)
    assert skipped2 == [at]


def one_warning(stderr: str) -> str:
    warnings = [line for line in stderr.splitlines() if line.startswith("WARNING:")]
    assert len(warnings) == 1, stderr
    return warnings[0]


def test_monitor_and_report_say_a_line_was_torn(tmp_path):
    at = torn_journal(tmp_path)
    p = autotune("monitor", str(tmp_path), "--plain", cwd=tmp_path, timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    line = one_warning(p.stderr)
    assert f"events.jsonl: 1 line could not be read (byte {at})" in line, line
    p = autotune("report", str(tmp_path), cwd=tmp_path, timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert f"events.jsonl: 1 line could not be read (byte {at})" in one_warning(p.stderr)


def test_a_resumed_run_shows_its_last_session(tmp_path):
    session(tmp_path, t0=1000.0, ended=1)
    session(tmp_path, t0=2000.0, ended=0)
    state = fold(read_events(tmp_path)[0])
    assert state.ended and state.exit_code == 0 and state.sessions == 2
    assert state.phase == "finished"


def test_a_killed_last_session_is_not_shown_as_the_old_end(tmp_path):
    session(tmp_path, t0=1000.0, ended=1)
    session(tmp_path, t0=2000.0, samples=True)  # killed: no run_ended
    state = fold(read_events(tmp_path)[0])
    assert not state.ended and state.exit_code is None
    old = time.time() - 3600
    os.utime(tmp_path / EVENTS, (old, old))
    p = autotune("monitor", str(tmp_path), "--plain", cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "never said it ended" in p.stderr and "ended with exit code 1" not in p.stderr
    p = autotune("report", str(tmp_path), cwd=tmp_path, timeout=60)
    html = (tmp_path / "report.html").read_text()
    assert "its last session has no run_ended" in html and "ended (exit 1)" not in html
