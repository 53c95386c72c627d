"""The benches fail when their stated target is missed or when they measured nothing: a bench
that always exits 0 proves nothing (issue 21)."""

import importlib.util
import math
import re
import subprocess
import sys
import time

import pytest

from conftest import ROOT


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("bench", ["bench_claims", "bench_search", "bench_cluster",
                                   "bench_search --shape nanogpt"])
def test_one_round_is_refused_rather_than_passed_on_an_infinite_interval(bench):
    name, *mode = bench.split()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), *mode, "--rounds", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--rounds must be at least 2" in r.stderr


def test_bench_search_fails_below_its_target_and_without_an_interval():
    search = _bench("search_common")
    assert search.verdict(search.TARGET + 0.01, 0.05) == 0
    assert search.verdict(search.TARGET - 0.01, 0.05) == 1
    assert search.verdict(1.2, math.inf) == 1  # one round: no interval, nothing shown
    assert search.verdict(math.nan, math.nan) == 1


def test_bench_payback_fails_a_projection_off_the_scripts_clock():
    payback = _bench("bench_payback")
    projected = {"default": 100.0, "recipe": 80.0}
    near = {"default": {"own_s": 110.0}, "recipe": {"own_s": 75.0}}
    assert payback.off_the_clock(projected, near)[1] == {}
    far = {"default": {"own_s": 100.0}, "recipe": {"own_s": 60.0}}  # 80 / 60 = 1.33
    assert set(payback.off_the_clock(projected, far)[1]) == {"recipe"}
    unmeasured = {"default": {"own_s": math.nan}, "recipe": {"own_s": 80.0}}
    assert set(payback.off_the_clock(projected, unmeasured)[1]) == {"default"}


def test_the_benches_interval_is_infinite_from_one_round_and_nan_from_none():
    common = _bench("common")
    assert common.interval([1.2]) == (1.2, math.inf)
    assert math.isnan(common.interval([])[0])
    m, half = common.ratio_interval([110.0, 90.0, None], [100.0, 100.0, 100.0])
    assert m == 1.0 and 0 < half < math.inf  # the round without a figure is left out


def test_bench_cluster_fails_below_its_target_a_failed_tune_or_no_interval():
    cluster = _bench("bench_cluster")
    ok = {"rate": "1gbit", "tuned_over_grid_best": [cluster.TARGET + 0.01, 0.05]}
    assert cluster.verdict([ok]) == 0
    low = {"rate": "100mbit", "tuned_over_grid_best": [cluster.TARGET - 0.01, 0.05]}
    assert cluster.verdict([ok, low]) == 1
    assert cluster.verdict([{"rate": "1gbit", "tuned_over_grid_best": [1.2, math.inf]}]) == 1
    assert cluster.verdict([{"rate": "1gbit", "error": "salloc: error"}]) == 1
    # the script's own lines after the first two; fewer than two left: no figure
    text = "step 5 samples/s 10.0\nstep 10 samples/s 90.0\nstep 15 samples/s 100.0\n"
    assert cluster.own_rate(text) is None
    assert cluster.own_rate(text + "step 20 samples/s 110.0\n") == 105.0


# Each shape's own throughput lines, as its script prints them, and the mean of their figures
# after the first; autotune prints a line beside them under `autotune run --plain` that is not
# the script's and must not be read.
OWN_LINES = {
    "word_lm": ["| epoch   1 |    10/  571 batches | ms/batch 52.31 | samples/s 382.4 | loss 7.61",
                "| epoch   1 |    20/  571 batches | ms/batch 50.00 | samples/s 400.0 | loss 7.40",
                "| epoch   1 |    30/  571 batches | ms/batch 55.56 | samples/s 360.0 | loss 7.32",
                380.0],
    "mingpt": ["iter 3: dt 3412 ms, 9.38 samples/s", "iter 6: dt 1012 ms, 31.62 samples/s",
               "iter 9: dt 1000 ms, 32.00 samples/s", 31.81],
    "nanogpt": ["iter 0: loss 3.8253, time 174.38ms, 68.8 samples/s",
                "iter 10: loss 3.1330, time 48.04ms, 249.8 samples/s",
                "step 20: train loss 2.4747, val loss 2.4704",
                "iter 20: loss 2.7660, time 26.99ms, 444.7 samples/s", 347.25],
    "lightning_ddp": ["lightning: batch 50 samples/s 100.0", "lightning: batch 100 samples/s 210.0",
                      "lightning: batch 150 samples/s 190.0", 200.0],
}
AUTOTUNE_LINE = "full run: 9999.0 samples/s (autotune's meter)"


def test_every_shape_reads_its_own_lines_after_the_first_and_not_autotunes():
    shapes = _bench("shapes")
    assert set(OWN_LINES) == set(shapes.SHAPES)  # a new shape brings its lines here
    for name, (*lines, mean) in OWN_LINES.items():
        text = "\n".join([lines[0], AUTOTUNE_LINE, *lines[1:], AUTOTUNE_LINE]) + "\n"
        assert shapes.own_rate(text, shapes.SHAPES[name].rate) == pytest.approx(mean), name
        assert shapes.own_rate(lines[0] + "\n" + AUTOTUNE_LINE, shapes.SHAPES[name].rate) is None
    assert shapes.named("slow_steps") is shapes.SHAPES["mingpt"]  # bench_claims's name for it


@pytest.mark.parametrize("name, quick", [
    ("word_lm", ["--tokens", "20000", "--epochs", "1", "--log-interval", "2"]),
    ("mingpt", ["--sample-s", "0", "--first-step-s", "0", "--base-ms", "20", "--per-sample-ms", "0",
                "--log-every", "2", "--trainer.max_iters", "10"]),
])
def test_the_shapes_scripts_print_the_lines_their_regex_reads(name, quick):
    """Each script run to a fixed count (word_lm one epoch of 20,000 tokens, 28 batches;
    minGPT 10 iterations), not a time: beside a busy suite word_lm's 2 s once held one line."""
    shapes = _bench("shapes")
    shape = shapes.SHAPES[name]
    r = subprocess.run([sys.executable, *shape.script, *shape.plain_args, *quick],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert shapes.own_rate(r.stdout, shape.rate) > 0, r.stdout


def test_nanogpt_shape_takes_key_value_flags_and_keeps_evaluation_off_its_clock():
    """Evaluation every iteration, 40 forward passes each, takes most of the wall time: the
    iterations' own times must add up to a small part of it (with evaluation on the clock they
    would be all of it), and ``samples/s x time`` is the batch asked for."""
    shapes = _bench("shapes")
    shape = shapes.SHAPES["nanogpt"]
    p = subprocess.Popen([sys.executable, shape.script[0], "--batch_size=4", "--n_layer=1",
                          "--n_head=2", "--n_embd=32", "--block_size=32", "--eval_interval=1",
                          "--eval_iters=20", "--log_interval=5", "--max_iters=20",
                          "--corpus_chars=20000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []  # (arrival, line)
    for line in p.stdout:
        seen.append((time.monotonic(), line))
    assert p.wait(timeout=120) == 0, "".join(line for _, line in seen)
    text = "".join(line for _, line in seen)
    iters = [(t, re.match(r"iter (\d+): loss [0-9.]+, time ([0-9.]+)ms, ([0-9.]+) samples/s",
                          line)) for t, line in seen]
    iters = [(t, m) for t, m in iters if m]
    assert [int(m.group(1)) for _, m in iters] == list(range(0, 21, 5)), text
    assert text.count("val loss") == 21  # an evaluation before every iteration
    assert shapes.own_rate(text, shape.rate) > 0
    for _, m in iters:
        assert float(m.group(3)) * float(m.group(2)) / 1000 == pytest.approx(4, rel=0.05)
    wall_s = iters[-1][0] - iters[0][0]  # iterations 1-20 and their evaluations
    own_s = sum(5 * float(m.group(2)) / 1000 for _, m in iters[1:])
    assert own_s < 0.5 * wall_s, (own_s, wall_s)


def test_nanogpt_shape_refuses_a_flag_of_the_wrong_type():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "scripts" / "nanogpt_shape.py"),
                        "--batch_size=4.5"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--batch_size must be a int" in r.stderr


def _space(cores: int, **kw):
    from autotune.tuning import space
    return space.Space(**{"domains": {"batch_size": (8, 16), "thread_pct": (25, 50, 100)},
                          "fixed": {"instances": 1},
                          "baseline": {"batch_size": 12, "thread_pct": 100, "instances": 1},
                          "cores": cores, "placeholders": ("batch_size",), **kw})


def test_a_thread_share_reaches_a_plain_run_as_the_thread_count_autotune_gives_it():
    shapes = _bench("shapes")
    nanogpt = shapes.SHAPES["nanogpt"]
    for cores, pct, threads in ((4, 25, 1), (4, 50, 2), (4, 100, 4), (2, 50, 1), (2, 100, 2),
                                (3, 50, 1)):
        run = shapes.plain_run(nanogpt, {"batch_size": 16, "thread_pct": pct, "instances": 1},
                               _space(cores))
        assert run.flags == ("--batch_size=16",)
        assert run.env["OMP_NUM_THREADS"] == run.env["MKL_NUM_THREADS"] == str(threads)
        assert run.argv("python") == ["python", *nanogpt.script, "--batch_size=16"]
        assert run.text() == f"OMP_NUM_THREADS={threads} --batch_size=16"
    # the user's own run: its own flags, and no thread variable of the bench's shell
    own = shapes.default_run(nanogpt)
    assert own.flags == ("--batch_size=12",) and not own.env
    assert own.environ({"OMP_NUM_THREADS": "7", "PATH": "/bin"}) == {"PATH": "/bin"}


def test_a_knob_only_autotune_can_set_is_refused_for_a_plain_run():
    shapes = _bench("shapes")
    with pytest.raises(shapes.NotPlain, match="instances=2"):
        shapes.plain_run(shapes.SHAPES["nanogpt"], {"batch_size": 16, "instances": 2},
                         _space(2, domains={"batch_size": (8, 16), "instances": (1, 2)}))
    mingpt = shapes.SHAPES["mingpt"]
    sp = _space(2, domains={"workers": (0, 2), "prefetch": (2, 4)}, placeholders=(),
                baseline={"batch_size": 32, "workers": 0, "prefetch": 2, "instances": 1})
    with pytest.raises(shapes.NotPlain, match="prefetch=4"):
        shapes.plain_run(mingpt, {"batch_size": 32, "workers": 2, "prefetch": 4}, sp)
    run = shapes.plain_run(mingpt, {"batch_size": 32, "workers": 2, "prefetch": 2}, sp)
    assert run.flags == ("--trainer.batch_size=32", "--trainer.num_workers=2") and not run.env


def test_bench_search_prints_every_noise_entry_of_the_tunes_summary():
    search = _bench("search_shape")
    summary = {"speedup": 1.2, "process_noise": {"between_rel": 0.01},
               "probes": {"best": {"noise": None, "samples_per_s": 3.0}, "baseline": None}}
    assert search.noise_fields(summary) == [("process_noise", {"between_rel": 0.01}),
                                            ("probes.best.noise", None)]
    assert search.brief(None) == "(none in this summary)"


def _batch_space(batches: str):
    """nanoGPT's batch 12 on two cores, only the batch searched (``batches``: its range)."""
    from autotune.tuning import space

    return space.build(space.Machine(cores=2, mem_available_bytes=16 * 2**30),
                       space.Baseline(batch_size=12, workers=0), space.SpaceRequest(
                           ranges=space.parse_space([batches]),
                           fixed=space.parse_fix(["workers=0", "thread_pct=100"])))


def test_bench_search_sets_the_grids_own_figure_beside_the_side_by_side():
    """A side by side that cannot tell the grid's best from the defaults passes a tune that kept
    them; the grid's own rounds, which put its best at 1.18x the defaults, are reported beside
    it (not the gate: the best of many noisy figures runs high)."""
    search = _bench("search_shape")
    sp = _batch_space("batch_size=12:96")
    configs = sp.configs()
    assert [c["batch_size"] for c in configs] == [12, 16, 32, 64, 96]
    grid = search.ClockGrid(configs, runs=[None] * 5, cost_s=1.0,
                            rates=[[150.2, 171.6], [None, 174.0], [182.0, 183.0],
                                   [180.6, 192.8], [183.4, 196.1]])
    assert grid.configs[grid.best]["batch_size"] == 96
    kept = grid.ratio_to_best(sp, sp.baseline)
    assert kept == pytest.approx((150.2 + 171.6) / (183.4 + 196.1))
    assert not search.grid_agrees(kept)
    assert grid.ratio_to_best(sp, {**sp.baseline, "batch_size": 16}) == pytest.approx(
        174.0 / ((183.4 + 196.1) / 2))  # a round without a figure is left out
    assert search.grid_agrees(grid.ratio_to_best(sp, {**sp.baseline, "batch_size": 32}))
    assert grid.ratio_to_best(sp, {**sp.baseline, "batch_size": 1000}) is None  # not in it
    assert search.grid_agrees(None)


def test_a_grid_is_reused_only_for_the_same_shape_and_space(tmp_path):
    """``--grid-from``: an earlier run's grid names grid-best again (its figures, its rounds and
    cost) for the same shape and space; a file of another shape, another space, or none that
    bench_search wrote is refused, saying which."""
    import argparse
    import json

    search = _bench("search_shape")
    sp = _batch_space("batch_size=12:32")
    configs = sp.configs()
    rates = {12: [150.0, 160.0], 16: [170.0, None], 32: [180.0, 186.0]}
    saved = {"header": "# bench_search then", "shape": "nanogpt", "grid_s": 95.0,
             "grid_seconds": 30.0, "grid_rounds": 2,
             "grid": [{"knobs": c, "rates": rates[c["batch_size"]]} for c in reversed(configs)]}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(saved))
    args = argparse.Namespace(grid_from=path, shape="nanogpt", space=[], grid_seconds=45.0,
                              grid_rounds=3)
    shapes = _bench("shapes")
    runs = [shapes.plain_run(shapes.SHAPES["nanogpt"], c, sp) for c in configs]
    grid = search.reused_grid(args, sp, configs, runs)
    assert [r for r in grid.rates] == [rates[c["batch_size"]] for c in configs]
    assert grid.configs[grid.best]["batch_size"] == 32 and grid.cost_s == 95.0
    assert (args.grid_seconds, args.grid_rounds) == (30.0, 2)  # what the figures came from

    for change, says in (({"shape": "mingpt"}, "shape 'mingpt'"),
                         ({"grid": saved["grid"][1:]}, "not this run's space of 3")):
        path.write_text(json.dumps({**saved, **change}))
        with pytest.raises(ValueError, match=says):
            search.reused_grid(args, sp, configs, runs)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a grid that bench_search --shape wrote"):
        search.reused_grid(args, sp, configs, runs)


@pytest.mark.parametrize("args, says", [
    (["--shape", "mingpt", "--grid-from", "no-such.json"], "--grid-from no-such.json: no such"),
    (["--grid-from", "no-such.json"], "--grid-from reuses a --shape run's grid"),
])
def test_bench_search_refuses_a_grid_it_cannot_reuse_before_measuring(args, says):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_search.py"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_a_reused_grid_brings_its_judging_when_it_judged_the_same_configs(tmp_path):
    """``--grid-from``: the earlier run's judging of the grid's top configs in turns (which
    cost minGPT's shape 23 minutes) names grid-best again when it judged this grid's top
    ``--judge-top``; a file without one, or one that judged other configs, is judged afresh."""
    import argparse
    import json

    search = _bench("search_shape")
    sp = _batch_space("batch_size=12:64")
    configs = sp.configs()
    rates = {12: [150.0, 160.0], 16: [170.0, 172.0], 32: [180.0, 186.0], 64: [190.0, 188.0]}
    grid = search.ClockGrid(configs, [None] * len(configs),
                            [rates[c["batch_size"]] for c in configs], 1.0)
    by_batch = {c["batch_size"]: c for c in configs}
    saved = {"judged": {"knobs": [by_batch[64], by_batch[32], by_batch[16]],
                        "rates": [[200.0, 201.0], [230.0, None], [150.0, 151.0]],
                        "wall_s": 600.0}}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(saved))
    args = argparse.Namespace(grid_from=path, judge_top=3)
    judged = search.reused_judging(args, sp, grid)
    assert [configs[i]["batch_size"] for i in judged.indices] == [64, 32, 16]
    assert configs[judged.best]["batch_size"] == 32 and judged.wall_s == 600.0
    assert search.reused_judging(argparse.Namespace(grid_from=path, judge_top=2), sp,
                                 grid) is None
    path.write_text(json.dumps({"judged": {**saved["judged"],
                                           "knobs": [by_batch[64], by_batch[16], by_batch[32]]}}))
    assert search.reused_judging(args, sp, grid) is None
    path.write_text(json.dumps({"grid": []}))
    assert search.reused_judging(args, sp, grid) is None
