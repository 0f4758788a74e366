"""Warm-up before a launch's measured windows: waves until the server's own generation rate is steady.

A first window on a fresh server runs cold (CUDA-graph and allocator warm-up, torch.compile's first
calls, empty caches): on one H200 the first confirmation repeat of a winner ran at half the second's
rate with 9 requests waiting (issue 31). One fixed warm-up of a few requests did not cover it. With
``workload.warmup_waves`` above 1, warm-up sends waves of at least one request per stream of the first
step and reads the server's ``/metrics`` around each: once a wave's generation tokens per second (the
server's counter, not the client's clock alone) is within ``warmup_steady_within`` of the wave before
it, the server is warm. A server that never settles is measured anyway after the last wave, and the
measurement says so (``steady: false``). With one wave (the default, and the CPU demo's scale), warm-up
is the single batch of ``warmup_prompts`` it always was.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.load.generator import LoadResult, WindowPlan
from tuner.load.units import Units
from tuner.objective import Workload

__all__ = ["Warmup", "WarmupWave", "run_warmup", "steady"]

log = logging.getLogger(__name__)

Window = Callable[[WindowPlan, Callable[[], bool]], LoadResult]
"""Runs one window of requests (the ladder's runner), stopping when the callable says so."""
ServerRate = Callable[[Mapping[Any, float], Mapping[Any, float]], float | None]
"""Generation tokens the server counted between two scrapes (None: the engine does not report them)."""


@dataclass(frozen=True)
class WarmupWave:
    requests: int
    failed: int
    duration_s: float
    server_generation_tok_s: float | None
    """The server's generation-token counter over the wave, per second of the wave (None: not reported)."""
    client_output_tok_s: float
    """The same wave's output tokens as the client counted them, per second (the fallback)."""

    @property
    def rate_tok_s(self) -> float:
        return self.server_generation_tok_s if self.server_generation_tok_s is not None else self.client_output_tok_s


@dataclass(frozen=True)
class Warmup:
    waves: tuple[WarmupWave, ...]
    steady: bool
    """The last two waves' rates agreed within the tolerance (True also for a single planned wave)."""
    stopped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"steady": self.steady, "stopped": self.stopped, "waves": [asdict(w) for w in self.waves]}


def steady(rates: Sequence[float], within: float) -> bool:
    """The last rate is within ``within`` (a share) of the one before it, and both are positive."""
    if len(rates) < 2:
        return False
    last, before = rates[-1], rates[-2]
    if not (last > 0 and before > 0) or math.isnan(last) or math.isnan(before):
        return False
    return abs(last - before) / before <= within


def run_warmup(window: Window, workload: Workload, units: Units, concurrency: int, should_stop: Callable[[], bool],
               scrape: Callable[[], Mapping[Any, float]], server_rate: ServerRate) -> Warmup:
    """Send the workload's warm-up: one batch, or waves until the server is steady (module docstring).

    ``concurrency`` is the first step's, in node requests; ``server_rate`` reads the generation tokens the
    server counted between two scrapes.
    """
    if not workload.warmup_prompts:
        return Warmup((), steady=True)
    streams = units.client_streams(concurrency)
    per_wave = units.client_requests(workload.warmup_prompts)
    if workload.warmup_waves > 1:
        per_wave = max(per_wave, streams)
    waves: list[WarmupWave] = []
    for number in range(workload.warmup_waves):
        before = scrape() if workload.warmup_waves > 1 else {}
        result = window(WindowPlan(number * per_wave, per_wave, streams, None, warmup=True), should_stop)
        if result.stopped:
            return Warmup(tuple(waves), steady=False, stopped=True)
        after = scrape() if workload.warmup_waves > 1 else {}
        duration = max(result.duration_s, 1e-9)
        counted = server_rate(before, after) if after else None
        wave = WarmupWave(requests=len(result.records), failed=sum(1 for r in result.records if not r.ok),
                          duration_s=result.duration_s,
                          server_generation_tok_s=None if counted is None else counted / duration,
                          client_output_tok_s=sum(r.output_tokens for r in result.records if r.ok) / duration)
        waves.append(wave)
        failed = [r.error for r in result.records if not r.ok]
        if failed:
            log.warning("warm-up wave %d: %d of %d requests failed: %s", number + 1, len(failed), wave.requests,
                        failed[0])
        log.info("warm-up wave %d: %d requests in %.2f s, %.1f tok/s (%s)", number + 1, wave.requests,
                 wave.duration_s, wave.rate_tok_s,
                 "server's counter" if wave.server_generation_tok_s is not None else "client's count")
        if workload.warmup_waves == 1:
            return Warmup(tuple(waves), steady=True)
        if steady([w.rate_tok_s for w in waves], workload.warmup_steady_within):
            return Warmup(tuple(waves), steady=True)
    log.warning("warm-up: the server's generation rate was not steady after %d waves (%s tok/s); measuring "
                "anyway", len(waves), ", ".join(f"{w.rate_tok_s:.1f}" for w in waves))
    return Warmup(tuple(waves), steady=False)
