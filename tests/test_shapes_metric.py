"""``--metric REGEX``: the script's own throughput lines as the measured series."""

import pytest

from autotune.measuring import steady
from autotune.measuring.metric import MetricLog, parse_metric


def test_named_group_required():
    with pytest.raises(ValueError, match="none of the named groups"):
        parse_metric(r"samples/s ([0-9.]+)")
    with pytest.raises(ValueError, match="more than one"):
        parse_metric(r"(?P<samples_per_s>[0-9.]+) (?P<ms_per_step>[0-9.]+)")
    with pytest.raises(ValueError, match="not a regular expression"):
        parse_metric(r"(?P<samples_per_s>[0-9.]+")


@pytest.mark.parametrize("pattern, line, rate", [
    (r"samples/s (?P<samples_per_s>[\d.,]+)", "epoch 1 samples/s 1,234.5 loss 2", 1234.5),
    (r"(?P<ms_per_step>[\d.]+) ms/step", "step 10 | 250.0 ms/step", 4.0),
    (r"(?P<steps_per_s>[\d.]+)it/s", " 40%|####  | 40/100 [00:04<00:06, 9.50it/s]", 9.5),
    (r"rank tput (?P<rank_samples_per_s>\d+)", "rank tput 300", 300.0),
])
def test_rate_of_a_line(pattern, line, rate):
    assert parse_metric(pattern).rate(line) == pytest.approx(rate)


def test_lines_that_say_nothing():
    m = parse_metric(r"samples/s (?P<samples_per_s>\S+)")
    assert m.rate("eval loss 0.3") is None
    assert m.rate("samples/s nan") is None
    assert m.rate("samples/s 0") is None
    assert m.rate("samples/s -3") is None


def test_scale_per_rank_and_per_step():
    assert parse_metric(r"(?P<samples_per_s>\d+)").scale(batch_size=None, ranks=4) == 1.0
    assert parse_metric(r"(?P<rank_samples_per_s>\d+)").scale(batch_size=None, ranks=4) == 4.0
    ms = parse_metric(r"(?P<ms_per_step>\d+)")
    assert ms.scale(batch_size=None, ranks=2) is None
    assert ms.scale(batch_size=32, ranks=2) == 64.0


def test_partial_lines_and_carriage_returns():
    log = MetricLog(parse_metric(r"(?P<steps_per_s>[\d.]+)it/s"))
    assert log.feed("10/100 [00:01, 10.0i", 1.0) == 0
    assert log.feed("t/s]\r20/100 [00:02, 12.0it/s]\r30/100 [00:03, 14.0it/s]", 2.0) == 2
    assert log.points == [(2.0, 11.0)]
    assert log.finish(3.0) == 1
    assert log.points[-1] == (3.0, 14.0)
    assert log.lines == 3


def test_series_integrates_rates_over_read_intervals():
    log = MetricLog(parse_metric(r"sps (?P<samples_per_s>\d+)"))
    log.feed("sps 999\n", 1.0)  # interval unknown: only starts the clock
    log.feed("sps 100\nsps 300\n", 2.0)  # one read, two lines: their mean over the interval
    log.feed("noise\n", 2.5)
    log.feed("sps 100\n", 4.0)
    assert log.series(2.0) == [(1.0, 0.0), (2.0, 400.0), (4.0, 800.0)]


def test_steady_estimate_of_a_metric_series_matches_the_printed_rate():
    log = MetricLog(parse_metric(r"(?P<ms_per_step>[\d.]+) ms"))
    t = 0.0
    for i in range(100):
        t += 0.2
        log.feed(f"step {i} {50 if i < 5 else 25} ms\n", t)  # slow start, then 40 steps/s
    est = steady.estimate(log.series(16.0), batches=len(log.points))
    assert est.samples_per_s == pytest.approx(640.0, rel=0.01)
