"""What a prefill/decode group's ``/metrics`` pages say about one window, pool by pool (issue 27).

A group's scrape (``tuner.engines.group.ServerGroup.scrape``) is every member's page in one, each sample
labelled with its member's pool (:data:`POOL_LABEL`). :class:`PoolMetrics` wraps the engine's own metric
map (:class:`~tuner.load.metrics.ServerMetrics`): it reads each pool's samples as the engine reads one
server's, keeps both under ``pools``, and adds what only a pair of pools has:

- **prefill and decode queue time apart**: ``queue`` holds the decode pool's queue percentiles under the
  usual keys and the prefill pool's as ``*_prefill_queue_ms`` (both copied into the window's summary);
- **the KV transfer**, where the connector exports it: NIXL's ``vllm:nixl_xfer_time_seconds`` percentiles,
  its ``vllm:nixl_bytes_transferred`` and ``vllm:nixl_num_failed_transfers``; for any connector, vLLM's
  ``vllm:external_prefix_cache_hits`` (prompt tokens the decode pool received rather than computed);
- **KV use per pool**: each pool's ``vllm:kv_cache_usage_perc`` mean and max under ``pools``.

The facts the window check reads (:mod:`tuner.load.freshness`, :mod:`tuner.load.knee`) are the node's:
prompt tokens where prompts are computed (the prefill pool), generated tokens where answers are
(the decode pool), prefix-cache hits, preemptions and waiting requests of both, the fuller pool's KV use,
the decode pool's running requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.metrics import (
    MetricKey,
    ServerMetrics,
    counter_deltas,
    histogram_deltas,
    histogram_quantile,
)

__all__ = ["MEMBER_LABEL", "POOLS", "POOL_LABEL", "TRANSFER_COUNTERS", "PoolMetrics", "of_pool"]

POOL_LABEL = "dsv4_pool"
"""The label a group's scrape adds to each sample: its member's pool."""
MEMBER_LABEL = "dsv4_member"
"""The label a group's scrape adds to each sample: its member (``prefill-0``)."""
POOLS = ("prefill", "decode")
TRANSFER_COUNTERS = ("vllm:nixl_num_failed_transfers", "vllm:external_prefix_cache_hits",
                     "vllm:external_prefix_cache_queries")
TRANSFER_TIME = "vllm:nixl_xfer_time_seconds"
TRANSFER_BYTES = "vllm:nixl_bytes_transferred"


def of_pool(samples: Mapping[MetricKey, float], pool: str) -> dict[MetricKey, float]:
    """The samples of one pool's members."""
    return {key: value for key, value in samples.items() if (POOL_LABEL, pool) in key[1]}


def _reported(samples: Mapping[MetricKey, float], name: str) -> bool:
    base = name.removesuffix("_total")
    return any(sample in (base, base + "_total", base + "_count") for sample, _labels in samples)


def transfer_summary(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float]) -> dict[str, Any]:
    """The KV transfer over one window, from the decode pool's samples (None where the connector is silent)."""
    deltas = counter_deltas(before, after, TRANSFER_COUNTERS)
    out: dict[str, Any] = {
        "failed_transfers": deltas["vllm:nixl_num_failed_transfers"]
        if _reported(after, "vllm:nixl_num_failed_transfers") else None,
        "external_prefix_cache_hits": deltas["vllm:external_prefix_cache_hits"]
        if _reported(after, "vllm:external_prefix_cache_hits") else None,
        "external_prefix_cache_queries": deltas["vllm:external_prefix_cache_queries"]
        if _reported(after, "vllm:external_prefix_cache_queries") else None,
        "transfers": None, "mean_transfer_ms": None, "p50_transfer_ms": None, "p95_transfer_ms": None,
        "mean_transfer_bytes": None}
    if _reported(after, TRANSFER_TIME):
        buckets, count, total = histogram_deltas(before, after, TRANSFER_TIME)
        out.update({"transfers": count, "mean_transfer_ms": total / count * 1000.0 if count > 0 else math.nan,
                    "p50_transfer_ms": histogram_quantile(buckets, 0.5) * 1000.0,
                    "p95_transfer_ms": histogram_quantile(buckets, 0.95) * 1000.0})
    if _reported(after, TRANSFER_BYTES):
        _, count, total = histogram_deltas(before, after, TRANSFER_BYTES)
        out["mean_transfer_bytes"] = total / count if count > 0 else math.nan
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not math.isnan(float(value)) else None


def _sum(*values: Any) -> float | None:
    numbers = [v for v in (_number(x) for x in values) if v is not None]
    return sum(numbers) if numbers else None


def _max(*values: Any) -> float | None:
    numbers = [v for v in (_number(x) for x in values) if v is not None]
    return max(numbers) if numbers else None


@dataclass(frozen=True)
class PoolMetrics:
    """A :class:`~tuner.load.metrics.ServerMetrics` over a prefill/decode group (module docstring)."""

    inner: ServerMetrics

    def window(self, before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
               gauges: Sequence[Mapping[MetricKey, float]]) -> dict[str, Any]:
        pools = {pool: self.inner.window(of_pool(before, pool), of_pool(after, pool),
                                         [of_pool(g, pool) for g in gauges]) for pool in POOLS}
        prefill, decode = pools["prefill"], pools["decode"]
        queue = dict(decode.get("queue") or {})
        queue.update({k.replace("_queue_ms", "_prefill_queue_ms"): v
                      for k, v in (prefill.get("queue") or {}).items() if k.endswith("_queue_ms")})
        out: dict[str, Any] = {"counters": decode.get("counters", {}), "spec_decode": decode.get("spec_decode"),
                               "queue": queue, "gauges": decode.get("gauges", {}), "pools": pools}
        if not after:
            return out
        out["transfer"] = transfer_summary(of_pool(before, "decode"), of_pool(after, "decode"))
        pf, df = prefill.get("facts") or {}, decode.get("facts") or {}
        out["facts"] = {
            "prefix_cache_hits": _sum(pf.get("prefix_cache_hits"), df.get("prefix_cache_hits")),
            "prefix_cache_queries": _sum(pf.get("prefix_cache_queries"), df.get("prefix_cache_queries")),
            "preemptions": _sum(pf.get("preemptions"), df.get("preemptions")),
            "prompt_tokens": pf.get("prompt_tokens"),
            "generation_tokens": df.get("generation_tokens"),
            "kv_usage_max": _max(pf.get("kv_usage_max"), df.get("kv_usage_max")),
            "queue_p95_ms": _max(pf.get("queue_p95_ms"), df.get("queue_p95_ms")),
            "running_max": df.get("running_max"),
            "waiting_max": _sum(pf.get("waiting_max"), df.get("waiting_max")),
        }
        return out
