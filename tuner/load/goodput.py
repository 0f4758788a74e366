"""Goodput: requests per second that met every per-request SLO (as ``vllm bench serve --goodput``)."""

from __future__ import annotations

from collections.abc import Mapping

from tuner.load.generator import LoadResult

PER_REQUEST_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


def request_goodput(result: LoadResult, limits_ms: Mapping[str, float]) -> float:
    """Successful requests meeting all ``limits_ms`` (keys ttft_ms, tpot_ms, e2el_ms), per second."""
    if result.duration_s <= 0:
        return 0.0
    good = 0
    for rec in result.records:
        if not rec.ok or rec.ttft_s is None:
            continue
        observed = {"ttft_ms": rec.ttft_s * 1000.0, "e2el_ms": rec.e2e_s * 1000.0,
                    "tpot_ms": ((rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1) * 1000.0
                                if rec.output_tokens > 1 else 0.0)}
        if all(observed[key] <= limit for key, limit in limits_ms.items()):
            good += 1
    return good / result.duration_s
