"""The monitor rendered from recorded journals, read back as a person would see it."""

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from autotune.monitor import event_line, fold, render
from autotune.monitor.view import eta_s, trials_table
from autotune.monitor.state import RunState
from autotune.monitor.text import sparkline
from autotune.measuring.outcome import Outcome

JOURNALS = Path(__file__).parent / "data" / "journals"


def events(name: str) -> list[dict]:
    with open(JOURNALS / f"{name}.jsonl") as f:
        return [json.loads(line) for line in f]


def screen(state: RunState, *, now: float, width: int = 120, **kw) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"), color_system=None)
    console.print(render(state, now=now, **kw))
    return console.export_text()


def line_of(text: str, needle: str) -> str:
    lines = [ln for ln in text.splitlines() if needle in ln]
    assert lines, f"{needle!r} not on screen:\n{text}"
    assert len(lines) == 1, f"{needle!r} is on {len(lines)} lines:\n{text}"
    return lines[0]


def field(text: str, label: str) -> str:
    """The value beside ``label`` in a panel: ``│ label   value   │``."""
    found = re.findall(rf"^│ {re.escape(label)} {{2,}}(.*?)\s*│$", text, re.M)
    assert len(found) == 1, f"panel field {label!r} found {len(found)} times:\n{text}"
    return found[0]


def trial_row(text: str, label: str) -> str:
    """The trials-table row of trial ``label`` (``#3``, ``probe-io``), mark column included."""
    found = [ln for ln in text.splitlines() if re.match(rf"^│ . │ {re.escape(label)} ", ln)]
    assert len(found) == 1, f"trial row {label!r} found {len(found)} times:\n{text}"
    return found[0]


@pytest.fixture(scope="module")
def mixed():
    return fold(events("tune_mixed"))


def test_mixed_run_header_says_what_ran_and_that_it_finished(mixed):
    text = screen(mixed, now=mixed.last_t + 100)
    assert "autotune wrap · train.py" in text
    assert "examples/image_classifier/train.py --epochs 1" in text
    assert field(text, "phase") == "finished"
    elapsed = field(text, "elapsed")
    assert "3:56 / 10:00 budget" in elapsed  # ended_t - started_t, not the time now
    assert "7/8 trials" in elapsed and "100%" in elapsed and "ETA" not in elapsed


def test_mixed_run_shows_failed_and_pruned_trials_with_why(mixed):
    text = screen(mixed, now=mixed.last_t)
    oom = trial_row(text, "#2")
    assert "batch_size=512 workers=4" in oom and "oom: out of memory" in oom
    crashed = trial_row(text, "#5")
    assert "crashed: ValueError: batch too large" in crashed
    pruned = trial_row(text, "#4")
    assert "pruned: interval 100.2-140.4 cannot reach the best" in pruned
    assert "120.3 ± 20.1" in pruned


def test_mixed_run_highlights_the_best_and_only_the_best(mixed):
    text = screen(mixed, now=mixed.last_t)
    best = trial_row(text, "#6")
    assert best.startswith("│ ★ │")
    assert "318.9 ± 7.5" in best and "batch_size=192 workers=2" in best
    assert text.count("★") == 1


def test_mixed_run_best_vs_baseline_speedup_recipe_and_history(mixed):
    text = screen(mixed, now=mixed.last_t)
    assert "317.7 ± 5.0 samples/s · batch_size=192 workers=2" in field(text, "best")
    assert "210.9 samples/s" in field(text, "baseline")
    assert "1.51x" in field(text, "speedup")
    assert "recipes/train-cpu2.toml" in field(text, "recipe")
    # ok trials in order 212, 302, (oom), 265, (crash), 319 -> the failed ones are gaps
    assert sparkline([212.4, 301.7, None, 265.0, None, 318.9]) in field(text, "history")


def test_mixed_run_full_run_panel(mixed):
    text = screen(mixed, now=mixed.last_t)
    assert "ended, exit code 0" in field(text, "full run")
    live = field(text, "live")
    assert "303.0 samples/s" in live and "step 120" in live and "23,040 samples" in live
    assert field(text, "trend") == sparkline([300 + 3 * (k % 5) for k in range(12)])


def test_the_full_run_panel_and_report_tell_where_its_time_goes(mixed):
    """Live: the shares since the last report; once ended: the whole run's, in the panel and
    as a bar of the report's chart."""
    from autotune.report.html import breakdown_section

    shares = {"data": [0.31, 0.02], "forward": [0.4, 0.03], "backward": [0.2, 0.02],
              "comm": [0.0, 0.0], "optimizer": [0.05, 0.01], "other": [0.04, 0.01]}
    evs = [e for e in events("tune_mixed") if e.get("event") not in ("fullrun_ended",
                                                                       "run_ended")]
    t = evs[-1]["t"]
    evs.append({"event": "fullrun_progress", "t": t + 1, "samples_per_s": 300.0, "steps": 130,
                "samples": 24000, "breakdown": {"shares": shares, "ranks": 1}})
    running = fold(evs)
    assert "data wait 31% ±2" in field(screen(running, now=t + 2), "time")
    assert "time: forward 40%, data wait 31%, backward 20%" in event_line(evs[-1])
    whole = dict(shares, data=[0.12, 0.01], forward=[0.59, 0.02])
    evs.append({"event": "fullrun_ended", "t": t + 3, "exit_code": 0,
                "breakdown": {"shares": whole, "ranks": 1}})
    ended = fold(evs)
    assert "data wait 12% ±1" in field(screen(ended, now=t + 4), "time (whole run)")
    assert "full run: data wait 12%" in breakdown_section(ended)


def test_cpu_device_panel_shows_cores_memory_and_loader_workers(mixed):
    text = screen(mixed, now=mixed.last_t)
    cpu = field(text, "cpu")
    assert "98% avg" in cpu and "0:" in cpu and "99%" in cpu and "1:" in cpu and "96%" in cpu
    assert "3.6/7.8 GiB" in field(text, "memory")
    assert "1 ranks, 2 loader workers" in field(text, "processes")


def test_two_gpu_host_device_panel_and_running_trial():
    state = fold(events("tune_2gpu"))
    now = state.started_t + 35
    text = screen(state, now=now)
    gpu0, gpu1 = line_of(text, "GPU0"), line_of(text, "GPU1")
    for line, util, mem, power, ranks in ((gpu0, "92%", "21.0/40.0", "302 W", "0,1,2"),
                                          (gpu1, "90%", "20.0/40.0", "297 W", "3,4,5")):
        assert "NVIDIA A100-SXM4-40GB" in line
        assert util in line and mem in line and power in line and ranks in line
    assert "2 x NVIDIA A100-SXM4-40GB" in field(text, "hardware")
    running = trial_row(text, "#1")
    assert running.startswith("│ ▶ │") and "running" in running and "3,188.0 ± 150.0 …" in running
    assert "0:14" in running  # running for now - started
    assert field(text, "phase") == "trial #1"
    assert field(text, "processes") == "6 ranks, 24 loader workers"
    assert "ETA 6:01" in field(text, "elapsed")  # 19 trials left x 19 s


def test_probe_run_shows_mode_bars_and_verdict_without_best():
    state = fold(events("probe_io_bound"))
    text = screen(state, now=state.last_t)
    assert "★" not in text and "best vs baseline" not in text
    for mode, rate in (("full", "180.2/s"), ("synthetic", "420.7/s"), ("io", "190.3/s")):
        assert rate in field(text, mode)
    assert "I/O-bound: the input pipeline delivers 190.3" in field(text, "verdict")


def test_long_runs_keep_best_and_running_rows_and_say_how_many_are_hidden(mixed):
    console = Console(record=True, width=120, file=open("/dev/null", "w"), color_system=None)
    console.print(trials_table(mixed, now=mixed.last_t, max_rows=3))
    text = console.export_text()
    assert "#6 " in text  # the best survives the cut
    assert "4 earlier trials not shown" in text
    assert "#0 " not in text


def test_eta_from_time_budget_and_from_trial_budget():
    s = fold([{"t": 0.0, "event": "run_started", "kind": "tune", "command": ["a.py"],
               "budget_s": 100, "trials": 4},
              {"t": 1.0, "event": "trial_started", "trial": "t0", "number": 0, "knobs": {}},
              {"t": 11.0, "event": "trial_finished", "trial": "t0", "number": 0,
               "result": {"outcome": "ok", "samples_per_s": 5.0, "duration_s": 10.0}}])
    assert eta_s(s, now=20.0) == pytest.approx(30.0)  # 3 trials left x 10 s beats 80 s left
    s.trials_budget = None
    assert eta_s(s, now=20.0) == pytest.approx(80.0)


def test_state_survives_malformed_and_unknown_events():
    s = fold([{"t": 0, "event": "run_started", "kind": "tune", "command": "a.py"},
              {"t": "x", "event": "trial_finished", "trial": "t", "result": "not a dict"},
              {"event": "something_new", "foo": 1}, "not a dict", {"t": 1, "event": "best",
                                                                   "knobs": None}])
    assert s.kind == "tune" and s.script == "a.py"
    text = screen(s, now=5.0)
    assert "autotune tune · a.py" in text


@pytest.mark.parametrize("name", ["tune_mixed", "tune_2gpu", "probe_io_bound"])
def test_every_recorded_event_has_a_readable_plain_line(name):
    for ev in events(name):
        line = event_line(ev)
        assert line and "\x1b" not in line and "{" not in line, (ev, line)


def test_a_row_status_is_an_outcome_as_the_journal_writes_it(mixed):
    statuses = {r.status for r in mixed.rows}
    assert {Outcome.OK, Outcome.OOM, Outcome.CRASHED, Outcome.PRUNED} <= statuses
    assert all(type(s) is str and f"{s}" == Outcome(s).value for s in statuses)


def test_plain_lines_say_outcomes_and_reasons():
    evs = {(e["event"], e.get("trial")): e for e in events("tune_mixed")}
    assert event_line(evs[("trial_finished", "trial-2")]).startswith(
        "trial #2 oom: out of memory: RuntimeError")
    assert "(log: " in event_line(evs[("trial_finished", "trial-2")])
    assert event_line(evs[("trial_pruned", "trial-4")]) == (
        "trial #4 pruned: interval 100.2-140.4 cannot reach the best 301.7")
    best = [e for e in events("tune_mixed") if e["event"] == "best"][0]
    assert event_line(best) == ("best: 317.7 ± 5.0 samples/s, 1.51x the baseline 210.9 · "
                                "batch_size=192 workers=2")


def test_probe_mode_without_throughput_says_which_outcome():
    evs = events("probe_io_bound")
    for ev in evs:
        if ev["event"] == "trial_finished" and ev["mode"] == "synthetic":
            ev["result"] = {**ev["result"], "outcome": "foreign-load", "reason": "1.60 cores of "
                            "CPU load from other programs"}
    state = fold(evs)
    text = screen(state, now=state.last_t)
    assert field(text, "synthetic") == "no throughput (foreign-load)"
    assert "foreign-load: 1.60 cores of CPU load" in trial_row(text, "probe-synthetic")


def test_a_trial_started_again_shows_as_running_not_as_its_first_attempt():
    first = {"outcome": "foreign-load", "reason": "1.65 cores of CPU load from other programs",
             "samples_per_s": 600.0, "ci_half": 90.0, "duration_s": 9.0}
    state = fold([
        {"t": 0.0, "event": "run_started", "kind": "tune", "command": ["a.py"]},
        {"t": 1.0, "event": "trial_started", "trial": "baseline", "knobs": {"batch_size": 32}},
        {"t": 10.0, "event": "trial_finished", "trial": "baseline", "result": first},
        {"t": 12.0, "event": "trial_started", "trial": "baseline", "knobs": {"batch_size": 32}}])
    row = trial_row(screen(state, now=14.0), "baseline")
    assert row.startswith("│ ▶ │") and "running" in row
    assert "foreign" not in row and "600.0" not in row and "0:02" in row


def test_allreduce_timing_is_one_short_line():
    done = {"t": 1, "event": "allreduce", "candidates": [1, 2, 4, 25], "result": {
        "backend": "gloo", "world_size": 2, "device": "cpu", "bucket_mb_range": [1.0, 4.0],
        "points": [{"bytes": 4096, "latency_s": 0.001, "algbw_gbps": 0.01,
                    "busbw_gbps": 0.01, "iters": 300}] * 8}}
    assert event_line(done) == ("allreduce on 2 gloo ranks, pays off from 1 to 4 MB; "
                                "bucket_mb candidates 1, 2, 4, 25")
    failed = {"t": 1, "event": "allreduce", "candidates": [1, 5, 25],
              "error": "the allreduce probe failed (exit codes [1, 1]); see x.log:\ntrace"}
    assert event_line(failed) == ("allreduce not timed (the allreduce probe failed (exit codes "
                                  "[1, 1]); see x.log:); bucket_mb candidates 1, 5, 25")


def test_a_finished_trial_says_where_its_time_went():
    result = {"outcome": "ok", "samples_per_s": 180.0, "ci_half": 4.0, "duration_s": 12.0,
              "breakdown": {"shares": {"data": [0.41, 0.05], "forward": [0.49, 0.04],
                                       "backward": [0.09, 0.02], "comm": [0.0, 0.0],
                                       "optimizer": [0.0, 0.0], "other": [0.01, 0.01]},
                            "ranks": 1}}
    line = event_line({"t": 1.0, "event": "trial_finished", "trial": "trial-3", "number": 3,
                       "result": result})
    assert "time: forward 49%, data wait 41%" in line
    del result["breakdown"]
    assert "time:" not in event_line({"t": 1.0, "event": "trial_finished", "trial": "trial-3",
                                      "number": 3, "result": result})


@pytest.mark.parametrize("core_s, gpu_s, want", [
    (0.00374, 0.0, "3.74 core-ms"), (0.002, 0.0005, "0.5 GPU-ms, 2 core-ms"), (0.0, 0.0, "-")])
def test_what_a_sample_costs_reads_in_the_unit_a_user_buys(core_s, gpu_s, want):
    from autotune.monitor.text import cost_text
    assert cost_text(core_s, gpu_s) == want


def test_a_changed_global_batch_and_memory_get_their_own_lines():
    assert event_line({"t": 1.0, "event": "batch_change", "text": "the winner trains with a "
                       "global batch of 256"}) == "batch: the winner trains with a global batch of 256"


def test_energy_reads_by_source_or_says_why_not():
    from autotune.monitor.text import energy_text
    assert energy_text({"gpu_j_per_sample": 0.523, "cpu_j_per_sample": None,
                        "gpu": "NVML energy counter", "cpu": "unavailable: no RAPL"}) == \
        "GPU 0.523 J (NVML energy counter); CPU package unavailable: no RAPL"
    assert energy_text(None) == "not measured"


def test_a_run_stopped_on_a_signal_ends_as_a_shell_reports_it_and_says_so():
    """MPICH's mpiexec returns 15 for ranks a SIGTERM ended, srun 143, a rank its
    KeyboardInterrupt's 1: a run autotune stopped on the signal it was sent ends 128 + N, keeps
    the engine's own code beside it, and its line says it was stopped."""
    import signal

    from autotune.measuring import fullrun

    code, ended = fullrun._stopped_by(signal.SIGTERM, 15, {})
    assert code == 143 and ended == {"signal": "SIGTERM", "launcher_exit_code": 15}
    assert fullrun._stopped_by(signal.SIGTERM, 143, {}) == (143, {"signal": "SIGTERM"})
    code, ended = fullrun._stopped_by(signal.SIGINT, 1, {"rank": 0})
    assert code == 130 and ended["rank"] == 0 and ended["launcher_exit_code"] == 1
    line = event_line({"t": 0.0, "event": "fullrun_ended", "exit_code": 143, **{
        "signal": "SIGTERM", "launcher_exit_code": 15}})
    assert "exit code 143 (stopped on SIGTERM; the launcher returned 15)" in line, line


def test_a_finished_trial_line_tells_a_figure_not_recorded_from_zero():
    """The plain line reads the result through `TrialResult.from_dict`; a figure an older
    journal lacks is shown as "-", one recorded as 0 as 0."""
    old = event_line({"t": 1.0, "event": "trial_finished", "trial": "trial-3", "number": 3,
                      "result": {"outcome": "ok"}})
    assert old == "trial #3 ok: - samples/s in - · (script defaults)"
    zero = event_line({"t": 1.0, "event": "trial_finished", "trial": "trial-3", "number": 3,
                       "result": {"outcome": "ok", "samples_per_s": 0.0, "ci_half": 0.0,
                                  "duration_s": 0.0, "knobs": {"batch_size": 8}}})
    assert zero == "trial #3 ok: 0.0 samples/s in 0:00 · batch_size=8"
