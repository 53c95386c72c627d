"""Outcome classification: each failure gets its own outcome and a one-line reason."""

import signal

import pytest

from autotune.measuring.outcome import Observed, Outcome, classify, script_exit_code
from autotune.measuring.bottleneck import decide
from probes.protocol import Mode


def test_ok_with_estimate():
    assert classify(Observed(exit_code=None, stopped_by_us=True, batches=100,
                             has_estimate=True)) == (Outcome.OK, "")


def test_oom_from_meter():
    outcome, reason = classify(Observed(exit_code=1, stopped_by_us=False, error_kind="oom",
                                        error_text="RuntimeError: can't allocate memory"))
    assert outcome == Outcome.OOM and "can't allocate" in reason


def test_sigkill_from_outside_is_oom_killer():
    outcome, reason = classify(Observed(exit_code=-signal.SIGKILL, stopped_by_us=False))
    assert outcome == Outcome.OOM and "OOM killer" in reason


def test_exception_is_crash_with_its_text():
    outcome, reason = classify(Observed(exit_code=1, stopped_by_us=False,
                                        error_kind="exception",
                                        error_text="ValueError: bad config"))
    assert (outcome, reason) == (Outcome.CRASHED, "ValueError: bad config")


def test_nonzero_exit_without_exception():
    outcome, reason = classify(Observed(exit_code=3, stopped_by_us=False,
                                        last_log_line="fatal: no data"))
    assert outcome == Outcome.CRASHED
    assert "code 3" in reason and "fatal: no data" in reason


def test_killed_by_signal_named():
    outcome, reason = classify(Observed(exit_code=-signal.SIGSEGV, stopped_by_us=False))
    assert outcome == Outcome.CRASHED and "SIGSEGV" in reason


def test_hung_after_batches():
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, batches=30,
                                        hung_s=12.0))
    assert outcome == Outcome.HUNG and "after 30 batches" in reason


@pytest.mark.parametrize("idle, want", [(True, Outcome.HUNG), (False, Outcome.OK)])
def test_a_stall_at_the_end_is_a_hang_when_the_processes_sat_idle(idle, want):
    """Trained long enough for an estimate (a slow host stretches 20 batches), then no progress
    for 12 s of 0.1 s steps until the probe ended: idle through it, a deadlock; busy, a pause
    (an evaluation) that keeps the estimate."""
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, batches=20,
                                        has_estimate=True, stalled_s=12.0, step_s=0.1,
                                        stalled_idle=idle))
    assert outcome == want, reason
    if want == Outcome.HUNG:
        assert "no progress for 12 s after 20 batches" in reason


def test_no_signal_when_nothing_fed():
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, ran_s=40))
    assert outcome == Outcome.NO_SIGNAL and "without a DataLoader batch" in reason


def test_steps_without_loader_asks_for_batch_size():
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, steps=500,
                                        needs_batch_size=True))
    assert outcome == Outcome.NO_SIGNAL and "{batch_size}" in reason


@pytest.mark.parametrize("counted_s,paused_s,first_s,want", [
    (8.0, 0.5, 0.5, "only 40 batches in 9 s: too few"),
    (8.5, 6.0, 0.5, "stood still for 6.0 s of the 8.5 s"),
    (1.5, 0.0, 1.0, "counted together for only 1.5 s"),
    (1.5, 0.0, 7.0, "the first came 7 s in (start-up took most of the probe), leaving 1.5 s"),
])
def test_batches_without_a_figure_say_why_there_is_none(counted_s, paused_s, first_s, want):
    """Many batches and no steady figure is not "too few": pauses took the counted time, the
    ranks' start-up took most of the probe, or the ranks counted together only briefly; the
    reason says which."""
    outcome, reason = classify(Observed(exit_code=None, stopped_by_us=True, batches=40, ran_s=9,
                                        counted_s=counted_s, paused_s=paused_s,
                                        first_s=first_s))
    assert outcome == Outcome.NO_SIGNAL and want in reason and "--seconds" in reason, reason


def test_early_exit():
    outcome, reason = classify(Observed(exit_code=0, stopped_by_us=False, batches=8))
    assert outcome == Outcome.EXITED_EARLY and "8 batches" in reason


def test_a_script_that_exits_0_after_a_steady_span_ended_with_its_figure():
    outcome, reason = classify(Observed(exit_code=0, stopped_by_us=False, batches=800,
                                        has_estimate=True))
    assert outcome == Outcome.ENDED and outcome.usable
    assert reason == ("the script ended on its own (exit 0) after 800 batches; the figure is "
                      "from the steady span before its end")


RAN_OUT = dict(exit_code=1, stopped_by_us=False, error_kind="stop_iteration",
               error_text="StopIteration: ")


@pytest.mark.parametrize("mode", list(Mode))
def test_data_that_ran_out_after_a_steady_span_ended_in_every_mode(mode):
    """``while True: next(it)`` over a finite loader: the uncaught StopIteration (exit 1) ends
    the script as it ends a real run; the steady span before it stands."""
    outcome, reason = classify(Observed(**RAN_OUT, batches=6000, has_estimate=True, mode=mode))
    assert outcome == Outcome.ENDED and outcome.usable
    assert reason == ("the script ended on its own (its data ran out: an uncaught "
                      "StopIteration) after 6000 batches; the figure is from the steady span "
                      "before its end")


def test_data_that_ran_out_before_a_steady_span_exited_early_and_is_no_figure():
    outcome, reason = classify(Observed(**RAN_OUT, batches=12))
    assert outcome == Outcome.EXITED_EARLY and not outcome.usable
    assert reason == ("the script ended on its own (its data ran out: an uncaught "
                      "StopIteration) after 12 batches, before a steady-state estimate; give it "
                      "more data or make it run longer")


def test_a_stop_iteration_before_any_batch_is_a_crash():
    outcome, reason = classify(Observed(**RAN_OUT))
    assert (outcome, reason) == (Outcome.CRASHED, "StopIteration before its first batch or step")


@pytest.mark.parametrize("ending", [
    dict(exit_code=1, error_kind="exception", error_text="ValueError: Tried to step 301 times"),
    dict(exit_code=3)])
def test_a_failure_after_a_steady_span_ends_a_synthetic_probe_but_crashes_a_full_one(ending):
    """Replayed batches (and epochs stretched to the real loader's pace) can trip the script's
    own checks at its end: the synthetic figure stands. In full mode the config failed."""
    seen = dict(stopped_by_us=False, batches=900, has_estimate=True, **ending)
    outcome, reason = classify(Observed(**seen, mode=Mode.SYNTHETIC))
    assert outcome == Outcome.ENDED
    assert reason.startswith("the script ended on its own (") and "on replayed batches" in reason
    assert classify(Observed(**seen, mode=Mode.FULL))[0] == Outcome.CRASHED
    assert classify(Observed(**seen, mode=Mode.IO))[0] == Outcome.CRASHED


def test_an_oom_or_a_signal_after_a_steady_span_is_never_an_end():
    measured = dict(stopped_by_us=False, batches=900, has_estimate=True, mode=Mode.SYNTHETIC)
    assert classify(Observed(**measured, exit_code=1, error_kind="oom",
                             error_text="RuntimeError: out of memory"))[0] == Outcome.OOM
    assert classify(Observed(**measured, exit_code=-signal.SIGSEGV))[0] == Outcome.CRASHED


def test_an_ended_probe_under_foreign_load_is_not_comparable_and_says_it_ended():
    outcome, reason = classify(Observed(**RAN_OUT, batches=6000, has_estimate=True,
                                        foreign_cores=2.0, foreign_limit_cores=0.5))
    assert outcome == Outcome.FOREIGN_LOAD
    assert reason.startswith("2.00 cores of CPU load from other programs during the probe")
    assert reason.endswith("; the script ended on its own (its data ran out: an uncaught "
                           "StopIteration) after 6000 batches; the figure is from the steady "
                           "span before its end")


def test_only_ok_and_ended_are_usable():
    assert {o for o in Outcome if o.usable} == {Outcome.OK, Outcome.ENDED}


MEASURED = dict(exit_code=None, stopped_by_us=True, batches=100, has_estimate=True)


@pytest.mark.parametrize("ended, want", [
    (dict(exit_code=None, stopped_by_us=True, ran_s=40), Outcome.NO_SIGNAL),
    (dict(exit_code=0, stopped_by_us=False, batches=8), Outcome.EXITED_EARLY)])
def test_metric_reason_replaces_the_reason_of_a_probe_that_measured_nothing(ended, want):
    why = "--metric matched no line of rank 0's output in 40 s"
    assert classify(Observed(**ended, metric_reason=why)) == (want, why)


def test_metric_reason_leaves_other_outcomes_alone():
    assert classify(Observed(**MEASURED, metric_reason="unused")) == (Outcome.OK, "")
    crashed = classify(Observed(exit_code=1, stopped_by_us=False, error_text="E: x",
                                metric_reason="unused"))
    assert crashed == (Outcome.CRASHED, "E: x")


def test_io_mode_without_a_dataloader_measured_nothing():
    outcome, reason = classify(Observed(**MEASURED, io_without_loader=True))
    assert outcome == Outcome.NO_SIGNAL and "io mode drains a DataLoader" in reason


def test_pruned_when_the_search_stopped_a_measured_probe():
    assert classify(Observed(**MEASURED, pruned=True)) == (
        Outcome.PRUNED, "its interval could not reach the best so far")
    # a probe that failed before the search could stop it keeps its failure
    assert classify(Observed(exit_code=1, stopped_by_us=False, error_text="E: x",
                             pruned=True))[0] == Outcome.CRASHED


def test_a_probe_without_a_figure_under_foreign_load_names_the_load():
    """No figure to set aside: it stays no-signal, and the reason says the load slowed it
    (a 25x slowdown under two busy programs left too few steady batches in CI)."""
    busy = dict(exit_code=None, stopped_by_us=True, batches=283, ran_s=16, counted_s=15.0)
    outcome, reason = classify(Observed(**busy, foreign_cores=1.2, foreign_limit_cores=0.3))
    assert outcome == Outcome.NO_SIGNAL
    assert reason.startswith("only 283 batches in 16 s: too few to measure"), reason
    assert reason.endswith("1.20 cores of CPU load from other programs slowed it meanwhile: "
                           "re-run when the machine is quiet"), reason
    quiet = classify(Observed(**busy, foreign_cores=0.2, foreign_limit_cores=0.3))
    assert quiet[0] == Outcome.NO_SIGNAL and "other programs" not in quiet[1]


def test_foreign_load_over_the_limit_is_not_comparable():
    outcome, reason = classify(Observed(**MEASURED, foreign_cores=1.5, foreign_limit_cores=0.5))
    assert outcome == Outcome.FOREIGN_LOAD
    assert reason.startswith("1.50 cores of CPU load from other programs during the probe")
    assert classify(Observed(**MEASURED, foreign_cores=0.4,
                             foreign_limit_cores=0.5)) == (Outcome.OK, "")


def test_foreign_load_spoils_a_pruned_probe_but_not_a_failure():
    assert classify(Observed(**MEASURED, pruned=True, foreign_cores=2.0,
                             foreign_limit_cores=0.5))[0] == Outcome.FOREIGN_LOAD
    assert classify(Observed(exit_code=1, stopped_by_us=False, error_text="E: x",
                             foreign_cores=2.0, foreign_limit_cores=0.5))[0] == Outcome.CRASHED


@pytest.mark.parametrize("attempt, last, want", [
    (1, False, "during the probe; not comparable, re-run when the machine is quiet"),
    (3, True, "in 3 attempt(s); not compared"),
    (None, True, "during the probe; not comparable, re-run when the machine is quiet")])
def test_the_last_attempt_of_a_rerun_series_says_how_many_were_spoiled(attempt, last, want):
    outcome, reason = classify(Observed(**MEASURED, foreign_cores=2.0, foreign_limit_cores=0.5,
                                        attempt=attempt, last_attempt=last))
    assert outcome == Outcome.FOREIGN_LOAD and reason == f"2.00 cores of CPU load from other " \
                                                         f"programs {want}"


def test_verdict_io_bound():
    v = decide(full=90.0, synthetic=400.0, io=100.0)
    assert v.bottleneck == "io"
    assert v.bound_samples_per_s == 100.0
    assert abs(v.full_share_of_bound - 0.9) < 1e-9
    assert "I/O-bound" in v.text and "90%" in v.text


def test_verdict_compute_bound_and_balanced():
    assert decide(50.0, 60.0, 500.0).bottleneck == "compute"
    assert decide(50.0, 100.0, 105.0).bottleneck == "balanced"


def test_the_verdict_names_the_share_that_binds_and_the_knob_that_moves_it():
    """The bars fixture's shape: compute-bound by the ceilings, the full run at 70% of the
    bound because a third of each step waits for the loader in the main process."""
    from autotune.measuring.breakdown import Breakdown

    parts = Breakdown({"data": (0.33, 0.02), "forward": (0.45, 0.02), "backward": (0.17, 0.01),
                       "comm": (0.0, 0.0), "optimizer": (0.02, 0.0), "other": (0.03, 0.01)}, 1)
    v = decide(620.0, 890.0, 2000.0, parts)
    assert v.bottleneck == "compute" and "70% of the bound" in v.text
    assert "compute (forward, backward, optimizer) takes 64% of each step" in v.text
    assert "33% waits for data: more DataLoader workers" in v.text
    comm = Breakdown({"data": (0.0, 0.0), "forward": (0.2, 0.02), "backward": (0.15, 0.01),
                      "comm": (0.45, 0.03), "optimizer": (0.02, 0.0), "other": (0.18, 0.0)}, 2)
    assert "exposed communication takes 45% of each step: a larger DDP bucket" in \
        decide(50.0, None, None, comm).text
    assert comm.moves()[:2] == ("bucket_mb", "instances")


def test_verdict_unknown_when_mode_failed():
    v = decide(50.0, None, 100.0)
    assert v.bottleneck == "unknown" and "synthetic" in v.text


def test_an_unknown_verdict_says_how_the_mode_probe_ended_and_where_its_log_is():
    v = decide(50.0, None, 100.0, why_none={Mode.SYNTHETIC: "hung: no progress for 30 s; "
                                                            "log: /runs/x/logs/verdict-synthetic.log"})
    assert v.bottleneck == "unknown"
    assert "the synthetic (hung: no progress for 30 s; log: /runs/x/logs/verdict-synthetic.log) " \
           "probe gave no throughput" in v.text


@pytest.mark.parametrize("codes, kw, want", [
    ([5, -15], dict(own=None, stopped_by_us=False), 5),  # the first failure, ours came after
    ([15], dict(own=5, stopped_by_us=True), 5),  # the rank's own code beats the engine's
    ([-15, 0], dict(own=None, stopped_by_us=True), None),  # our TERM at the probe's end
    ([0, 1], dict(own=None, stopped_by_us=True, stopped_clean=True), 0),  # pulled out by it
    ([1, 0], dict(own=None, stopped_by_us=True, stopped_clean=True, error=True), 1),
    ([1, 0], dict(own=None, stopped_by_us=True), 1),  # not explained by our stop
    ([0, 0], dict(own=None, stopped_by_us=False), 0),
    ([], dict(own=None, stopped_by_us=True), None),
])
def test_the_scripts_exit_code_is_told_from_our_stop(codes, kw, want):
    kw = {"stopped_clean": False, "error": False, **kw}
    assert script_exit_code(codes, **kw) == want
