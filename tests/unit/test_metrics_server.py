"""Server-side figures from /metrics: histogram deltas and quantiles (queue time), gauges over DP engines."""

from __future__ import annotations

import math

import pytest

from tuner.engines.vllm.metrics import gauge_summary, gauge_total, queue_time_summary
from tuner.load.metrics import histogram_deltas, histogram_quantile, parse_prometheus

H = "vllm:request_queue_time_seconds"


def _page(engine_counts: dict[str, list[int]], sums: dict[str, float], bounds: tuple[str, ...]) -> str:
    lines = []
    for engine, counts in engine_counts.items():
        for le, c in zip(bounds, counts, strict=True):
            lines.append(f'{H}_bucket{{engine="{engine}",le="{le}"}} {c}')
        lines.append(f'{H}_count{{engine="{engine}"}} {counts[-1]}')
        lines.append(f'{H}_sum{{engine="{engine}"}} {sums[engine]}')
    return "\n".join(lines)


BOUNDS = ("0.1", "0.5", "1.0", "+Inf")


def test_histogram_deltas_add_engines_and_subtract_the_start() -> None:
    before = parse_prometheus(_page({"0": [1, 1, 1, 1], "1": [0, 0, 0, 0]}, {"0": 0.05, "1": 0.0}, BOUNDS))
    after = parse_prometheus(_page({"0": [3, 5, 5, 5], "1": [0, 2, 4, 5]}, {"0": 1.05, "1": 4.0}, BOUNDS))
    buckets, count, total = histogram_deltas(before, after, H)
    assert buckets == [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (math.inf, 9.0)]
    assert count == 9.0 and total == pytest.approx(5.0)


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (math.inf, 10.0)]
    assert histogram_quantile(buckets, 0.1) == pytest.approx(0.1 * 1 / 2)  # rank 1 of 2 in [0, 0.1]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.1 + 0.4 * (5 - 2) / 4)
    assert histogram_quantile(buckets, 0.99) == 1.0  # in +Inf: the highest finite bound
    assert math.isnan(histogram_quantile([], 0.5))
    assert math.isnan(histogram_quantile([(1.0, 0.0), (math.inf, 0.0)], 0.5))


def test_queue_time_summary_in_ms_and_nan_without_requests() -> None:
    before = parse_prometheus(_page({"0": [0, 0, 0, 0]}, {"0": 0.0}, BOUNDS))
    after = parse_prometheus(_page({"0": [0, 4, 4, 4]}, {"0": 1.2}, BOUNDS))
    q = queue_time_summary(before, after)
    assert q["queue_requests"] == 4
    assert q["mean_queue_ms"] == pytest.approx(300.0)
    assert q["median_queue_ms"] == pytest.approx(300.0)  # rank 2 of 4 in (0.1, 0.5]
    assert set(q) >= {"p95_queue_ms", "p99_queue_ms"}
    empty = queue_time_summary(before, before)
    assert empty["queue_requests"] == 0 and math.isnan(empty["median_queue_ms"]) and math.isnan(empty["mean_queue_ms"])


def test_gauges_sum_engines_but_average_kv_usage() -> None:
    page = parse_prometheus("\n".join([
        'vllm:num_requests_running{engine="0"} 3', 'vllm:num_requests_running{engine="1"} 5',
        'vllm:num_requests_waiting{engine="0"} 1', 'vllm:num_requests_waiting{engine="1"} 0',
        'vllm:kv_cache_usage_perc{engine="0"} 0.5', 'vllm:kv_cache_usage_perc{engine="1"} 0.9']))
    assert gauge_total(page, "vllm:num_requests_running") == 8
    assert gauge_total(page, "vllm:kv_cache_usage_perc") == pytest.approx(0.7)
    assert gauge_total(page, "vllm:absent") is None
    idle = parse_prometheus('vllm:num_requests_running{engine="0"} 0')
    summary = gauge_summary([page, idle, {}])
    running = summary["vllm:num_requests_running"]
    assert running == {"samples": 2, "mean": 4.0, "max": 8.0}
    assert summary["vllm:kv_cache_usage_perc"]["samples"] == 1
