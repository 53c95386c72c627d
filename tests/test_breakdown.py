"""Where the time goes: the meters' step clock, the shares with intervals, and a real probe
against a script that keeps its own clock of its data wait."""

import json
import re
import subprocess
import sys

import pytest

from autotune.measuring import breakdown
from conftest import SCRIPTS
from probes.parts import StepClock


def test_the_step_clock_splits_a_step_at_the_hooks():
    c = StepClock()
    c.data(0.0, 0.3)  # waited 0.3 s for the batch
    c.backward(0.5, 0.7)  # forward ran 0.3 -> 0.5
    c.optimizer(0.7, 0.75)
    c.backward(0.8, 0.9)  # a second backward on the same batch: no forward is charged again
    assert c.snapshot() == pytest.approx(
        {"data": 0.3, "forward": 0.2, "backward": 0.3, "comm": 0.0, "optimizer": 0.05})


def test_waiting_after_the_last_bucket_launched_is_exposed_communication(monkeypatch):
    import probes.parts as parts
    c = StepClock()
    c.data(0.0, 0.1)
    monkeypatch.setattr(parts.time, "monotonic", lambda: 0.6)
    c.bucket_launched()  # the last bucket at 0.6: no compute left after it
    c.backward(0.2, 0.9)
    snap = c.snapshot()
    assert snap["backward"] == pytest.approx(0.4) and snap["comm"] == pytest.approx(0.3)
    c.backward(1.0, 1.2)  # the next backward launched nothing (no DDP): all compute
    assert c.snapshot()["comm"] == pytest.approx(0.3)


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
    assert "data wait 30%" in b.describe()


def test_two_ranks_are_averaged_and_a_span_the_ticks_miss_tells_nothing():
    fast = ticks({"data": 0.01, "forward": 0.09}, 80)
    slow = ticks({"data": 0.05, "forward": 0.05}, 80)
    b = breakdown.from_ticks([fast, slow], 2.0, 18.0, windows=8)
    assert b.ranks == 2 and b.share("data") == pytest.approx(0.30)
    assert breakdown.from_ticks([fast], 30.0, 60.0, windows=8) is None


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
    r = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json", "--modes", "full",
                        "--seconds", "20", "--runs-dir", str(tmp_path),
                        str(SCRIPTS / "data_wait.py"), "--item-ms", str(item_ms),
                        "--log-every", "10"],
                       capture_output=True, text=True, timeout=180)
    full = json.loads(r.stdout)["modes"]["full"]
    assert full["samples_per_s"] > 0, r.stderr[-2000:]
    b = breakdown.Breakdown.from_dict(full["breakdown"])
    with open(full["log_path"]) as f:
        truth = own_data_share(f.read(), full["window_start_t"], full["window_end_t"])
    assert abs(b.share("data") - truth) <= 0.10, (b.shares, truth)
    if item_ms:
        assert b.binding() in ("data", "forward") and b.share("data") > 0.2
    else:
        assert b.share("data") < 0.1 and b.binding() != "data"


@pytest.mark.slow
@pytest.mark.parametrize("hook", ["none", "fp16", "builtin", "fp16-late"])
def test_ddp_communication_is_timed_through_the_scripts_own_hook_or_ours(tmp_path, hook):
    """Two DDP ranks: with no hook of the script's, ours (DDP's default allreduce, timed)
    measures exposed communication; a hook the script registers is wrapped and still runs, also
    one registered after the first forward pass (DDP takes one registration: it goes through
    ours); a built-in hook trains untimed. No case breaks the script."""
    r = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json", "--modes", "full",
                        "--instances", "2", "--seconds", "15", "--runs-dir", str(tmp_path),
                        str(SCRIPTS / "ddp_toy.py"), "--comm-hook", hook],
                       capture_output=True, text=True, timeout=180)
    full = json.loads(r.stdout)["modes"]["full"]
    assert full["outcome"] in ("ok", "foreign-load"), full["reason"]
    b = breakdown.Breakdown.from_dict(full["breakdown"])
    assert b.ranks == 2
    if hook == "builtin":
        assert b.share("comm") == 0.0
    else:
        assert b.share("comm") > 0.0


@pytest.mark.slow
def test_what_a_sample_costs_is_the_cpu_the_script_used(tmp_path):
    """A script that sleeps for its data and spins one core for its compute: the core-seconds
    a sample costs, times samples/s, is the cores it kept busy, i.e. its own compute share."""
    r = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json", "--modes", "full",
                        "--seconds", "20", "--runs-dir", str(tmp_path),
                        str(SCRIPTS / "data_wait.py"), "--item-ms", "2", "--spin",
                        "--log-every", "10"],
                       capture_output=True, text=True, timeout=180)
    full = json.loads(r.stdout)["modes"]["full"]
    assert full["samples_per_s"] > 0, r.stderr[-2000:]
    cores = full["core_s_per_sample"] * full["samples_per_s"]
    with open(full["log_path"]) as f:
        lines = re.findall(r"share data [0-9.]+ compute ([0-9.]+) steps \d+ t ([0-9.]+)",
                           f.read())
    own = [float(c) for c, t in lines
           if full["window_start_t"] < float(t) <= full["window_end_t"] + 1.0]
    assert own, lines
    assert abs(cores - sum(own) / len(own)) <= 0.15, (cores, own)
    assert full["gpu_s_per_sample"] == 0.0
