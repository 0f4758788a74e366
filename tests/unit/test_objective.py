"""tuner/objective.py: margins by hand, failed fraction, failed_score, SLO validation, shipped objectives."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from tuner import catalog
from tuner.errors import CatalogError
from tuner.objective import Objective, constraint_names, failed_score, load_objective, score


def _obj(**kw: object) -> Objective:
    return Objective.model_validate({"name": "t", **kw})


def test_margins_are_relative_and_signed() -> None:
    obj = _obj(slos={"p95_ttft_ms": 2000, "p95_itl_ms": 50})
    s = score(obj, {"output_throughput": 1234.5, "p95_ttft_ms": 2500, "p95_itl_ms": 40,
                    "completed": 10, "failed": 0})
    assert s.value == 1234.5
    assert s.constraints == pytest.approx((0.25, -0.2, 0.0, 0.0))  # (2500-2000)/2000, (40-50)/50, failed, ran
    assert not s.feasible
    assert s.violations == ("p95_ttft_ms 2500.0 > 2000",)


def test_margin_exactly_at_limit_passes() -> None:
    obj = _obj(slos={"p99_itl_ms": 100})
    s = score(obj, {"output_throughput": 10, "p99_itl_ms": 100.0, "completed": 4, "failed": 0})
    assert s.constraints == (0.0, 0.0, 0.0)
    assert s.feasible and s.violations == ()


def test_all_under_limits_is_feasible() -> None:
    obj = _obj(slos={"p95_ttft_ms": 1000, "median_e2el_ms": 4000})
    s = score(obj, {"output_throughput": 7.0, "p95_ttft_ms": 250, "median_e2el_ms": 1000,
                    "completed": 3, "failed": 0})
    assert s.constraints == pytest.approx((-0.75, -0.75, 0.0, 0.0))
    assert s.feasible


def test_missing_slo_key_in_summary_violates() -> None:
    obj = _obj(slos={"p95_ttft_ms": 1000})
    s = score(obj, {"output_throughput": 7.0, "completed": 3, "failed": 0})
    assert s.constraints[0] > 0 and math.isfinite(s.constraints[0])  # Optuna refuses NaN; inf is no use either
    assert not s.feasible
    assert len(s.violations) == 1 and s.violations[0].startswith("p95_ttft_ms")


def test_nan_latency_and_nan_metric_do_not_pass() -> None:
    obj = _obj(slos={"p95_ttft_ms": 1000})
    s = score(obj, {"output_throughput": float("nan"), "p95_ttft_ms": float("nan"), "completed": 3, "failed": 0})
    assert all(math.isfinite(c) for c in s.constraints)
    assert s.constraints[0] > 0 and not s.feasible
    assert s.value == failed_score(obj).value == 0.0


def test_failed_fraction_margin() -> None:
    obj = _obj(max_failed_fraction=0.1)
    s = score(obj, {"output_throughput": 5.0, "completed": 15, "failed": 5})
    assert s.constraints == pytest.approx((0.25 - 0.1, 0.0))
    assert not s.feasible
    assert len(s.violations) == 1 and s.violations[0].startswith("failed requests 25.0%")
    ok = score(obj, {"output_throughput": 5.0, "completed": 19, "failed": 1})
    assert ok.constraints == pytest.approx((0.05 - 0.1, 0.0))
    assert ok.feasible


def test_no_requests_counts_as_all_failed() -> None:
    s = score(_obj(max_failed_fraction=0.5), {"output_throughput": 0.0})
    assert s.constraints == pytest.approx((0.5, 0.0))
    assert not s.feasible


def test_minimize_latency_metric_value() -> None:
    obj = _obj(direction="minimize", metric="p95_itl_ms")
    s = score(obj, {"p95_itl_ms": 42.5, "completed": 1, "failed": 0})
    assert s.value == 42.5 and s.feasible


def test_constraint_names_line_up_with_margins() -> None:
    obj = _obj(slos={"p95_ttft_ms": 1, "p99_itl_ms": 1})
    assert constraint_names(obj) == ["p95_ttft_ms", "p99_itl_ms", "failed_fraction", "trial_ran"]
    assert len(score(obj, {"completed": 1}).constraints) == len(constraint_names(obj))


def test_failed_score_maximize() -> None:
    obj = _obj(slos={"p95_ttft_ms": 1})
    s = failed_score(obj)
    assert s.value == 0.0
    assert s.constraints == (1.0, 1.0, 1.0)
    assert not s.feasible


def test_failed_score_minimize_is_worse_than_any_real_value() -> None:
    s = failed_score(_obj(direction="minimize", metric="p95_itl_ms"))
    assert s.value >= 1e12
    assert s.constraints == (1.0, 1.0)
    assert not s.feasible


@pytest.mark.parametrize("key", ["ttft", "ttft_ms", "p95_ttft", "p95_ttft_s", "p95_foo_ms", "P95_TTFT_MS"])
def test_slo_key_without_unit_or_stat_is_rejected(key: str) -> None:
    with pytest.raises(ValidationError, match="no recognised unit"):
        _obj(slos={key: 5})


@pytest.mark.parametrize("limit", [0, -1, -0.5])
def test_non_positive_limit_rejected(limit: float) -> None:
    with pytest.raises(ValidationError, match="must be a positive number"):
        _obj(slos={"p95_ttft_ms": limit})


@pytest.mark.parametrize("key", ["p95_ttft_ms", "p99.9_itl_ms", "mean_tpot_ms", "median_e2el_ms", "p50_ttft_ms"])
def test_valid_slo_keys(key: str) -> None:
    assert _obj(slos={key: 5}).slos == {key: 5.0}


@pytest.mark.parametrize("metric", ["tokens_per_second", "ttft", "p95_ttft", ""])
def test_unknown_metric_rejected(metric: str) -> None:
    with pytest.raises(ValidationError, match="unknown metric"):
        _obj(metric=metric)


def test_ttft_slo_without_unit_in_yaml_is_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "obj.yaml"
    path.write_text("name: o\nslos:\n  ttft: 5\n", encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        load_objective(str(path))
    assert info.value.key == "slos"
    assert "'ttft'" in info.value.problem


def test_with_slos_overrides_and_adds() -> None:
    obj = _obj(slos={"p95_ttft_ms": 2000, "p95_itl_ms": 50})
    new = obj.with_slos({"p95_ttft_ms": 500, "p99_e2el_ms": 9000})
    assert new.slos == {"p95_ttft_ms": 500.0, "p95_itl_ms": 50.0, "p99_e2el_ms": 9000.0}
    assert obj.slos == {"p95_ttft_ms": 2000, "p95_itl_ms": 50}  # original unchanged
    assert new.name == obj.name and new.workload == obj.workload


def test_with_slos_validates_overrides() -> None:
    with pytest.raises(ValidationError):
        _obj().with_slos({"ttft": 5})
    with pytest.raises(ValidationError):
        _obj().with_slos({"p95_ttft_ms": 0})


@pytest.mark.parametrize("name", catalog.known_names("objectives"))
def test_every_shipped_objective_loads(name: str) -> None:
    obj = load_objective(name)
    assert obj.name == name
    assert obj.direction in ("maximize", "minimize")
    assert all(limit > 0 for limit in obj.slos.values())


def test_shipped_throughput_objective_values() -> None:
    obj = load_objective("throughput")
    assert obj.direction == "maximize" and obj.metric == "output_throughput"
    assert obj.slos == {"p95_ttft_ms": 120000.0, "p95_itl_ms": 1000.0}  # the node's (test_workload_scale.py)
    assert obj.at_scale("demo").slos == {"p95_ttft_ms": 20000.0, "p95_itl_ms": 2000.0}  # the CPU demo's
