"""Where the time goes: the meters' step clock, the shares with intervals, and a real probe
against a script that keeps its own clock of its data wait."""

import json
import math
import os
import re

import pytest

from autotune.measuring import breakdown
from conftest import HEAVY, SCRIPTS, last_json, probe_full
from probes.parts import StepClock


class Clock:
    """time.monotonic for `probes.parts`, moved by hand."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def now(monkeypatch):
    import probes.parts as parts
    clock = Clock()
    monkeypatch.setattr(parts.time, "monotonic", clock)
    return clock


def test_the_step_clock_splits_a_step_at_the_hooks(now):
    c = StepClock(cuda=NoCuda())
    c.data(0.0, 0.3)  # waited 0.3 s for the batch
    now.t = 0.5
    c.backward_begin()  # forward ran 0.3 -> 0.5
    now.t = 0.7
    c.backward_end()
    c.optimizer_begin()
    now.t = 0.75
    c.optimizer_end()
    now.t = 0.8
    c.backward_begin()  # a second backward on the same batch: no forward is charged again
    now.t = 0.9
    c.backward_end()
    assert c.snapshot() == pytest.approx(
        {"data": 0.3, "forward": 0.2, "backward": 0.3, "comm": 0.0, "optimizer": 0.05})
    assert c.clock == "host"


def test_waiting_after_the_last_bucket_launched_is_exposed_communication(now):
    c = StepClock(cuda=NoCuda())
    c.data(0.0, 0.1)
    now.t = 0.2
    c.backward_begin()
    now.t = 0.6
    c.bucket_launched()  # the last bucket at 0.6: no compute left after it
    now.t = 0.9
    c.backward_end()
    snap = c.snapshot()
    assert snap["backward"] == pytest.approx(0.4) and snap["comm"] == pytest.approx(0.3)
    now.t = 1.0
    c.backward_begin()
    now.t = 1.2
    c.backward_end()  # the next backward launched nothing (no DDP): all compute
    assert c.snapshot()["comm"] == pytest.approx(0.3)


class NoCuda:
    """torch.cuda in a process that never initialised CUDA."""

    def is_initialized(self):
        return False


class FakeCuda:
    """torch.cuda as its documentation has it, on a device that runs behind the host: an
    event's ``record()`` stamps the stream, ``query()`` is False until the device reached it,
    ``elapsed_time(end)`` is milliseconds between two completed events (and raises before)."""

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.device_t = None

        def record(self):
            FakeCuda.recorded.append(self)

        def query(self):
            return self.device_t is not None and self.device_t <= FakeCuda.device_now

        def elapsed_time(self, end):
            if not (self.query() and end.query()):
                raise RuntimeError("Both events must be completed before calculating "
                                   "elapsed time.")
            return (end.device_t - self.device_t) * 1000.0

    recorded: list = []
    device_now = 0.0

    def is_initialized(self):
        return True


def test_on_cuda_the_parts_are_the_device_s_time_between_events(now):
    """The host queues a step in 0.05 s and runs ahead; the device takes 1.0 s for it. The host
    clock would put the step's time wherever the host next waits; the events put it where the
    device spent it, once the device has got there (nothing waits for it)."""
    FakeCuda.recorded, FakeCuda.device_now = [], 0.0
    c = StepClock(cuda=FakeCuda())
    c.data(0.0, 0.01)
    now.t = 0.02
    c.backward_begin()
    now.t = 0.04
    c.backward_end()
    c.optimizer_begin()
    now.t = 0.05
    c.optimizer_end()
    # where the device reached each event: forward 0.4 s, backward 0.5 s, optimizer 0.1 s
    for ev, t in zip(FakeCuda.recorded, (0.0, 0.4, 0.9, 0.9, 1.0)):
        ev.device_t = t
    FakeCuda.device_now = 0.95  # the optimizer's end not reached yet: it waits for a tick
    snap = c.snapshot()
    assert c.clock == "cuda-events"
    assert snap["forward"] == pytest.approx(0.4) and snap["backward"] == pytest.approx(0.5)
    assert snap["optimizer"] == 0.0 and snap["data"] == pytest.approx(0.01)  # the host's wait
    FakeCuda.device_now = 2.0
    assert c.snapshot()["optimizer"] == pytest.approx(0.1)


def test_the_host_clock_asked_for_records_no_cuda_event(now):
    """``AUTOTUNE_STEP_CLOCK=host``: the same step as above, timed by the host alone, with no
    CUDA event recorded (what tells the events' own cost apart on a GPU host)."""
    from probes.meter import Meter

    FakeCuda.recorded = []
    assert Meter(env={"AUTOTUNE_STEP_CLOCK": "host"}).clock.events is False
    assert Meter(env={}).clock.events is True
    c = StepClock(cuda=FakeCuda(), events=False)
    c.data(0.0, 0.01)
    now.t = 0.02
    c.backward_begin()
    now.t = 0.04
    c.backward_end()
    assert FakeCuda.recorded == [] and c.clock == "host"
    snap = c.snapshot()
    assert snap["forward"] == pytest.approx(0.01) and snap["backward"] == pytest.approx(0.02)


def test_a_step_that_runs_its_closure_counts_forward_and_backward_once(now):
    """Lightning's automatic optimization: the batch is handed over, then ``optimizer.step``
    runs the closure (forward, backward) inside itself. The optimizer keeps only the rest."""
    c = StepClock(cuda=NoCuda())
    c.data(0.0, 0.1)
    now.t = 0.15
    c.optimizer_begin()  # 0.1 -> 0.15: the framework's own work before the step
    now.t = 0.4
    c.backward_begin()  # the closure's forward: 0.1 -> 0.4
    now.t = 0.7
    c.backward_end()
    now.t = 0.8
    c.optimizer_end()  # the update itself: 0.7 -> 0.8
    snap = c.snapshot()
    assert snap == pytest.approx(
        {"data": 0.1, "forward": 0.3, "backward": 0.3, "comm": 0.0, "optimizer": 0.1})
    assert sum(snap.values()) == pytest.approx(0.8)  # the step's wall time, nothing twice


def test_lbfgs_evaluates_its_closure_several_times_inside_one_step(now):
    c = StepClock(cuda=NoCuda())
    c.data(0.0, 0.1)
    c.optimizer_begin()  # at 0.1
    for k in range(3):  # each evaluation: 0.1 s forward, 0.2 s backward
        now.t = 0.1 + 0.3 * k + 0.1
        c.backward_begin()
        now.t += 0.2
        c.backward_end()
    now.t = 1.1  # the line search's own arithmetic: 1.0 -> 1.1
    c.optimizer_end()
    snap = c.snapshot()
    assert snap["forward"] == pytest.approx(0.3) and snap["backward"] == pytest.approx(0.6)
    assert snap["optimizer"] == pytest.approx(0.1)
    assert sum(snap.values()) == pytest.approx(1.1)


def test_on_cuda_a_closure_step_leaves_the_optimizer_only_its_own_device_time(now):
    FakeCuda.recorded, FakeCuda.device_now = [], 0.0
    c = StepClock(cuda=FakeCuda())
    c.data(0.0, 0.01)  # event 0: handed
    c.optimizer_begin()  # event 1
    now.t = 0.02
    c.backward_begin()  # event 2
    now.t = 0.03
    c.backward_end()  # event 3
    now.t = 0.04
    c.optimizer_end()  # event 4
    # on the device: forward 0.0 -> 0.4, backward 0.4 -> 0.9, the update 0.9 -> 1.0
    for ev, t in zip(FakeCuda.recorded, (0.0, 0.0, 0.4, 0.9, 1.0)):
        ev.device_t = t
    FakeCuda.device_now = 2.0
    snap = c.snapshot()
    assert snap["forward"] == pytest.approx(0.4) and snap["backward"] == pytest.approx(0.5)
    assert snap["optimizer"] == pytest.approx(0.1)


def ticks(per_step, n, tick_s=0.25, step_s=0.1, t0=0.0):
    """Cumulative part seconds, ticked, for a rank repeating one step."""
    out = []
    for k in range(n + 1):
        t = t0 + k * tick_s
        steps = t / step_s
        out.append((t, {p: v * steps for p, v in per_step.items()}))
    return out


def test_shares_and_other_from_the_ticks():
    step = {"data": 0.03, "forward": 0.04, "backward": 0.02, "comm": 0.0, "optimizer": 0.005}
    b = breakdown.from_ticks([ticks(step, 80)], 2.0, 18.0, windows=8)
    assert b.share("data") == pytest.approx(0.30) and b.share("forward") == pytest.approx(0.40)
    assert b.share("other") == pytest.approx(0.05)
    assert b.binding() == "forward"
    assert b.shares["data"][1] == pytest.approx(0.0, abs=1e-9)  # a steady script: no spread
    again = breakdown.Breakdown.from_dict(json.loads(json.dumps(b.to_dict())))
    assert again.share("data") == pytest.approx(0.30, abs=1e-4)
    assert "data wait 30%" in b.describe() and "CUDA" not in b.describe()
    gpu = breakdown.from_ticks([ticks(step, 80)], 2.0, 18.0, windows=8, clock="cuda-events")
    assert gpu.describe().endswith("(GPU time from CUDA events)")
    assert breakdown.Breakdown.from_dict(gpu.to_dict()).clock == "cuda-events"


def test_a_part_whose_sum_steps_back_has_a_share_of_zero_not_below():
    """A part's sum that ends the span a little lower than it began (seen on a two-rank DDP
    toy's backward: -0.0034 over a probe) reads 0; a recipe holding the breakdown reads back."""
    from autotune.tuning import recipes
    pts = ticks({"data": 0.01, "forward": 0.08}, 80)
    pts = [(t, {**parts, "backward": 0.05 - 0.001 * t}) for t, parts in pts]
    b = breakdown.from_ticks([pts], 2.0, 18.0, windows=8)
    assert b.share("backward") == 0.0 and b.share("forward") == pytest.approx(0.80)
    assert all(0.0 <= share <= 1.0 and half >= 0.0 for share, half in b.shares.values()), b.shares
    pair_ok = recipes._KINDS["a [share, half-width] pair"]
    table = b.to_dict()["shares"]
    assert all(pair_ok(v) for v in table.values()), table


def test_what_more_workers_can_gain_is_the_data_wait_taken_back_whole():
    """A knob acting on one group gains at most that group's time, at the upper end of its
    interval: a step waiting 10% ±2 for data runs at most 1/(1 - 0.12) as fast without the wait.
    A knob acting on several has no such bound."""
    b = breakdown.Breakdown({"data": (0.10, 0.02), "forward": (0.6, 0.01),
                             "other": (0.3, 0.01)}, ranks=1)
    assert b.most_gain("workers") == pytest.approx(0.12 / 0.88)
    assert b.most_gain("batch_size") is None and b.most_gain("thread_pct") is None
    idle = breakdown.Breakdown({"data": (0.001, 0.0005), "other": (0.999, 0.001)}, ranks=1)
    assert idle.most_gain("workers") < 0.002
    stuck = breakdown.Breakdown({"data": (0.99, 0.05), "other": (0.01, 0.01)}, ranks=1)
    assert stuck.most_gain("workers") == math.inf


def test_two_ranks_are_averaged_and_a_span_the_ticks_miss_tells_nothing():
    fast = ticks({"data": 0.01, "forward": 0.09}, 80)
    slow = ticks({"data": 0.05, "forward": 0.05}, 80)
    b = breakdown.from_ticks([fast, slow], 2.0, 18.0, windows=8)
    assert b.ranks == 2 and b.share("data") == pytest.approx(0.30)
    assert breakdown.from_ticks([fast], 30.0, 60.0, windows=8) is None


def test_a_trail_takes_ticks_and_starts_over_when_the_clock_changes():
    """The one fold of part ticks a probe and the full run share: a tick without parts adds
    nothing, and sums that switch to CUDA events are not added to the host's."""
    trail = breakdown.PartTrail()
    trail.add({"type": "tick"}, 1.0)
    assert trail.points == [] and trail.clock == "host"
    step = {"data": 0.03, "forward": 0.04}
    for t, _ in ticks(step, 80)[:3]:
        trail.add({"parts": {p: v * t for p, v in step.items()}}, t)
    assert len(trail.points) == 3 and trail.clock == "host"
    trail.add({"parts": {"forward": 0.1}, "parts_clock": "cuda-events"}, 5.0)
    assert trail.points == [(5.0, {"forward": 0.1})] and trail.clock == "cuda-events"
    # the ranks' trails give one breakdown, on the device's clock where any rank has it
    host = breakdown.PartTrail(ticks(step, 80))
    gpu = breakdown.PartTrail(ticks(step, 80), clock="cuda-events")
    b = breakdown.from_trails([host, gpu], 2.0, 18.0, windows=8)
    assert b.ranks == 2 and b.clock == "cuda-events" and b.share("data") == pytest.approx(0.30)


def own_data_share(log: str, start: float, end: float) -> float:
    """The script's own data-wait share over the lines it printed inside the probe's window."""
    lines = [(float(t), float(d)) for d, t in
             re.findall(r"share data ([0-9.]+) compute [0-9.]+ steps \d+ t ([0-9.]+)", log)]
    inside = [d for t, d in lines if start < t <= end + 1.0]
    assert len(inside) >= 2, (lines, start, end)
    return sum(inside) / len(inside)


@pytest.mark.slow
@pytest.mark.parametrize("item_ms", [2.0, 0.0])  # ~half the step waits for data; none does
def test_the_data_stall_share_is_the_scripts_own_within_ten_points(tmp_path, item_ms):
    full = probe_full(tmp_path, SCRIPTS / "data_wait.py", "--item-ms", item_ms,
                      "--log-every", 10, seconds=20)
    b = breakdown.Breakdown.from_dict(full["breakdown"])
    with open(full["log_path"]) as f:
        truth = own_data_share(f.read(), full["window_start_t"], full["window_end_t"])
    assert abs(b.share("data") - truth) <= 0.10, (b.shares, truth)
    if item_ms:
        assert b.binding() in ("data", "forward") and b.share("data") > 0.2
    else:  # (a loaded CI worker's stalls land on whatever the main thread was doing: 0.101
        # once, within its 10 points of the script's own 0.0x, so the bound is not 0.1)
        assert b.share("data") < 0.15 and b.binding() != "data"


@pytest.mark.slow
@pytest.mark.parametrize("script, args", [
    ("ok.py", []),  # the plain loop
    ("shape_closure.py", ["--optimizer", "lbfgs"]),  # the closure evaluated several times
    ("shape_closure.py", ["--optimizer", "sgd"]),  # once, as Lightning's automatic optimization
])
def test_the_parts_of_a_step_add_up_to_its_time_whatever_runs_inside_the_optimizer(
        tmp_path, script, args):
    full = probe_full(tmp_path, SCRIPTS / script, *args)
    b = breakdown.Breakdown.from_dict(full["breakdown"])
    timed = [p for p in b.shares if p != "other"]
    total = sum(b.share(p) for p in timed)
    slack = sum(b.shares[p][1] for p in timed) + 0.02
    assert total <= 1.0 + slack, b.shares  # nothing counted twice
    assert b.share("forward") > 0 and b.share("backward") > 0, b.shares
    if script == "shape_closure.py":  # the update itself is small beside the passes it runs
        assert b.share("optimizer") < b.share("forward") + b.share("backward"), b.shares


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["none", "fp16", "builtin", "fp16-late"])
def test_ddp_communication_on_the_cpu_is_timed_by_ddp_whatever_hook_the_script_has(tmp_path,
                                                                                  hook):
    """Two DDP ranks on the CPU: DDP's own timers measure the exposed communication with no
    hook of the script's, with the script's Python hook (registered before the first forward
    pass or after it) and with a built-in (C++) one. No case breaks the script."""
    full = probe_full(tmp_path, "--instances", 2, SCRIPTS / "ddp_toy.py", "--comm-hook", hook)
    assert full["outcome"] in ("ok", "foreign-load"), full["reason"]
    b = breakdown.Breakdown.from_dict(full["breakdown"])
    assert b.ranks == 2
    # the wait DDP's timers read is taken out of the backward pass; what is left, the toy's
    # backward compute, is about 1% of a step and may read 0 (CI read 0.0 ± 0.057 with the
    # late fp16 hook), but the pass with its wait is a part of the step
    assert b.share("comm") > 0.0 and "backward" in b.shares, b.shares
    assert b.share("backward") + b.share("comm") > 0.05, b.shares


def test_a_sample_s_cost_is_read_over_what_the_cpu_trail_covers():
    """The CPU trail (the probe loop's polls: when, CPU seconds so far) at 0.6 cores, a figure
    of 100 samples/s over 10 s: 6 ms of CPU a sample, whether the trail covers the whole span
    or ends 0.4 s short of it (a late last poll: before, no cost at all); none where it covers
    under half; in turns only the slices' time counts."""
    from autotune.measuring.reading import core_s_per_sample

    trail = [(t / 5, 0.6 * t / 5) for t in range(0, 61)]  # 0 to 12 s, a poll every 0.2 s
    assert core_s_per_sample(trail, 1.0, 11.0, 100.0) == pytest.approx(0.006)
    short = [(t, c) for t, c in trail if t <= 10.6]
    assert core_s_per_sample(short, 1.0, 11.0, 100.0) == pytest.approx(0.006)
    assert core_s_per_sample([(t, c) for t, c in trail if t <= 5.8], 1.0, 11.0, 100.0) is None
    assert core_s_per_sample(trail[:1], 1.0, 11.0, 100.0) is None
    # in turns: 0.6 cores while in its two 2 s slices, nothing between them
    turns = [(0.0, 0.0), (2.0, 0.0), (4.0, 1.2), (6.0, 1.2), (8.0, 2.4), (10.0, 2.4)]
    assert core_s_per_sample(turns, 1.0, 9.0, 100.0, [(2.0, 4.0), (6.0, 8.0)]) == \
        pytest.approx(0.006)


@pytest.mark.slow
def test_what_a_sample_costs_is_the_cpu_the_script_used(tmp_path):
    """A script that sleeps for its data and spins one core for its compute: the core-seconds
    a sample costs, times samples/s, is the cores it kept busy by its own CPU clock (its compute
    share on a quiet machine; less on a busy one, where the spinning loses the core at times)."""
    full = probe_full(tmp_path, SCRIPTS / "data_wait.py", "--item-ms", 2, "--spin",
                      "--log-every", 10, seconds=20)
    cores = full["core_s_per_sample"] * full["samples_per_s"]
    with open(full["log_path"]) as f:
        lines = re.findall(r"share data [0-9.]+ compute [0-9.]+ steps \d+ t ([0-9.]+) "
                           r"cpu ([0-9.]+)", f.read())
    own = [float(c) for t, c in lines
           if full["window_start_t"] < float(t) <= full["window_end_t"] + 1.0]
    assert own, lines
    assert abs(cores - sum(own) / len(own)) <= 0.15, (cores, own)
    assert full["gpu_s_per_sample"] == 0.0


@pytest.mark.slow
@pytest.mark.xdist_group(HEAVY)
def test_a_loader_in_the_main_process_is_tuned_to_its_bound_or_the_recipe_names_the_stall(
        tmp_path):
    """The shape the verdict used to misread: the loader in the training process, a third of
    each step waiting for it, the full run well under its bound. The search starts from the
    data wait (workers first); after it the winner reaches 90% of its bound, or the recipe's
    verdict says which share stops it. The batch is held at the script's own: data_wait.py
    computes for a fixed time per step, so a larger batch would win by amortising that, not by
    overlapping the loading; one rank, since ranks are not what this shape is about (and their
    probe and allreduce timing cost a minute). Confirmation probes of 8 s: 320 of its 25 ms
    steps each, and three rounds of 18 s probes made this the suite's longest test but one."""
    import tomllib

    from conftest import autotune

    p = autotune("tune", "--plain", "--foreign-limit", "1000", "--json", "--trials", "4",
                 "--seconds", "12", "--confirm-rounds", "3", "--confirm-seconds", "8",
                 "--verdict", "--fix", "threads=1",
                 "batch_size=16", "instances=1",
                 "--recipe-dir", str(tmp_path / "recipes"), "--", str(SCRIPTS / "data_wait.py"),
                 "--item-ms", "1", "--compute-ms", "25", "--workers", "{workers}",
                 cwd=tmp_path, env=dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")),
                 timeout=400)
    summary = last_json(p)
    assert "the first probes move workers" in p.stderr
    recipe = tomllib.loads(open(summary["recipe"]).read())
    verdict = recipe["verdict"]
    names_the_stall = "the data wait takes" in verdict["text"] or \
        "waits for data" in verdict["text"]
    # or compute stops it: the verdict says so, and its share leaves the data wait (a third of
    # each step before) at most a fifth
    compute = re.search(r"compute \(forward, backward, optimizer\) takes (\d+)%", verdict["text"])
    # (a mode probe that gave nothing on a loaded machine leaves the ceilings unknown, and the
    # verdict says how it ended; the full run's own breakdown still names the share)
    compute_binds = compute and int(compute[1]) >= 80 and (
        verdict["bottleneck"] == "compute" or
        verdict["bottleneck"] == "unknown" and "log: " in verdict["text"])
    assert verdict["full_share_of_bound"] >= 0.9 or names_the_stall or compute_binds, verdict
    # loading overlapped with compute, when the rounds show it beyond doubt; else the reason
    # says how many rounds would (a busy machine spreads them)
    assert summary["best"]["knobs"]["workers"] >= 1 or (
        summary["kept_baseline"] and "rounds" in summary["reason"]), summary["reason"]


def full_run(tmp_path, script, knobs, *args):
    """`autotune run` of ``script ARGS`` with a recipe holding ``knobs``, which must succeed:
    the finished process and the run's journal events."""
    from autotune.hardware import fingerprint
    from autotune.store.journal import read_events
    from autotune.tuning import recipes
    from conftest import autotune

    script = str(script)
    recipe = recipes.save(recipes.Recipe(
        name="br", knobs=knobs, samples_per_s=1.0, ci_half=0.1, baseline_samples_per_s=1.0,
        speedup=1.0, kept_baseline=True, fingerprint=fingerprint.current([script]),
        script_path=script), tmp_path)
    p = autotune("run", "--plain", "--recipe", str(recipe), "--", script, *args, cwd=tmp_path,
                 env=dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")), timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir, = (tmp_path / "runs").iterdir()
    return p, read_events(run_dir)[0]


@pytest.mark.slow
def test_the_full_run_reports_where_its_time_goes_live_and_over_the_whole_run(tmp_path):
    """`autotune run`: each progress report carries the shares since the last one, the end the
    whole run's, whose data wait is the script's own within ten points; the monitor's line
    and the report show it."""
    from autotune.monitor.text import event_line

    p, events = full_run(tmp_path, SCRIPTS / "data_wait.py", {"workers": 0}, "--item-ms", "2",
                         "--max-seconds", "16", "--log-every", "10")
    live = [e["breakdown"] for e in events
            if e["event"] == "fullrun_progress" and e.get("breakdown")]
    assert live, [e for e in events if e["event"] == "fullrun_progress"]
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    whole = breakdown.Breakdown.from_dict(ended.get("breakdown"))
    assert whole is not None, ended
    own = [float(d) for d in re.findall(r"share data ([0-9.]+) compute", p.stdout)]
    assert len(own) >= 3, p.stdout[-2000:]
    truth = sum(own) / len(own)
    assert abs(whole.share("data") - truth) <= 0.10, (whole.shares, truth)
    assert "where the time went: data wait" in event_line(ended)


def test_a_script_without_a_dataloader_has_its_forward_from_the_last_step_s_end(now):
    """word_language_model's shape: batches are slices of one tensor, no DataLoader hands them
    over. The forward runs from the previous step's end to the backward (the slicing with it);
    before any step ended there is nothing to measure from."""
    c = StepClock(cuda=NoCuda())
    now.t = 1.0
    c.backward_begin()  # the first step: no earlier end to count from
    now.t = 1.3
    c.backward_end()
    c.optimizer_begin()
    now.t = 1.4
    c.optimizer_end()
    for k in range(2):  # then steps of 0.2 forward, 0.3 backward, 0.1 optimizer
        now.t += 0.2
        c.backward_begin()
        now.t += 0.3
        c.backward_end()
        c.optimizer_begin()
        now.t += 0.1
        c.optimizer_end()
    snap = c.snapshot()
    assert snap == pytest.approx(
        {"data": 0.0, "forward": 0.4, "backward": 0.9, "comm": 0.0, "optimizer": 0.3})
    # gradient accumulation: the second micro-batch's forward runs from the first's backward
    now.t += 0.1
    c.backward_begin()
    now.t += 0.3
    c.backward_end()
    now.t += 0.2
    c.backward_begin()
    now.t += 0.3
    c.backward_end()
    assert c.snapshot()["forward"] == pytest.approx(0.7)


def test_a_script_with_a_dataloader_charges_no_forward_to_a_second_backward(now):
    c = StepClock(cuda=NoCuda())
    c.data(0.0, 0.1)
    now.t = 0.3
    c.backward_begin()
    now.t = 0.5
    c.backward_end()
    now.t = 0.9
    c.backward_begin()  # no new batch: the loader's script gets no forward here
    now.t = 1.0
    c.backward_end()
    assert c.snapshot()["forward"] == pytest.approx(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["none", "fp16"])
def test_the_full_run_leaves_ddp_s_own_allreduce_to_ddp(tmp_path, hook):
    """`autotune run` of two DDP ranks: with no hook of the script's, DDP keeps its own (C++)
    allreduce (a Python hook routes every bucket through torch's Python allreduce path, which
    cost short steps about 5%), and its own timers still say how long the backward pass waited
    for it; a hook the script registers is its own, and runs as the script asked."""
    p, events = full_run(tmp_path, SCRIPTS / "ddp_toy.py", {"instances": 2}, "--comm-hook", hook,
                         "--run-seconds", "8")
    ran = re.findall(r"ddp_toy: rank \d done after \d+ steps, comm hook (\S+)", p.stdout)
    assert ran == [{"none": "none", "fp16": "fp16_compress_hook"}[hook]] * 2, p.stdout[-2000:]
    ended = next(e for e in events if e["event"] == "fullrun_ended")
    whole = breakdown.Breakdown.from_dict(ended.get("breakdown"))
    assert whole is not None and whole.ranks == 2, ended
    # DDP's timers read a wait, taken out of the backward pass; the toy's backward compute is
    # about 1% of a step, so what is left of it may read 0 (a share is never below it), but the
    # backward pass with its wait is a part of the step (20-24% in four runs with the fp16 hook)
    assert whole.share("comm") > 0 and "backward" in whole.shares, whole.shares
    assert whole.share("backward") + whole.share("comm") > 0.05, whole.shares
