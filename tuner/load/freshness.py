"""Every measured window sends prompts its server has not seen, and the server's counters must agree.

Prompts are numbered (:func:`tuner.load.workload.prompt_at`): a launch's windows (the ladder's steps,
a confirmation's repeats) each take the next unused numbers, so no measured prompt is sent twice to
one server. Warm-up prompts come from a stream of their own and are never measured.

After each window the server's own counters say what it did (the engine's metric map puts them in the
window's ``facts``: prefix-cache hits and queries, preemptions, KV-cache use, queue time). A window
whose counters contradict its workload is *refused*: its figures do not measure what the workload
says. A workload that declares no shared prefix (kind ``random``) has nothing the prefix cache can
reuse, so a hit means a prompt was re-sent (or another client used the server), and the window
measured a warm cache. Kinds ``shared_prefix`` and ``agent`` (multi-turn sessions re-send their
history) expect hits. Other figures are *flags*, kept beside the window: preemptions (KV ran out, so
the window includes recomputation), and counters the engine did not report (unverified).

Tolerance: a hit needs a whole KV block of identical tokens at the same position. Random token ids
(drawn from ``vocab - 100`` ids) share a block by chance with probability about ``vocab^-block``,
nil at any block size vLLM accepts, and token-id prompts carry no BOS or template prefix. So
:data:`PREFIX_HIT_TOLERANCE` allows 0.1 % of the queried tokens (a stray block in a very long window,
e.g. of a server that adds a BOS block of its own), and no more: one re-sent prompt of a 32-prompt
window is already 3 %.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.objective import Workload

__all__ = ["PREFIX_HIT_TOLERANCE", "SHARED_PREFIX_KINDS", "WindowCheck", "check_window"]

SHARED_PREFIX_KINDS = frozenset({"shared_prefix", "agent"})
"""Workload kinds whose requests share prefixes on purpose: prefix-cache hits are expected there."""

PREFIX_HIT_TOLERANCE = 0.001
"""Largest share of a window's queried prompt tokens that may hit the prefix cache on a workload
that declares no shared prefix."""


@dataclass(frozen=True)
class WindowCheck:
    """What one window's server counters say about it."""

    refused: tuple[str, ...] = ()
    """Contradictions with the workload: the window's figures are refused."""
    flags: tuple[str, ...] = ()
    """Notes that do not refuse the window (preemptions, counters not reported)."""

    @property
    def ok(self) -> bool:
        return not self.refused

    def to_json(self) -> dict[str, Any]:
        return {"refused": list(self.refused), "flags": list(self.flags)}


def _number(facts: Mapping[str, Any], key: str) -> float | None:
    value = facts.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def check_window(workload: Workload, server: Mapping[str, Any], *, stopped: bool = False) -> WindowCheck:
    """Check one window's ``server`` block (the engine's ``ServerMetrics.window``) against its workload.

    ``stopped``: the window was cut by the tuner, so no closing scrape was taken (nothing to check).
    """
    if stopped:
        return WindowCheck()
    facts = server.get("facts")
    if not isinstance(facts, Mapping) or not facts:
        return WindowCheck(flags=("unverified: the engine reported no counters for this window",))
    refused: list[str] = []
    flags: list[str] = []
    hits = _number(facts, "prefix_cache_hits")
    queries = _number(facts, "prefix_cache_queries")
    preempted = _number(facts, "preemptions")
    if hits is None or queries is None:
        flags.append("unverified: no prefix-cache counters (prefix caching off, or not reported)")
    elif workload.kind not in SHARED_PREFIX_KINDS and hits > PREFIX_HIT_TOLERANCE * queries and preempted:
        # A preempted request is admitted again and reads back the blocks it computed before (vLLM keeps
        # them in the prefix cache): hits on a window at the KV knee, not prompts sent twice.
        flags.append(f"the prefix cache served {hits:.0f} of {queries:.0f} prompt tokens ({hits / queries:.1%}) "
                     f"after {preempted:.0f} preemptions: preempted requests reading back their own blocks")
    elif workload.kind not in SHARED_PREFIX_KINDS and hits > PREFIX_HIT_TOLERANCE * queries:
        refused.append(f"the prefix cache served {hits:.0f} of {queries:.0f} prompt tokens "
                       f"({hits / queries:.1%}) on a {workload.kind!r} workload that shares no prefix: the "
                       "window re-sent prompts the server had seen (or another client used it), so it "
                       "measured a warm cache")
    preemptions = _number(facts, "preemptions")
    if preemptions:
        flags.append(f"{preemptions:.0f} preemptions: the KV cache ran out (peak use "
                     f"{_percent(facts.get('kv_usage_max'))}), so the window includes recomputation")
    return WindowCheck(refused=tuple(refused), flags=tuple(flags))


def _percent(value: Any) -> str:
    return f"{float(value):.0%}" if isinstance(value, (int, float)) else "not reported"
