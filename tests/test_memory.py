"""Memory by batch size: a line through the probes' peaks, the batches that fit, the chart."""

import json
from types import SimpleNamespace

import pytest

from autotune.commands.cli import main
from autotune.monitor.text import event_line
from autotune.tuning import memory

MB = 2**20


def test_two_batch_sizes_give_the_fixed_part_and_the_part_that_grows():
    fit = memory.MemoryFit.of([(32, 400 * MB), (128, 592 * MB), (64, 464 * MB)], "host")
    assert fit.fixed_bytes == pytest.approx(336 * MB)
    assert fit.per_sample_bytes == pytest.approx(2 * MB)
    # 8 GB free, 90% of it: (7372.8 - 336) MB / 2 MB per sample
    assert fit.max_batch(8 * 1024 * MB) == 3518
    assert fit.max_batch(8 * 1024 * MB, ranks=2) == (int((0.9 * 4096 - 336) // 2))
    # one peak scaled in proportion to the batch would say far less: 128 x 7372.8 / 592
    assert 128 * 0.9 * 8 * 1024 / 592 < fit.max_batch(8 * 1024 * MB) / 2
    assert "336.0 MB + 2.0 MB per sample (fitted to 3 probes at batch 32, 64, 128)" in \
        fit.describe()


def test_one_batch_size_tells_no_line_and_a_flat_one_no_limit():
    assert memory.MemoryFit.of([(32, 400 * MB), (32, 410 * MB)], "host") is None
    flat = memory.MemoryFit.of([(32, 400 * MB), (64, 399 * MB)], "gpu")
    assert flat.per_sample_bytes == 0 and flat.max_batch(MB * 1024) is None


def test_rank_points_take_gpu_memory_where_cuda_ran_else_one_rank_s_share_of_the_host_s():
    host = SimpleNamespace(ranks_seen=2, peak_rss_bytes=800 * MB, cuda_peak_bytes=0)
    one = SimpleNamespace(ranks_seen=1, peak_rss_bytes=300 * MB, cuda_peak_bytes=0)
    assert memory.rank_points([({"batch_size": 32, "instances": 2}, host),
                               ({"batch_size": 8}, one)]) == \
        ([(32, 400.0 * MB), (8, 300.0 * MB)], "host")
    gpu = SimpleNamespace(ranks_seen=1, peak_rss_bytes=300 * MB, cuda_peak_bytes=2000 * MB)
    assert memory.rank_points([({"batch_size": 64}, gpu), ({"batch_size": 8}, one)]) == \
        ([(64, 2000.0 * MB)], "gpu")


def test_the_report_charts_memory_by_batch_with_the_fitted_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    events = [{"t": 1.0, "event": "run_started", "kind": "tune", "command": ["train.py"]}]
    for i, (b, mb) in enumerate([(16, 368), (32, 400), (128, 592)]):
        events.append({"t": 2.0 + i, "event": "trial_finished", "trial": f"trial-{i}",
                       "number": i, "mode": "full",
                       "result": {"outcome": "ok", "samples_per_s": 100.0 + i, "ci_half": 1.0,
                                  "knobs": {"batch_size": b, "threads": 2},
                                  "peak_rss_bytes": 2 * mb * MB, "ranks_seen": 2}})
    text = "host memory per rank: 336.0 MB + 2.0 MB per sample (fitted to 3 probes)"
    events.append({"t": 9.0, "event": "memory_fit", "text": text})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert event_line(events[-1]) == f"memory: {text}"
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    html = out.read_text()
    assert "Memory by batch size" in html and text in html
    assert 'data-chart="memory"' in html and 'class="trend"' in html
    assert 'data-x="128" data-y="592.0"' in html  # one rank's share of the two ranks' peak
