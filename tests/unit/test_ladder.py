"""The concurrency ladder, against the stand-in server (a fake vLLM with a fixed number of decode slots)."""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tuner.engines.vllm.metrics import VLLM_METRICS
from tuner.load.generator import RequestRecord
from tuner.load.ladder import LadderSpec, Measurement, SloWatch, ladder_concurrencies, measure
from tuner.load.metrics import parse_prometheus
from tuner.load.workload import Workload
from tuner.objective import Objective

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.standins.stream_server import StandInBehaviour, StandInThread


class LadderObjective(Objective):
    """Objective plus the ``ladder`` field the lead adds to objective.py."""

    ladder: LadderSpec | None = None


def _scrape(base_url: str) -> Any:
    def scrape() -> dict[Any, float]:
        return dict(parse_prometheus(httpx.get(base_url + "/metrics", timeout=5).text))
    return scrape


@pytest.fixture
def slots4() -> Iterator[StandInThread]:
    """A stand-in that decodes at most 4 requests at once, 5 ms per token: ~800 tok/s at most."""
    with StandInThread(StandInBehaviour(itl_s=0.005, capacity=4)) as server:
        yield server


def _objective(**kw: Any) -> LadderObjective:
    workload = Workload(input_len=8, output_len=20, num_prompts=4, warmup_prompts=1, concurrency=1)
    return LadderObjective(name="t", workload=workload, **kw)


def _measure(server: StandInThread, objective: Objective, should_stop: Any = lambda: False) -> Measurement:
    return measure(server.base_url, "standin", objective, vocab_size=4096, api_key=None,
                   should_stop=should_stop, scrape=_scrape(server.base_url), server_metrics=VLLM_METRICS)


def test_concurrencies() -> None:
    assert ladder_concurrencies(LadderSpec(start=1, factor=2, max=20)) == [1, 2, 4, 8, 16, 20]
    assert ladder_concurrencies(LadderSpec(start=3, factor=1.5, max=10)) == [3, 5, 7, 10]
    assert ladder_concurrencies(LadderSpec(steps=(8, 2, 2, 32))) == [2, 8, 32]
    assert ladder_concurrencies(LadderSpec(start=4, max=4)) == [4]
    with pytest.raises(ValidationError):
        LadderSpec(start=8, max=4)
    with pytest.raises(ValidationError):
        LadderSpec(factor=1.0)
    with pytest.raises(ValidationError):
        LadderSpec(stepz=[1])  # type: ignore[call-arg]


def test_without_a_ladder_one_step_at_the_workload_concurrency(slots4: StandInThread) -> None:
    m = _measure(slots4, Objective(name="t", workload=Workload(input_len=8, output_len=10, num_prompts=6,
                                                               concurrency=3, warmup_prompts=1)))
    assert len(m.steps) == 1 and m.chosen == 0 and not m.stopped
    assert m.summary["completed"] == 6 and m.summary["max_concurrency"] == 3
    assert m.server["counters"]["vllm:generation_tokens"] == 60  # the warm-up is outside the window
    data = json.loads(json.dumps(m.to_json()))
    assert data["summary"]["completed"] == 6 and len(data["steps"][0]["requests"]) == 6


def test_ladder_stops_when_throughput_stops_rising_and_reports_the_best(slots4: StandInThread) -> None:
    m = _measure(slots4, _objective(ladder=LadderSpec(start=1, factor=2, max=64, min_gain=0.15)))
    conc = [s.concurrency for s in m.steps]
    rates = [s.summary["output_throughput"] for s in m.steps]
    # Below the 4 slots throughput scales, above it is flat (loose bounds: a busy CI machine).
    assert conc[:2] == [1, 2] and rates[1] > 1.3 * rates[0]
    assert "stopped rising" in m.stop_reason and conc[-1] in (4, 8, 16) and len(conc) >= 3
    assert m.chosen is not None and m.summary is m.steps[m.chosen].summary
    assert m.summary["output_throughput"] == max(rates)
    assert all(s.feasible for s in m.steps) and not m.stopped
    above = m.steps[-1]
    assert above.summary["completed"] == max(4, 4 * above.concurrency)  # prompts_per_concurrency
    # Requests beyond the 4 slots queued: the server's histogram says so, the gauges saw it.
    assert above.summary["median_queue_ms"] > 10
    assert m.steps[0].server["queue"]["median_queue_ms"] < 10
    gauges = above.server["gauges"]
    assert gauges["vllm:num_requests_running"]["samples"] >= 1
    assert gauges["vllm:num_requests_running"]["max"] <= 4  # summed over the 2 engines
    assert "client_saturated" in above.client and above.client["client_events"] > 0
    # Every step sent new prompts: no job number repeats across steps.
    jobs = [r.job for s in m.steps for r in s.result.records]
    assert len(jobs) == len(set(jobs))


def test_ladder_stops_at_a_broken_slo_and_cuts_the_step_early(slots4: StandInThread) -> None:
    # 4 slots × 100 ms per request: at concurrency 32 a request waits ~0.7 s on average.
    objective = _objective(slos={"p90_ttft_ms": 150.0},
                           ladder=LadderSpec(steps=(2, 4, 32), prompts_per_concurrency=8, min_gain=0.0))
    m = _measure(slots4, objective)
    assert [s.concurrency for s in m.steps] == [2, 4, 32]
    last = m.steps[-1]
    assert not last.feasible and "SLO broken at concurrency 32" in m.stop_reason
    assert last.early_stop_reason and "p90_ttft_ms" in last.early_stop_reason
    assert len([r for r in last.result.records if r.ok]) < 256  # cut before all 256 were sent
    assert m.chosen is not None and m.steps[m.chosen].concurrency in (2, 4) and m.steps[m.chosen].feasible
    assert m.summary["max_concurrency"] in (2, 4)


def test_no_step_meets_the_slo_reports_the_lowest(slots4: StandInThread) -> None:
    objective = _objective(slos={"p50_ttft_ms": 0.001}, ladder=LadderSpec(steps=(2, 4), early_stop=False))
    m = _measure(slots4, objective)
    assert len(m.steps) == 1 and m.chosen == 0 and not m.steps[0].feasible
    assert not m.steps[0].early_stop_reason  # early stop off: the step ran to the end
    assert m.summary["completed"] == 8


def test_tuner_stop_ends_the_ladder_and_says_stopped(slots4: StandInThread) -> None:
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 40

    m = _measure(slots4, _objective(ladder=LadderSpec(steps=(1, 2, 4, 8), prompts_per_concurrency=50)), should_stop)
    assert m.stopped and "stopped" in m.stop_reason


def test_ladder_with_two_client_processes(slots4: StandInThread) -> None:
    objective = _objective(ladder=LadderSpec(steps=(2, 8), client_processes=2))
    m = _measure(slots4, objective)
    assert [s.summary["completed"] for s in m.steps] == [8, 32]
    assert m.steps[1].client["client_processes"] == 2
    assert sorted(r.job for r in m.steps[1].result.records) == list(range(8, 40))


def _rec(ttft_s: float) -> RequestRecord:
    return RequestRecord(ok=True, error="", prompt_tokens=1, output_tokens=2, start_s=0.0, ttft_s=ttft_s,
                         itl_s=(0.01,), e2e_s=ttft_s + 0.01)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60), st.sampled_from([50, 90, 95, 99]),
       st.floats(0.1, 1.9), st.integers(0, 2**32 - 1))
def test_slo_watch_only_calls_a_step_lost_when_it_is(ttfts: list[float], pct: int, limit_s: float,
                                                     seed: int) -> None:
    objective = Objective(name="t", slos={f"p{pct}_ttft_ms": limit_s * 1000})
    watch = SloWatch(objective, len(ttfts))
    order = list(ttfts)
    random.Random(seed).shuffle(order)
    lost = False
    for t in order:
        lost = watch.add(_rec(t)) or lost
    actual = float(np.percentile(np.asarray(ttfts) * 1000, pct))
    if lost:
        assert actual > limit_s * 1000  # never a false alarm, whatever the order
    over = sum(1 for t in ttfts if t > limit_s)
    if over >= len(ttfts):
        assert lost


def test_slo_watch_counts_failures_but_not_stopped_requests() -> None:
    objective = Objective(name="t", max_failed_fraction=0.1)
    watch = SloWatch(objective, 20)
    bad = RequestRecord(ok=False, error="HTTP 500", prompt_tokens=1, output_tokens=0, start_s=0.0, ttft_s=None,
                        itl_s=(), e2e_s=0.1)
    stopped = RequestRecord(ok=False, error="stopped: asked", prompt_tokens=1, output_tokens=0, start_s=0.0,
                            ttft_s=None, itl_s=(), e2e_s=0.1)
    assert not watch.add(stopped) and not watch.add(bad) and not watch.add(bad)
    assert watch.add(bad) and "3 failed" in watch.reason
    assert math.isclose(watch.max_failed, 2.0)
