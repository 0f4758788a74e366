"""Predict, then verify: the prior's ranking, the corrected model's next launch, and the chance the night is won.

:class:`Predictor` holds one study's model: the space as a table (:mod:`tuner.predict.table`), what
the objective asks (:class:`~tuner.predict.surface.ObjectiveModel`), and the model's constants (the
prior: :data:`~tuner.perfmodel.NOMINAL`). Before the first launch it ranks every launchable
point by predicted objective value under the SLOs (:meth:`Predictor.ranking`) and picks the top few,
diverse: no two of the same topology, MoE kernel, all2all and speculation setting
(:meth:`Predictor.diverse_top`).

:class:`Guide` then runs the night's loop: after each launch it refits the correction factors
(:mod:`tuner.predict.correction`), fits a Gaussian process on what the corrected model still gets
wrong (the residual, over lever distance), remembers which kind of configuration failed, and
proposes the untried point with the largest expected improvement over the measured best, over
draws of the corrected model (:meth:`Guide.next_point`). Each launch is also held against the value and
uncertainty the model stated for it before (:mod:`tuner.predict.trust`); once the model's errors exceed
what it states, the next launch is chosen by the measurements instead (:mod:`tuner.predict.explore`).
:meth:`Guide.chance_to_beat` is the probability, over those draws, that some untried point beats the
winner by more than the measurement noise: the stop estimate.

Everything is computed on a **pool**: the rows that rank near the top under the prior or under one
of several draws of it (a mis-calibrated constant cannot lift a row from outside the pool into the
lead), plus the best rows of every structural class. Pure numpy; no Optuna.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.failures import FailureClass
from tuner.perfmodel import NOMINAL, Coefficients
from tuner.predict.correction import PRIOR_SD, Correction, Factor, Observation, apply, factors_for, fit
from tuner.predict.explore import cell_codes, explore, second_spread
from tuner.predict.fluid import startup_ok, wave_bench
from tuner.predict.steptime import coefficient_arrays
from tuner.predict.surface import SLO_FIGURES, ObjectiveModel, Surface, evaluate
from tuner.predict.table import SpaceTable, descending
from tuner.predict.trust import Residual, Trust
from tuner.search.profile import DRAFT_TOKENS_PARAM, TOPOLOGY_PARAM, Scalar
from tuner.search.space import build_config

__all__ = ["NUMERICS_LEVERS", "Choice", "Guide", "Predictor", "Ranked"]

START_FAILURES = frozenset({"bad_flag", "oom", "timeout", "hang", "crash", "nccl", "assertion"})
"""Failure classes of a launch that never became ready because of its flags (``tuner.failures``)."""
SPECULATION_MARGIN = 0.10
"""A prior pick speculates only when predicted this much better than its class's best without speculation."""
SPREAD_DIFFER_IN = 2
"""The first picks differ from each other and from the baselines in this many of topology, MoE kernel, batching."""
SPREAD_PAUSE = 0.1
"""A launch of the second spread that comes within this share of the best is refined (one GP launch) first."""
NUMERICS_LEVERS = ("moe-backend", "all2all-backend", "kv-cache-dtype", "quantization", "dtype", DRAFT_TOKENS_PARAM)
"""Levers that change what the model computes: a failed correctness gate is blamed on these alone."""


@dataclass(frozen=True)
class Ranked:
    """One point as the model sees it."""

    point: int
    params: Mapping[str, Scalar]
    value: float
    feasible: bool
    concurrency: int
    figures: Mapping[str, float]


@dataclass(frozen=True)
class Choice:
    """The guide's next launch, and why."""

    point: int
    predicted: float
    expected_improvement: float
    p_fail: float
    led_by: str = "model"
    """``model``: the corrected model's expected improvement; ``measurements``: the model is distrusted and
    the measurement-led GP chose (:mod:`tuner.predict.explore`); ``spread``: the model is distrusted and the
    second spread chose (:func:`~tuner.predict.explore.second_spread`)."""


def _class_key(table: SpaceTable, row: int) -> tuple[object, ...]:
    cfg = table.physics.configs[row]
    phys = table.physics
    layout = "pd" if phys.pd is not None and row in set(phys.pd.rows.tolist()) else ""
    return (layout + cfg.topology_name, phys.moe_field[row], cfg.all2all_backend if cfg.dp > 1 else "", cfg.eplb,
            bool(phys.spec_k[row] > 0))


class Predictor:
    """One study's model: table, objective, constants, and the pool the search works on."""

    def __init__(self, table: SpaceTable, objective: ObjectiveModel, base: Coefficients = NOMINAL, *,
                 pool_draws: int = 8, pool_top: int = 400, class_top: int = 3, seed: int = 0) -> None:
        self.table = table
        self.objective = objective
        self.base = base
        self.factors: tuple[Factor, ...] = factors_for(table.physics)
        phys = table.physics
        full = self.surface_all(base)
        self.prior_surface = full
        ok = self.usable(full, base)
        scores = [np.where(ok, full.value, -1.0)]
        rng = np.random.default_rng(seed)
        for _ in range(pool_draws):
            theta = rng.normal(0.0, PRIOR_SD, size=len(self.factors))
            coeffs = apply(base, self.factors, theta)
            s = self.surface_all(coeffs)
            scores.append(np.where(self.usable(s, coeffs), s.value, -1.0))
        chosen: set[int] = set()
        for score in scores:
            top = descending(score)[:pool_top]
            chosen.update(int(r) for r in top if score[r] > 0)
        best_by_class: dict[tuple[object, ...], list[tuple[float, int]]] = {}
        for r in range(len(phys)):
            value = max(float(s[r]) for s in scores)
            if value > 0:
                best_by_class.setdefault(_class_key(table, r), []).append((value, r))
        for rows in best_by_class.values():
            chosen.update(r for _, r in sorted(rows, key=_best_first)[:class_top])
        self.pool = np.array(sorted(chosen), dtype=np.int64)
        self.pool_phys = phys.take(self.pool)
        self.row_to_pool = {int(r): i for i, r in enumerate(self.pool)}
        # the points of each pool row (configurations that differ only in what the model cannot see)
        self.points_of_row: dict[int, list[int]] = {}
        for point, row in enumerate(table.phys_of):
            if row >= 0 and int(row) in self.row_to_pool:
                self.points_of_row.setdefault(int(row), []).append(point)
        self.pool_points = np.array([self.points_of_row[int(r)][0] for r in self.pool], dtype=np.int64)
        """One point per pool row, in the pool's order."""
        self.codes = _encode(table)
        self.cells = cell_codes(table)
        """The cell (topology × speculation) of every point, as an integer (:func:`~tuner.predict.explore.cell_of`)."""
        # A speculative point launches its no-speculation control first (the study's rule): its twin.
        self.control_of: dict[int, int] = {}
        for points in self.points_of_row.values():
            for point in points:
                params = table.params[point]
                if int(params.get(DRAFT_TOKENS_PARAM, 0) or 0) > 0:
                    twin = table.index_of.get(build_config(table.profile, {**params, DRAFT_TOKENS_PARAM: 0}).key())
                    if twin is not None:
                        self.control_of[point] = twin

    # -- the model on rows ---------------------------------------------------------------------------
    def surface_all(self, coeffs: Coefficients) -> Surface:
        return evaluate(self.table.physics, coefficient_arrays(self.table.physics, coeffs), self.objective)

    def surface_pool(self, coeffs: Coefficients, subset: np.ndarray | None = None) -> Surface:
        """The objective on the pool's rows (or on ``subset``, indices into the pool)."""
        phys = self.pool_phys if subset is None else self.pool_phys.take(subset)
        return evaluate(phys, coefficient_arrays(phys, coeffs), self.objective)

    def usable(self, s: Surface, coeffs: Coefficients, phys: object | None = None) -> np.ndarray:
        ph = self.table.physics if phys is None else phys
        return s.feasible & startup_ok(ph, coefficient_arrays(ph, coeffs))  # type: ignore[arg-type]

    # -- the prior ---------------------------------------------------------------------------------------
    def ranked(self, point: int, s: Surface, row_index: int) -> Ranked:
        chosen = int(s.chosen[row_index])
        figures = {name: float(s.steps.figures[name][row_index, chosen]) for name in SLO_FIGURES.values()}
        return Ranked(point=point, params=self.table.params[point], value=float(s.value[row_index]),
                      feasible=bool(s.feasible[row_index]), concurrency=s.concurrency(row_index),
                      figures=figures)

    def ranking(self, top: int = 10) -> list[Ranked]:
        """The launchable points best under the prior, best first (one per physics row)."""
        s = self.prior_surface
        score = np.where(self.usable(s, self.base), s.value, -1.0)
        out: list[Ranked] = []
        for row in descending(score):
            if score[row] <= 0 or len(out) >= top:
                break
            point = int(np.flatnonzero(self.table.phys_of == row)[0])
            out.append(self.ranked(point, s, int(row)))
        return out

    def prior_value(self, point: int) -> float | None:
        """The prior's predicted objective value of one point (0 when it predicts an SLO miss)."""
        row = int(self.table.phys_of[point])
        if row < 0:
            return None
        s = self.prior_surface
        return float(s.value[row]) if s.feasible[row] else 0.0

    def feasible_share(self) -> float:
        s = self.prior_surface
        launchable = self.table.phys_of >= 0
        ok = self.usable(s, self.base)
        good = np.zeros(len(self.table), dtype=bool)
        good[launchable] = ok[self.table.phys_of[launchable]]
        return float(good.mean()) if len(good) else 0.0

    def diverse_top(self, k: int, exclude: Sequence[int] = ()) -> list[int]:
        """The ``k`` best points under the prior, no two of one topology, MoE kernel and all2all.

        Within a class the best configuration without speculation is taken unless a speculative one is
        predicted :data:`SPECULATION_MARGIN` better: a speculative launch costs its control's launch too.
        """
        s = self.prior_surface
        score = np.where(self.usable(s, self.base), s.value, -1.0)
        phys = self.table.physics

        def base_key(row: int) -> tuple[object, ...]:
            return _class_key(self.table, row)[:-1]

        best: dict[tuple[object, ...], dict[bool, int]] = {}
        for row in descending(score):
            if score[row] <= 0:
                break
            per = best.setdefault(base_key(int(row)), {})
            per.setdefault(bool(phys.spec_k[row] > 0), int(row))
        taken = {base_key(int(self.table.phys_of[p])) for p in exclude if self.table.phys_of[p] >= 0}
        chosen: list[tuple[float, int]] = []
        for key, per in best.items():
            if key in taken:
                continue
            row = _plain_unless_speculation_pays(per, score)
            chosen.append((float(score[row]), row))
        chosen.sort(reverse=True)
        return [int(np.flatnonzero(self.table.phys_of == row)[0]) for _, row in chosen[:k]]

    def cell(self, row: int) -> tuple[object, object, object]:
        """(topology, MoE kernel, batching) of a physics row: the dimensions the first picks spread over."""
        phys = self.table.physics
        return (phys.configs[row].topology_name, phys.moe_field[row],
                (int(phys.max_num_seqs[row]), int(phys.max_batched_tokens[row])))

    def spread_top(self, k: int, exclude: Sequence[int] = (), differ_in: int = SPREAD_DIFFER_IN) -> list[int]:
        """The best ``k`` points under the prior, spread over topology × MoE kernel × batching.

        Greedy, best predicted first. The first pick is the model's best outside the cells of ``exclude``
        (the recipe baselines); each later one differs from every earlier pick and every point of
        ``exclude`` in at least ``differ_in`` of topology, MoE kernel and batching (max-num-seqs with
        max-num-batched-tokens), or, when none is left that does, in at least one. Within its cell a pick
        speculates only when predicted :data:`SPECULATION_MARGIN` better than without.
        """
        s = self.prior_surface
        score = np.where(self.usable(s, self.base), s.value, -1.0)
        phys = self.table.physics
        order = [int(r) for r in descending(score) if score[r] > 0]
        best: dict[tuple[object, ...], dict[bool, int]] = {}
        for row in order:
            best.setdefault(self.cell(row), {}).setdefault(bool(phys.spec_k[row] > 0), row)
        taken = [self.cell(int(self.table.phys_of[p])) for p in exclude if self.table.phys_of[p] >= 0]
        chosen: list[int] = []
        for need in sorted({differ_in, 1}, reverse=True):
            for cell, per in best.items():
                if len(chosen) >= k:
                    break
                here = need if chosen else 1
                if any(sum(a != b for a, b in zip(cell, other, strict=True)) < here
                       for other in taken + [self.cell(r) for r in chosen]):
                    continue
                chosen.append(_plain_unless_speculation_pays(per, score))
        return [int(np.flatnonzero(self.table.phys_of == r)[0]) for r in chosen]


def _encode(table: SpaceTable) -> np.ndarray:
    names = table.profile.param_names()
    codes = np.full((len(table), len(names)), -1, dtype=np.int64)
    maps: list[dict[str, int]] = [{} for _ in names]
    for i, params in enumerate(table.params):
        for j, name in enumerate(names):
            if name in params:
                codes[i, j] = maps[j].setdefault(str(params[name]), len(maps[j]))
    return codes


@dataclass(frozen=True)
class _Evaluation:
    """The corrected model on the pool and its draws on the candidates (cached until the next launch)."""

    points: np.ndarray
    """One point per candidate row."""
    values: np.ndarray
    """(draws, candidates): predicted objective value, 0 where a draw predicts a failure or an SLO miss."""
    mean_r: np.ndarray
    sd_r: np.ndarray
    p_fail: np.ndarray
    mean_surface: Surface
    coeffs: Coefficients


@dataclass
class _Launch:
    point: int
    observation: Observation | None
    value: float | None
    feasible: bool
    failure_class: str | None


@dataclass
class Guide:
    """The model-guided search of one study (see the module docstring)."""

    predictor: Predictor
    noise_sd: float = 0.03
    """Relative sd of one measurement: the stop estimate asks for a win larger than twice this."""
    draws: int = 16
    candidates: int = 300
    seed: int = 0
    residual_sd: float = 0.10
    residual_length: float = 2.0
    learn: bool = True
    """False: never refit (the prior's ranking alone, with the failure memory; an ablation for the benchmark)."""
    explore_when_distrusted: bool = True
    """False: keep ranking by the corrected model after it is distrusted (an ablation for the benchmark)."""
    second_spread: bool = True
    """Once distrusted, measure each competitive topology's speculative gain and the topologies never launched
    before refining (:func:`~tuner.predict.explore.second_spread`); False: an ablation for the benchmark."""
    launches: list[_Launch] = field(default_factory=list)
    correction: Correction | None = None
    trust: Trust = field(default_factory=Trust)
    _rng: np.random.Generator = field(init=False)
    _fitted: bool = field(init=False, default=False)
    _evaluation: _Evaluation | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self.correction = Correction.none(self.predictor.factors)

    # -- what happened ------------------------------------------------------------------------------
    def observe(self, point: int, *, concurrency: int | None, figures: Mapping[str, float | None] | None,
                value: float | None, feasible: bool, failure_class: str | None = None) -> None:
        """One launch's outcome: its figures at the reported concurrency, or the class of its failure."""
        row = int(self.predictor.table.phys_of[point])
        obs = None
        if figures and concurrency and row >= 0 and (figures.get("output_tok_s") or 0) > 0:
            obs = Observation(row=row, concurrency=int(concurrency), output_tok_s=figures.get("output_tok_s"),
                              ttft_p95_ms=figures.get("ttft_p95_ms"), itl_p95_ms=figures.get("itl_p95_ms"))
        if self.learn and row >= 0 and failure_class != FailureClass.INTERRUPTED.value:
            self._check(point, value if feasible else None, failure_class)
        self.launches.append(_Launch(point, obs, value, feasible, failure_class))
        self._fitted = False
        self._evaluation = None

    def _check(self, point: int, measured: float | None, failure_class: str | None) -> None:
        """Hold a launch's measurement against what the model stated before it (:class:`Trust`)."""
        predicted, sd, chance_ok = self.predictive(point)
        expected_to_pass = predicted > 0 and chance_ok >= 0.8 and self.p_fail_of(point) < 0.3
        surprise = expected_to_pass and measured is None and failure_class not in (None, "")
        self.trust.add(Residual(launch=len(self.launches) + 1, point=point, predicted=predicted, sd=sd,
                                measured=measured if measured and measured > 0 else None, surprise=surprise))

    def predictive(self, point: int, draws: int = 16) -> tuple[float, float, float]:
        """What the model states for ``point`` now: (predicted value, log-space sd, chance it runs within its SLOs).

        The sd joins the corrected model's posterior draws, the residual GP's sd at the point and the
        measurement noise the guide was told.
        """
        p = self.predictor
        row = int(p.table.phys_of[point])
        if row < 0:
            return 0.0, 1.0, 0.0
        correction = self.refit()
        sub = p.table.physics.take(np.array([row]))
        rng = np.random.default_rng((self.seed, len(self.launches), point))
        values = []
        for theta in correction.draws(rng, draws):
            c_s = apply(p.base, p.factors, theta)
            surf = evaluate(sub, coefficient_arrays(sub, c_s), p.objective)
            ok = bool(p.usable(surf, c_s, sub)[0])
            values.append(float(surf.value[0]) if ok else 0.0)
        good = np.array([v for v in values if v > 0])
        mean_r, sd_r = self._residual(np.array([point], dtype=np.int64))
        if values[0] <= 0 or good.size == 0:
            return 0.0, 1.0, float(good.size) / len(values)
        spread = float(np.std(np.log(good))) if good.size > 1 else PRIOR_SD
        sd = math.sqrt(spread ** 2 + float(sd_r[0]) ** 2 + self.noise_sd ** 2)
        return values[0] * math.exp(float(mean_r[0])), sd, float(good.size) / len(values)

    @property
    def launched_points(self) -> set[int]:
        return {launch.point for launch in self.launches}

    @property
    def best_value(self) -> float:
        values = [launch.value for launch in self.launches if launch.feasible and launch.value]
        return max(values) if values else 0.0

    # -- the model now -------------------------------------------------------------------------------------
    def refit(self) -> Correction:
        """Refit the correction to every launch with figures; cached until the next :meth:`observe`."""
        if self._fitted and self.correction is not None:
            return self.correction
        p = self.predictor
        obs = [launch.observation for launch in self.launches if launch.observation is not None]
        self.correction = (fit(p.table.physics, p.base, p.objective, obs, p.factors) if self.learn
                           else Correction.none(p.factors))
        self._fitted = True
        return self.correction

    def coefficients(self) -> Coefficients:
        return self.refit().coefficients(self.predictor.base)

    def _residual(self, rows_points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior (mean, sd) of log(measured / corrected) throughput at ``rows_points`` (point indices)."""
        p = self.predictor
        obs = [(launch.point, launch.observation) for launch in self.launches if launch.observation is not None]
        if not obs or not self.learn:
            return np.zeros(rows_points.size), np.full(rows_points.size, self.residual_sd)
        coeffs = self.coefficients()
        rows = np.array([o.row for _, o in obs])
        sub = p.table.physics.take(rows)
        conc = np.array([o.concurrency for _, o in obs], dtype=np.float64)
        predicted = wave_bench(sub, coefficient_arrays(sub, coeffs), p.objective.shape(conc)).output_tok_s
        y = np.log(np.array([o.output_tok_s for _, o in obs], dtype=np.float64) / np.maximum(predicted, 1e-9))
        x_obs = p.codes[[pt for pt, _ in obs]]
        # The residual's prior sd: at least what the corrected model still misses on the launches so far.
        spread = max(self.residual_sd, self.refit().rms_after)
        s2, noise2 = spread ** 2, self.noise_sd ** 2 + 0.02 ** 2

        def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            d = (a[:, None, :] != b[None, :, :]).sum(axis=2)
            return np.asarray(s2 * np.exp(-d / self.residual_length), dtype=np.float64)

        k_oo = kernel(x_obs, x_obs) + noise2 * np.eye(len(obs))
        k_co = kernel(p.codes[rows_points], x_obs)
        alpha = np.linalg.solve(k_oo, y)
        mean = k_co @ alpha
        v = np.linalg.solve(k_oo, k_co.T)
        var = np.clip(s2 - np.einsum("ij,ji->i", k_co, v), 1e-6, None)
        return mean, np.sqrt(var)

    def _p_fail(self, points: np.ndarray) -> np.ndarray:
        """Chance each point fails the way a launched neighbour did (numerics levers only, for a gate)."""
        p = self.predictor
        names = p.table.profile.param_names()
        numerics = np.array([n in NUMERICS_LEVERS for n in names])
        survive = np.ones(points.size)
        codes = p.codes[points]
        for launch in self.launches:
            cls = launch.failure_class
            if not cls or cls in (FailureClass.SLO_VIOLATED.value, FailureClass.INFEASIBLE.value,
                                  FailureClass.INTERRUPTED.value):
                continue
            if launch.observation is not None and cls not in (FailureClass.GUARD_FAILED.value,):
                continue
            base = p.codes[launch.point]
            levers = numerics if cls == FailureClass.GUARD_FAILED.value else np.ones(len(names), dtype=bool)
            if cls not in START_FAILURES | {FailureClass.GUARD_FAILED.value}:
                levers = np.ones(len(names), dtype=bool)
            d = (codes[:, levers] != base[levers]).sum(axis=1)
            survive *= 1.0 - 0.9 * np.exp(-2.0 * d)
        return 1.0 - survive

    def _evaluate(self) -> _Evaluation:
        """The corrected model on the pool, its draws on the candidates, the residual and failure terms."""
        if self._evaluation is not None:
            return self._evaluation
        p = self.predictor
        correction = self.refit()
        coeffs = correction.coefficients(p.base)
        mean_surface = p.surface_pool(coeffs)
        usable = p.usable(mean_surface, coeffs, p.pool_phys)
        launched_rows = {int(p.table.phys_of[launch.point]) for launch in self.launches}
        open_rows = np.array([int(r) not in launched_rows for r in p.pool])
        score = np.where(usable & open_rows, mean_surface.value, -1.0)
        order = descending(score)
        cand = [int(i) for i in order[: self.candidates] if score[i] > 0]
        classes: dict[tuple[object, ...], int] = {}
        for i in order:
            if score[i] <= 0:
                break
            key = _class_key(p.table, int(p.pool[i]))
            if classes.get(key, 0) < 2:
                classes[key] = classes.get(key, 0) + 1
                cand.append(int(i))
        cand_idx = np.array(sorted(set(cand)), dtype=np.int64)
        points = np.array([p.points_of_row[int(p.pool[i])][0] for i in cand_idx], dtype=np.int64)
        values = np.zeros((self.draws, cand_idx.size))
        thetas = correction.draws(self._rng, self.draws)
        sub = p.pool_phys.take(cand_idx) if cand_idx.size else p.pool_phys.take(np.zeros(0, dtype=np.int64))
        for s, theta in enumerate(thetas):
            if cand_idx.size == 0:
                break
            c_s = apply(p.base, p.factors, theta)
            surf = evaluate(sub, coefficient_arrays(sub, c_s), p.objective)
            ok = p.usable(surf, c_s, sub)
            values[s] = np.where(ok, surf.value, 0.0)
        mean_r, sd_r = self._residual(points) if points.size else (np.zeros(0), np.zeros(0))
        p_fail = self._p_fail(points) if points.size else np.zeros(0)
        self._evaluation = _Evaluation(points=points, values=values, mean_r=mean_r, sd_r=sd_r, p_fail=p_fail,
                                       mean_surface=mean_surface, coeffs=coeffs)
        return self._evaluation

    # -- decisions -------------------------------------------------------------------------------------------
    def next_point(self, exclude: Sequence[int] = ()) -> Choice | None:
        """The untried point with the largest expected improvement (None: the pool is exhausted).

        While the model is trusted, under the corrected model; once :attr:`trust` distrusts it, under the
        measurement-led GP (:func:`~tuner.predict.explore.explore`).
        """
        if self.learn and self.explore_when_distrusted and not self.trust.trusted:
            led = self._by_measurements(exclude)
            if led is not None:
                return led
        st = self._evaluate()
        points, values, mean_r, sd_r, p_fail = st.points, st.values, st.mean_r, st.sd_r, st.p_fail
        if points.size == 0:
            return None
        eps = self._rng.standard_normal(values.shape)
        samples = values * np.exp(mean_r + sd_r * eps)
        best = self.best_value
        ei = np.maximum(samples - best, 0.0).mean(axis=0) * (1.0 - p_fail)
        expected = values.mean(axis=0) * np.exp(mean_r) * (1.0 - p_fail)
        blocked = np.array([pt in self.launched_points or pt in set(exclude) for pt in points])
        # Improvement per launch: a speculative point whose control has not run costs two.
        launched = self.launched_points
        cost = np.array([2.0 if (pt in self.predictor.control_of and self.predictor.control_of[pt] not in launched)
                         else 1.0 for pt in points])
        ei = ei / cost
        ei = np.where(blocked, -1.0, ei)
        expected = np.where(blocked, -1.0, expected)
        pick = int(np.argmax(ei)) if ei.max() > 0 else int(np.argmax(expected))
        if blocked[pick]:
            return None
        return Choice(point=int(points[pick]), predicted=float(values[0, pick] * math.exp(mean_r[pick])),
                      expected_improvement=float(max(ei[pick], 0.0)), p_fail=float(p_fail[pick]))

    def _by_measurements(self, exclude: Sequence[int]) -> Choice | None:
        observed = [(launch.point, float(launch.value)) for launch in self.launches
                    if launch.feasible and launch.value and launch.value > 0]
        launched = self.launched_points
        control_of = self.predictor.control_of

        def cost(point: int) -> float:
            return 2.0 if point in control_of and control_of[point] not in launched else 1.0

        outcomes = self.outcomes()
        led_by = "spread"
        seats = self.seats()
        found = second_spread(self.predictor, self.coefficients(), observed, launched, self._p_fail, exclude=exclude,
                              cells=self.predictor.cells, seats=seats) \
            if self.second_spread and not self._refine_first() else None
        if found is None:
            led_by = "measurements"
            found = explore(self.predictor, self.coefficients(), observed, launched, self._p_fail, cost, self._rng,
                            noise_sd=self.noise_sd, exclude=exclude, outcomes=outcomes, cells=self.predictor.cells,
                            seats=seats)
        if found is None:
            return None
        return Choice(point=found.point, predicted=found.predicted, expected_improvement=found.expected_improvement,
                      p_fail=found.p_fail, led_by=led_by)

    def seats(self) -> dict[int, float]:
        """The running requests per DP rank each launch with figures measured at: its reported concurrency over
        its DP size, at most its ``max-num-seqs``."""
        phys = self.predictor.table.physics
        return {launch.point: min(
                    float(phys.max_num_seqs[obs.row]),
                    obs.concurrency / max(float(phys.dp[obs.row]), 1.0))
                for launch in self.launches if (obs := launch.observation) is not None}

    def outcomes(self) -> list[tuple[int, bool]]:
        """(point, gave no value) of every launch that ended on its own, for the measured failure rate
        (:func:`~tuner.predict.explore.failure_rate`). No value: it failed to start, crashed or failed a gate, or
        it missed an SLO at every step of its ladder: under the objective such a launch is worth nothing, and a
        latency the model under-predicts misses again at the neighbouring settings. Not counted: a point refused
        before launch (nothing ran) and an interrupted launch (nothing was learned)."""
        unlaunched = {FailureClass.INFEASIBLE.value, FailureClass.INTERRUPTED.value}
        return [(launch.point, not launch.feasible) for launch in self.launches
                if launch.failure_class not in unlaunched]

    def _refine_first(self) -> bool:
        """The last launch opened a cell (topology × speculation) and measured within :data:`SPREAD_PAUSE` of the
        best before it: the GP refines once there before the second spread goes on."""
        if not self.launches:
            return False
        last, earlier = self.launches[-1], self.launches[:-1]
        cells = self.predictor.cells
        if not last.feasible or not last.value or any(cells[e.point] == cells[last.point] for e in earlier):
            return False
        before = max((e.value or 0.0 for e in earlier if e.feasible), default=0.0)
        return last.value >= (1.0 - SPREAD_PAUSE) * before

    def p_fail_of(self, point: int) -> float:
        """The failure memory's chance that ``point`` fails as a launched neighbour did."""
        return float(self._p_fail(np.array([point], dtype=np.int64))[0])

    def chance_to_beat(self) -> float:
        """P(an untried point beats the best measured value by more than 2 × the noise), over model draws."""
        st = self._evaluate()
        points, values, mean_r, p_fail = st.points, st.values, st.mean_r, st.p_fail
        if values.size == 0:
            return 0.0
        open_ = np.array([pt not in self.launched_points for pt in points])
        best = self.best_value
        if best <= 0:
            return 1.0
        target = best * math.exp(2.0 * self.noise_sd)
        lifted = values * np.exp(mean_r) * np.where(p_fail > 0.5, 0.0, 1.0)
        lifted = np.where(open_, lifted, 0.0)
        return float((lifted.max(axis=1) > target).mean())

    def predicted(self, point: int) -> Ranked | None:
        """The corrected model's prediction for one point (for the report), None outside the model's space."""
        p = self.predictor
        row = int(p.table.phys_of[point])
        if row < 0:
            return None
        coeffs = self.coefficients()
        sub = p.table.physics.take(np.array([row]))
        s = evaluate(sub, coefficient_arrays(sub, coeffs), p.objective)
        return p.ranked(point, s, 0)

    def predicted_optimum(self) -> float:
        st = self._evaluate()
        surface, coeffs = st.mean_surface, st.coeffs
        ok = self.predictor.usable(surface, coeffs, self.predictor.pool_phys)
        return float(np.where(ok, surface.value, 0.0).max()) if ok.any() else 0.0


def _best_first(value_row: tuple[float, int]) -> tuple[float, int]:
    """Sort key: the larger value first, and of equal values the earlier row (:func:`descending`'s order)."""
    return -value_row[0], value_row[1]


def topology_of_point(table: SpaceTable, point: int) -> str:
    return str(table.params[point].get(TOPOLOGY_PARAM, ""))


def _plain_unless_speculation_pays(per: dict[bool, int], score: np.ndarray) -> int:
    """A cell's pick: its best row without speculation, or with it when predicted
    :data:`SPECULATION_MARGIN` better (``per``: speculates → the cell's best row so; one at least)."""
    plain, spec = per.get(False), per.get(True)
    if plain is None or (spec is not None and score[spec] > score[plain] * (1.0 + SPECULATION_MARGIN)):
        assert spec is not None
        return spec
    return plain
