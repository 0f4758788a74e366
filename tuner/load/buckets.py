"""TTFT per context bucket: how the first token's wait grows with the prompt (issue 27).

A long-context workload draws prompt lengths over a range (``input_len`` ± ``range_ratio``); one p95 TTFT
over all of them hides whether the longest prompts wait seconds more than the shortest, which is what a
prefill pool is sized for. :func:`ttft_by_context` splits a window's successful requests into
:data:`BUCKETS` equal slices of the workload's prompt range and reports each slice's TTFT in node
milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuner.load.generator import RequestRecord
from tuner.load.units import IDENTITY, Units
from tuner.objective import Workload

__all__ = ["BUCKETS", "context_edges", "ttft_by_context"]

BUCKETS = 3


def context_edges(workload: Workload, buckets: int = BUCKETS) -> tuple[int, ...]:
    """The upper prompt length of each bucket but the last (empty for fixed-length prompts)."""
    if workload.range_ratio <= 0 or buckets < 2:
        return ()
    low = workload.input_len * (1.0 - workload.range_ratio)
    high = workload.input_len * (1.0 + workload.range_ratio)
    return tuple(round(low + (high - low) * i / buckets) for i in range(1, buckets))


def ttft_by_context(records: Sequence[RequestRecord], edges: Sequence[int], units: Units = IDENTITY
                    ) -> list[dict[str, Any]]:
    """Each bucket's prompt range, requests, and p50/p95 TTFT in node ms (None where it holds no request)."""
    if not edges:
        return []
    bounds: list[int | None] = [0, *edges, None]
    out: list[dict[str, Any]] = []
    for low, high in itertools.pairwise(bounds):
        assert low is not None
        ttfts = [r.ttft_s * 1000.0 * units.time_scale for r in records
                 if r.ok and r.ttft_s is not None and r.prompt_tokens > low
                 and (high is None or r.prompt_tokens <= high)]
        values = np.asarray(ttfts, dtype=np.float64)
        out.append({"prompt_tokens_above": low, "prompt_tokens_upto": high, "requests": len(ttfts),
                    "p50_ttft_ms": float(np.percentile(values, 50)) if ttfts else None,
                    "p95_ttft_ms": float(np.percentile(values, 95)) if ttfts else None})
    return out
