"""Allreduce by message size: the pure parts, and a real 2-rank gloo run on this host."""

import os

import pytest

from autotune.launching.rank_command import PROJECT_ROOT
from autotune.measuring import allreduce
from autotune import LaunchError
from fakes.gpu_host import fake_pynvml, write_nvml_config
from probes import allreduce as rank_side

MB = 1024 * 1024


def test_sizes_cover_4kb_to_256mb_by_4():
    s = rank_side.sizes()
    assert s[0] == 4096 and s[-1] == 256 * MB and all(b == 4 * a for a, b in zip(s, s[1:]))
    assert rank_side.sizes(4096, 5000) == [4096, 5000]
    with pytest.raises(ValueError, match="min_bytes <= max_bytes"):
        rank_side.sizes(8192, 4096)


def test_bus_factor_is_that_of_a_ring():
    assert rank_side.bus_factor(2) == 1.0 and rank_side.bus_factor(8) == 1.75
    assert rank_side.bus_factor(1) == 1.0


def _result(busbw_by_size):
    return allreduce.AllreduceResult("gloo", 2, "cpu", tuple(
        allreduce.Point(b, b / (bw * 1e9), bw, bw) for b, bw in busbw_by_size))


def test_bucket_range_from_where_bandwidth_rises_and_saturates():
    r = _result([(64 * 1024, 0.1), (MB, 0.6), (4 * MB, 0.95), (16 * MB, 1.0), (64 * MB, 0.9)])
    assert allreduce.bucket_range(r) == (1.0, 16.0)
    slow = _result([(MB, 0.1), (16 * MB, 0.5), (64 * MB, 1.0)])
    assert allreduce.bucket_range(slow) == (16.0, 256.0)
    flat = _result([(4096, 1.0), (MB, 1.0)])
    assert allreduce.bucket_range(flat) == (1.0, 4.0)


def test_placement_one_rank_per_gpu_or_cpu():
    assert allreduce.placement_for(2, 4) == ("gpu", 1, 2)
    assert allreduce.placement_for(2, 1) == ("cpu", 2, None)
    assert allreduce.placement_for(2, 0) == ("cpu", 2, None)


def test_parse_refuses_what_is_not_a_result():
    with pytest.raises(ValueError, match="not an allreduce result"):
        allreduce.parse({"points": []})
    with pytest.raises(ValueError, match="without a single"):
        allreduce.parse({"backend": "gloo", "world_size": 2, "points": []})


@pytest.mark.slow
def test_two_gloo_ranks_on_this_host(tmp_path):
    result = allreduce.measure(ranks=2, log_dir=tmp_path, cwd=str(tmp_path),
                               max_bytes=MB, seconds_per_size=0.05, timeout_s=180)
    assert result.backend == "gloo" and result.world_size == 2 and result.device == "cpu"
    assert [p.bytes for p in result.points] == [4096, 16384, 65536, 262144, MB]
    assert all(p.latency_s > 0 and p.busbw_gbps > 0 and p.iters >= 3 for p in result.points)
    low, high = allreduce.bucket_range(result)
    assert 1.0 <= low <= high <= 256.0
    assert allreduce.rows(result)[0][0] == "4 KB"


@pytest.mark.slow
def test_a_failing_probe_says_where_to_look(tmp_path):
    with pytest.raises(LaunchError, match="allreduce.log"):
        allreduce.measure(ranks=2, log_dir=tmp_path, min_bytes=8192, max_bytes=4096,
                          timeout_s=120)


@pytest.mark.slow
def test_cpu_ranks_on_a_host_with_cuda_take_gloo(tmp_path, monkeypatch):
    # Two ranks and one GPU: the probe's ranks run on the CPU. A rank that chose NCCL because
    # CUDA was there took cuda:LOCAL_RANK, and rank 1 failed with "invalid device ordinal"
    # (seen on an H200). Here CUDA only looks present, as it would to such a rank.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.is_available = lambda: True\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(PROJECT_ROOT)]))
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=1)):
        result = allreduce.measure(ranks=2, log_dir=tmp_path / "logs", cwd=str(tmp_path),
                                   max_bytes=16384, seconds_per_size=0.05, timeout_s=180,
                                   env=env)
    assert result.backend == "gloo" and result.device == "cpu" and result.world_size == 2
    assert [p.bytes for p in result.points] == [4096, 16384]
