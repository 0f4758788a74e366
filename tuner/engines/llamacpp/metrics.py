"""llama-server's ``/metrics`` (``--metrics``) and what it says about one measured window.

Counters diffed per window (:data:`COUNTERS`): prompt tokens (and those served from its prompt cache)
and the seconds spent on them, predicted tokens and the seconds spent on them, decode calls, and the
drafts, drafted tokens and accepted tokens of speculative decoding (the pinned build's
``llamacpp:spec_decode_*_total``). Prompt processing and decoding are measured apart, as the dossier's
Strix Halo record measures them: ``prompt_tok_s`` = Δ prompt tokens / Δ prompt seconds, ``decode_tok_s`` =
Δ predicted tokens / Δ predicted seconds (the server's own clocks, summed over slots). Gauges sampled
during the window: requests processing and deferred (the knee check's ``running_max`` / ``waiting_max``).

Prompt tokens a slot took from its cache are the window's prefix-cache hits (of processed + cached tokens
queried), so the window check can refuse a window that re-sent a prompt. llama-server has no preemption
or queue-time counters on this page: those facts are None (not reported), and the window check says so
rather than reading them as zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.load.metrics import MetricKey, counter_delta, counter_deltas

__all__ = ["COUNTERS", "GAUGES", "LLAMACPP_METRICS", "LlamaCppMetrics", "rates"]

PREFIX = "llamacpp:"
COUNTERS = tuple(PREFIX + name for name in (
    "prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total", "tokens_predicted_seconds_total",
    "prompt_tokens_cached_total", "n_decode_total", "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"))
GAUGES = tuple(PREFIX + name for name in ("requests_processing", "requests_deferred", "n_busy_slots_per_decode"))


def rates(deltas: Mapping[str, float]) -> dict[str, float | None]:
    """Prompt and decode tokens per second over a window, from the server's own token and second counters."""
    def ratio(tokens: str, seconds: str) -> float | None:
        t, s = counter_delta(deltas, PREFIX + tokens), counter_delta(deltas, PREFIX + seconds)
        return round(t / s, 3) if s > 0 else None

    drafted = counter_delta(deltas, PREFIX + "spec_decode_num_draft_tokens_total")
    accepted = counter_delta(deltas, PREFIX + "spec_decode_num_accepted_tokens_total")
    return {"prompt_tok_s": ratio("prompt_tokens_total", "prompt_seconds_total"),
            "decode_tok_s": ratio("tokens_predicted_total", "tokens_predicted_seconds_total"),
            "draft_acceptance_rate": round(accepted / drafted, 4) if drafted > 0 else None}


def _gauge(samples: Sequence[Mapping[MetricKey, float]], name: str) -> dict[str, float | int | None]:
    values = [v for s in samples for (sample, _labels), v in s.items() if sample == name]
    return {"samples": len(values), "mean": sum(values) / len(values) if values else None,
            "max": max(values) if values else None}


@dataclass(frozen=True)
class LlamaCppMetrics:
    """llama-server's :class:`~tuner.load.metrics.ServerMetrics`: the ``server`` block of one window."""

    counters: tuple[str, ...] = COUNTERS

    def window(self, before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
               gauges: Sequence[Mapping[MetricKey, float]]) -> dict[str, Any]:
        gauge = {name: _gauge(gauges, name) for name in GAUGES}
        if not after:
            return {"counters": {}, "spec_decode": {}, "queue": {}, "gauges": gauge, "rates": {}}
        deltas = counter_deltas(before, after, self.counters)
        speed = rates(deltas)
        drafted = counter_delta(deltas, PREFIX + "spec_decode_num_draft_tokens_total")
        accepted = counter_delta(deltas, PREFIX + "spec_decode_num_accepted_tokens_total")
        drafts = counter_delta(deltas, PREFIX + "spec_decode_num_drafts_total")
        reported = {sample for sample, _labels in after}
        # llama-server counts the prompt tokens it took from a slot's cache apart from those it processed
        cached = (counter_delta(deltas, PREFIX + "prompt_tokens_cached_total")
                  if PREFIX + "prompt_tokens_cached_total" in reported else None)
        queried = None if cached is None else cached + counter_delta(deltas, PREFIX + "prompt_tokens_total")
        return {"counters": deltas, "rates": speed, "queue": {}, "gauges": gauge,
                "spec_decode": {"num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
                                "acceptance_rate": speed["draft_acceptance_rate"],
                                "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None},
                "facts": {"prefix_cache_hits": cached, "prefix_cache_queries": queried, "preemptions": None,
                          "prompt_tokens": (counter_delta(deltas, PREFIX + "prompt_tokens_total")
                                            if PREFIX + "prompt_tokens_total" in reported else None),
                          "kv_usage_max": None, "queue_p95_ms": None,
                          "running_max": gauge[PREFIX + "requests_processing"]["max"],
                          "waiting_max": gauge[PREFIX + "requests_deferred"]["max"],
                          "prompt_tok_s": speed["prompt_tok_s"], "decode_tok_s": speed["decode_tok_s"]}}


LLAMACPP_METRICS = LlamaCppMetrics()
