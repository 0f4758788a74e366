"""The load paths a trial takes, against the real vLLM CPU server: the multi-step ladder, the shipped
throughput objective at the CPU profile's scale, and ``ClientPool`` (several client processes as one).

They had met only stand-ins (tests/standins/). Here they run on the server the load tests share
(``vllm_cpu_server``: tests/cpu_server.py), each on prompts of a seed of its own, and what the client
recorded is held against what the server counted in the same window: its prompt and generation tokens,
its prefix-cache queries and hits (none: every window sends new prompts).

The objective is ``objectives/throughput.yaml`` as the ``cpu`` profile runs it (``scales.demo``: random
prompts of 128 ± 25 % tokens, 128 ± 25 % out, a ladder of 4, 16 and 32 streams with 3 prompts per
stream, p95 TTFT and ITL limits); only its prompt seed is changed, so that no other test on the shared
server has sent these prompts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from tests.cpu_server import SERVED, SharedServer
from tuner.engines import default_engine
from tuner.load.affinity import pinned
from tuner.load.ladder import Measurement, Step, measure
from tuner.load.metrics import parse_prometheus
from tuner.load.workload import prompt_at
from tuner.objective import Objective
from tuner.search.envelope import objective_for
from tuner.search.profile import load_profile

pytestmark = [pytest.mark.server]


def _shipped(seed: int, **ladder: Any) -> Objective:
    objective = objective_for(load_profile("cpu"), "throughput")
    assert objective.ladder is not None
    return objective.model_copy(update={"workload": objective.workload.model_copy(update={"seed": seed}),
                                        "ladder": objective.ladder.model_copy(update=ladder)})


def _measure(server: SharedServer, objective: Objective) -> Measurement:
    def scrape() -> Mapping[Any, float]:
        return parse_prometheus(httpx.get(server.base_url + "/metrics", timeout=30).text)

    with pinned(server.split.client if server.split else None):
        return measure(server.base_url, SERVED, objective, vocab_size=server.vocab_size, api_key=None,
                       should_stop=lambda: False, scrape=scrape, server_metrics=default_engine().metrics,
                       request_timeout_s=600)


def _requests(objective: Objective, concurrency: int) -> int:
    assert objective.ladder is not None
    return max(objective.workload.num_prompts, math.ceil(concurrency * objective.ladder.prompts_per_concurrency))


def _check_step_against_the_server(step: Step, objective: Objective, vocab_size: int) -> None:
    """Every planned prompt was sent once, in full, and the server counted exactly what the client recorded."""
    requests = _requests(objective, step.concurrency)
    records = step.result.records
    assert [r.job for r in records] == list(range(step.first_job, step.first_job + requests))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok][:3]
    assert step.summary["completed"] == requests and step.summary["failed"] == 0
    workload = objective.workload
    for r in records:  # the prompt of job n is prompt n of the workload's seed, whichever process sent it
        prompt = prompt_at(workload, vocab_size, r.job)
        assert r.prompt_tokens == len(prompt.token_ids) and r.output_tokens == prompt.output_len, r
    low, high = workload.input_len * (1 - workload.range_ratio), workload.input_len * (1 + workload.range_ratio)
    assert all(low <= r.prompt_tokens <= high for r in records)
    assert len({r.prompt_tokens for r in records}) > 1  # drawn lengths (range_ratio 0.25), not one fixed length
    counters = step.server["counters"]
    assert counters["vllm:prompt_tokens"] == sum(r.prompt_tokens for r in records), counters
    assert counters["vllm:generation_tokens"] == sum(r.output_tokens for r in records), counters
    facts = step.server["facts"]
    assert facts["prefix_cache_queries"] > 0 and facts["prefix_cache_hits"] == 0, facts
    assert step.check.refused == ()
    assert step.server["gauges"]["vllm:num_requests_running"]["samples"] > 0
    assert step.summary["max_concurrency"] == step.concurrency
    assert step.summary["output_throughput"] > 0 and step.summary["p95_ttft_ms"] > 0


def test_the_shipped_throughput_objective_runs_its_ladder_on_the_real_server(
        vllm_cpu_server: SharedServer) -> None:
    objective = _shipped(vllm_cpu_server.seed())
    assert objective.ladder is not None and objective.ladder.steps == (4, 16, 32)
    m = _measure(vllm_cpu_server, objective)

    # The steps climb the ladder in order, each on the prompts after the last one sent.
    concurrencies = [s.concurrency for s in m.steps]
    assert concurrencies == [4, 16, 32][:len(concurrencies)] and len(concurrencies) >= 2, m.stop_reason
    first = 0
    for step in m.steps:
        assert step.first_job == first
        first += _requests(objective, step.concurrency)
        _check_step_against_the_server(step, objective, vllm_cpu_server.vocab_size)
    assert m.next_job == first

    # It stopped for the reason it gives, by the objective's own rule.
    rates = [s.summary["output_throughput"] for s in m.steps]
    if m.stop_reason == "ran every step":
        assert len(m.steps) == 3
    elif m.stop_reason.startswith("throughput stopped rising"):
        assert rates[-1] <= max(rates[:-1]) * (1 + objective.ladder.min_gain), rates
    else:
        assert m.stop_reason.startswith("SLO broken") and not m.steps[-1].feasible, (m.stop_reason, rates)

    # The reported step is the best feasible one, and its figures are the measurement's.
    assert m.chosen is not None
    chosen = m.steps[m.chosen]
    assert chosen.feasible and m.summary == chosen.summary
    assert chosen.summary["output_throughput"] == max(s.summary["output_throughput"] for s in m.steps if s.feasible)
    for slo, limit in objective.slos.items():
        assert chosen.summary[slo] <= limit


def test_client_pool_sends_every_prompt_once_and_the_server_counts_them(vllm_cpu_server: SharedServer) -> None:
    objective = _shipped(vllm_cpu_server.seed(), steps=(4, 16), client_processes=2)
    m = _measure(vllm_cpu_server, objective)
    assert [s.concurrency for s in m.steps][:1] == [4]
    for step in m.steps:
        assert step.client["client_processes"] == 2, step.client
        _check_step_against_the_server(step, objective, vllm_cpu_server.vocab_size)
        # One time axis for both processes: every send falls inside the window.
        assert all(0.0 <= r.start_s <= step.result.duration_s for r in step.result.records)
