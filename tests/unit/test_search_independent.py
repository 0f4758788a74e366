"""The search benchmark on a node the model did not write (issue 24), CI-sized.

The node is the independent model (``tuner/engines/emulated/independent``: no code or constant of the prior),
as ``benchmarks/bench_search.py --truth independent`` runs it, on gh200x4, seeds 0-7 of the table, 12 launches
each; and on h200x8, seeds 0-3, 16 launches each, for the second spread (the optimum there is often a
topology × speculation cell the model ranks low). ``--prior model`` as it ships must stay above the bars
below. They are regression bars, set from what it measured there with some room (the issue's goal is judged
on the full table: 30 seeds, both nodes, every search, in docs/evidence/search-independent/ and
docs/search.md, section 2b); the median launches to 95 % is the goal's own bar.
"""

from __future__ import annotations

import statistics
from types import ModuleType

import numpy as np
import pytest

from tests.conftest import load_benchmark
from tuner.predict.explore import cell_of

SEEDS = range(8)
CAP = 12
MEDIAN_TO_95 = 8
"""The issue's goal: 95 % of the optimum within 8 launches in the median (measured: 7.5 on these seeds)."""
EXPORTED_FLOOR = 0.88
"""Every seed's winner exported after 12 launches is at least this share of the optimum (measured: 0.91 at worst)."""
BASELINE_SLACK = 0.06
"""No seed's exported winner falls below the best seeded baseline by more than this share (measured: none falls
below it; 0.057 at worst before the recipes were confirmed beside the candidates, seed 0)."""
H200_SEEDS = range(4)
H200_CAP = 16
SPECULATIVE_CELLS = 3
"""Topologies whose speculative gain the second spread measured within 16 launches, at least (measured: 3-4)."""
H200_EXPORTED = 0.95
"""Each of these seeds' winner exported after 12 launches, as a share of the optimum (measured: 0.971 at worst,
seed 3)."""
DISTRUSTED = 5
"""Seeds on which the guide stops trusting the model within 12 launches (measured: 6 of 8)."""


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_search")


@pytest.fixture(scope="module")
def node(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> object:
    return bench.load_node("gh200x4", cache=tmp_path_factory.mktemp("bench-search"))


@pytest.fixture(scope="module")
def runs(bench: ModuleType, node: object) -> list[object]:
    out = []
    for seed in SEEDS:
        truth = bench.make_truth(node, seed, 0.2, "independent")
        out.append(bench.run_study(node, truth, bench.METHODS["model"], seed, CAP))
    return out


def _to(run: object, fraction: float) -> float:
    values, optimum = run.values, run.optimum  # type: ignore[attr-defined]
    hit = next((i for i, v in enumerate(values, start=1) if v >= fraction * optimum), None)
    return float(hit) if hit is not None else float("inf")


def test_the_node_is_not_the_model(bench: ModuleType, node: object) -> None:
    """The prior's favourite is not the node's best, and the model is wrong about what fits."""
    truth = bench.make_truth(node, 0, 0.2, "independent")
    favourite = node.predictor.ranking(top=1)[0]  # type: ignore[attr-defined]
    assert truth.value[favourite.point] < 0.95 * truth.optimum
    launchable = ~node.table.prunable  # type: ignore[attr-defined]
    assert (launchable & ~(truth.starts & truth.survives)).any()  # the memory model says fit, the node fails


def test_the_guided_search_reaches_95_percent_within_8_launches(runs: list[object]) -> None:
    assert statistics.median(_to(r, 0.95) for r in runs) <= MEDIAN_TO_95


def test_the_exported_winner_is_good_and_never_below_the_best_baseline(runs: list[object]) -> None:
    for run in runs:
        exported = run.exported_12  # type: ignore[attr-defined]
        assert exported is not None
        assert exported >= EXPORTED_FLOOR * run.optimum  # type: ignore[attr-defined]
        assert exported >= (1.0 - BASELINE_SLACK) * run.baseline_best  # type: ignore[attr-defined]


def test_the_guide_noticed_the_model_was_wrong(runs: list[object]) -> None:
    at = [r.distrust_at for r in runs]  # type: ignore[attr-defined]
    assert sum(a is not None for a in at) >= DISTRUSTED, at


@pytest.fixture(scope="module")
def h200(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> object:
    return bench.load_node("h200x8", cache=tmp_path_factory.mktemp("bench-search-h200"))


def _speculative_cells(node: object, run: object) -> set[object]:
    params = node.table.params  # type: ignore[attr-defined]
    return {cell_of(params[p]) for p in run.points if cell_of(params[p])[1]}  # type: ignore[attr-defined]


def test_on_h200x8_the_second_spread_measures_what_the_model_ranks_low(bench: ModuleType, h200: object) -> None:
    """Once the model is distrusted the guide measures each competitive topology's speculative gain before it
    refines; without the second spread (the ablation) it launches no speculative configuration at all."""
    for seed in H200_SEEDS:
        truth = bench.make_truth(h200, seed, 0.2, "independent")
        run = bench.run_study(h200, truth, bench.METHODS["model"], seed, H200_CAP, stop_when_reached=False)
        assert run.distrust_at is not None
        assert len(_speculative_cells(h200, run)) >= SPECULATIVE_CELLS, (seed, _speculative_cells(h200, run))
        assert run.exported_12 is not None and run.exported_12 >= H200_EXPORTED * run.optimum, seed
    truth = bench.make_truth(h200, 0, 0.2, "independent")
    ablation = bench.run_study(h200, truth, bench.METHODS["model-one-spread"], 0, H200_CAP, stop_when_reached=False)
    assert not _speculative_cells(h200, ablation)


def test_the_quiet_node_measures_its_noise_free_values(bench: ModuleType, node: object) -> None:
    """``--truth independent-quiet`` (the diagnostic of docs/search.md, section 2b) is the same node measured
    without its noise: each launch measures the value the table scores it by, an SLO miss stays one."""
    truth = bench.make_truth(node, 0, 0.2, "independent")
    quiet = bench.make_truth(node, 0, 0.2, "independent-quiet")
    assert quiet.optimum == truth.optimum
    rng = np.random.default_rng(0)
    runs = [int(p) for p in np.flatnonzero(truth.value > 0)[::97][:20]]
    missed = [int(p) for p in np.flatnonzero((truth.value == 0) & ~node.table.prunable)[:5]]  # type: ignore[attr-defined]
    assert runs and missed
    for point in runs:
        outcome = quiet.measure(point, rng)
        assert outcome.feasible and outcome.value == pytest.approx(float(truth.value[point]), rel=1e-9)
    assert not any(quiet.measure(p, rng).feasible for p in missed)
    noisy = [truth.measure(p, rng).value / float(truth.value[p]) for p in runs]
    assert max(abs(r - 1.0) for r in noisy) > 0.01  # the node itself is noisy: the diagnostic removes something


def test_measurement_noise_reads_the_launches_apart_by_drafts(bench: ModuleType, node: object) -> None:
    params = node.table.params  # type: ignore[attr-defined]
    plain = next(i for i, p in enumerate(params) if not p.get("speculative.draft_tokens"))
    drafted = next(i for i, p in enumerate(params) if p.get("speculative.draft_tokens"))
    runs = [{"points": [plain, plain, drafted, drafted, plain], "measured": [110.0, 90.0, 100.0, 100.0, None],
             "values": [100.0, 100.0, 100.0, 100.0, 100.0]}]
    got = bench.measurement_noise(runs, params)
    assert got["no_drafts"]["launches"] == 2 and got["drafts"]["launches"] == 2
    assert got["drafts"]["sd_pct"] == 0.0
    assert 9.0 < got["no_drafts"]["sd_pct"] < 11.0
