"""The benches fail when their stated target is missed or when they measured nothing: a bench
that always exits 0 proves nothing (issue 21)."""

import importlib.util
import math
import subprocess
import sys

import pytest

from conftest import ROOT


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("bench", ["bench_claims", "bench_search", "bench_cluster"])
def test_one_round_is_refused_rather_than_passed_on_an_infinite_interval(bench):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{bench}.py"), "--rounds", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--rounds must be at least 2" in r.stderr


def test_bench_search_fails_below_its_target_and_without_an_interval():
    search = _bench("bench_search")
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
