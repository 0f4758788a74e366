"""The independent truth (issue 24): isolated from tuner/predict/ and tuner/perfmodel/ both ways, calibrated to
the blog, and with the effects the prior does not write down."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np
import pytest

from tuner.engines.emulated.independent import NOMINAL, calibration_points, drawn, evaluate, measure

ROOT = Path(__file__).resolve().parents[1]
INDEPENDENT = ROOT / "tuner" / "engines" / "emulated" / "independent"
PREDICT = ROOT / "tuner" / "predict"
PERFMODEL = ROOT / "tuner" / "perfmodel"


def _imports(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_independent_model_imports_nothing_from_predict_or_the_performance_model() -> None:
    own = "tuner.engines.emulated.independent"
    bad = {n for n in _imports(INDEPENDENT) if n.startswith("tuner.") and not n.startswith(own)}
    assert bad == set()


def test_predict_imports_nothing_from_the_independent_model() -> None:
    assert {n for n in _imports(PREDICT) if "independent" in n} == set()


def test_the_performance_model_imports_nothing_from_the_independent_model() -> None:
    assert {n for n in _imports(PERFMODEL) if "independent" in n} == set()


def test_calibrated_to_the_gh200x4_blog() -> None:
    points = {name: measure(options, "gh200x4", c).tokens_per_s for name, (options, c) in calibration_points().items()}
    assert points["TP4"] == pytest.approx(5856, rel=0.01)
    assert points["DP4+EP"] == pytest.approx(12802, rel=0.01)
    assert points["DP4+EP+W4A8"] / points["DP4+EP"] == pytest.approx(1.40, rel=0.02)


def _dp4(**over: object) -> dict[str, object]:
    options, _ = calibration_points()["DP4+EP"]
    return {**options, **over}


def test_w4a8_gain_appears_only_above_a_batch_size() -> None:
    small = _dp4(**{"max-num-seqs": 8})
    plain, w4a8 = measure(small, concurrency=32), measure({**small, "moe-backend": "humming"}, concurrency=32)
    assert w4a8.tokens_per_s <= plain.tokens_per_s  # 32 × 6 / 256 tokens per expert: below the kernel's threshold
    big_plain, big_w4a8 = measure(_dp4(), concurrency=2752), measure(_dp4(**{"moe-backend": "humming"}),
                                                                        concurrency=2752)
    assert big_w4a8.tokens_per_s > 1.2 * big_plain.tokens_per_s


def test_all_to_all_cost_grows_with_the_ranks_and_the_batch() -> None:
    from tuner.engines.emulated.independent.hardware import node_named
    from tuner.engines.emulated.independent.launch import parse
    from tuner.engines.emulated.independent.step import step_s

    def comm_s(dp: int, batch: float) -> float:
        x = parse([_dp4(**{"data-parallel-size": dp})])
        node = node_named("h200x8")
        with_comm = step_s(x, node, NOMINAL, np.array([batch]), np.zeros(1), 1664.0)[0]
        free = step_s(x, node, dataclasses_replace(link=1e9), np.array([batch]), np.zeros(1), 1664.0)[0]
        return float(with_comm - free)

    assert comm_s(8, 256) > comm_s(4, 256) * 1.5  # more ranks: more to move, and congestion
    # per token, a large batch moves slower than a small one (congestion), not faster
    assert comm_s(8, 4096) / 4096 > 1.2 * comm_s(8, 1024) / 1024


def dataclasses_replace(link: float) -> object:
    import dataclasses

    return dataclasses.replace(NOMINAL, link_eff=link, agrs_latency_s=0.0, allreduce_latency_s=0.0, dp_sync_s=0.0)


def test_a_launch_the_start_up_profile_allows_fails_under_load() -> None:
    ev = evaluate([_dp4(**{"max-num-batched-tokens": 16384})], "gh200x4", np.array([[2752]]))
    assert ev.starts[0] and not ev.survives_load[0]
    assert "under load" in ev.reason[0]


def test_preemption_past_the_kv_pool_costs_throughput_and_queues_requests() -> None:
    options = _dp4(**{"max-num-seqs": 2048})
    ev = evaluate([options], "gh200x4", np.array([[2752, 5504, 8256]]))
    per_request = ev.output_tok_s[0]
    assert per_request[2] < per_request[1] * 1.02  # past the pool: no gain for a third more streams
    assert ev.ttft_p95_ms[0, 2] > 2 * ev.ttft_p95_ms[0, 1]


def test_noise_grows_with_load_and_is_drawn_per_seed() -> None:
    ev = evaluate([_dp4()], "gh200x4", np.array([[64, 2752]]))
    assert ev.noise_sd[0, 1] > ev.noise_sd[0, 0]
    draws = [measure(_dp4(), concurrency=2752, rng=random.Random(i)).tokens_per_s for i in range(40)]
    assert float(np.std(draws) / np.mean(draws)) > 0.02
    assert drawn(1) != drawn(2) and drawn(1) == drawn(1)
