"""vLLM's metric names, and what they say about one measured window.

The load generator reads any Prometheus page (:mod:`tuner.load.metrics`); which names vLLM exposes,
and how they add up, is here:

- counters diffed per window (:data:`SERVER_COUNTERS`): prompt and generated tokens, preemptions,
  prefix-cache queries and hits, speculative drafts and acceptances;
- speculative-decoding acceptance (:func:`spec_decode_summary`);
- queue time (:func:`queue_time_summary`): the client cannot see how long a request waited for a
  batch slot, vLLM's ``vllm:request_queue_time_seconds`` histogram can;
- gauges sampled during a window (:func:`gauge_total` sums the engines of a DP deployment,
  :func:`gauge_summary` reduces the samples).

:data:`VLLM_METRICS` puts them together as the engine's :class:`~tuner.load.metrics.ServerMetrics`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.metrics import (
    MetricKey,
    counter_delta,
    counter_deltas,
    histogram_deltas,
    histogram_quantile,
    percentile_word,
)

__all__ = [
    "GAUGES",
    "KV_CACHE_USAGE",
    "QUEUE_TIME_HISTOGRAM",
    "SERVER_COUNTERS",
    "SPEC_DECODE_COUNTERS",
    "VLLM_METRICS",
    "VllmMetrics",
    "gauge_summary",
    "gauge_total",
    "queue_time_summary",
    "spec_decode_summary",
    "window_facts",
]

SERVER_COUNTERS = (
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
"""Counters whose growth over a window is recorded (``server_metrics.json``: ``counters``)."""

SPEC_DECODE_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)

QUEUE_TIME_HISTOGRAM = "vllm:request_queue_time_seconds"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""A per-engine fraction: engines are averaged, not added."""
GAUGES = (KV_CACHE_USAGE, "vllm:num_requests_running", "vllm:num_requests_waiting")


def spec_decode_summary(deltas: Mapping[str, float]) -> dict[str, float | None]:
    """Speculative-decoding acceptance over a window, from :func:`~tuner.load.metrics.counter_deltas` output.

    Pass deltas of :data:`SPEC_DECODE_COUNTERS` (either spelling). ``acceptance_rate`` is
    accepted / drafted tokens, a fraction in [0, 1] (``vllm bench serve`` reports it in percent);
    ``mean_acceptance_length`` is ``1 + accepted / drafts`` (tokens per verification step).
    Both are None when nothing was drafted.
    """
    drafts = counter_delta(deltas, "vllm:spec_decode_num_drafts")
    draft_tokens = counter_delta(deltas, "vllm:spec_decode_num_draft_tokens")
    accepted = counter_delta(deltas, "vllm:spec_decode_num_accepted_tokens")
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None,
    }


def queue_time_summary(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
                       percentiles: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Queue time of the requests vLLM finished in the window (``vllm:request_queue_time_seconds``).

    Keys ``mean_queue_ms``, ``median_queue_ms``, ``p{P}_queue_ms`` (bucket-interpolated, so only as
    fine as vLLM's buckets) and ``queue_requests``; NaN when no request was recorded.
    """
    buckets, count, total = histogram_deltas(before, after, QUEUE_TIME_HISTOGRAM)
    out = {"queue_requests": count, "mean_queue_ms": total / count * 1000.0 if count > 0 else math.nan,
           "median_queue_ms": histogram_quantile(buckets, 0.5) * 1000.0}
    for p in percentiles:
        out[f"p{percentile_word(p)}_queue_ms"] = histogram_quantile(buckets, p / 100.0) * 1000.0
    return out


def gauge_total(samples: Mapping[MetricKey, float], name: str) -> float | None:
    """One gauge summed over its label sets (the engines under DP); None when absent.

    ``vllm:kv_cache_usage_perc`` is a per-engine fraction, so for it this is the mean over engines.
    """
    values = [v for (sample, _labels), v in samples.items() if sample == name and not math.isnan(v)]
    if not values:
        return None
    if name == KV_CACHE_USAGE:
        return sum(values) / len(values)
    return sum(values)


def gauge_summary(series: Sequence[Mapping[MetricKey, float]],
                  names: Iterable[str] = GAUGES) -> dict[str, dict[str, float | int | None]]:
    """Mean and max of each gauge over scrapes taken during a window, engines combined."""
    out: dict[str, dict[str, float | int | None]] = {}
    for name in names:
        values = [v for v in (gauge_total(s, name) for s in series) if v is not None]
        out[name] = {"samples": len(values),
                     "mean": sum(values) / len(values) if values else None,
                     "max": max(values) if values else None}
    return out


@dataclass(frozen=True)
class VllmMetrics:
    """vLLM's :class:`~tuner.load.metrics.ServerMetrics`: the ``server`` block of one measured window."""

    counters: tuple[str, ...] = SERVER_COUNTERS

    def window(self, before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
               gauges: Sequence[Mapping[MetricKey, float]]) -> dict[str, Any]:
        if not after:
            return {"counters": {}, "spec_decode": spec_decode_summary({}), "queue": {},
                    "gauges": gauge_summary(gauges)}
        deltas = counter_deltas(before, after, self.counters)
        queue = queue_time_summary(before, after)
        gauge = gauge_summary(gauges)
        return {"counters": deltas, "spec_decode": spec_decode_summary(deltas), "queue": queue, "gauges": gauge,
                "facts": window_facts(deltas, after, queue, gauge)}


def _reported(scrape: Mapping[MetricKey, float], name: str) -> bool:
    base = name.removesuffix("_total")
    return any(sample in (base, base + "_total") for sample, _labels in scrape)


def window_facts(deltas: Mapping[str, float], after: Mapping[MetricKey, float], queue: Mapping[str, float],
                 gauges: Mapping[str, Mapping[str, float | int | None]]) -> dict[str, float | None]:
    """The figures :func:`tuner.load.freshness.check_window` reads, in engine-neutral names.

    A counter the page did not carry is None (not reported), not 0 (reported, did not grow):
    ``vllm:prefix_cache_*`` are absent when prefix caching is off.
    """
    def counter(name: str) -> float | None:
        return counter_delta(deltas, name) if _reported(after, name) else None

    return {"prefix_cache_hits": counter("vllm:prefix_cache_hits"),
            "prefix_cache_queries": counter("vllm:prefix_cache_queries"),
            "preemptions": counter("vllm:num_preemptions"),
            "prompt_tokens": counter("vllm:prompt_tokens"),
            "generation_tokens": counter("vllm:generation_tokens"),
            "kv_usage_max": gauges.get(KV_CACHE_USAGE, {}).get("max"),
            "queue_p95_ms": queue.get("p95_queue_ms"),
            "running_max": gauges.get("vllm:num_requests_running", {}).get("max"),
            "waiting_max": gauges.get("vllm:num_requests_waiting", {}).get("max")}


VLLM_METRICS = VllmMetrics()
