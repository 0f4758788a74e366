"""Goodput: requests per second that met every per-request SLO (as ``vllm bench serve --goodput``)."""

from __future__ import annotations

from collections.abc import Mapping

from tuner.load.generator import LoadResult
from tuner.load.units import IDENTITY, Units

PER_REQUEST_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


def request_goodput(result: LoadResult, limits_ms: Mapping[str, float], units: Units = IDENTITY) -> float:
    """Successful requests meeting all ``limits_ms`` (keys ttft_ms, tpot_ms, e2el_ms), per second.

    ``result`` holds client records; ``limits_ms`` and the answer are node figures (:mod:`tuner.load.units`):
    each request's times are scaled to the node's before the limits apply, and the rate is the node's.
    """
    if result.duration_s <= 0:
        return 0.0
    scale = 1000.0 * units.time_scale
    good = 0
    for rec in result.records:
        if not rec.ok or rec.ttft_s is None:
            continue
        observed = {"ttft_ms": rec.ttft_s * scale, "e2el_ms": rec.e2e_s * scale,
                    "tpot_ms": ((rec.e2e_s - rec.ttft_s) / (rec.output_tokens - 1) * scale
                                if rec.output_tokens > 1 else 0.0)}
        if all(observed[key] <= limit for key, limit in limits_ms.items()):
            good += 1
    return units.node_rate(good / result.duration_s)
