"""The search benchmark's node: the emulated DSV4-Flash node whose truth the tuner's prior does not know.

For a hardware profile and a seed, :func:`make_truth` draws the node's true constants away from the
model's (:func:`tuner.perfmodel.perturbed`: every kernel, backend and link efficiency off by
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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.engines.emulated import Truth as NodeTruth
from tuner.engines.emulated import truth_from_seed
from tuner.perfmodel import Coefficients
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

    def runs_at(self, point: int) -> bool:
        """The launch of ``point`` starts and passes its gates (False where the feasibility model refuses it)."""
        row = int(self.table.phys_of[point])
        return row >= 0 and bool(self.runs[row])

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


# -- the independent truth (issue 24): a node the prior's model did not write ---------------------------------
_LAUNCHES: dict[tuple[str, int], Any] = {}


def _launches(table: SpaceTable) -> Any:
    """Every point's ``vllm serve`` options, parsed by the independent model once per table."""
    from tuner.engines.emulated.independent import parse
    from tuner.search.space import build_config

    key = (table.profile.name, len(table))
    if key not in _LAUNCHES:
        _LAUNCHES[key] = parse([build_config(table.profile, dict(p)).args for p in table.params])
    return _LAUNCHES[key]


@dataclass
class IndependentTruth:
    """Seed ``seed``'s node under the independent model (:mod:`tuner.engines.emulated.independent`).

    Every point of the table is a launch of its ``vllm serve`` options on that model; the ladder is the
    study's own (``knee_fractions`` × the feasibility model's knee of each launch, as the study sizes it;
    the best step under the SLOs). ``value`` is the noise-free objective (0 where the launch fails,
    misses an SLO, or the feasibility model refuses it); ``optimum`` its maximum over the points the
    study can launch; ``optimum_all`` over every point (the feasibility model's refusals included, each
    laddered through the model's own KV pool). Noise is the model's own: it grows with load, DP and
    speculation, one launch in about sixteen runs slow, and none of it is told to a search.
    """

    table: SpaceTable
    model: ObjectiveModel
    seed: int
    starts: np.ndarray
    survives: np.ndarray
    reason: tuple[str, ...]
    steps: StepFigures
    noise_sd: np.ndarray
    value: np.ndarray
    value_all: np.ndarray
    optimum: float
    optimum_all: float
    slow_p: float
    slow_cost: float
    latency_sd: float

    def reached(self, point: int, fraction: float) -> bool:
        return bool(self.value[point] >= fraction * self.optimum)

    def runs_at(self, point: int) -> bool:
        """The launch of ``point`` starts and survives the ladder (False where the feasibility model refuses it)."""
        return bool(not self.table.prunable[point] and self.starts[point] and self.survives[point])

    def measure(self, point: int, rng: np.random.Generator, *, noise: float = 0.0,
                latency_noise: float = 0.0) -> Outcome:
        """Launch ``point``. ``noise``/``latency_noise`` are ignored: the node's noise is its own."""
        if self.table.prunable[point]:
            return Outcome(False, False, 0.0, "oom")
        if not self.starts[point] or not self.survives[point]:
            return Outcome(True, False, 0.0, "oom")
        n = self.steps.value.shape[1]
        sd = self.noise_sd[point]
        launch = rng.normal(0.0, float(sd.mean()))
        slow = math.log(1.0 - self.slow_cost) if rng.random() < self.slow_p else 0.0
        factor = np.exp(launch + slow + rng.normal(0.0, 0.5, n) * sd)
        noisy = StepFigures(
            value=(self.steps.value[point] * factor)[None, :],
            concurrency=self.steps.concurrency[point][None, :],
            figures={k: (v[point] * np.exp(rng.normal(0.0, self.latency_sd * (1.0 + 2.0 * sd), n)) / np.sqrt(factor))
                     [None, :] for k, v in self.steps.figures.items()})
        s = ladder(self.model, noisy)
        j = int(s.chosen[0])
        figures = {"output_tok_s": float(noisy.value[0, j]) if self.model.metric == "output_throughput" else math.nan,
                   "ttft_p95_ms": float(noisy.figures["ttft_p95_ms"][0, j]),
                   "itl_p95_ms": float(noisy.figures["itl_p95_ms"][0, j])}
        feasible = bool(s.feasible[0])
        return Outcome(True, feasible, float(s.value[0]), None if feasible else "slo_violated",
                       int(noisy.concurrency[0, j]), figures, tuple(float(m) for m in s.margins[0]))


def quiet(truth: IndependentTruth) -> IndependentTruth:
    """``truth`` measured without noise: every launch measures its noise-free figures (a diagnostic: how much of
    what a search misses on the node is its noise, not its structure)."""
    return dataclasses.replace(truth, noise_sd=np.zeros_like(truth.noise_sd), slow_p=0.0, latency_sd=0.0)


def make_independent_truth(table: SpaceTable, model: ObjectiveModel, seed: int, spread: float = 0.2
                           ) -> IndependentTruth:
    """Seed ``seed``'s independent node over ``table`` (see :class:`IndependentTruth`)."""
    from tuner.engines.emulated.independent import drawn, evaluate_parsed

    x = _launches(table)
    constants = drawn(seed, spread=spread)
    rows = np.maximum(table.phys_of, 0)
    knee = np.where(table.phys_of >= 0, table.physics.knee[rows], 0).astype(np.float64)
    # a point the feasibility model refuses has no knee of the study's: its own KV pool's stands in
    nominal = evaluate_parsed(x, table.profile.name, np.ones((len(table), 1)), constants=constants,
                              input_len=model.input_len, output_len=model.output_len)
    own = np.minimum(nominal.kv_tokens / (model.input_len + model.output_len), x.seqs) * x.dp
    knee = np.where(knee > 0, knee, np.maximum(own, 1.0))
    fractions = model.knee_fractions or (1.0,)
    conc = np.stack([np.maximum(1, np.round(f * knee)) for f in fractions], axis=1).astype(np.int64)
    ev = evaluate_parsed(x, table.profile.name, conc, constants=constants, input_len=model.input_len,
                         output_len=model.output_len)
    steps = StepFigures(value=ev.output_tok_s if model.metric == "output_throughput"
                        else ev.output_tok_s * (model.input_len + model.output_len) / model.output_len,
                        concurrency=conc,
                        figures={"ttft_p95_ms": ev.ttft_p95_ms, "itl_p95_ms": ev.itl_p95_ms,
                                 "tpot_mean_ms": ev.itl_p95_ms})
    surface = ladder(model, steps)
    runs = ev.starts & ev.survives_load
    value_all = np.where(runs & surface.feasible, surface.value, 0.0)
    value = np.where(table.prunable, 0.0, value_all)
    return IndependentTruth(table=table, model=model, seed=seed, starts=ev.starts, survives=ev.survives_load,
                            reason=ev.reason, steps=steps, noise_sd=ev.noise_sd, value=value, value_all=value_all,
                            optimum=float(value.max()), optimum_all=float(value_all.max()),
                            slow_p=constants.slow_launch_p, slow_cost=constants.slow_launch_cost,
                            latency_sd=constants.latency_noise)
