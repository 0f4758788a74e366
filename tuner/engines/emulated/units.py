"""The emulator's units: the one place that says how a client's measurements map to the node's.

Two settings (``docs/emulator.md``, "Units"):

- ``time_scale`` s: virtual (node) seconds per real second. A step the model prices at 100 ms
  reaches the client after 100 / s ms. Start-up may use its own ``startup_time_scale``.
- ``multiplicity`` M: one HTTP request stands for M identical virtual requests. They occupy M
  batch slots, M × their tokens of KV, and count M times in every ``/metrics`` counter and
  histogram. The stream carries one of them: its ``usage`` is one request's, its chunks one
  request's tokens.

``/metrics`` and the start-up log speak node units (virtual seconds, virtual requests and tokens),
as a real node's would. A client converts what it measured with :class:`Units`:

==========================  =====================================================
client measured             node quantity
==========================  =====================================================
TTFT, ITL, TPOT, E2E (s)    × time_scale
output / total tok/s        × multiplicity / time_scale
requests/s                  × multiplicity / time_scale
streams in flight           × multiplicity (the node's concurrency)
window duration (s)         × time_scale
==========================  =====================================================
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["Units"]


@dataclass(frozen=True)
class Units:
    time_scale: float = 1.0
    """Virtual seconds per real second (≥ 1 compresses time)."""
    multiplicity: int = 1
    """Virtual requests per HTTP request."""
    startup_time_scale: float = 1.0
    """Virtual seconds per real second during start-up (the log's durations are virtual)."""

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and self.startup_time_scale > 0 and self.multiplicity >= 1):
            raise ValueError(f"units need time scales > 0 and multiplicity >= 1, got {self}")

    def node_seconds(self, client_seconds: float) -> float:
        """A latency or duration the client measured, in node seconds."""
        return client_seconds * self.time_scale

    def client_seconds(self, node_seconds: float) -> float:
        return node_seconds / self.time_scale

    def node_rate(self, client_per_s: float) -> float:
        """A token or request rate the client measured, as the node's rate."""
        return client_per_s * self.multiplicity / self.time_scale

    def node_requests(self, client_requests: int) -> int:
        return client_requests * self.multiplicity

    def client_streams(self, node_concurrency: int) -> int:
        """Streams a client opens for a node concurrency (rounded up)."""
        return max(1, math.ceil(node_concurrency / self.multiplicity))

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)
