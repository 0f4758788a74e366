"""Search by the measurements once the model is not trusted: a GP on what the model gets wrong, and the
neighbours of the best launches.

When :class:`~tuner.predict.trust.Trust` says the model's errors are larger than it states, the corrected
model stops ranking the space. The next launch is chosen by expected improvement under a Gaussian
process on ``log(measured value)`` whose prior mean is the corrected model's prediction and whose
amplitude is what the model actually missed by (at least :data:`AMPLITUDE_FLOOR`): where launches have
measured, the measurements lead; far from them, the model still says where to look, with the spread it
has earned. Candidates are the model's best untried rows and every configuration within
:data:`NEIGHBOUR_DISTANCE` levers of the best measured launches, whether the model ranks them or not
(a model that is wrong about a lever cannot keep its better setting out of reach). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.perfmodel import Coefficients
from tuner.predict.steptime import coefficient_arrays
from tuner.predict.surface import evaluate

__all__ = ["AMPLITUDE_FLOOR", "NEIGHBOUR_DISTANCE", "Explored", "explore"]

AMPLITUDE_FLOOR = 0.2
"""Log-space sd of the GP's departure from the model, at least: the model was found wrong by more than it said."""
NOISE_FLOOR = 0.05
"""A measurement's log sd, at least, once the model is distrusted (the told noise may be wrong too)."""
NEIGHBOUR_DISTANCE = 2
NEIGHBOURS_OF = 3
MODEL_CANDIDATES = 200
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
            noise_sd: float, exclude: Sequence[int] = (), outcomes: Sequence[tuple[int, bool]] = ()) -> Explored | None:
    """The next launch by expected improvement under the measurement-led GP (None: nothing to measure from).

    ``observed``: (point, measured objective value) of every launch that met the SLOs; ``launched``: every
    point launched (failed ones too); ``p_fail``: the failure memory's chance per point; ``cost``: launches a
    point takes (a speculative point whose control has not run costs two); ``outcomes``: (point, failed to
    run) of every launch, for the measured failure rate (:func:`failure_rate`).
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

    # candidates: near the best launches, and the model's best untried rows
    blocked = launched | set(exclude)
    near: set[int] = set()
    for pt in obs_points[np.argsort(-y)][:NEIGHBOURS_OF]:
        d = (codes != codes[pt]).sum(axis=1)
        near.update(int(q) for q in np.flatnonzero((d > 0) & (d <= NEIGHBOUR_DISTANCE)))
    pool_points = np.array([predictor.points_of_row[int(r)][0]  # type: ignore[attr-defined]
                            for r in predictor.pool], dtype=np.int64)  # type: ignore[attr-defined]
    pool_values = model.values(pool_points)
    ranked = pool_points[np.argsort(-pool_values)]
    top = [int(q) for q in ranked if int(q) not in blocked][:MODEL_CANDIDATES]
    cand = np.array(sorted((near | set(top)) - blocked), dtype=np.int64)
    cand = cand[~table.prunable[cand]] if cand.size else cand
    if cand.size == 0:
        return None
    # the GP on log(measured) around the model
    m_obs = prior_mean(obs_points)
    m_c = prior_mean(cand)
    resid = y - m_obs
    amp2 = max(AMPLITUDE_FLOOR, float(np.sqrt(np.mean(resid ** 2)))) ** 2
    noise2 = max(noise_sd, NOISE_FLOOR) ** 2

    def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d = (codes[a][:, None, :] != codes[b][None, :, :]).sum(axis=2)
        return np.asarray(amp2 * np.exp(-d / LENGTH), dtype=np.float64)

    k_oo = kernel(obs_points, obs_points) + noise2 * np.eye(obs_points.size)
    alpha = np.linalg.solve(k_oo, resid)
    k_co = kernel(cand, obs_points)
    mu = m_c + k_co @ alpha
    var = np.clip(amp2 - np.einsum("ij,ji->i", k_co, np.linalg.solve(k_oo, k_co.T)), 1e-6, None)
    sd = np.sqrt(var)
    # the incumbent: the best launch as the GP smooths it (one lucky measurement is not the bar)
    mu_obs = m_obs + (k_oo - noise2 * np.eye(obs_points.size)) @ alpha
    best = float(np.exp(mu_obs.max()))
    eps = rng.standard_normal((DRAWS, cand.size))
    gain = np.maximum(np.exp(mu + sd * eps) - best, 0.0).mean(axis=0)
    fail = np.maximum(p_fail(cand), failure_rate(codes, outcomes, cand))
    costs = np.array([cost(int(q)) for q in cand])
    score = gain * (1.0 - fail) / costs
    pick = int(np.argmax(score)) if score.max() > 0 else int(np.argmax(mu - 10.0 * fail))
    return Explored(point=int(cand[pick]), predicted=float(np.exp(mu[pick])),
                    expected_improvement=float(score[pick]), p_fail=float(fail[pick]))
