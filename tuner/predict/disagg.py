"""What a closed-loop benchmark measures on a prefill/decode layout: two pools and the link between them (issue 27).

The wave model (:mod:`tuner.predict.fluid`) describes one server whose steps mix prefill chunks into decode.
A layout separates them: a request is prefilled by the prefill pool (which emits its first token), its
KV moves over the node's link, and the decode pool computes the last prompt token and decodes the rest.
For ``c`` clients sending prompts of ``I`` tokens for ``O`` out, on a layout whose prefill pool runs ``P``
engines (DP × instances) and decode pool ``D``:

- **prefill**: an engine prefills ``B`` tokens a step (its max-num-batched-tokens) in ``t_p(B)`` (the step
  time of the prefill member, :func:`tuner.predict.steptime.step_time`), so the pool serves
  ``μ_p = P·B / (I·t_p)`` requests a second; one request alone takes ``⌈I/B⌉·t_p``;
- **transfer**: ``T_x`` = a fixed cost + ``I`` tokens of KV over one GPU's link at the efficiency the
  emulated node assumes (:mod:`tuner.perfmodel.transfer`);
- **decode**: each engine runs ``n`` requests (its seats, its KV, the clients it gets) in steps of
  ``t_d(n)``; a request decodes ``(O − 1)/τ`` steps, so the pool serves ``μ_d = D·n / ((1 + (O − 1)/τ)·t_d)``;
- **the loop**: throughput ``X = min(μ_p, μ_d, c / (T_p + T_x + T_d))``, solved with ``n = X·T_d / D``
  (Little's law) by a few fixed-point steps; a client's cycle is ``c/X``, so its mean TTFT is ``c/X`` less
  the decode after the first token. At the start every client sends at once: the first wave's p95 waits
  for the prefill pool to work through the wave (``(c − 5 % of the requests) / μ_p``), as in the wave model.
- **ITL**: a decode step late in the answer, at ``n`` requests; no prefill chunk ever joins it, which is
  what the layout is for.

It registers itself with the wave model (:data:`tuner.predict.fluid.OVERLAYS`): every caller of
:func:`~tuner.predict.fluid.wave_bench` (the objective's ladder, the corrections' refit, the guide) sees a
layout's rows through this model. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from tuner.perfmodel.architecture import ATTENTION_CONTEXT_CAP_TOKENS
from tuner.perfmodel.transfer import TRANSFER_EFFICIENCY, TRANSFER_LATENCY_S
from tuner.predict.fluid import OVERLAYS, Shape, WaveFigures, kv_blocks
from tuner.predict.steptime import Batch, CoefficientArrays, coefficient_arrays, step_time, tokens_per_decode
from tuner.predict.table import PdPhysics, Physics

__all__ = ["PoolFigures", "pd_bench"]

FIXED_POINT_STEPS = 6


class PoolFigures:
    """A layout's figures per row (arrays), beside the benchmark's: what each pool does."""

    def __init__(self, prefill_rate: np.ndarray, decode_rate: np.ndarray, transfer_s: np.ndarray,
                 throughput: np.ndarray) -> None:
        self.prefill_rate = prefill_rate
        """Requests a second the prefill pool can serve."""
        self.decode_rate = decode_rate
        """Requests a second the decode pool serves at the benchmark's seats."""
        self.transfer_s = transfer_s
        self.throughput = throughput
        """Requests a second the benchmark reaches."""


def _decode_batch(n: np.ndarray, ctx: float | np.ndarray) -> Batch:
    cap = float(ATTENTION_CONTEXT_CAP_TOKENS)
    return Batch(decode_seqs=n, decode_context_tokens=n * ctx, decode_attended_tokens=n * np.minimum(ctx, cap))


def pd_bench(phys: Physics, ca: CoefficientArrays, shape: Shape) -> tuple[WaveFigures, PoolFigures]:
    """The benchmark's figures on rows that are all layouts (``phys.pd`` covers every row)."""
    pd = phys.pd
    assert pd is not None and len(pd.rows) == len(phys)
    f64 = np.float64
    n_rows = len(phys)
    isl, osl = float(shape.input_len), float(shape.output_len)
    concurrency = np.broadcast_to(np.asarray(shape.concurrency, dtype=f64), (n_rows,))
    prompts = np.broadcast_to(np.asarray(shape.num_prompts, dtype=f64), (n_rows,))
    # -- prefill pool: engines of the prefill member, each a full budget of prompt tokens a step
    pre = pd.prefill
    pca = coefficient_arrays(pre, ca.c)
    engines_p = pre.dp.astype(f64) * pd.prefill_instances
    budget = pre.max_batched_tokens.astype(f64)
    chunk = np.minimum(budget, isl)
    cap = float(ATTENTION_CONTEXT_CAP_TOKENS)
    per_step = Batch(prefill_seqs=np.maximum(1.0, np.ceil(budget / isl)), prefill_tokens=budget,
                     prefill_context_tokens=np.full_like(budget, isl / 2.0),
                     prefill_attended_pairs=budget * min(isl / 2.0, cap))
    t_p = step_time(pre, pca, per_step).total_s
    mu_p = engines_p * budget / (isl * t_p)
    alone = np.ceil(isl / chunk) * step_time(pre, pca, Batch(prefill_seqs=1.0, prefill_tokens=chunk,
                                                            prefill_context_tokens=isl / 2.0,
                                                            prefill_attended_pairs=chunk * min(isl / 2.0, cap))
                                             ).total_s
    # -- the transfer
    transfer = TRANSFER_LATENCY_S + isl * pd.transfer_bytes_per_token * ca.kv_factor / (
        pd.link_bytes_s * TRANSFER_EFFICIENCY)
    # -- decode pool: the row itself is the decode member
    engines_d = phys.dp.astype(f64) * pd.decode_instances
    tau = tokens_per_decode(phys, ca)
    steps = 1.0 + max(0.0, osl - 1.0) / tau
    blocks = kv_blocks(phys, ca)
    per_request_blocks = np.ceil((isl + osl + phys.spec_k) / phys.block_size)
    seat_cap = np.maximum(1.0, np.minimum(phys.max_num_seqs.astype(f64), np.floor(blocks / per_request_blocks)))
    n = np.maximum(1.0, np.minimum(concurrency / engines_d, seat_cap))
    ctx_mid = isl + osl / 2.0
    for _ in range(FIXED_POINT_STEPS):
        t_d = step_time(phys, ca, _decode_batch(n, ctx_mid)).total_s
        decode_s = steps * t_d
        mu_d = engines_d * n / decode_s
        x = np.minimum.reduce([mu_p, mu_d, concurrency / (alone + transfer + decode_s)])
        n = np.clip(x * decode_s / engines_d, 1.0, seat_cap)
    t_d = step_time(phys, ca, _decode_batch(n, ctx_mid)).total_s
    decode_s = steps * t_d
    mu_d = engines_d * seat_cap / (steps * step_time(phys, ca, _decode_batch(seat_cap, ctx_mid)).total_s)
    x = np.minimum.reduce([mu_p, mu_d, concurrency / (alone + transfer + decode_s)])
    # -- figures
    after_first = max(0.0, osl - 1.0) / tau * t_d
    ttft_mean = np.maximum(concurrency / x - after_first, alone + transfer + t_d)
    tail = 0.05 * prompts
    ramp = np.maximum(concurrency - tail, 0.0) / mu_p + alone + transfer + t_d
    ttft = np.maximum(ttft_mean, np.where(tail < concurrency, ramp, ttft_mean))
    t_late = step_time(phys, ca, _decode_batch(n, isl + osl)).total_s
    duration = prompts / x
    figures = WaveFigures(output_tok_s=prompts * osl / duration, ttft_p95_ms=ttft * 1e3, itl_p95_ms=t_late * 1e3,
                          tpot_mean_ms=t_d / tau * 1e3, seats=n, decode_step_ms=t_d * 1e3)
    return figures, PoolFigures(prefill_rate=mu_p, decode_rate=mu_d, transfer_s=transfer, throughput=x)


def _subset(figures: WaveFigures, rows: np.ndarray) -> dict[str, np.ndarray]:
    return {name: getattr(figures, name)[rows] for name in figures.__dataclass_fields__}


def overlay(phys: Physics, ca: CoefficientArrays, shape: Shape, figures: WaveFigures) -> WaveFigures:
    """``figures`` with the layouts' rows replaced by :func:`pd_bench`'s (the wave model's hook)."""
    pd: PdPhysics | None = phys.pd
    if pd is None or len(pd.rows) == 0:
        return figures
    rows = pd.rows
    sub = phys.take(rows)
    sub_ca = CoefficientArrays(c=ca.c, moe_mfu=ca.moe_mfu[rows], a2a_eff=ca.a2a_eff[rows],
                               a2a_latency=ca.a2a_latency[rows], acceptance=ca.acceptance[rows],
                               kv_factor=ca.kv_factor)
    conc = np.broadcast_to(np.asarray(shape.concurrency, dtype=np.float64), (len(phys),))[rows]
    prompts = np.broadcast_to(np.asarray(shape.num_prompts, dtype=np.float64), (len(phys),))[rows]
    pd_figures, _ = pd_bench(sub, sub_ca, Shape(shape.input_len, shape.output_len, conc, prompts))
    values = {name: np.array(getattr(figures, name), dtype=np.float64, copy=True)
              for name in figures.__dataclass_fields__}
    for name, column in values.items():
        column[rows] = getattr(pd_figures, name)
    return WaveFigures(**values)


OVERLAYS.append(overlay)
