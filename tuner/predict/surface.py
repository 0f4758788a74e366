"""An objective's value on every launch of a table, as the study would measure it: the ladder, under the SLOs.

:class:`ObjectiveModel` is what the performance model can predict of an
:class:`~tuner.objective.Objective`: a throughput metric, p95 TTFT / ITL limits, a random workload,
and the concurrency ladder (:mod:`tuner.load.ladder`: step up until an SLO breaks or throughput
stops rising by ``min_gain``; report the best step that meets every SLO, else the lowest step).
:func:`evaluate` runs that ladder over :func:`~tuner.predict.fluid.wave_bench` for every row of a
:class:`~tuner.predict.table.Physics` at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tuner.objective import Objective
from tuner.predict.fluid import Shape, WaveFigures, prompts_for, wave_bench
from tuner.predict.steptime import CoefficientArrays
from tuner.predict.table import Physics

__all__ = ["SLO_FIGURES", "ObjectiveModel", "PriorUnavailable", "StepFigures", "Surface", "evaluate"]

SLO_FIGURES: Mapping[str, str] = {"p95_ttft_ms": "ttft_p95_ms", "p95_itl_ms": "itl_p95_ms",
                                  "mean_tpot_ms": "tpot_mean_ms"}
"""The SLO keys the model predicts, and the :class:`~tuner.predict.fluid.WaveFigures` field of each."""
_METRICS = {"output_throughput": 1.0, "total_token_throughput": None, "request_throughput": None,
            "request_goodput": None}
"""``request_goodput`` is predicted as the request throughput of a step whose p95 figures meet the SLOs (at least
95 % of its requests then meet limits like them: issue 27's long-context objective sets both alike)."""


class PriorUnavailable(ValueError):
    """The model cannot predict this objective (its metric, SLO or workload); the reason says which."""


@dataclass(frozen=True)
class ObjectiveModel:
    """What the model predicts of an objective: metric, SLOs, workload lengths, ladder.

    A ladder is either absolute (``concurrencies``, node streams) or relative to each launch's KV knee
    (``knee_fractions``: step ``f`` runs ``round(f × knee)``, as the study resolves it per trial).
    """

    metric: str
    slos: tuple[tuple[str, float], ...]
    input_len: int
    output_len: int
    num_prompts: int
    concurrencies: tuple[int, ...]
    prompts_per_concurrency: float
    min_gain: float
    patience: int
    knee_fractions: tuple[float, ...] | None = None
    ignored_slos: tuple[str, ...] = ()

    @classmethod
    def from_objective(cls, objective: Objective) -> ObjectiveModel:
        if objective.direction != "maximize" or objective.metric not in _METRICS:
            raise PriorUnavailable(f"objective {objective.name!r}: the model predicts throughput metrics "
                                   f"({', '.join(_METRICS)}), not {objective.direction} {objective.metric}")
        w = objective.workload
        if w.kind != "random" or w.request_rate is not None:
            raise PriorUnavailable(f"objective {objective.name!r}: the model predicts a closed-loop random "
                                   f"workload, not kind {w.kind!r}" + (" at a fixed rate" if w.request_rate else ""))
        ladder = objective.ladder
        fractions: tuple[float, ...] | None = None
        if ladder is None:
            steps: tuple[int, ...] = (w.concurrency,)
            per, gain, patience = 0.0, 0.0, 1
        else:
            relative = getattr(ladder, "knee_fractions", None)
            if relative is not None and ladder.steps is None:
                fractions = tuple(sorted(float(f) for f in relative))
                steps = ()
            elif ladder.steps is not None:
                steps = tuple(sorted(set(ladder.steps)))
            else:
                out: list[int] = []
                value = float(ladder.start)
                while True:
                    c = min(ladder.max, math.ceil(value - 1e-9))
                    if not out or c > out[-1]:
                        out.append(c)
                    if c >= ladder.max:
                        break
                    value *= ladder.factor
                steps = tuple(out)
            per, gain, patience = ladder.prompts_per_concurrency, ladder.min_gain, ladder.patience
        slos = tuple((k, float(v)) for k, v in objective.slos.items() if k in SLO_FIGURES)
        ignored = tuple(k for k in objective.slos if k not in SLO_FIGURES)
        return cls(metric=objective.metric, slos=slos, input_len=w.input_len, output_len=w.output_len,
                   num_prompts=w.num_prompts, concurrencies=steps, prompts_per_concurrency=per, min_gain=gain,
                   patience=patience, knee_fractions=fractions, ignored_slos=ignored)

    @property
    def n_steps(self) -> int:
        return len(self.knee_fractions) if self.knee_fractions is not None else len(self.concurrencies)

    def concurrency_matrix(self, phys: Physics) -> np.ndarray:
        """(rows, steps) node concurrency of each launch's ladder."""
        if self.knee_fractions is None:
            return np.broadcast_to(np.asarray(self.concurrencies, dtype=np.int64), (len(phys), self.n_steps))
        knee = np.maximum(phys.knee.astype(np.float64), 1.0)
        cols = [np.maximum(1, np.round(f * knee)).astype(np.int64) for f in self.knee_fractions]
        return np.stack(cols, axis=1) if cols else np.zeros((len(phys), 0), dtype=np.int64)

    def shape(self, concurrency: int | np.ndarray) -> Shape:
        return Shape(self.input_len, self.output_len, concurrency,
                     prompts_for(concurrency, self.num_prompts, self.prompts_per_concurrency))

    def metric_of(self, figures: WaveFigures) -> np.ndarray:
        per_request = float(self.input_len + self.output_len) / float(self.output_len)
        if self.metric == "total_token_throughput":
            return figures.output_tok_s * per_request
        if self.metric in ("request_throughput", "request_goodput"):
            return figures.output_tok_s / float(self.output_len)
        return figures.output_tok_s

    def describe(self) -> str:
        ladder = (f"ladder at {', '.join(f'{f:g}' for f in self.knee_fractions)} × each launch's KV knee"
                  if self.knee_fractions is not None else f"ladder {list(self.concurrencies)}")
        slos = ", ".join(f"{k} ≤ {v:g}" for k, v in self.slos) or "no SLOs"
        return f"{self.metric}, random {self.input_len}/{self.output_len}, {ladder}, {slos}"


@dataclass(frozen=True)
class StepFigures:
    """Each ladder step's figures: arrays of shape (rows, steps)."""

    value: np.ndarray
    concurrency: np.ndarray
    figures: Mapping[str, np.ndarray]
    """``ttft_p95_ms``, ``itl_p95_ms``, ``tpot_mean_ms`` by step."""


@dataclass(frozen=True)
class Surface:
    """The objective on every row: the ladder's chosen step, its value and SLO margins."""

    value: np.ndarray
    feasible: np.ndarray
    margins: np.ndarray
    """(rows, SLOs): (observed − limit) / limit at the chosen step (≤ 0 passes)."""
    chosen: np.ndarray
    """Index of the reported step in each row's ladder."""
    steps: StepFigures

    def concurrency(self, i: int) -> int:
        """The node concurrency of row ``i``'s reported step."""
        return int(self.steps.concurrency[i, self.chosen[i]])


def step_figures(phys: Physics, ca: CoefficientArrays, model: ObjectiveModel) -> StepFigures:
    conc = model.concurrency_matrix(phys)
    values: list[np.ndarray] = []
    figs: dict[str, list[np.ndarray]] = {name: [] for name in SLO_FIGURES.values()}
    for j in range(model.n_steps):
        f = wave_bench(phys, ca, model.shape(conc[:, j]))
        values.append(model.metric_of(f))
        for name in figs:
            figs[name].append(getattr(f, name))
    return StepFigures(value=np.stack(values, axis=1), concurrency=np.asarray(conc),
                       figures={k: np.stack(v, axis=1) for k, v in figs.items()})


def ladder(model: ObjectiveModel, steps: StepFigures) -> Surface:
    """The ladder's choice on given step figures (predicted, or measured with noise)."""
    rows, n_steps = steps.value.shape
    n_slos = len(model.slos)
    margins = np.zeros((rows, n_steps, n_slos))
    for i, (key, limit) in enumerate(model.slos):
        margins[:, :, i] = (steps.figures[SLO_FIGURES[key]] - limit) / limit
    ok = np.asarray((margins <= 0).all(axis=2), dtype=bool) if n_slos else np.ones((rows, n_steps), dtype=bool)
    active = np.ones(rows, dtype=bool)
    best = np.full(rows, -np.inf)
    chosen = np.full(rows, -1, dtype=np.int64)
    stale = np.zeros(rows, dtype=np.int64)
    for j in range(n_steps):
        value = steps.value[:, j]
        meets = active & ok[:, j]
        gain = meets & (value > best * (1.0 + model.min_gain))
        better = meets & (value > best)
        chosen = np.where(better, j, chosen)
        best = np.where(better, value, best)
        stale = np.where(gain, 0, np.where(meets, stale + 1, stale))
        active = active & ok[:, j] & (stale < model.patience)
    feasible = chosen >= 0
    pick = np.where(feasible, chosen, 0)
    idx = np.arange(rows)
    return Surface(value=steps.value[idx, pick], feasible=feasible, margins=margins[idx, pick, :], chosen=pick,
                   steps=steps)


def evaluate(phys: Physics, ca: CoefficientArrays, model: ObjectiveModel) -> Surface:
    """The objective on every row of ``phys`` under coefficients ``ca``."""
    return ladder(model, step_figures(phys, ca, model))
