"""Search by the measurements once the model is not trusted: a GP on what the model gets wrong, and the
neighbours of the best launches.

When :class:`~tuner.predict.trust.Trust` says the model's errors are larger than it states, the corrected
model stops ranking the space. The next launch is chosen by expected improvement under a Gaussian
process on ``log(measured value)`` whose prior mean is the corrected model's prediction and whose
amplitude is what the model actually missed by (at least :data:`AMPLITUDE_FLOOR`): where launches have
measured, the measurements lead; far from them, the model still says where to look, with the spread it
has earned. Candidates are the model's best untried rows and every configuration within
:data:`NEIGHBOUR_DISTANCE` levers of the best measured launches, whether the model ranks them or not
(a model that is wrong about a lever cannot keep its better setting out of reach).

A model that is wrong is often wrong about a whole **cell**, a topology with or without speculative
decoding (a hybrid TP × DP the model undervalues, drafts that pay more on one topology than it says).
So the candidates also hold the model's best few configurations of every cell, the neighbours of the best
launch of every cell that measured within reach of the best, and the speculative twins of every
launch that ran, at its own token budget and at the one their drafts need (:func:`twin_budget`; at its own
budget the control has run: one launch). In the GP's distance a different topology or
draft count weighs :data:`CELL_WEIGHT` levers: what was measured in one cell says less about another, so
a cell nobody launched keeps the model's uncertainty and its expected improvement. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.perfmodel import Coefficients
from tuner.predict.steptime import coefficient_arrays
from tuner.predict.surface import evaluate
from tuner.predict.table import descending
from tuner.search.profile import DISAGG_PARAM, DRAFT_TOKENS_PARAM, TOPOLOGY_PARAM
from tuner.search.space import build_config

__all__ = ["AMPLITUDE_FLOOR", "BUDGET_PARAM", "CELL_SD", "CELL_WEIGHT", "NEIGHBOUR_DISTANCE", "Explored", "ResidualGP",
           "cell_codes", "cell_of", "explore", "lever_weights", "second_spread", "speculative_twins", "twin_budget"]

AMPLITUDE_FLOOR = 0.2
"""Log-space sd of the GP's departure from the model, at least: the model was found wrong by more than it said."""
NOISE_FLOOR = 0.05
"""A measurement's log sd, at least, once the model is distrusted (the told noise may be wrong too)."""
NEIGHBOUR_DISTANCE = 2
NEIGHBOURS_OF = 3
MODEL_CANDIDATES = 200
CELL_CANDIDATES = 3
"""The model's best untried configurations of each cell (topology × speculation) that are candidates."""
CELL_WEIGHT = 3.0
"""Levers a different topology or draft count counts for in the GP's distance (one for any other lever)."""
CELL_SD = 0.3
"""Log-space sd of how far the corrected model may be off for a whole cell (one offset shared by the cell's
configurations: a speculative gain, a topology's communication); one launch in a cell measures it for all."""
CELL_REACH = 0.7
"""A cell whose best launch measured at least this share of the best launch has its neighbours searched."""
SPREAD_REACH = 0.6
"""The second spread measures the speculative twin of a topology's best launch when that launch measured at least
this share of the best launch: a speculative gain of up to 1 / 0.6, about 1.7 times, could still win."""
SPREAD_FAIL = 0.5
"""The second spread skips a configuration the failure memory gives at least this chance to fail."""
BUDGET_PARAM = "max-num-batched-tokens"
LENGTH = 1.5
DRAWS = 64
FAILURE_PRIOR_RATE = 0.1
FAILURE_TEMPER = 0.5
"""Naive Bayes multiplies levers as if independent; the square root keeps its odds from running away."""


@dataclass(frozen=True)
class Explored:
    point: int
    predicted: float
    """The GP's posterior mean of the objective value."""
    expected_improvement: float
    p_fail: float


class _Model:
    """The corrected model's value for any table point (0 where it predicts a failure or an SLO miss)."""

    def __init__(self, predictor: object, coeffs: Coefficients) -> None:
        self.p = predictor
        self.coeffs = coeffs
        self.cache: dict[int, float] = {}

    def values(self, points: np.ndarray) -> np.ndarray:
        p = self.p
        table = p.table  # type: ignore[attr-defined]
        rows = table.phys_of[points]
        todo = sorted({int(r) for r in rows if r >= 0 and int(r) not in self.cache})
        if todo:
            sub = table.physics.take(np.array(todo, dtype=np.int64))
            surface = evaluate(sub, coefficient_arrays(sub, self.coeffs), p.objective)  # type: ignore[attr-defined]
            ok = p.usable(surface, self.coeffs, sub)  # type: ignore[attr-defined]
            for r, v, good in zip(todo, surface.value, ok, strict=True):
                self.cache[r] = float(v) if good else 0.0
        return np.array([self.cache.get(int(r), 0.0) if r >= 0 else 0.0 for r in rows])


def failure_rate(codes: np.ndarray, outcomes: Sequence[tuple[int, bool]], points: np.ndarray) -> np.ndarray:
    """Chance each of ``points`` fails to run, from the launches so far (``outcomes``: (point, failed)).

    A tempered naive Bayes over lever settings: each setting's share among the launches that failed
    against its share among those that ran (Laplace-smoothed), multiplied over the levers, the product
    taken to the power :data:`FAILURE_TEMPER`. A failure under load follows a few settings together
    (high memory utilisation with a dispatch buffer, say) whatever the other levers are, which a distance
    over every lever cannot see.
    """
    if not outcomes:
        return np.zeros(points.size)
    pts = np.array([pt for pt, _ in outcomes], dtype=np.int64)
    failed = np.array([f for _, f in outcomes], dtype=bool)
    n_fail, n_ok = int(failed.sum()), int((~failed).sum())
    if n_fail == 0:
        return np.zeros(points.size)
    prior = (n_fail + FAILURE_PRIOR_RATE) / (failed.size + 1.0)
    log_odds = np.full(points.size, np.log(prior / (1.0 - prior)))
    cand = codes[points]
    for j in range(codes.shape[1]):
        values = codes[pts, j]
        levels = max(int(codes[:, j].max()) + 2, 2)  # -1 (the lever is off) shifts to 0
        fail_counts = np.bincount(values[failed] + 1, minlength=levels)
        ok_counts = np.bincount(values[~failed] + 1, minlength=levels)
        mine = cand[:, j] + 1
        p_fail = (fail_counts[mine] + 1.0) / (n_fail + levels)
        p_ok = (ok_counts[mine] + 1.0) / (n_ok + levels)
        log_odds += FAILURE_TEMPER * np.log(p_fail / p_ok)
    return np.asarray(1.0 / (1.0 + np.exp(-log_odds)))


def explore(predictor: object, coeffs: Coefficients, observed: Sequence[tuple[int, float]], launched: set[int],
            p_fail: Callable[[np.ndarray], np.ndarray], cost: Callable[[int], float], rng: np.random.Generator, *,
            noise_sd: float, exclude: Sequence[int] = (), outcomes: Sequence[tuple[int, bool]] = (),
            cells: np.ndarray | None = None, seats: Mapping[int, float] | None = None) -> Explored | None:
    """The next launch by expected improvement under the measurement-led GP (None: nothing to measure from).

    ``observed``: (point, measured objective value) of every launch that met the SLOs; ``launched``: every
    point launched (failed ones too); ``p_fail``: the failure memory's chance per point; ``cost``: launches a
    point takes (a speculative point whose control has not run costs two); ``outcomes``: (point, gave no value:
    failed, or missed an SLO) of every launch, for the measured failure rate (:func:`failure_rate`); ``cells``:
    the cell of every table point as one integer (:func:`cell_codes`; computed when not given); ``seats``: the
    running requests per DP rank each launch measured at, for its speculative twins' token budget
    (:func:`twin_budget`: the twins at the launch's own budget are candidates too).
    """
    if not observed:
        return None
    table = predictor.table  # type: ignore[attr-defined]
    codes: np.ndarray = predictor.codes  # type: ignore[attr-defined]
    model = _Model(predictor, coeffs)
    obs_points = np.array([pt for pt, _ in observed], dtype=np.int64)
    y = np.log(np.array([v for _, v in observed], dtype=np.float64))
    floor = float(y.min()) - 0.7

    def prior_mean(points: np.ndarray) -> np.ndarray:
        v = model.values(points)
        return np.where(v > 0, np.log(np.maximum(v, 1e-9)), floor)

    # candidates: near the best launches, the model's best untried rows, and the same for every cell
    blocked = launched | set(exclude)
    cells = cell_codes(table) if cells is None else cells
    near = _near_best(codes, cells, obs_points, y)
    pool_points: np.ndarray = predictor.pool_points  # type: ignore[attr-defined]
    pool_values = model.values(pool_points)
    order = descending(pool_values)
    ranked = pool_points[order]
    top = [int(q) for q in ranked if int(q) not in blocked][:MODEL_CANDIDATES]
    per_cell: dict[int, int] = {}
    for q, value in zip(ranked, pool_values[order], strict=True):
        if value <= 0 or int(q) in blocked or per_cell.get(int(cells[q]), 0) >= CELL_CANDIDATES:
            continue
        per_cell[int(cells[q])] = per_cell.get(int(cells[q]), 0) + 1
        top.append(int(q))
    twins = {t for pt in obs_points for held in (None, (seats or {}).get(int(pt)))
             for t in speculative_twins(table, int(pt), held)}
    cand = np.array(sorted((near | set(top) | twins) - blocked), dtype=np.int64)
    cand = cand[~table.prunable[cand]] if cand.size else cand
    if cand.size == 0:
        return None
    # the GP on log(measured) around the model
    m_obs = prior_mean(obs_points)
    m_c = prior_mean(cand)
    resid = y - m_obs
    amp2 = max(AMPLITUDE_FLOOR, float(np.sqrt(np.mean(resid ** 2)))) ** 2
    noise2 = max(noise_sd, NOISE_FLOOR) ** 2

    gp = ResidualGP(codes, cells, lever_weights(table), amp2, noise2)
    mu_r, sd = gp.posterior(obs_points, resid, cand)
    mu = m_c + mu_r
    # the incumbent: the best launch as the GP smooths it (one lucky measurement is not the bar)
    mu_obs = m_obs + gp.smoothed(obs_points, resid)
    best = float(np.exp(mu_obs.max()))
    eps = rng.standard_normal((DRAWS, cand.size))
    gain = np.maximum(np.exp(mu + sd * eps) - best, 0.0).mean(axis=0)
    fail = np.maximum(p_fail(cand), failure_rate(codes, outcomes, cand))
    costs = np.array([cost(int(q)) for q in cand])
    score = gain * (1.0 - fail) / costs
    pick = int(np.argmax(score)) if score.max() > 0 else int(np.argmax(mu - 10.0 * fail))
    return Explored(point=int(cand[pick]), predicted=float(np.exp(mu[pick])),
                    expected_improvement=float(score[pick]), p_fail=float(fail[pick]))


@dataclass(frozen=True)
class ResidualGP:
    """A GP on what the model gets wrong (log measured − log model) over the table's points.

    Its kernel joins a local term, ``amp2 · exp(−d / LENGTH)`` with ``d`` the weighted count of levers that
    differ (:func:`lever_weights`), and a cell term, ``CELL_SD² · [same cell]``: one offset shared by every
    configuration of a topology × speculation cell, so one launch in a cell moves the whole cell.
    """

    codes: np.ndarray
    cells: np.ndarray
    weights: np.ndarray
    amp2: float
    noise2: float

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = ((self.codes[a][:, None, :] != self.codes[b][None, :, :]) * self.weights).sum(axis=2)
        same_cell = self.cells[a][:, None] == self.cells[b][None, :]
        return np.asarray(self.amp2 * np.exp(-d / LENGTH) + CELL_SD ** 2 * same_cell, dtype=np.float64)

    def _solve(self, obs: np.ndarray, resid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k_oo = self.kernel(obs, obs) + self.noise2 * np.eye(obs.size)
        return k_oo, np.linalg.solve(k_oo, resid)

    def posterior(self, obs: np.ndarray, resid: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of the residual at ``points``, given ``resid`` measured at ``obs``."""
        k_oo, alpha = self._solve(obs, resid)
        k_co = self.kernel(points, obs)
        var = self.amp2 + CELL_SD ** 2 - np.einsum("ij,ji->i", k_co, np.linalg.solve(k_oo, k_co.T))
        return k_co @ alpha, np.sqrt(np.clip(var, 1e-6, None))

    def smoothed(self, obs: np.ndarray, resid: np.ndarray) -> np.ndarray:
        """The residual at the launches themselves, with the measurement noise taken out."""
        k_oo, alpha = self._solve(obs, resid)
        return np.asarray((k_oo - self.noise2 * np.eye(obs.size)) @ alpha)


def cell_of(params: Mapping[str, object]) -> tuple[object, bool]:
    """A configuration's cell: its topology (or prefill/decode layout) and whether it speculates."""
    where = params.get(TOPOLOGY_PARAM, params.get(DISAGG_PARAM))
    return where, int(params.get(DRAFT_TOKENS_PARAM, 0) or 0) > 0  # type: ignore[call-overload]


def cell_codes(table: object) -> np.ndarray:
    """The cell of every point of ``table`` as a small integer (:func:`cell_of`)."""
    index: dict[tuple[object, bool], int] = {}
    params = table.params  # type: ignore[attr-defined]
    return np.array([index.setdefault(cell_of(p), len(index)) for p in params], dtype=np.int64)


def lever_weights(table: object) -> np.ndarray:
    """Each lever's weight in the GP's distance: :data:`CELL_WEIGHT` for topology, layout and draft count."""
    names = table.profile.param_names()  # type: ignore[attr-defined]
    heavy = {TOPOLOGY_PARAM, DISAGG_PARAM, DRAFT_TOKENS_PARAM}
    return np.array([CELL_WEIGHT if n in heavy else 1.0 for n in names])


def speculative_twins(table: object, point: int, seats: float | None = None) -> list[int]:
    """The points that are ``point`` with each draft count the profile offers (``point`` without drafts), but
    those the feasibility model refuses.

    With ``seats`` (the running requests per DP rank ``point`` measured at), each twin takes the token budget its
    drafts need (:func:`twin_budget`) instead of ``point``'s own."""
    params = table.params[point]  # type: ignore[attr-defined]
    profile = table.profile  # type: ignore[attr-defined]
    if cell_of(params)[1] or profile.speculative is None:
        return []
    out = []
    for drafts in profile.speculative.draft_tokens.choices or ():
        if int(drafts) <= 0:
            continue
        twin = {**params, DRAFT_TOKENS_PARAM: drafts}
        if seats is not None and BUDGET_PARAM in params:
            twin[BUDGET_PARAM] = twin_budget(table, point, int(drafts), seats)
        key = build_config(profile, twin).key()
        found = table.index_of.get(key)  # type: ignore[attr-defined]
        if found is not None and not table.prunable[found]:  # type: ignore[attr-defined]
            out.append(int(found))
    return out


def twin_budget(table: object, point: int, drafts: int, seats: float) -> int:
    """The token budget (``max-num-batched-tokens``) a speculative twin of ``point`` needs at ``seats`` running
    requests per DP rank.

    vLLM's scheduler charges every running request its draft tokens too (``num_tokens_with_spec``: 1 + drafts
    a step), and the prompts pass through the same budget: at least ``prompt / output`` tokens a step for each
    running request, as for the control (more when drafts are accepted and requests finish sooner):
    ``seats × (1 + drafts + prompt / output)``. A twin that keeps its control's budget can be starved of prefill
    where the control was not. The smallest offered budget that holds it, never below ``point``'s own; the
    largest offered where none does."""
    params = table.params[point]  # type: ignore[attr-defined]
    own = int(params[BUDGET_PARAM])
    lever = table.profile.lever(BUDGET_PARAM)  # type: ignore[attr-defined]
    choices = sorted(int(c) for c in (lever.choices if lever is not None and lever.choices else [own]))
    workload = table.workload  # type: ignore[attr-defined]
    need = seats * (1.0 + drafts + workload.input_len / max(workload.output_len, 1))
    fits = [c for c in choices if c >= max(own, need)]
    return fits[0] if fits else max(own, choices[-1])


def _near_best(codes: np.ndarray, cells: np.ndarray, obs_points: np.ndarray, y: np.ndarray) -> set[int]:
    """Every point within :data:`NEIGHBOUR_DISTANCE` levers of the :data:`NEIGHBOURS_OF` best launches, and of
    the best launch of every cell that measured at least :data:`CELL_REACH` of the best."""
    order = descending(y)
    centres = [int(pt) for pt in obs_points[order][:NEIGHBOURS_OF]]
    seen: set[int] = set()
    for i in order:
        cell = int(cells[obs_points[i]])
        if cell not in seen and y[i] >= y.max() + np.log(CELL_REACH):
            seen.add(cell)
            centres.append(int(obs_points[i]))
    near: set[int] = set()
    for pt in dict.fromkeys(centres):
        d = (codes != codes[pt]).sum(axis=1)
        near.update(int(q) for q in np.flatnonzero((d > 0) & (d <= NEIGHBOUR_DISTANCE)))
    return near


def second_spread(predictor: object, coeffs: Coefficients, observed: Sequence[tuple[int, float]], launched: set[int],
                  p_fail: Callable[[np.ndarray], np.ndarray], *, exclude: Sequence[int] = (),
                  cells: np.ndarray | None = None, seats: Mapping[int, float] | None = None) -> Explored | None:
    """The next launch of the second spread, once the model is distrusted (None: the spread is done).

    A model found wrong is least to be believed where it has no measurement: the speculative gain of a
    topology (it rests on an acceptance rate only a launch measures) and the topologies it ranked too low
    to launch. So before the GP refines, the guide measures, best first:

    - for every topology whose best launch measured at least :data:`SPREAD_REACH` of the best launch and
      that has no speculative launch yet: that launch's speculative twin (one launch where its control has
      run, two where its budget is raised), with the draft count the corrected model prefers (the fewest when
      it prefers none), and the token budget those drafts need at the running requests that launch measured
      (``seats``, per DP rank: :func:`twin_budget`; its own budget when not known);
    - for every topology never launched whose best configuration under the corrected model could still win
      by what the model has been off so far: its prediction, times the launches' mean measured / predicted
      ratio, within ``exp(−2 sd)`` of the best launch, ``sd`` the spread of the launches' log ratios (at least
      :data:`AMPLITUDE_FLOOR`). A node slower everywhere than the model says moves every prediction alike
      and makes no unlaunched topology likelier to win; a model wrong by topology does.

    A configuration the failure memory gives :data:`SPREAD_FAIL` or more to fail is skipped.
    """
    if not observed:
        return None
    table = predictor.table  # type: ignore[attr-defined]
    cells = cell_codes(table) if cells is None else cells
    model = _Model(predictor, coeffs)
    best = max(v for _, v in observed)
    points = np.array([pt for pt, _ in observed], dtype=np.int64)
    predicted_obs = model.values(points)
    ran = predicted_obs > 0
    errors = np.log(np.array([v for _, v in observed])[ran] / predicted_obs[ran])
    bias = float(errors.mean()) if errors.size else 0.0
    off_by = max(AMPLITUDE_FLOOR, float(errors.std()) if errors.size > 1 else 0.0)
    blocked = launched | set(exclude)
    tried = {cell_of(table.params[pt]) for pt in launched}
    best_launch: dict[object, tuple[float, int]] = {}
    for pt, value in observed:
        where, speculates = cell_of(table.params[pt])
        if not speculates and value > best_launch.get(where, (0.0, -1))[0]:
            best_launch[where] = (value, pt)
    options: list[tuple[float, int]] = []
    for where, (value, pt) in best_launch.items():
        if value < SPREAD_REACH * best or (where, True) in tried:
            continue
        twins = [t for t in speculative_twins(table, pt, (seats or {}).get(pt)) if t not in blocked]
        if twins:
            predicted = model.values(np.array(twins, dtype=np.int64))
            options.append((value, twins[int(np.argmax(predicted))] if predicted.max() > 0 else twins[0]))
    topologies = {where for where, _ in tried}
    pool_points: np.ndarray = predictor.pool_points  # type: ignore[attr-defined]
    pool_values = model.values(pool_points)
    best_new: dict[object, tuple[float, int]] = {}
    for pt, value in zip(pool_points, pool_values, strict=True):
        where, speculates = cell_of(table.params[int(pt)])
        if (speculates or where in topologies or int(pt) in blocked or table.prunable[pt]
                or value * np.exp(bias + 2.0 * off_by) < best):
            continue
        if value > best_new.get(where, (0.0, -1))[0]:
            best_new[where] = (float(value), int(pt))
    options += list(best_new.values())
    for _value, pt in sorted(options, key=lambda vp: (-vp[0], vp[1])):
        fail = float(p_fail(np.array([pt], dtype=np.int64))[0])
        if fail < SPREAD_FAIL:
            return Explored(point=pt, predicted=float(model.values(np.array([pt]))[0]), expected_improvement=0.0,
                            p_fail=fail)
    return None
