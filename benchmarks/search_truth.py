"""The search benchmark's node: the emulated DSV4-Flash node whose truth the tuner's prior does not know.

For a hardware profile and a seed, :func:`make_truth` draws the node's true constants away from the
model's (:func:`tuner.engines.emulated.perturbed`: every kernel, backend and link efficiency off by
up to ±30 %, the Humming W4A8 backend's gain missing, one kind of communication twice as costly:
all2all on even seeds, the TP allreduce on odd ones) and tabulates what every launch of the profile
would measure on it, with the emulated node's own failure and trap tables (:mod:`tuner.engines.emulated.truth`).

:meth:`Truth.measure` is one launch: the ladder's steps with launch-to-launch noise, the ladder's
choice under the SLOs, or the failure the node gives (a start-up out-of-memory, a correctness gate
refusing a trap). The figures come from the wave model (:mod:`tuner.predict.fluid`), which agrees
with the emulated node's scheduler as ``bench_search.py --validate`` measures; a table of a whole
truth takes a fraction of a second, so every seed's is exact, not sampled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.engines.emulated import Coefficients, truth_from_seed
from tuner.engines.emulated import Truth as NodeTruth
from tuner.predict.fluid import startup_ok
from tuner.predict.steptime import coefficient_arrays
from tuner.predict.surface import ObjectiveModel, StepFigures, ladder, step_figures
from tuner.predict.table import SpaceTable

NOISE_THROUGHPUT = 0.03
"""Relative sd of a launch's measured throughput (see docs/search.md, "Noise")."""
NOISE_LATENCY = 0.05
"""Relative sd of a launch's p95 TTFT and p95 ITL."""


def truth_kwargs(seed: int) -> dict[str, Any]:
    """How seed ``seed``'s node differs from the model, beyond the ±30 % spread."""
    kind = "all2all" if seed % 2 == 0 else "allreduce"
    return {"drop_backend_gain": "humming", "comm_factor": {kind: 2.0}}


@dataclass(frozen=True)
class Outcome:
    """One launch as the study records it."""

    launched: bool
    feasible: bool
    value: float
    failure_class: str | None
    concurrency: int | None = None
    figures: dict[str, float] | None = None
    margins: tuple[float, ...] = ()


@dataclass
class Truth:
    """A node's truth over a profile's table (see the module docstring)."""

    table: SpaceTable
    model: ObjectiveModel
    seed: int
    node: NodeTruth
    steps: StepFigures
    runs: np.ndarray
    """Per physics row: the launch starts and passes its gates."""
    gate_fails: np.ndarray
    value: np.ndarray
    """Per point: the true (noise-free) objective value, 0 where it fails, misses an SLO or is pruned."""
    optimum: float

    @property
    def coefficients(self) -> Coefficients:
        return self.node.coefficients

    def reached(self, point: int, fraction: float) -> bool:
        return bool(self.value[point] >= fraction * self.optimum)

    def measure(self, point: int, rng: np.random.Generator, *, noise: float = NOISE_THROUGHPUT,
                latency_noise: float = NOISE_LATENCY) -> Outcome:
        """Launch ``point``: its failure, or its ladder under noise, as the study would record it."""
        row = int(self.table.phys_of[point])
        if row < 0:
            return Outcome(False, False, 0.0, "oom")
        if self.gate_fails[row]:
            return Outcome(True, False, 0.0, "guard_failed")
        if not self.runs[row]:
            return Outcome(True, False, 0.0, "oom")
        n = self.steps.value.shape[1]
        noisy = StepFigures(
            value=(self.steps.value[row] * np.exp(rng.normal(0.0, noise, n)))[None, :],
            concurrency=self.steps.concurrency[row][None, :],
            figures={k: (v[row] * np.exp(rng.normal(0.0, latency_noise, n)))[None, :]
                     for k, v in self.steps.figures.items()})
        s = ladder(self.model, noisy)
        j = int(s.chosen[0])
        figures = {"output_tok_s": float(noisy.value[0, j]) * (1.0 if self.model.metric == "output_throughput"
                                                               else math.nan),
                   "ttft_p95_ms": float(noisy.figures["ttft_p95_ms"][0, j]),
                   "itl_p95_ms": float(noisy.figures["itl_p95_ms"][0, j])}
        feasible = bool(s.feasible[0])
        return Outcome(True, feasible, float(s.value[0]), None if feasible else "slo_violated",
                       int(noisy.concurrency[0, j]), figures, tuple(float(m) for m in s.margins[0]))


def make_truth(table: SpaceTable, model: ObjectiveModel, seed: int, spread: float = 0.3) -> Truth:
    node = truth_from_seed(seed, spread, **truth_kwargs(seed))
    phys = table.physics
    ca = coefficient_arrays(phys, node.coefficients)
    steps = step_figures(phys, ca, model)
    surface = ladder(model, steps)
    gate_fails = np.array([node.trap(cfg) is not None for cfg in phys.configs])
    fails_at_start = np.array([node.failure(cfg, "hang") is not None or node.failure(cfg, "oom_under_load") is not None
                               for cfg in phys.configs])
    runs = startup_ok(phys, ca) & ~fails_at_start & ~gate_fails
    row_value = np.where(runs & surface.feasible, surface.value, 0.0)
    value = np.where(table.phys_of >= 0, row_value[np.maximum(table.phys_of, 0)], 0.0)
    return Truth(table=table, model=model, seed=seed, node=node, steps=steps, runs=runs, gate_fails=gate_fails,
                 value=value, optimum=float(value.max()))
