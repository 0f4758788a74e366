"""Measure one launch: run the objective's workload against a ready server.

``measure`` is the seam the trial calls. Today it runs one step at the workload's concurrency;
the concurrency ladder (several steps inside one launch, stop when throughput stops rising or an
SLO breaks) grows here without touching the trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tuner import metrics
from tuner.loadgen import LoadResult, run_load_sync
from tuner.objective import Objective

SERVER_COUNTERS = (
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
    "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)

Scrape = Callable[[], Mapping[Any, float]]


@dataclass(frozen=True)
class Step:
    concurrency: int
    summary: Mapping[str, Any]
    server: Mapping[str, Any]
    result: LoadResult


@dataclass(frozen=True)
class Measurement:
    summary: Mapping[str, Any]
    """The chosen step's summary (``vllm bench serve`` keys), scored by the objective."""
    server: Mapping[str, Any]
    """The chosen step's ``/metrics`` counter deltas and speculative-decoding figures."""
    steps: tuple[Step, ...]
    stopped: bool

    def to_json(self) -> dict[str, Any]:
        return {"summary": dict(self.summary), "server": dict(self.server),
                "steps": [{"concurrency": s.concurrency, "summary": dict(s.summary), "server": dict(s.server),
                           "requests": [asdict(r) for r in s.result.records]} for s in self.steps]}


def measure(base_url: str, model: str, objective: Objective, *, vocab_size: int, api_key: str | None,
            should_stop: Callable[[], bool], scrape: Scrape) -> Measurement:
    before = scrape()
    result = run_load_sync(base_url, model, objective.workload, vocab_size=vocab_size, api_key=api_key,
                           should_stop=should_stop)
    summary = metrics.summarize(result)
    after = scrape() if not result.stopped else {}
    deltas = metrics.counter_deltas(before, after, SERVER_COUNTERS) if after else {}
    server = {"counters": deltas, "spec_decode": metrics.spec_decode_summary(deltas)}
    step = Step(concurrency=objective.workload.concurrency, summary=summary, server=server, result=result)
    return Measurement(summary=summary, server=server, steps=(step,), stopped=result.stopped)
