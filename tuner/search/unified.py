"""Will a launch fit a unified-memory host? The memory model of a Strix Halo (or a CPU) profile.

On a host whose GPU shares the host's memory (the Ryzen AI Max+ 395's Radeon 8060S and its 128 GiB),
every byte a llama-server launch holds comes out of one pool, the limit the server runs under
(``unified_memory.host_limit_gib``, the cgroup's ``memory.max`` where one is set) less a reserve:

    weights (target, + draft when drafting)
  + KV cache: ctx-size × bytes per token at the K and V cache types (each half of the K+V figure at its
    type), + the draft's share (``draft_kv_fraction``) when drafting
  + compute buffers: ``compute_base_gib`` + ``compute_bytes_per_ubatch_token`` × ubatch-size
  ≤ host_limit_gib − reserve_gib

Weights are the sizes of the files the launch reads (``Engine.model_files``, on the host at run time)
or, for a plan, the sizes the profile's envelopes state. Pure: no launch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.search.profile import SPECULATIVE_OPTION, UnifiedMemory

__all__ = ["DEFAULT_CACHE_TYPE", "DEFAULT_UBATCH", "GIB", "UnifiedFit", "unified_fit"]

GIB = 1 << 30
DEFAULT_CACHE_TYPE = "f16"
"""llama-server's K and V cache type when ``cache-type-k`` / ``cache-type-v`` are not set."""
DEFAULT_UBATCH = 512
"""llama-server's ``--ubatch-size`` default."""


@dataclass(frozen=True)
class UnifiedFit:
    """One launch's memory on a unified-memory host, in GiB; ``ok`` when the total fits the limit."""

    weights_gib: float
    kv_gib: float
    compute_gib: float
    limit_gib: float
    context_tokens: int
    reason: str = ""

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.compute_gib

    @property
    def ok(self) -> bool:
        return not self.reason and self.total_gib <= self.limit_gib

    @property
    def headroom_gib(self) -> float:
        return self.limit_gib - self.total_gib

    def describe(self) -> str:
        verdict = "fits" if self.ok else "does not fit"
        return (f"{verdict}: weights {self.weights_gib:.2f} + KV {self.kv_gib:.2f} ({self.context_tokens:,} tokens) "
                f"+ compute {self.compute_gib:.2f} = {self.total_gib:.2f} GiB of {self.limit_gib:.2f} GiB"
                + (f"; {self.reason}" if self.reason else ""))

    def to_json(self) -> dict[str, Any]:
        return {"weights_gib": round(self.weights_gib, 3), "kv_gib": round(self.kv_gib, 3),
                "compute_gib": round(self.compute_gib, 3), "total_gib": round(self.total_gib, 3),
                "limit_gib": round(self.limit_gib, 3), "context_tokens": self.context_tokens, "ok": self.ok}


def unified_fit(memory: UnifiedMemory, args: Mapping[str, Any], *, target_bytes: float, draft_bytes: float,
                context_tokens: int | None = None) -> UnifiedFit:
    """The memory a launch of ``args`` needs, with the target and draft of these sizes (bytes)."""
    drafting = isinstance(args.get(SPECULATIVE_OPTION), Mapping)
    ctx = int(args.get("ctx-size") or context_tokens or 0)
    types = (str(args.get("cache-type-k", DEFAULT_CACHE_TYPE)), str(args.get("cache-type-v", DEFAULT_CACHE_TYPE)))
    unknown = [t for t in types if t not in memory.kv_bytes_per_token]
    reason = ""
    if unknown:
        reason = (f"no KV size for cache type {unknown[0]!r} in unified_memory.kv_bytes_per_token "
                  f"({', '.join(sorted(memory.kv_bytes_per_token))})")
    per_token = sum(memory.kv_bytes_per_token.get(t, 0.0) for t in types) / 2
    if drafting:
        per_token *= 1.0 + memory.draft_kv_fraction
    ubatch = int(args.get("ubatch-size") or DEFAULT_UBATCH)
    compute = memory.compute_base_gib * GIB + memory.compute_bytes_per_ubatch_token * ubatch
    weights = target_bytes + (draft_bytes if drafting else 0.0)
    return UnifiedFit(weights_gib=weights / GIB, kv_gib=ctx * per_token / GIB, compute_gib=compute / GIB,
                      limit_gib=memory.host_limit_gib - memory.reserve_gib, context_tokens=ctx, reason=reason)
