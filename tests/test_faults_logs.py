"""Fault matrix, logs: a script that prints megabytes a second leaves probe logs of a bounded
size (head and tail kept, one line saying what was dropped), and what the user is shown of a
failure still comes from the real end of the log."""

import uuid

import pytest

from autotune.measuring import logs
from autotune.measuring.trial import TrialSpec, run_trial
from conftest import SCRIPTS, autotune, trial_processes

pytestmark = pytest.mark.slow

BOUND = logs.KEEP_HEAD_BYTES + logs.KEEP_TAIL_BYTES + 1024


def dropped_line(path) -> list[str]:
    with open(path, "rb") as f:
        return [line.decode() for line in f if line.startswith(b"[autotune: ")]


def test_a_failing_chatty_probe_keeps_its_last_words(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    command = (str(SCRIPTS / "chatty.py"), "--burst-mb", "6", "--die-at", "3")
    r = run_trial(TrialSpec.of(command=command,
                               cwd=str(tmp_path), log_dir=tmp_path / "logs", name=name,
                               max_s=40.0, min_measure_s=60.0, hang_s=10.0, grace_s=3.0,
                               foreign_limit_cores=1e9))
    assert trial_processes(name) == []
    assert r.exit_code == 3, r.reason
    assert r.log_tail.splitlines()[-1] == "chatty: my last words"
    log = tmp_path / "logs" / f"{name}.log"
    assert log.stat().st_size <= BOUND  # 6 MiB and more printed
    assert len(dropped_line(log)) == 1
    assert log.read_text().splitlines()[-1] == "chatty: my last words"


def test_a_chatty_probe_leaves_bounded_logs(tmp_path):
    runs = tmp_path / "runs"
    p = autotune("probe", "--modes", "full", "--seconds", "6", "--runs-dir", str(runs), "--plain",
                 "--", str(SCRIPTS / "chatty.py"), "--burst-mb", "6", cwd=tmp_path,
                 timeout=120)
    assert "Traceback" not in p.stderr, p.stderr  # the outcome depends on the machine's load
    found = list(runs.rglob("*.log"))
    assert found and all(f.stat().st_size <= BOUND for f in found), \
        [(f.name, f.stat().st_size) for f in found]
    assert sum(len(dropped_line(f)) for f in found) >= 1, p.stdout + p.stderr  # printed more
