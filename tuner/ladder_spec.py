"""The ``ladder:`` block of an objective: how :func:`tuner.ladder.measure` steps concurrency.

Kept apart from :mod:`tuner.ladder` so that :mod:`tuner.objective` can import it without a cycle.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, model_validator

__all__ = ["LadderSpec", "ladder_concurrencies"]


class LadderSpec(BaseModel, extra="forbid", frozen=True):
    """How to step concurrency inside one launch (``ladder:`` in an objective)."""

    start: int = Field(default=1, gt=0, description="first step's concurrency")
    factor: float = Field(default=2.0, gt=1.0, description="each step multiplies concurrency by this")
    max: int = Field(default=256, gt=0, description="highest concurrency tried")
    steps: tuple[int, ...] | None = Field(default=None,
                                          description="explicit concurrencies; overrides start/factor/max")
    prompts_per_concurrency: float = Field(
        default=4.0, gt=0.0, description="each step sends at least concurrency × this requests (and num_prompts)")
    min_gain: float = Field(default=0.05, ge=0.0, description="a step must beat the best by this fraction")
    patience: int = Field(default=1, gt=0, description="steps without gain before the ladder stops")
    early_stop: bool = Field(default=True, description="cut a step once its SLO is clearly lost")
    stop_on_client_saturation: bool = True
    gauge_interval_s: float = Field(default=0.5, gt=0.0, description="how often gauges are scraped in a window")
    client_processes: int | Literal["auto"] = Field(
        default=1, description="load-generator processes; 'auto' adds one per ~streams_per_process streams")
    streams_per_process: int = Field(default=512, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LadderSpec:
        if self.steps is not None and (not self.steps or any(s <= 0 for s in self.steps)):
            raise ValueError("steps must be a non-empty list of positive concurrencies")
        if self.steps is None and self.start > self.max:
            raise ValueError(f"start ({self.start}) is above max ({self.max})")
        if isinstance(self.client_processes, int) and self.client_processes <= 0:
            raise ValueError("client_processes must be positive or 'auto'")
        return self


def ladder_concurrencies(spec: LadderSpec) -> list[int]:
    """The concurrencies a ladder tries, in order: ``start · factor^k`` (rounded up) to ``max``."""
    if spec.steps is not None:
        return sorted(set(spec.steps))
    out: list[int] = []
    value = float(spec.start)
    while True:
        c = min(spec.max, math.ceil(value - 1e-9))
        if not out or c > out[-1]:
            out.append(c)
        if c >= spec.max:
            return out
        value *= spec.factor
