"""Fault matrix, hangs: a script that trained a few steps and then stopped making progress reads
as `hung` (how long, against its own step time) even when the probe is shorter than the hang
threshold; `no-signal` with "allow more --seconds" is kept for a script that never stepped."""

import pytest

from autotune.measuring.outcome import Observed, Outcome, classify
from conftest import SCRIPTS, autotune


def test_stalled_after_steps_is_hung():
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, batches=20,
                                        ran_s=12.0, stalled_s=9.0, step_s=0.05))
    assert outcome == Outcome.HUNG, reason
    assert "no progress for 9 s after 20 batches" in reason and "0.05 s" in reason
    assert "--seconds" not in reason


def test_slow_but_moving_is_still_too_few():
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, batches=4,
                                        ran_s=12.0, stalled_s=1.5, step_s=2.0))
    assert outcome == Outcome.NO_SIGNAL and "allow more --seconds" in reason


def test_a_script_that_exited_is_not_hung():
    outcome, _ = classify(Observed(exit_code=0, stopped_by_us=False, batches=20, ran_s=12.0,
                                   stalled_s=9.0, step_s=0.05))
    assert outcome == Outcome.EXITED_EARLY


@pytest.mark.slow
def test_a_short_probe_of_a_hung_script_says_hung(tmp_path):
    p = autotune("probe", "--modes", "full", "--seconds", "20", "--plain", "--",
                 str(SCRIPTS / "hang.py"), "--after", "20", cwd=tmp_path, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    said = p.stdout + p.stderr
    assert "hung: no progress for" in said and "after 20 batches" in said, said
    assert "no-signal" not in said and "allow more --seconds" not in said, said


@pytest.mark.slow
def test_a_short_probe_that_never_stepped_is_no_signal(tmp_path):
    p = autotune("probe", "--modes", "full", "--seconds", "6", "--plain", "--",
                 str(SCRIPTS / "hang.py"), "--at-start", cwd=tmp_path, timeout=120)
    said = p.stdout + p.stderr
    assert "no-signal" in said and "allow more --seconds" in said, said
    assert "hung" not in said, said
