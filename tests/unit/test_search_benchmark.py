"""The search benchmark, CI-sized: on an emulated gh200x4 node whose truth the prior does not know (constants
±30 %, the Humming gain missing, one kind of communication doubled), ``--prior model`` reaches 95 % of
the true optimum in fewer launches than the study's sampler alone (``--prior none``) and than random search.

The full table (30 seeds, both nodes, every search) is ``benchmarks/bench_search.py``; its data and
table are in docs/evidence/search-emulated/ and docs/search.md.
"""

from __future__ import annotations

import statistics
from types import ModuleType

import pytest

from tests.conftest import load_benchmark

SEEDS = range(4)
CAP = 20


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_search")


@pytest.fixture(scope="module")
def node(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> object:
    return bench.load_node("gh200x4", cache=tmp_path_factory.mktemp("bench-search"))


@pytest.fixture(scope="module")
def runs(bench: ModuleType, node: object) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {"model": [], "tpe": [], "random": []}
    for seed in SEEDS:
        truth = bench.search_truth.make_truth(node.table, node.model, seed)  # type: ignore[attr-defined]
        for method in out:
            out[method].append(bench.run_study(node, truth, bench.METHODS[method], seed, CAP))
    return out


def _to(run: object, fraction: float) -> float:
    values = run.values  # type: ignore[attr-defined]
    optimum = run.optimum  # type: ignore[attr-defined]
    hit = next((i for i, v in enumerate(values, start=1) if v >= fraction * optimum), None)
    return float(hit) if hit is not None else float("inf")


def test_the_truth_differs_from_the_prior(bench: ModuleType, node: object) -> None:
    truth = bench.search_truth.make_truth(node.table, node.model, 0)  # type: ignore[attr-defined]
    prior_best = node.predictor.ranking(top=1)[0]  # type: ignore[attr-defined]
    # The prior's favourite (Humming + DeepEP low-latency) is a trap on the node: its gate refuses it.
    assert truth.value[prior_best.point] == 0.0
    assert truth.optimum < prior_best.value * 0.9  # the node is slower than the model says


def test_the_model_guided_study_beats_the_sampler_alone_and_random_search(runs: dict[str, list[object]]) -> None:
    median = {m: statistics.median(_to(r, 0.95) for r in rs) for m, rs in runs.items()}
    # 8 before the second spread (issue 24's last step): once the model is distrusted the guide now measures
    # each competitive topology's speculative gain and the topologies it never launched before it refines,
    # which costs this node, whose structure the model has right, a few launches on seeds 2 and 3 (measured 9.5);
    # since a speculative twin takes the token budget its drafts need, a probe whose budget is raised takes its own
    # control too (measured 10.5; the full table's median is 7, as before: docs/search.md, section 1)
    assert median["model"] <= 11, median
    assert median["model"] < median["tpe"], median
    assert median["model"] < median["random"], median


def test_the_stop_estimate_falls_once_the_optimum_is_found(runs: dict[str, list[object]]) -> None:
    # Where the guide stopped trusting the model (issue 24) there is no estimate to fall; on this node, whose
    # structure is the model's, most seeds keep trusting it.
    trusted = [run for run in runs["model"] if run.distrust_at is None]  # type: ignore[attr-defined]
    assert len(trusted) >= len(runs["model"]) // 2
    for run in trusted:
        chance = run.chance  # type: ignore[attr-defined]
        assert chance[0] == 1.0  # nothing feasible measured beyond the first baseline: everything may beat it
        found = int(_to(run, 0.98))
        assert found <= len(chance)
        assert min(chance[found - 1:]) < 0.5
