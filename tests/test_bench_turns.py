"""bench/turns.py: plain runs of a shape's script taking turns on the machine, read by the
script's own lines. Real processes of minGPT's shape (`tests/scripts/slow_steps.py`) whose
steps sleep to a fixed length, so their rates are known: 8 samples in 100 ms and 32 in 100 ms.
A loaded machine (CI runs two tests at once) can lengthen a step past its sleep, never shorten
one: the figures are bounded above by the sleeps and checked below with room for the load."""

import re
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import shapes, turns  # noqa: E402

pytestmark = pytest.mark.slow

QUICK = ("--sample-s", "0", "--first-step-s", "0", "--base-ms", "100", "--per-sample-ms", "0",
         "--jitter", "0", "--log-every", "1")


def runs_left() -> list:
    """This test's runs still running (`live_children`: a zombie another test's orphan left to
    this worker, a subreaper, has no command line and runs nothing)."""
    from conftest import live_children

    out = []
    for p in live_children():
        try:
            if re.search("slow_steps", " ".join(p.cmdline())):
                out.append(p)
        except psutil.Error:
            continue
    return out


def run(batch: int) -> shapes.PlainRun:
    shape = shapes.SHAPES["mingpt"]
    return shapes.PlainRun((*shape.script, *QUICK), (f"--trainer.batch_size={batch}",))


def test_runs_take_turns_and_each_is_read_from_its_own_lines_inside_its_slices(tmp_path):
    pattern = shapes.SHAPES["mingpt"].rate
    small, large = turns.take_turns([run(8), run(32)], pattern, tmp_path, measure_s=3.0,
                                    slice_s=1.0)
    for r in (small, large):
        assert len(r.slices) >= turns.MIN_SLICES and sum(b - a for a, b in r.slices) >= 3.0
        assert len(r.counted) >= 3 * len(r.slices), (r.counted, r.slices)
    # never at once: one's slices never overlap the other's (A B B A)
    spans = sorted([(a, b, "s") for a, b in small.slices] + [(a, b, "l") for a, b in large.slices])
    assert all(b1 <= a2 for (_, b1, _), (a2, _, _) in zip(spans, spans[1:])), spans
    assert [w for *_, w in spans][:4] == ["s", "l", "l", "s"], spans
    # each figure its own lines': 8 and 32 samples every 100 ms (and the step's own work,
    # which a loaded machine stretches more at 32: 270 against 78 under the suite beside a
    # second one), never the other's, whose figure is a quarter or four times its own
    assert 56 < small.rate <= 80 and 224 < large.rate <= 320, (small.rate, large.rate)
    assert 3.2 <= large.rate / small.rate <= 4.4, (small.rate, large.rate)
    # a line whose span held a hold (or the run alone before its turns) is left out: it reads
    # far slower than the rest
    for r in (small, large):
        assert r.left_out and min(r.left_out) < 0.8 * min(r.counted), (r.left_out, r.counted)
    mine = runs_left()
    assert not mine, mine  # every run stopped


def test_the_grids_top_configs_are_judged_again_in_turns_and_grid_best_is_the_best_of_them(
        tmp_path, monkeypatch):
    """``bench_search --shape``'s grid ran its plain runs one after another, and its figures
    put batch 8 first (as a drifting machine can); the grid's top three, judged again in
    turns, put 32 first (it gives four times 8's samples a step), and that is grid-best. A
    config the judging left out has no judged figure."""
    import argparse
    import functools

    from autotune.tuning import space
    from bench import search_shape as search

    sp = space.build(space.Machine(cores=2, mem_available_bytes=16 * 2**30),
                     space.Baseline(batch_size=8, workers=0), space.SpaceRequest(
                         ranges=space.parse_space(["batch_size=4:32"]),
                         fixed=space.parse_fix(["workers=0", "thread_pct=100"])))
    configs = [c for c in sp.configs() if c["batch_size"] in (4, 8, 16, 32)]
    assert [c["batch_size"] for c in configs] == [4, 8, 16, 32]
    misled = {4: 100.0, 8: 500.0, 16: 400.0, 32: 450.0}  # what the plain runs read
    grid = search.ClockGrid(configs, [run(c["batch_size"]) for c in configs],
                            [[misled[c["batch_size"]]] for c in configs], cost_s=1.0)
    assert configs[grid.best]["batch_size"] == 8
    monkeypatch.setattr(search.turns, "take_turns",
                        functools.partial(turns.take_turns, slice_s=0.6))
    args = argparse.Namespace(judge_top=3, rounds=1, final_seconds=1.5, work=tmp_path)
    judged = search.judge_top(args, shapes.SHAPES["mingpt"], grid)
    assert [configs[i]["batch_size"] for i in judged.indices] == [8, 32, 16]
    assert all(len(r) == 1 and r[0] for r in judged.rates), judged.rates
    assert configs[judged.best]["batch_size"] == 32, judged.rates
    ratio = judged.ratio_to_best(grid, sp, {**sp.baseline, "batch_size": 8})
    assert ratio == pytest.approx(judged.rates[0][0] / judged.rates[1][0]), judged.rates
    assert 0.22 <= ratio <= 0.32, judged.rates  # 8's samples a step over 32's (and the load)
    assert judged.ratio_to_best(grid, sp, {**sp.baseline, "batch_size": 4}) is None
    mine = runs_left()
    assert not mine, mine


# a controller of autotune's kind: its rank in a session of its own, writing to a log file, and
# (a poor controller) leaving the rank behind when Ctrl-C stops it
DETACHED = """
import subprocess, sys
log = open(sys.argv[1], "w")
rank = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True)
try:
    rank.wait()
except KeyboardInterrupt:
    pass
"""


def test_a_run_whose_rank_has_its_own_session_and_log_is_held_whole_and_read_from_its_log(
        tmp_path):
    """`take_turns_of` on two such controllers: each rank holds still while the other runs
    (none of its lines is read outside its own slices, the tail's poll aside), each figure is
    its own rank's, from its log, and neither rank outlives the turns."""
    pattern = shapes.SHAPES["mingpt"].rate
    starts = []
    for batch in (8, 32):
        r = run(batch)
        log = tmp_path / f"rank-{batch}" / "rank0.log"
        log.parent.mkdir()
        starts.append(turns.Start(
            (sys.executable, "-c", DETACHED, str(log), *r.argv(sys.executable)),
            {**r.environ(dict(__import__("os").environ)), "PYTHONUNBUFFERED": "1"},
            tmp_path / f"rank-{batch}" / "*.log"))
    small, large = turns.take_turns_of(starts, pattern, tmp_path, measure_s=3.0, slice_s=1.0)
    end = max(b for r in (small, large) for _, b in r.slices)  # then each is stopped
    for r in (small, large):
        assert len(r.slices) >= turns.MIN_SLICES and len(r.counted) >= 3 * len(r.slices), r
        first = r.slices[0][0]
        late = [t for t in r.stamps if first < t < end and
                not any(a <= t <= b + 0.25 for a, b in r.slices)]
        assert not late, (late, r.slices)  # held: nothing printed during the other's slices
    assert 56 < small.rate <= 80 and 224 < large.rate <= 320, (small.rate, large.rate)
    mine = runs_left()
    assert not mine, mine  # the ranks its controllers left behind were stopped too


def _wait_for(ok, timeout_s: float) -> None:
    """Until ``ok()`` holds (polled every 50 ms); an AssertionError after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.05)


def test_a_run_whose_root_is_held_resumes_its_ranks_alone_and_is_stopped_whole(tmp_path):
    """`Start.root_held` (bench_parity's ``run-controller-held``): once held, a turn continues
    the root's descendants in sessions of their own and leaves the root (the controller)
    stopped; the rank goes on printing without it, and the stop ends both."""
    import signal

    pattern = shapes.SHAPES["mingpt"].rate
    r = run(8)
    log = tmp_path / "rank" / "rank0.log"
    log.parent.mkdir()
    start = turns.Start((sys.executable, "-c", DETACHED, str(log), *r.argv(sys.executable)),
                        {**r.environ(dict(__import__("os").environ)), "PYTHONUNBUFFERED": "1"},
                        tmp_path / "rank" / "*.log", root_held=True)
    one = turns._Run(start, tmp_path)
    try:
        _wait_for(lambda: len(one.rates(pattern)) >= 2, 60.0)
        one.signal(signal.SIGSTOP)
        one.signal(signal.SIGCONT)
        root = psutil.Process(one.proc.pid)
        rank = root.children()[0]
        assert root.status() == psutil.STATUS_STOPPED
        assert rank.status() != psutil.STATUS_STOPPED
        seen = len(one.rates(pattern))
        _wait_for(lambda: len(one.rates(pattern)) >= seen + 3, 30.0)  # it runs alone
    finally:
        one.stop()
    assert one.proc.poll() is not None
    mine = runs_left()
    assert not mine, mine


class _Stops:
    def __init__(self, fails: bool = False):
        self.fails, self.stopped = fails, False

    def stop(self) -> None:
        self.stopped = True
        if self.fails:
            raise RuntimeError("could not stop")


def test_every_run_is_stopped_when_stopping_one_fails_and_the_failure_is_raised_after():
    runs = [_Stops(), _Stops(fails=True), _Stops()]
    with pytest.raises(RuntimeError, match="could not stop"):
        turns.stop_all(runs)
    assert [r.stopped for r in runs] == [True, True, True]
