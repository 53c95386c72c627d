"""Probes fitted to real scripts with slow steps, end to end: real processes, real training.

The scripts (`scripts/slow_steps.py`, minGPT's shape; `scripts/word_lm.py`, word_language_model's)
spend most of each step waiting, as a script on a slower device does, so these long tests leave
the CPU to the rest of the suite. Foreign load is not flagged (``--foreign-limit``).
"""

import re
import statistics
import subprocess
import sys
import time

import pytest

from autotune.store.journal import read_events
from conftest import HEAVY, SCRIPTS, autotune, last_json, live_children

# each test tunes for minutes, mostly waiting on its script's slow steps, and judges timings:
# with the suite's heaviest tunes, one after another (`HEAVY`), so on one worker of CI's three.
# (Three workers on two cores once ran the slow-steps tune's probes longer than planned; that
# was while the ranks' OpenMP threads spun, before conftest made them sleep.)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(HEAVY)]

QUIET = ["--plain", "--foreign-limit", "1000"]
OUTSIDE_ROUNDS = 3  # interleaved rounds of plain runs that check a claim
T_975 = {2: 4.303}  # Student's t, 97.5th percentile, by degrees of freedom


def test_a_script_with_slow_steps_is_measured_by_every_probe_and_uses_its_budget(tmp_path):
    """minGPT's shape: 5 s of sampling before the first step, a first step 3 s slower, then
    about a second a step at batch 32, longer with the batch. No --seconds: fitted."""
    t0 = time.monotonic()
    # 4 minutes: what the test checks (every probe measures, the budget is used and kept) a
    # 5-minute budget shows too, with a minute more of the suite's heaviest group
    p = autotune("tune", *QUIET, "--json", "--budget", "4m", "--seed", "3",
                 "--baseline", "batch_size=32", "workers=0", "--",
                 str(SCRIPTS / "slow_steps.py"), "--trainer.batch_size={batch_size}",
                 "--trainer.num_workers={workers}", cwd=tmp_path, timeout=420)
    wall = time.monotonic() - t0
    s = last_json(p)
    run_dir = s["run_dir"]
    events, _ = read_events(run_dir)
    searched = [e for e in events if e["event"] == "trial_finished"
                and str(e.get("trial", "")).startswith("trial-")]
    outcomes = [e["result"]["outcome"] for e in searched]
    assert searched, outcomes  # (a 4-minute budget holds a few probes of such a script)
    assert all(o in ("ok", "pruned") for o in outcomes), \
        [(e["result"]["outcome"], e["result"]["reason"]) for e in searched]
    assert "budget" in s["stop_reason"]
    notes = " | ".join(s["notes"])
    assert "first batch after" in notes and "budget 4m:" in notes
    # used: the search stops when one more probe (as the plan sized it) would not fit beside
    # the confirmation's reserve, whose probes end once tight, sooner than reserved: the run
    # ends within two probes of its budget, and not far past it
    probe_s = float(re.search(r"search probe\(s\) of ~(\d+) s", notes).group(1))
    assert 240 - 2 * probe_s - race_unspent_s(p.stderr, s) <= wall <= 240 + 45, (wall, probe_s)
    assert live_children() == []


def race_unspent_s(told: str, summary: dict) -> float:
    """What the confirmation planned and did not spend because its race decided before its
    planned rounds (a look that switched, or dropped every candidate): the planned rounds
    not run, at the plan's cost per round; 0 where it ran them all or did not race."""
    m = re.search(r"confirming: .*?, (\d+) (?:interleaved )?round\(s\).*?about (\d+) s planned",
                  told)
    if not m or "confirmation: the race stopped: " not in " | ".join(summary["notes"]):
        return 0.0
    planned, cost_s = int(m.group(1)), float(m.group(2))
    return cost_s * max(0, planned - int(summary.get("confirm_rounds") or 0)) / planned


def _own_rate(text: str) -> list[float]:
    """The script's own samples/s lines (word_lm.py prints them every --log-interval)."""
    return [float(m.group(1)) for m in
            re.finditer(r"^\| epoch .*\| samples/s +([0-9.]+)", text, re.M)]


def test_a_claimed_speed_up_holds_when_the_script_measures_it(tmp_path):
    """word_language_model's shape: no DataLoader, ``--batch_size {batch_size}``, steps of
    0.2 s + 10 ms a sample (a slow first step), so batch 80 trains 1.6x the samples of the
    script's own 20. The recipe's claim is checked against the script's own printed
    throughput, default vs ``autotune run --recipe``, interleaved."""
    script = [str(SCRIPTS / "word_lm.py"), "--pad-ms", "200", "--pad-ms-per-sample", "10",
              "--first-step-s", "2", "--log-interval", "5", "--tokens", "200000"]
    # three trials: the baseline and two search probes, so that one probe read under the
    # suite's other worker (compared anyway: QUIET) cannot leave nothing to claim or check
    # Probes of at most 15 s (not fitted: under the suite's other worker a fitted baseline
    # once took 76 s and the next probe 121 s, and the tune ran past its 420 s): the claim is
    # what this test checks, not the fitting (the test above checks that)
    p = autotune("tune", *QUIET, "--json", "--trials", "3", "--seed", "1", "--seconds", "15",
                 "--space", "batch_size=20:80", "--fix", "instances=1", "thread_pct=100",
                 "--confirm-rounds", "3", "--confirm-seconds", "20", "--baseline",
                 "batch_size=20",
                 "--recipe-dir", str(tmp_path / "recipes"),
                 "--", *script, "--batch_size", "{batch_size}", cwd=tmp_path, timeout=600)
    s = last_json(p)
    if s["kept_baseline"]:
        # Not beyond doubt over these rounds (a busy machine spreads them): no claim, and the
        # reason says how many rounds would decide. Nothing to check against the script.
        # (a round whose probe failed under the suite's load gives no ratio: "a switch needs
        # 2 rounds at least", and the rounds that would decide)
        assert re.search(r"(about \d+ rounds would show the gain|too wide for more rounds|"
                         r"\d+ rounds of ~\d+ s \(.* more\) would decide)", s["reason"]), \
            s["reason"]
        assert s["speedup"] == 1.0 and s["best"]["knobs"] == s["baseline"]["knobs"]
        return
    # two rounds at least, or one that decides alone (the race's first look, where even the
    # upper bound of the spread between processes cannot explain the gain)
    assert s["confirm_rounds"] >= 2 or "over one interleaved round, beyond doubt even were " \
        "processes" in s["reason"], s["reason"]
    assert s["candidates"] >= 1
    low, high = s["speedup_interval"]
    assert low < s["speedup"] < high
    recipe = s["recipe"]
    # Interleaved rounds of plain runs (default, recipe), each read by the script's own
    # samples/s lines after the first (which holds step one); a round's ratio pairs the two
    # runs that shared the machine's state. The outside figure has its own spread: this suite's
    # other worker loads the CPU in bursts (CI once read 2.48x from two rounds of one line each
    # against a claim of 1.79x, 1.42x-2.26x), so the claim holds when the script's own
    # interval, over the rounds' ratios, meets the claimed one; a claim the script's clock
    # shows wrong beyond both spreads (above or below) fails.
    ratios = []
    for _ in range(OUTSIDE_ROUNDS):
        plain = subprocess.run([sys.executable, *script, "--batch_size", "20",
                                "--max-seconds", "14", "--log-interval", "2"], cwd=tmp_path,
                               text=True, capture_output=True, timeout=120)
        assert plain.returncode == 0, plain.stderr[-2000:]
        default = _own_rate(plain.stdout)[1:]
        tuned = autotune("run", "--plain", "--recipe", recipe, "--runs-dir",
                         str(tmp_path / "runs"), "--", *script, "--batch_size", "{batch_size}",
                         "--max-seconds", "14", "--log-interval", "2", cwd=tmp_path,
                         timeout=120)
        assert tuned.returncode == 0, tuned.stderr[-2000:]
        ours = _own_rate(tuned.stdout)[1:]
        assert default and ours, (plain.stdout[-1000:], tuned.stdout[-1000:])
        ratios.append(statistics.fmean(ours) / statistics.fmean(default))
    outside = statistics.fmean(ratios)
    half = T_975[OUTSIDE_ROUNDS - 1] * statistics.stdev(ratios) / OUTSIDE_ROUNDS ** 0.5
    assert outside - half <= high and outside + half >= low, \
        (ratios, outside, half, (low, s["speedup"], high))
    assert live_children() == []
