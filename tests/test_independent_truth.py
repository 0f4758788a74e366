"""The independent truth (issue 24): isolated from tuner/predict/ both ways, calibrated to the blog."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tuner.engines.emulated.independent import calibration_points, measure

ROOT = Path(__file__).resolve().parents[1]
INDEPENDENT = ROOT / "tuner" / "engines" / "emulated" / "independent"
PREDICT = ROOT / "tuner" / "predict"


def _imports(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_independent_model_imports_nothing_from_predict_or_the_emulated_model() -> None:
    own = "tuner.engines.emulated.independent"
    bad = {n for n in _imports(INDEPENDENT) if n.startswith("tuner.") and not n.startswith(own)}
    assert bad == set()


def test_predict_imports_nothing_from_the_independent_model() -> None:
    assert {n for n in _imports(PREDICT) if "independent" in n} == set()


def test_calibrated_to_the_gh200x4_blog() -> None:
    points = {name: measure(options).tokens_per_s for name, options in calibration_points().items()}
    assert points["TP4"] == pytest.approx(5856, rel=0.01)
    assert points["DP4+EP"] == pytest.approx(12802, rel=0.01)
    assert points["DP4+EP+W4A8"] / points["DP4+EP"] == pytest.approx(1.40, rel=0.02)


def test_w4a8_gain_appears_only_above_its_batch_size() -> None:
    small = {**calibration_points()["DP4+EP"], "max-num-seqs": 32}
    assert measure({**small, "moe-backend": "w4a8"}).tokens_per_s == pytest.approx(measure(small).tokens_per_s)


def test_a_launch_the_memory_arithmetic_allows_fails_under_load() -> None:
    options = {**calibration_points()["DP4+EP"], "gpu-memory-utilization": 0.97}
    result = measure(options)
    assert not result.started and "fragmentation" in result.reason
