"""The run journal: torn lines never break readers; concurrent writers never mix inside a line."""

import json
import subprocess
import sys

from autotune.store.journal import EVENTS, Journal, read_events
from results import trial_result

WRITER = r"""
import sys
from autotune.store.journal import Journal
run_dir, who, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
journal = Journal(run_dir)
for i in range(n):
    journal.emit("confirmation", round=i, trial=who, knobs={}, samples_per_s=None, ci_half=None,
                 outcome="ok", reason=who * size)
"""


def test_events_round_trip_with_offsets(tmp_path):
    j = Journal(tmp_path)
    j.emit("run_started", kind="probe", command=["a.py"], cwd="/tmp")
    events, offset = read_events(tmp_path)
    assert [e["event"] for e in events] == ["run_started"]
    assert offset == (tmp_path / EVENTS).stat().st_size
    j.emit("run_ended", exit_code=0)
    more, offset2 = read_events(tmp_path, offset=offset)
    assert [e["event"] for e in more] == ["run_ended"] and offset2 > offset


def test_missing_journal_reads_as_no_events(tmp_path):
    assert read_events(tmp_path / "nope") == ([], 0)


def test_torn_last_line_is_not_read_until_complete(tmp_path):
    j = Journal(tmp_path)
    j.emit("run_started", kind="tune", command=["a.py"], cwd="/tmp")
    line = json.dumps({"t": 1.0, "event": "trial_started", "trial": "t0"}) + "\n"
    with open(tmp_path / EVENTS, "a") as f:
        f.write(line[:20])  # a writer in the middle of its line
    events, offset = read_events(tmp_path)
    assert [e["event"] for e in events] == ["run_started"]
    with open(tmp_path / EVENTS, "a") as f:
        f.write(line[20:])
    events, _ = read_events(tmp_path, offset=offset)
    assert [e["event"] for e in events] == ["trial_started"]


def test_writer_that_died_mid_line_does_not_swallow_the_next_event(tmp_path):
    Journal(tmp_path).emit("run_started", kind="tune", command=["a.py"], cwd="/tmp")
    with open(tmp_path / EVENTS, "a") as f:
        f.write('{"t": 2.0, "event": "trial_sta')  # crashed here: no newline, ever
    j = Journal(tmp_path)  # e.g. `tune --resume` opening the same journal
    j.emit("trial_started", trial="t1", number=None, knobs={}, mode="full")
    j.emit("run_ended", exit_code=0)
    events, _ = read_events(tmp_path)
    assert [e["event"] for e in events] == ["run_started", "trial_started", "run_ended"]


def test_garbage_and_non_object_lines_are_skipped(tmp_path):
    (tmp_path / EVENTS).write_text('{"t":1,"event":"a"}\nnot json\n[1,2]\n\n{"t":2,"event":"b"}\n')
    events, _ = read_events(tmp_path)
    assert [e["event"] for e in events] == ["a", "b"]


def test_concurrent_writers_in_several_processes_never_interleave_inside_a_line(tmp_path):
    writers, per_writer, size = 4, 300, 6000  # lines longer than PIPE_BUF (4096)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), chr(ord("a") + w),
                               str(per_writer), str(size)]) for w in range(writers)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    raw = (tmp_path / EVENTS).read_bytes()
    # A writer opening the journal while another's long line is being copied in may see no
    # newline at the end yet and add one: an empty line, which readers skip.
    lines = [line for line in raw.splitlines() if line]
    assert raw.endswith(b"\n") and len(lines) == writers * per_writer
    seen: dict[str, list[int]] = {}
    for line in lines:
        ev = json.loads(line)  # every line is one whole event
        assert ev["reason"] == ev["trial"] * size
        seen.setdefault(ev["trial"], []).append(ev["round"])
    assert {w: sorted(v) for w, v in seen.items()} == {
        chr(ord("a") + w): list(range(per_writer)) for w in range(writers)}
    events, _ = read_events(tmp_path)
    assert len(events) == writers * per_writer


def test_events_are_strict_json_an_unknown_interval_is_null(tmp_path):
    """jq and JSON.parse reject Python's Infinity/NaN: a probe too short for an interval (its
    half-width is infinite) is written with ci_half null."""
    r = trial_result(samples_per_s=195.0, ci_half=float("inf"), foreign_cores=float("nan"),
                     log_path=str(tmp_path / "x.log"), foreign_limit_cores=0.3)
    j = Journal(tmp_path)
    j.emit("trial_finished", trial="t", number=None, mode="full", result=r)
    j.emit("fullrun_started", command=[tmp_path], knobs={"a": (1, 2)}, instances=1,
           launcher="local")
    lines = (tmp_path / EVENTS).read_text().splitlines()
    assert "Infinity" not in lines[0] and "NaN" not in lines[0]
    ev, started = (json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
                   for line in lines)
    assert ev["result"]["ci_half"] is None and ev["result"]["foreign_cores"] is None
    assert ev["result"]["samples_per_s"] == 195.0 and ev["result"]["outcome"] == "ok"
    assert started["command"] == [str(tmp_path)] and started["knobs"] == {"a": [1, 2]}


def test_an_unknown_interval_reads_as_a_question_mark():
    from autotune.monitor.text import fmt_rate

    assert fmt_rate(195.0, float("inf")) == "195.0 ± ?"
    assert fmt_rate(195.0, 3.25) == "195.0 ± 3.2"
    assert fmt_rate(195.0, None) == "195.0"
