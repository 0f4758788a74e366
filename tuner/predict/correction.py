"""Learn the residual, not the surface: refit the model's calibration constants to what the launches measured.

After each launch the ratio measured / predicted (output throughput, p95 TTFT, p95 ITL at the
concurrency the ladder reported) is explained by a few **correction factors**, each the multiplier
of one group of the model's constants:

- ``backend:<kernel>``: the MoE kernel's efficiency (``moe_mfu_marlin``, ``moe_mfu_humming`` …);
- ``topology:tp``: the TP allreduce's efficiency; ``topology:dp/<all2all>``: the DP/EP dispatch's,
  per all2all backend; ``topology:frontend``: the API server's cost per streamed token;
- ``speculation:<method>``: the draft's acceptance;
- ``node:weights``, ``node:kv``, ``node:compute``, ``node:elementwise``, ``node:host``: the node's
  memory streams, GEMM efficiency, per-token kernels and per-step host time.

A factor of 1.2 means that part of the node ran 20 % faster than the model said (for a cost, 20 %
cheaper). The fit is a regularised least squares in log space (each factor's prior: log-normal,
sd :data:`PRIOR_SD`, the spread a mis-calibrated model shows), robust (Huber) so that one launch the
model cannot explain does not drag every factor, and bounded (:data:`THETA_BOUND`); solved by
Gauss–Newton on the wave model (:mod:`tuner.predict.fluid`). Its Laplace covariance gives the
posterior draws the search and the stop estimate use. Pure numpy; a refit over a night's launches
takes well under a second.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.perfmodel import Coefficients
from tuner.predict.fluid import wave_bench
from tuner.predict.steptime import coefficient_arrays
from tuner.predict.surface import ObjectiveModel
from tuner.predict.table import Physics

__all__ = ["FIGURE_SD", "PRIOR_SD", "Correction", "Factor", "Observation", "apply", "factors_for", "fit"]

PRIOR_SD = 0.25
"""Prior sd of each factor's log: a constant the model has wrong by ±30 % sits near one sd."""
FIGURE_SD = {"output_tok_s": 0.05, "itl_p95_ms": 0.12, "ttft_p95_ms": 0.25}
"""Log-space sd of one measured figure around the model: launch noise plus what the wave model
cannot tell (its agreement with the scheduler, docs/search.md)."""
_FRACTION_CAP = 0.95
HUBER_K = 2.0
"""Residuals (in sd) past this count linearly: one launch the model cannot explain does not drag every factor."""
THETA_BOUND = 1.2
"""No factor moves further than e^±1.2 (×0.30 to ×3.3): past that the model is not mis-calibrated but wrong."""


@dataclass(frozen=True)
class Factor:
    """One correction factor: the constants it scales, and whether they are costs (divided) or rates."""

    name: str
    fields: tuple[str, ...]
    cost: bool = False


@dataclass(frozen=True)
class Observation:
    """What one launch measured, at the concurrency its ladder reported (None: it produced no figures)."""

    row: int
    """The launch's row in the table's physics."""
    concurrency: int
    output_tok_s: float | None
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None


def factors_for(phys: Physics) -> tuple[Factor, ...]:
    """The factors a table's launches can tell apart (a backend or all2all the space never runs has none)."""
    out = [Factor("node:weights", ("weight_stream_eff",)), Factor("node:kv", ("kv_read_eff",)),
           Factor("node:compute", ("dense_mfu", "attention_mfu")),
           Factor("node:elementwise", ("activation_stream_eff",)),
           Factor("node:host", ("host_step_s", "kernel_floor_s", "launch_s", "graph_replay_s"), cost=True)]
    for field in sorted(set(phys.moe_field)):
        out.append(Factor(f"backend:{field.removeprefix('moe_mfu_')}", (field,)))
    if (phys.tp > 1).any():
        out.append(Factor("topology:tp", ("allreduce_eff",)))
    names = {f.name for f in dataclasses.fields(Coefficients)}
    for backend in sorted({b for b, d in zip(phys.a2a_backend, phys.dp, strict=True) if d > 1}):
        field = f"a2a_eff_{backend}" if f"a2a_eff_{backend}" in names else "a2a_eff_other"
        out.append(Factor(f"topology:dp/{backend}", (field,)))
    if (phys.api_servers == 1).any():
        out.append(Factor("topology:frontend", ("frontend_token_s",), cost=True))
    for method in sorted({m for m in phys.spec_method if m}):
        field = f"accept_{method}" if f"accept_{method}" in names else "accept_other"
        out.append(Factor(f"speculation:{method}", (field,)))
    return tuple(out)


def apply(base: Coefficients, factors: Sequence[Factor], theta: np.ndarray) -> Coefficients:
    """``base`` with each factor's constants multiplied by exp(θ) (costs divided by it)."""
    values: dict[str, float] = {}
    for factor, t in zip(factors, theta, strict=True):
        scale = math.exp(float(t))
        for field in factor.fields:
            current = values.get(field, float(getattr(base, field)))
            new = current / scale if factor.cost else current * scale
            if (field.endswith(("_eff", "_mfu")) or "_mfu_" in field or "_eff_" in field
                    or field.startswith("accept_")):
                new = min(new, _FRACTION_CAP)
            values[field] = new
    return dataclasses.replace(base, **values)


@dataclass(frozen=True)
class Correction:
    """The fitted factors (log scale), their covariance, and how well the fit explains the launches."""

    factors: tuple[Factor, ...]
    theta: np.ndarray
    cov: np.ndarray
    observations: int
    rms_before: float
    """RMS of log(measured / predicted) throughput under the prior."""
    rms_after: float

    @classmethod
    def none(cls, factors: tuple[Factor, ...]) -> Correction:
        n = len(factors)
        return cls(factors, np.zeros(n), np.eye(n) * PRIOR_SD ** 2, 0, 0.0, 0.0)

    def coefficients(self, base: Coefficients) -> Coefficients:
        return apply(base, self.factors, self.theta)

    def draws(self, rng: np.random.Generator, n: int) -> list[np.ndarray]:
        """``n`` posterior draws of θ; the first is the fit itself."""
        out = [self.theta]
        if n > 1:
            out += list(rng.multivariate_normal(self.theta, self.cov, size=n - 1, method="eigh"))
        return out

    def table(self) -> list[dict[str, float | str]]:
        """Each factor: multiplier and its 68 % interval (for the report)."""
        sd = np.sqrt(np.clip(np.diag(self.cov), 0.0, None))
        return [{"factor": f.name, "multiplier": round(math.exp(t), 3), "low": round(math.exp(t - s), 3),
                 "high": round(math.exp(t + s), 3), "constants": ", ".join(f.fields)}
                for f, t, s in zip(self.factors, self.theta, sd, strict=True)]


_FIGURES = ("output_tok_s", "ttft_p95_ms", "itl_p95_ms")


def _predict(sub: Physics, base: Coefficients, factors: Sequence[Factor], theta: np.ndarray, model: ObjectiveModel,
             concurrencies: np.ndarray) -> np.ndarray:
    """(observations, figures) predicted at each observation's concurrency (``sub``: their rows)."""
    coeffs = apply(base, factors, theta)
    figs = wave_bench(sub, coefficient_arrays(sub, coeffs), model.shape(concurrencies))
    return np.stack([getattr(figs, name) for name in _FIGURES], axis=1)


def fit(phys: Physics, base: Coefficients, model: ObjectiveModel, observations: Sequence[Observation],
        factors: tuple[Factor, ...] | None = None, *, prior_sd: float = PRIOR_SD, iterations: int = 8) -> Correction:
    """The factors that best explain ``observations`` (those with figures), starting from ``base``."""
    factors = factors if factors is not None else factors_for(phys)
    usable = [o for o in observations if o.output_tok_s and o.output_tok_s > 0]
    if not usable:
        return Correction.none(factors)
    rows = np.array([o.row for o in usable], dtype=np.int64)
    conc = np.array([o.concurrency for o in usable], dtype=np.int64)
    measured = np.full((len(usable), len(_FIGURES)), np.nan)
    for i, o in enumerate(usable):
        for j, name in enumerate(_FIGURES):
            value = getattr(o, name)
            if value is not None and value > 0 and math.isfinite(value):
                measured[i, j] = value
    mask = np.isfinite(measured)
    log_y = np.log(np.where(mask, measured, 1.0))
    sd = np.array([FIGURE_SD[name] for name in _FIGURES])
    n = len(factors)

    sub = phys.take(rows)

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = _predict(sub, base, factors, theta, model, conc)
        r = (log_y - np.log(np.maximum(pred, 1e-12))) / sd
        # Latencies answer to costs with the opposite sign; both enter as log ratios.
        return np.concatenate([r[mask], theta / prior_sd])

    n_data = int(mask.sum())

    def weights(r: np.ndarray) -> np.ndarray:
        """Huber weights on the data part (a measurement far off the model counts linearly, not squared)."""
        w = np.ones(r.size)
        data = np.abs(r[:n_data])
        w[:n_data] = np.where(data <= HUBER_K, 1.0, HUBER_K / np.maximum(data, 1e-12))
        return w

    def loss(r: np.ndarray) -> float:
        data = np.abs(r[:n_data])
        huber = np.where(data <= HUBER_K, 0.5 * data ** 2, HUBER_K * data - 0.5 * HUBER_K ** 2)
        return float(huber.sum() + 0.5 * (r[n_data:] ** 2).sum())

    theta = np.zeros(n)
    r = residuals(theta)
    rms_before = _rms_throughput(r, mask, sd)
    lam = 1e-3
    jac = np.zeros((r.size, n))
    for _ in range(iterations):
        h = 0.02
        for j in range(n):
            step = theta.copy()
            step[j] += h
            jac[:, j] = (residuals(step) - r) / h
        w = weights(r)
        grad = jac.T @ (w * r)
        hess = jac.T @ (w[:, None] * jac)
        improved = False
        delta = np.zeros(n)
        for _try in range(6):
            delta = np.linalg.solve(hess + lam * np.diag(np.diag(hess) + 1e-9), -grad)
            candidate = np.clip(theta + delta, -THETA_BOUND, THETA_BOUND)
            r_new = residuals(candidate)
            if loss(r_new) < loss(r):
                theta, r = candidate, r_new
                lam = max(lam / 3.0, 1e-6)
                improved = True
                break
            lam *= 5.0
        if not improved or float(np.max(np.abs(delta))) < 1e-3:
            break
    w = weights(r)
    cov = np.linalg.inv(jac.T @ (w[:, None] * jac) + 1e-9 * np.eye(n))
    return Correction(factors=factors, theta=theta, cov=cov, observations=len(usable), rms_before=rms_before,
                      rms_after=_rms_throughput(r, mask, sd))


def _rms_throughput(r: np.ndarray, mask: np.ndarray, sd: np.ndarray) -> float:
    """RMS of the throughput log-ratios inside a residual vector (first figure column of the masked part)."""
    flat_cols = np.nonzero(mask)[1]
    thr = r[: flat_cols.size][flat_cols == 0] * sd[0]
    return float(np.sqrt(np.mean(thr ** 2))) if thr.size else 0.0
