"""Client units and node units: how what the load generator measured maps to the node it stands for.

A real server's client measures the node itself, so its :class:`Units` are the identity. An engine
that compresses time and multiplies requests (the emulated node) states its units, and every client
measurement is converted to node units *once*, here, as it leaves a measured window: summaries, SLO
checks, reports and the exported evidence are all in node units. The units are defined in one place,
``docs/emulator.md`` ("Units"); this module applies them (``Units.node_summary`` one way;
``client_streams``, ``client_requests``, ``client_rate`` and ``client_startup_seconds`` the other). The
study's clock uses the time scale too (:mod:`tuner.study.clock`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["HOST_PAUSE_S", "IDENTITY", "Units"]

_LATENCY_MS = re.compile(r"^(mean|median|std|p\d{1,2}(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_RATES = frozenset({"request_throughput", "output_throughput", "total_token_throughput", "request_goodput"})
_COUNTS = frozenset({"completed", "failed", "total_input_tokens", "total_output_tokens"})
_SECONDS = frozenset({"duration"})
HOST_PAUSE_S = 10.0
"""Real seconds of silence a busy 2-core host can cause a process by itself: no compressed stall limit is shorter."""


@dataclass(frozen=True)
class Units:
    """How one client measurement maps to the node's (``docs/emulator.md``, "Units")."""

    time_scale: float = 1.0
    """Node (virtual) seconds per real second (≥ 1 compresses time)."""
    multiplicity: int = 1
    """Node requests per client request (one HTTP request stands for this many)."""
    startup_time_scale: float = 1.0
    """Node seconds per real second while the server starts (the emulator's start-up log is in node time)."""
    process_start_s: float = 0.0
    """Real seconds the server's process needs before its node clock starts (the emulator imports vLLM's
    parser first); added to a start-up limit when it becomes real seconds to wait."""

    def __post_init__(self) -> None:
        if not (self.time_scale > 0 and self.startup_time_scale > 0 and self.multiplicity >= 1
                and self.process_start_s >= 0):
            raise ValueError(f"units need time scales > 0, multiplicity >= 1 and process_start_s >= 0, got {self}")

    @property
    def identity(self) -> bool:
        """The client measures the node itself (a real server)."""
        return self.time_scale == 1.0 and self.multiplicity == 1 and self.startup_time_scale == 1.0 \
            and self.process_start_s == 0.0

    # -- client → node ------------------------------------------------------------------------------
    def node_seconds(self, client_seconds: float) -> float:
        """A latency or duration the client measured, in node seconds."""
        return client_seconds * self.time_scale

    def node_rate(self, client_per_s: float) -> float:
        """A token or request rate the client measured, as the node's rate."""
        return client_per_s * self.multiplicity / self.time_scale

    def node_requests(self, client_requests: int) -> int:
        return client_requests * self.multiplicity

    def node_summary(self, summary: Mapping[str, Any]) -> dict[str, Any]:
        """A window's client summary (``vllm bench serve`` keys) in node units.

        Latencies and the duration are multiplied by the time scale, rates by multiplicity / time
        scale, request and token counts by the multiplicity. ``max_concurrency`` is left as it is: the
        ladder sets it to the node concurrency it ran. Other keys pass unchanged.
        """
        if self.identity:
            return dict(summary)
        out: dict[str, Any] = {}
        for key, value in summary.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                out[key] = value
            elif _LATENCY_MS.match(key) or key in _SECONDS:
                out[key] = value * self.time_scale
            elif key in _RATES:
                out[key] = self.node_rate(value)
            elif key in _COUNTS:
                out[key] = value * self.multiplicity
            else:
                out[key] = value
        return out

    # -- node → client ------------------------------------------------------------------------------
    def client_seconds(self, node_seconds: float) -> float:
        return node_seconds / self.time_scale

    def client_startup_seconds(self, node_seconds: float) -> float:
        """A start-up limit of the node (a ready timeout, a watchdog's stall), as real seconds to wait."""
        return node_seconds / self.startup_time_scale + self.process_start_s

    def client_stall_seconds(self, node_seconds: float) -> float:
        """A start-up stall limit between two progress lines (the node clock runs by then), as real seconds.

        Never below :data:`HOST_PAUSE_S` (or the node's own limit, if shorter): a busy host can keep a process
        silent that long by itself, and at a start-up time scale of 400 the node's 600 s would be 1.5 real s.
        Until the server's first own log record the watchdog also allows ``process_start_s``
        (:attr:`tuner.engines.process.LaunchSpec.process_start_grace_s`).
        """
        return max(node_seconds / self.startup_time_scale, min(node_seconds, HOST_PAUSE_S))

    def client_streams(self, node_concurrency: int) -> int:
        """Streams a client opens for a node concurrency (rounded up)."""
        return max(1, math.ceil(node_concurrency / self.multiplicity))

    def client_requests(self, node_requests: int) -> int:
        """Client requests that make at least ``node_requests`` node requests."""
        return max(1, math.ceil(node_requests / self.multiplicity))

    def client_rate(self, node_per_s: float) -> float:
        """The client's send rate for a node request rate."""
        return node_per_s * self.time_scale / self.multiplicity

    def to_json(self) -> dict[str, float | int]:
        """The fields; ``process_start_s`` only when set (the server states the three it runs at)."""
        data: dict[str, float | int] = asdict(self)
        if not self.process_start_s:
            data.pop("process_start_s")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Units:
        return cls(time_scale=float(data.get("time_scale", 1.0)), multiplicity=int(data.get("multiplicity", 1)),
                   startup_time_scale=float(data.get("startup_time_scale", data.get("time_scale", 1.0))),
                   process_start_s=float(data.get("process_start_s", 0.0)))


IDENTITY = Units()
"""A real server's units: the client measures the node."""
