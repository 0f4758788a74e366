"""Objectives: what to maximize or minimize, under which SLOs, on which workload.

An SLO is a limit on one key of the load summary (the ``vllm bench serve`` result keys), so its
unit is in its name: ``p95_ttft_ms: 2000``. Margins follow Optuna's sign: a margin ≤ 0 passes.
Margins are relative (``(value - limit) / limit``) so constraints on different scales compare.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner import catalog
from tuner.ladder_spec import LadderSpec
from tuner.workload import Workload

_LATENCY_KEY = re.compile(r"^(mean|median|p\d{1,2}(\.\d+)?)_(ttft|tpot|itl|e2el|queue)_ms$")
_RATE_KEYS = {"output_throughput", "total_token_throughput", "request_throughput"}
METRIC_KEYS = _RATE_KEYS | {"request_goodput"}
_GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    direction: Literal["maximize", "minimize"] = "maximize"
    metric: str = "output_throughput"
    slos: dict[str, float] = Field(default_factory=dict)
    """Upper limits on latency keys, e.g. ``p95_ttft_ms: 2000``."""
    max_failed_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    workload: Workload = Field(default_factory=Workload)
    ladder: LadderSpec | None = None
    """Concurrency ladder inside one launch; None = one step at ``workload.concurrency``."""
    goodput_slos: dict[str, float] = Field(default_factory=dict)
    """Per-request limits (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) a request must meet to count as goodput."""
    guards: list[str] = Field(default_factory=list)
    """Correctness gates every trial must pass (names in ``guards/`` or YAML paths)."""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in METRIC_KEYS and not _LATENCY_KEY.match(value):
            raise ValueError(f"unknown metric {value!r}; use one of {sorted(METRIC_KEYS)} or a latency "
                             "key such as p95_itl_ms")
        return value

    @field_validator("slos")
    @classmethod
    def _slo_keys_have_units(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if not _LATENCY_KEY.match(key):
                raise ValueError(
                    f"SLO {key!r} has no recognised unit/statistic; write it as <stat>_<metric>_ms, "
                    "e.g. p95_ttft_ms, p99_itl_ms, median_e2el_ms")
            if limit <= 0:
                raise ValueError(f"SLO {key} must be a positive number of milliseconds, got {limit}")
        return value

    @field_validator("goodput_slos")
    @classmethod
    def _goodput_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if key not in _GOODPUT_KEYS:
                raise ValueError(f"goodput SLO {key!r} unknown; use {', '.join(_GOODPUT_KEYS)}")
            if limit <= 0:
                raise ValueError(f"goodput SLO {key} must be a positive number of milliseconds")
        return value

    @model_validator(mode="after")
    def _goodput_needs_limits(self) -> Objective:
        if self.metric == "request_goodput" and not self.goodput_slos:
            raise ValueError("metric request_goodput needs goodput_slos (e.g. ttft_ms: 2000, tpot_ms: 100)")
        return self

    def with_slos(self, overrides: Mapping[str, float]) -> Objective:
        slos = {**self.slos, **overrides}
        return Objective.model_validate({**self.model_dump(), "slos": slos})


@dataclass(frozen=True)
class Score:
    value: float
    constraints: tuple[float, ...]
    """One margin per SLO (in ``objective.slos`` order), then the failed-request fraction margin."""
    violations: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return all(c <= 0 for c in self.constraints)


def constraint_names(objective: Objective) -> list[str]:
    return [*objective.slos, "failed_fraction", "trial_ran"]


def score(objective: Objective, summary: Mapping[str, float]) -> Score:
    """Objective value and SLO margins of one completed load run."""
    value = float(summary.get(objective.metric, 0.0))
    if math.isnan(value):
        value = failed_score(objective).value
    margins: list[float] = []
    violations: list[str] = []
    for key, limit in objective.slos.items():
        observed = float(summary.get(key, float("inf")))
        # No sample (NaN) or no key (inf) cannot pass an SLO; Optuna refuses NaN, so use a finite margin.
        margin = (observed - limit) / limit if math.isfinite(observed) else 1.0
        margins.append(margin)
        if margin > 0:
            violations.append(f"{key} {observed:.1f} > {limit:g}")
    total = float(summary.get("completed", 0)) + float(summary.get("failed", 0))
    failed_fraction = float(summary.get("failed", 0)) / total if total else 1.0
    margins.append(failed_fraction - objective.max_failed_fraction)
    if failed_fraction > objective.max_failed_fraction:
        violations.append(f"failed requests {failed_fraction:.1%} > {objective.max_failed_fraction:.1%}")
    margins.append(0.0)
    return Score(value=value, constraints=tuple(margins), violations=tuple(violations))


def failed_score(objective: Objective) -> Score:
    """What a trial that produced no measurement scores: worst value, every constraint violated."""
    worst = 0.0 if objective.direction == "maximize" else 1e12
    return Score(value=worst, constraints=tuple([1.0] * len(constraint_names(objective))), violations=())


def load_objective(name_or_path: str) -> Objective:
    return catalog.load_model(catalog.resolve("objectives", name_or_path), Objective)
