"""Measured windows send prompts the server has not seen: proved by the real vLLM CPU server's own counters.

The server the load tests share (``vllm_cpu_server``, tests/cpu_server.py) serves the tiny demo model
with prefix caching on (``--enable-prefix-caching``, block size 32); this test's prompts come from seed
0, which no other user of that server draws. Two measurements on it, the second starting where the
first stopped (as a confirmation's repeats do), show no prefix-cache hit in any window. The old
behaviour, a second measurement that starts at prompt 0 again (each repeat re-sending jobs 0..n), hits
the cache, and the window check refuses it.
A real confirmation launch (two repeats on one server, through the whole study) is checked for the same
in ``tests/integration/test_study_e2e.py``. Run under ``flock /tmp/dsv4-vllm.lock``: it uses a server.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.cpu_server import SharedServer
from tuner.engines import default_engine
from tuner.load.ladder import LadderSpec, Measurement, measure
from tuner.load.metrics import parse_prometheus
from tuner.load.warmup import steady
from tuner.objective import Objective, Workload

pytestmark = [pytest.mark.server]

SERVED = "demo"
# Two ladder steps, so a measurement has two windows of 6 prompts of 128 tokens each (4 blocks of 32).
OBJECTIVE = Objective(
    name="fresh", metric="output_throughput", direction="maximize", slos={"p95_ttft_ms": 600_000},
    workload=Workload(input_len=128, output_len=8, range_ratio=0.0, num_prompts=6, concurrency=4,
                      warmup_prompts=2, ignore_eos=True),
    ladder=LadderSpec(steps=(2, 4), prompts_per_concurrency=1.5, min_gain=0.0, patience=2,
                      stop_on_client_saturation=False))


def _measure(server: SharedServer, first_job: int) -> Measurement:
    def scrape() -> dict[Any, float]:
        return dict(parse_prometheus(httpx.get(server.base_url + "/metrics", timeout=10).text))

    return measure(server.base_url, SERVED, OBJECTIVE, vocab_size=server.vocab_size, api_key=None,
                   should_stop=lambda: False, scrape=scrape, server_metrics=default_engine().metrics,
                   request_timeout_s=300, first_job=first_job)


def _hits(m: Measurement) -> list[tuple[float, float]]:
    return [(s.server["facts"]["prefix_cache_hits"], s.server["facts"]["prefix_cache_queries"]) for s in m.steps]


def test_windows_on_one_server_send_fresh_prompts_and_the_old_restart_at_prompt_0_is_refused(
        vllm_cpu_server: SharedServer) -> None:
    server = vllm_cpu_server
    first = _measure(server, 0)
    second = _measure(server, first.next_job)
    assert [s.first_job for s in (*first.steps, *second.steps)] == [0, 6, 12, 18]
    assert first.next_job == 12 and second.next_job == 24
    for m in (first, second):
        assert len(m.steps) == 2 and m.refused == ()
        for hits, queries in _hits(m):
            assert queries > 0, "the server reported no prefix-cache queries: is prefix caching on?"
            assert hits == 0, _hits(m)
        assert all(s.feasible for s in m.steps)
    # The old behaviour: the next repeat starts at prompt 0 again. The cache serves those prompts,
    # and the window check refuses the windows.
    again = _measure(server, 0)
    hits, queries = _hits(again)[0]
    assert hits > 0.5 * queries, _hits(again)  # 3 of each prompt's 4 blocks come from the cache
    assert again.refused and "on a 'random' workload that shares no prefix" in again.refused[0]
    assert not again.steps[0].feasible and any("window refused" in v for v in again.steps[0].violations)
    assert len(again.steps) == 1  # a refused window ends the ladder, as a broken SLO does


def test_warmup_waves_are_read_off_the_real_servers_counter(vllm_cpu_server: SharedServer) -> None:
    """``warmup_waves`` > 1 (issue 31): each wave's rate is the server's own generation counter, which counts
    exactly the tokens the client received; waves send fresh prompts of one request per stream at least, and
    stop once two waves agree or after the last one."""
    server = vllm_cpu_server
    workload = OBJECTIVE.workload.model_copy(update={"warmup_prompts": 1, "warmup_waves": 4, "seed": 31,
                                                     "warmup_steady_within": 0.2})
    objective = OBJECTIVE.model_copy(update={"workload": workload})

    def scrape() -> dict[Any, float]:
        return dict(parse_prometheus(httpx.get(server.base_url + "/metrics", timeout=10).text))

    m = measure(server.base_url, SERVED, objective, vocab_size=server.vocab_size, api_key=None,
                should_stop=lambda: False, scrape=scrape, server_metrics=default_engine().metrics,
                request_timeout_s=300)
    assert m.warmup is not None
    waves = m.warmup.waves
    assert 2 <= len(waves) <= 4
    for wave in waves:
        assert wave.requests == 2 and wave.failed == 0  # one request per stream of the first step (2)
        assert wave.server_generation_tok_s is not None
        assert wave.server_generation_tok_s == pytest.approx(wave.client_output_tok_s)  # 8 tokens a request
    rates = [w.rate_tok_s for w in waves]
    assert m.warmup.steady == steady(rates, 0.2)
    assert m.warmup.steady or len(waves) == 4
    assert all(h == 0 for h, _ in _hits(m)), _hits(m)  # the waves' prompts were new; so were the steps'
