"""Warm-up waves until the server's generation rate is steady (tuner/load/warmup.py, issue 31).

The window and the ``/metrics`` page are replaced by a server whose rate this test sets wave by wave (the
real server's counters are checked in tests/integration/test_freshness.py): what is decided here is when
warm-up stops, how many requests a wave sends, and that every wave sends new prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tuner.load.generator import LoadResult, RequestRecord, WindowPlan
from tuner.load.units import IDENTITY
from tuner.load.warmup import run_warmup, steady
from tuner.objective import Workload


class RateServer:
    """Answers each wave at the next of ``rates`` (tokens/s), one second a wave; counts what it generated."""

    def __init__(self, rates: list[float], report_counter: bool = True) -> None:
        self.rates = rates
        self.report = report_counter
        self.generated = 0.0
        self.plans: list[WindowPlan] = []
        self.scrapes = 0

    def window(self, plan: WindowPlan, should_stop: Callable[[], bool]) -> LoadResult:
        rate = self.rates[min(len(self.plans), len(self.rates) - 1)]
        self.plans.append(plan)
        per_request = int(rate / plan.jobs)
        self.generated += per_request * plan.jobs
        records = tuple(RequestRecord(ok=True, error="", prompt_tokens=16, output_tokens=per_request, start_s=0.0,
                                      ttft_s=0.1, itl_s=(), e2e_s=1.0, job=plan.first_job + i)
                        for i in range(plan.jobs))
        return LoadResult(records, 1.0, plan.concurrency, None)

    def scrape(self) -> Mapping[Any, float]:
        self.scrapes += 1
        return {("generation", ()): self.generated}

    def server_rate(self, before: Mapping[Any, float], after: Mapping[Any, float]) -> float | None:
        if not self.report:
            return None
        return after[("generation", ())] - before[("generation", ())]


def _warm(server: RateServer, **workload: Any) -> Any:
    w = Workload(input_len=16, output_len=16, concurrency=8, **workload)
    return run_warmup(server.window, w, IDENTITY, 8, lambda: False, server.scrape, server.server_rate)


def test_one_wave_is_the_old_warmup_and_reads_no_metrics() -> None:
    server = RateServer([100.0])
    warm = _warm(server, warmup_prompts=2)
    assert [(p.first_job, p.jobs, p.warmup) for p in server.plans] == [(0, 2, True)]
    assert server.scrapes == 0 and warm.steady and len(warm.waves) == 1


def test_waves_stop_once_two_agree_and_each_sends_new_prompts_one_per_stream() -> None:
    server = RateServer([400.0, 720.0, 760.0, 800.0])
    warm = _warm(server, warmup_prompts=2, warmup_waves=5, warmup_steady_within=0.1)
    assert [(p.first_job, p.jobs) for p in server.plans] == [(0, 8), (8, 8), (16, 8)]  # 8 streams, 2 prompts
    assert warm.steady and [w.server_generation_tok_s for w in warm.waves] == [400.0, 720.0, 760.0]


def test_a_server_that_never_settles_is_measured_after_the_last_wave_and_says_so() -> None:
    server = RateServer([100.0, 300.0, 100.0, 300.0])
    warm = _warm(server, warmup_prompts=8, warmup_waves=4)
    assert len(warm.waves) == 4 and not warm.steady
    assert warm.to_json()["steady"] is False


def test_without_the_servers_counter_the_clients_count_decides() -> None:
    server = RateServer([400.0, 410.0], report_counter=False)
    warm = _warm(server, warmup_prompts=8, warmup_waves=3)
    assert len(warm.waves) == 2 and warm.steady
    assert warm.waves[0].server_generation_tok_s is None and warm.waves[0].client_output_tok_s == 400.0


@pytest.mark.parametrize(("rates", "within", "expected"), [
    ([100.0], 0.1, False), ([100.0, 109.0], 0.1, True), ([100.0, 111.0], 0.1, False), ([0.0, 0.0], 0.1, False),
    ([100.0, 92.0], 0.1, True)])
def test_steady(rates: list[float], within: float, expected: bool) -> None:
    assert steady(rates, within) is expected
