"""Client units → node units (tuner/load/units.py), the knee's evidence (tuner/load/knee.py), the study clock."""

from __future__ import annotations

import math

import pytest

from tuner.load.generator import LoadResult, RequestRecord
from tuner.load.goodput import request_goodput
from tuner.load.knee import KneeEvidence, knee_evidence, saturation
from tuner.load.ladder import SloWatch
from tuner.load.units import HOST_PAUSE_S, IDENTITY, Units
from tuner.objective import Objective, Workload
from tuner.study.clock import StudyClock
from tuner.study.ranking import time_for_another

UNITS = Units(time_scale=10.0, multiplicity=4, startup_time_scale=10.0, process_start_s=30.0)


def test_a_summary_becomes_node_units_once() -> None:
    client = {"duration": 12.0, "completed": 8, "failed": 1, "total_input_tokens": 800, "total_output_tokens": 1600,
              "request_throughput": 0.5, "output_throughput": 100.0, "total_token_throughput": 150.0,
              "p95_ttft_ms": 20.0, "mean_itl_ms": 3.0, "std_tpot_ms": 1.0, "median_e2el_ms": 900.0,
              "p99.9_itl_ms": 7.0, "max_concurrency": 64, "p95_queue_ms": 5.0, "gpu_energy_j": 2.0}
    node = UNITS.node_summary(client)
    assert node["duration"] == 120.0
    assert (node["completed"], node["failed"], node["total_output_tokens"]) == (32, 4, 6400)
    assert node["output_throughput"] == pytest.approx(40.0)  # × 4 / 10
    assert node["request_throughput"] == pytest.approx(0.2)
    assert (node["p95_ttft_ms"], node["mean_itl_ms"], node["std_tpot_ms"]) == (200.0, 30.0, 10.0)
    assert node["median_e2el_ms"] == 9000.0 and node["p99.9_itl_ms"] == 70.0
    # The ladder sets the node concurrency itself; the server's own queue figures are node units already.
    assert node["max_concurrency"] == 64 and node["p95_queue_ms"] == 5.0 and node["gpu_energy_j"] == 2.0
    assert IDENTITY.node_summary(client) == client


def test_node_figures_become_what_the_client_sends() -> None:
    assert [UNITS.client_streams(c) for c in (1, 4, 5, 2740)] == [1, 1, 2, 685]
    assert [UNITS.client_requests(n) for n in (1, 8, 9)] == [1, 2, 3]
    assert UNITS.client_rate(2.0) == pytest.approx(5.0)  # 2 node req/s: 2 × 10 / 4 client req/s
    assert UNITS.client_startup_seconds(3600.0) == pytest.approx(390.0)  # / 10 + the process start
    assert IDENTITY.client_startup_seconds(3600.0) == 3600.0
    assert UNITS.client_stall_seconds(600.0) == pytest.approx(60.0)  # between progress lines: no process start
    assert IDENTITY.client_stall_seconds(600.0) == 600.0
    fast = Units(time_scale=25.0, startup_time_scale=400.0)
    assert fast.client_stall_seconds(600.0) == HOST_PAUSE_S  # not 1.5 s: a busy host pauses a process that long
    assert fast.client_stall_seconds(4.0) == 4.0  # never above the node's own limit
    assert Units.from_json(UNITS.to_json()) == UNITS
    with pytest.raises(ValueError, match="multiplicity"):
        Units(multiplicity=0)


def _record(ttft_s: float, e2e_s: float, tokens: int = 11) -> RequestRecord:
    return RequestRecord(ok=True, error="", prompt_tokens=8, output_tokens=tokens, start_s=0.0, ttft_s=ttft_s,
                         itl_s=(0.01,) * (tokens - 1), e2e_s=e2e_s)


def test_goodput_judges_node_latencies_and_reports_a_node_rate() -> None:
    # Client TTFT 0.3 s is 3 s on the node: under a 5 s limit; 0.6 s is 6 s: over it.
    result = LoadResult(records=(_record(0.3, 1.0), _record(0.6, 1.0)), duration_s=2.0, concurrency=2,
                        request_rate=None)
    assert request_goodput(result, {"ttft_ms": 5000.0}, UNITS) == pytest.approx(1 / 2.0 * 4 / 10)
    assert request_goodput(result, {"ttft_ms": 5000.0}) == pytest.approx(1.0)  # a real server: both pass


def test_the_slo_watch_compares_node_milliseconds() -> None:
    objective = Objective(name="t", slos={"p95_ttft_ms": 1000.0}, workload=Workload())
    watch = SloWatch(objective, planned_requests=1, units=UNITS)  # a p95 of 1 request allows none over the limit
    assert watch.add(_record(0.09, 1.0)) is False  # 0.9 node s
    assert watch.add(_record(0.11, 1.0)) is True  # 1.1 node s: lost
    assert SloWatch(objective, planned_requests=1).add(_record(0.11, 1.0)) is False  # 110 ms on a real server


def _server(kv: float | None = None, preemptions: float | None = 0.0, running: float | None = None,
            waiting: float | None = None, queue_ms: float | None = None) -> dict[str, object]:
    return {"facts": {"kv_usage_max": kv, "preemptions": preemptions, "running_max": running, "waiting_max": waiting,
                      "queue_p95_ms": queue_ms}}


@pytest.mark.parametrize(("server", "concurrency", "shown"), [
    (_server(kv=0.97), 2740, "KV cache 97% full"),
    (_server(kv=0.5, preemptions=12), 2740, "12 preemptions"),
    # The max-num-seqs cap (8 engines × 1,024): the batch never ran past the knee, and requests waited.
    (_server(kv=0.58, running=8192, waiting=4096), 12288, "batch full"),
    (_server(kv=0.58, running=8192, waiting=0), 12288, ""),  # nobody waited: no cap shown
    (_server(kv=0.4, running=12000, waiting=300), 12288, ""),  # ran past the knee: the knee was too low
    (_server(kv=0.58, running=8192, waiting=10), 8192, ""),  # at the knee only: a start burst, not a cap
    # The server's queue-time histogram: requests waited half a request's life for a slot.
    (_server(kv=0.2, queue_ms=90_000.0), 12288, "requests waited for the batch"),
    (_server(kv=0.2, queue_ms=30_000.0), 4096, ""),  # the prefill queue of a burst, below the knee
    ({}, 4110, ""),
])
def test_saturation_is_what_the_server_counted(server: dict[str, object], concurrency: int, shown: str) -> None:
    why = saturation(server, concurrency, knee=8192 if concurrency >= 8192 else 2740,
                     summary={"median_e2el_ms": 150_000.0})
    assert (why.startswith(shown) if shown else why == "")


def test_a_knee_claim_with_an_empty_cache_is_not_shown() -> None:
    steps = [(1370, _server(kv=0.3), {}), (2740, _server(kv=0.55), {}), (4110, _server(kv=0.6), {})]
    evidence = knee_evidence(steps, 2740)
    assert isinstance(evidence, KneeEvidence) and not evidence.shown and evidence.top_concurrency == 4110
    assert "peak KV use 60%" in evidence.evidence
    assert knee_evidence([(1370, _server(kv=0.3), {}), (2740, _server(kv=1.0), {})], 2740).shown
    assert not knee_evidence([], 2740).shown


def test_the_study_clock_runs_node_seconds() -> None:
    wall = [1000.0]
    clock = StudyClock(time_scale=25.0, origin=1000.0, wall=lambda: wall[0])
    wall[0] = 1060.0
    assert clock.now() == pytest.approx(1000.0 + 60 * 25)
    assert StudyClock(origin=5.0, wall=lambda: 7.0).now() == 7.0
    assert clock.node_seconds(2.0) == 50.0
    assert math.isclose(StudyClock().now(), StudyClock().now(), abs_tol=1.0)


class _Trials:
    """The one call :func:`time_for_another` makes on an Optuna study."""

    def __init__(self, durations_s: list[float]) -> None:
        self.durations_s = durations_s

    def get_trials(self, deepcopy: bool = False) -> list[object]:
        return [type("T", (), {"user_attrs": {"duration_s": d}})() for d in self.durations_s]


def test_another_trial_is_judged_on_the_node_clock() -> None:
    # An 8 h node budget: 2 node hours used, the longest trial so far took 1 node hour.
    start = 0.0
    deadline = start + 8 * 3600
    trials = _Trials([1800.0, 3600.0])
    assert time_for_another(trials, deadline, 600.0, now=start + 2 * 3600)  # type: ignore[arg-type]
    assert not time_for_another(trials, deadline, 600.0, reserve_s=3 * 3600, now=start + 4.5 * 3600)  # type: ignore[arg-type]
