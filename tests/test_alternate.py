"""Real probes that take turns on the machine (`autotune.measuring.alternate`): each runs only
in its own slices, is read from them, and nothing outlives the turns, held or not."""

import os
import re
import signal
import threading
import time
import uuid

import psutil
import pytest

from autotune.hardware import proc
from autotune.measuring import alternate
from autotune.measuring.outcome import Outcome
from autotune.measuring.trial import TrialSpec, run_trial
from conftest import SCRIPTS, live_children, trial_processes

pytestmark = pytest.mark.slow

STEP_RE = re.compile(r"^step \d+ ([0-9.]+)$", re.M)
EDGE_S = 0.05  # a signal's delivery, either side of a slice


def spec(tmp_path, name, *args, batch=8):
    return TrialSpec.of(command=(str(SCRIPTS / "stamped.py"), "--batch", str(batch), *args),
                        cwd=str(tmp_path), log_dir=tmp_path / "logs", name=name,
                        samples_per_step=batch, hang_s=10.0, startup_s=30.0, grace_s=3.0,
                        foreign_limit_cores=1e9, device="cpu")


def together(specs, *, measure_s=4.0, **kw):
    turns = []
    results = alternate.run_together(lambda i, turn: run_trial(specs[i], turn=turn),
                                     len(specs), measure_s=measure_s, start_s=30.0,
                                     on_turns=turns.extend, **kw)
    return results, turns


def stamps(result) -> list[float]:
    return [float(t) for t in STEP_RE.findall(open(result.log_path).read())]


def test_two_probes_take_turns_and_each_is_read_from_its_own_slices(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    fast = spec(tmp_path, f"{name}-a", "--step-ms", "20")
    slow = spec(tmp_path, f"{name}-b", "--step-ms", "60")
    (a, b), (ta, tb) = together([fast, slow], slice_s=1.0)
    assert a.outcome == Outcome.OK and b.outcome == Outcome.OK, (a.reason, b.reason)
    # each ran its slices in turn, never at once: A B B A ...
    assert len(ta.slices) == len(tb.slices) >= alternate.MIN_SLICES
    spans = sorted([(x, y, "a") for x, y in ta.slices] + [(x, y, "b") for x, y in tb.slices])
    assert all(y1 <= x2 for (_, y1, _), (x2, _, _) in zip(spans, spans[1:])), spans
    assert [w for *_, w in spans][:4] == ["a", "b", "b", "a"], spans
    # a process held through another's slice took no step in it (the script's own clock)
    for mine, theirs in ((a, tb), (b, ta)):
        inside = [t for t in stamps(mine) for x, y in theirs.slices
                  if x + EDGE_S < t < y - EDGE_S]
        assert inside == [], (mine.log_path, inside)
    # each figure is its slices': 8 samples a step of ~20 ms (+ the step), against ~60 ms
    assert len(a.slice_rates) == len(ta.slices) and all(a.slice_rates)
    assert ta.measured_s() >= 4.0 and tb.measured_s() >= 4.0
    # from batch to batch inside them: all of a slice but its edges, where the batches before
    # the rank's first report in the slice, and after its last, are not read: a tick at most
    # each (plus a resumed process's wait for a core, under load)
    lost_per_slice = (ta.measured_s() - a.measured_s) / len(ta.slices)
    assert 0 <= lost_per_slice < 2 * fast.tick_s + EDGE_S, (a.measured_s, ta.measured_s())
    assert 1.8 < a.samples_per_s / b.samples_per_s < 3.2, (a.samples_per_s, b.samples_per_s)
    assert trial_processes(name) == [] and live_children() == []


def test_a_probe_that_crashes_in_its_turn_drops_out_and_the_other_measures_on(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    ok = spec(tmp_path, f"{name}-ok", "--step-ms", "20")
    crash = spec(tmp_path, f"{name}-crash", "--step-ms", "20", "--crash-after", "120")
    (a, b), (ta, tb) = together([ok, crash], slice_s=1.0)
    assert b.outcome == Outcome.CRASHED, (b.outcome, b.reason)
    assert a.outcome == Outcome.OK, a.reason
    assert len(ta.slices) > len(tb.slices) and ta.measured_s() >= 4.0
    assert trial_processes(name) == [] and live_children() == []


def test_ctrl_c_while_probes_take_turns_leaves_no_process_held_or_running(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    specs = [spec(tmp_path, f"{name}-a"), spec(tmp_path, f"{name}-b")]
    turns: list[alternate.Turn] = []
    seen_held = []

    def interrupt():  # in A's second slice, through which B is held (A1 B1 B2 A2 A3 B3)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (len(turns) == 2 and
                                                   len(turns[1].slices) >= 2):
            time.sleep(0.02)
        held = turns[1].processes() if len(turns) == 2 else []
        until = time.monotonic() + 2  # SIGSTOP takes effect when the kernel next runs it
        while held and time.monotonic() < until and \
                any(p.status() != psutil.STATUS_STOPPED for p in held):
            time.sleep(0.01)
        seen_held.append([p.status() for p in held])
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        alternate.run_together(lambda i, turn: run_trial(specs[i], turn=turn), 2,
                               measure_s=600.0, start_s=30.0, slice_s=1.0,
                               on_turns=turns.extend)
    assert seen_held and seen_held[0] and \
        all(st == psutil.STATUS_STOPPED for st in seen_held[0]), seen_held
    assert trial_processes(name) == [] and live_children() == []


def test_stop_ends_a_held_group_with_its_term_not_the_kill_after_the_grace(tmp_path):
    launched = proc.start(proc.LaunchSpec(
        argv=("sleep", "60"), env=dict(os.environ), cwd=str(tmp_path),
        marker=f"t{uuid.uuid4().hex[:8]}", stdout_path=tmp_path / "out",
        stderr_path=tmp_path / "err"))
    proc.signal_group(launched, signal.SIGSTOP)
    assert proc.stop(launched, grace_s=30.0) == -signal.SIGTERM
    assert live_children() == []


def test_a_round_takes_what_round_s_expects_when_a_batch_outlasts_the_slice(tmp_path):
    """A process with 0.6 s steps holds slices of three of its batches (1.8 s, not the 1 s
    asked), so the round lasts far longer than the two processes' measuring time and start-up;
    `alternate.round_s`, from each process's first batch and step as its probe saw them, says
    how long (the confirmation plans its rounds in turns by it)."""
    name = f"t{uuid.uuid4().hex[:8]}"
    fast = spec(tmp_path, f"{name}-a", "--step-ms", "20")
    slow = spec(tmp_path, f"{name}-b", "--step-ms", "600")
    t0 = time.monotonic()
    (a, b), (_, tb) = together([fast, slow], measure_s=2.0, slice_s=1.0)
    wall = time.monotonic() - t0
    assert a.outcome == Outcome.OK and b.outcome == Outcome.OK, (a.reason, b.reason)
    # its slices run past the 1 s asked, to three batch ends (the first may count a batch that
    # ended before its hold and was read after)
    assert sum(y - x for x, y in tb.slices) / len(tb.slices) > 2 * 0.6, tb.slices

    def step(result) -> float:
        ts = stamps(result)
        gaps = sorted(y - x for x, y in zip(ts, ts[1:]))
        return gaps[len(gaps) // 2]  # the median: held spans fall between some steps

    # the probes' own pace leaves the holds out (it feeds the fit of later probes)
    assert 0 < a.first_s < 30 and 0 < b.first_s < 30, (a.first_s, b.first_s)
    assert b.step_s == pytest.approx(step(b), rel=0.3), (b.step_s, step(b))
    expected = alternate.round_s(2.0, [(a.first_s, step(a)), (b.first_s, step(b))],
                                 slice_s=1.0)
    # past the start-ups (long or short, as the machine's load makes them), the turns take far
    # longer than the two processes' measuring time alone
    in_turns = expected - a.first_s - b.first_s
    assert in_turns > 1.5 * 2 * 2.0, (expected, a.first_s, b.first_s)
    # the trials' own teardown (SIGTERM, the grace) comes on top
    assert 0.8 * expected <= wall <= 1.2 * expected + 3.0, (wall, expected)
    assert trial_processes(name) == [] and live_children() == []
