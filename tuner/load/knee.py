"""Does a ladder show the knee it was sized for? The server's own counters say.

A ladder stepped relative to a launch's predicted KV knee (``knee_fractions`` in the objective) claims
that its top step reached saturation. That claim holds only if the server's counters for that window
(the engine's ``facts``: :class:`tuner.load.metrics.ServerMetrics`) show one of:

- the KV cache near full: peak ``kv_usage_max`` ≥ :data:`KV_FULL` (a sampled gauge);
- preemptions: requests evicted because KV ran out (a counter);
- requests waited for a place in the batch: the step's p95 queue time (the server's histogram) is at
  least :data:`QUEUE_SHARE` of the median request's whole latency. A burst of prompts also queues, for
  prefill, below the knee; but a request that waits a good part of another's lifetime waited for a
  slot (the max-num-seqs cap, or KV that could not admit it);
- a full batch with a queue, from the sampled gauges: the server never ran more than the knee (within
  5 %) although the step held at least :data:`PAST_KNEE` × the knee in flight, and requests waited.

A top step with an empty-looking cache and none of these does not show a knee: the measurement says
so (:class:`KneeEvidence`, ``shown`` False) and the trial is flagged, so nobody reads its best step as
the node's saturation point. The same test decides whether "throughput stopped rising" may end a
knee-sized ladder early (:func:`saturated`): only once a step showed saturation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["KV_FULL", "PAST_KNEE", "QUEUE_SHARE", "KneeEvidence", "knee_evidence", "saturation"]

KV_FULL = 0.90
"""Peak KV-cache use that counts as full (vLLM's gauge is sampled, so the true peak may be higher)."""
QUEUE_SHARE = 0.5
"""A p95 queue time of this share of the median end-to-end latency is a wait for a batch slot."""
PAST_KNEE = 1.2
"""A step this far past the knee must show the cap: a full batch and a queue."""


@dataclass(frozen=True)
class KneeEvidence:
    """Whether a knee-sized ladder's top step showed saturation, and what showed it."""

    predicted: int
    """The knee the ladder was sized from (node concurrency: the feasibility model's, per launch)."""
    top_concurrency: int
    shown: bool
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(facts: Mapping[str, Any], key: str) -> float | None:
    value = facts.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def saturation(server: Mapping[str, Any], concurrency: int, knee: int,
               summary: Mapping[str, Any] | None = None) -> str:
    """What in one window's ``server`` block (and its node-unit ``summary``) shows saturation ("" when nothing does)."""
    facts = server.get("facts")
    if not isinstance(facts, Mapping):
        return ""
    kv = _number(facts, "kv_usage_max")
    if kv is not None and kv >= KV_FULL:
        return f"KV cache {kv:.0%} full at its peak"
    preemptions = _number(facts, "preemptions")
    if preemptions:
        return f"{preemptions:.0f} preemptions (KV ran out)"
    queue, e2e = _number(facts, "queue_p95_ms"), _number(summary or {}, "median_e2el_ms")
    if queue is not None and e2e and queue >= QUEUE_SHARE * e2e:
        return (f"requests waited for the batch: p95 queue {queue / 1000:.1f} s against a median request of "
                f"{e2e / 1000:.1f} s")
    running, waiting = _number(facts, "running_max"), _number(facts, "waiting_max")
    if (running is not None and waiting and concurrency >= PAST_KNEE * knee
            and 0.95 * knee <= running <= 1.05 * knee):
        return (f"batch full: at most {running:.0f} requests running of {concurrency} in flight, "
                f"up to {waiting:.0f} waiting")
    return ""


def knee_evidence(steps: Sequence[tuple[int, Mapping[str, Any], Mapping[str, Any]]], knee: int) -> KneeEvidence:
    """The verdict on a ladder's top step (``steps``: each step's node concurrency, ``server`` block and summary)."""
    if not steps:
        return KneeEvidence(predicted=knee, top_concurrency=0, shown=False, evidence="no step ran")
    top, server, summary = max(steps, key=lambda s: s[0])
    why = saturation(server, top, knee, summary)
    if why:
        return KneeEvidence(predicted=knee, top_concurrency=top, shown=True, evidence=why)
    facts = server.get("facts") if isinstance(server.get("facts"), Mapping) else {}
    kv = _number(facts, "kv_usage_max") if isinstance(facts, Mapping) else None
    seen = f"peak KV use {kv:.0%}" if kv is not None else "no KV-use figure from the server"
    return KneeEvidence(predicted=knee, top_concurrency=top, shown=False,
                        evidence=f"not shown: at concurrency {top} ({top / max(1, knee):.2f} x the predicted knee "
                        f"{knee}) the server reports {seen}, no preemption and no wait for a batch slot")
