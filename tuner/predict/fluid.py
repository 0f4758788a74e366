"""What a closed-loop benchmark would measure on many launches at once: a wave model over the step time.

:func:`tuner.engines.emulated.predict` runs a benchmark through the emulated node's scheduler, step
by step (about a second a launch). This module answers the same question for a whole table of
launches in milliseconds, by following what that scheduler does with a closed loop of ``c``
clients sending ``N`` prompts of ``I`` tokens in and ``O`` out (``c/dp`` clients per DP engine):

- **Seats.** An engine runs ``n = min(c/dp, max-num-seqs, what its KV cache holds at full length,
  what the token budget lets decode)`` requests at once; clients beyond ``n`` wait in its queue.
- **Waves.** At the start every client sends at once. Chunked prefill admits ``a = B_p / I``
  requests a step, ``B_p`` being the token budget decodes leave (``max-num-batched-tokens − n·(1+k)``),
  so the first wave ramps up over ``n/a`` steps. A request then decodes ``D = (O − 1)/τ`` steps
  (``τ`` tokens a step with speculation), and its client's next prompt takes its seat in the next
  step: every seat runs ``N/(dp·n)`` requests back to back, ``1 + D`` steps each, and the last wave
  ramps down as the first ramped up.
- **Steps.** A step that carries prefill ("mixed") costs the step time of ``n`` decodes plus
  ``B_p`` prefill tokens; a pure decode step that of ``n`` decodes at the mean context ``I + O/2``.
- **Figures.** Output throughput is ``N·O`` over the summed step times. TTFT: the first wave waits
  for its turn in the ramp (``i/a`` mixed steps for the ``i``-th), later requests one mixed step (or
  the queue's wait when clients outnumber seats); its p95 is read off that distribution. ITL (one
  gap per streamed chunk): the share of gaps that fall in mixed steps decides whether p95 is a
  mixed step or a decode step late in the wave.

``docs/search.md`` reports how closely this agrees with the scheduler (``benchmarks/bench_search.py
--validate``). It is the prior's predictor, and the search benchmark's fast truth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tuner.perfmodel.architecture import ATTENTION_CONTEXT_CAP_TOKENS
from tuner.predict.steptime import Batch, CoefficientArrays, step_time, tokens_per_decode
from tuner.predict.table import Physics

__all__ = ["Shape", "WaveFigures", "kv_blocks", "startup_ok", "wave_bench"]


@dataclass(frozen=True)
class Shape:
    """One ladder step: lengths, node concurrency, prompts (one value, or one per launch)."""

    input_len: int
    output_len: int
    concurrency: int | np.ndarray
    num_prompts: int | np.ndarray


@dataclass(frozen=True)
class WaveFigures:
    """A benchmark's figures per launch (node units), as arrays."""

    output_tok_s: np.ndarray
    ttft_p95_ms: np.ndarray
    itl_p95_ms: np.ndarray
    tpot_mean_ms: np.ndarray
    seats: np.ndarray
    """Requests each engine runs at once."""
    decode_step_ms: np.ndarray


DRIVER_RESERVED_FRACTION = 0.015
SPREAD_WIDTH = 4.0
"""How many standard deviations of a request's decode-step count a wave's finishes spread over."""
KV_PREEMPT_CONTEXT = 0.6
"""A KV-bound engine keeps about as many requests running as fit at ``I + 0.6·O`` tokens."""
KV_PREEMPT_RECOMPUTE = 0.5
"""Prompts recomputed per request when a KV-bound engine holds twice the requests its cache fits."""


def kv_blocks(phys: Physics, ca: CoefficientArrays) -> np.ndarray:
    """KV blocks per engine, as the emulated node allocates them (its truth's bytes per token)."""
    per_token = phys.kv_bytes_per_token * ca.kv_factor
    tokens = np.floor(np.maximum(phys.kv_budget_bytes, 0.0) / per_token)
    return np.where(phys.kv_budget_bytes > 0, np.floor(tokens / phys.block_size), 0.0)


def startup_ok(phys: Physics, ca: CoefficientArrays) -> np.ndarray:
    """vLLM's start-up memory checks pass (weights load, KV blocks exist, one max-len request fits)."""
    free = phys.node.memory_per_device_bytes * (1.0 - DRIVER_RESERVED_FRACTION)
    blocks = kv_blocks(phys, ca)
    ok = (phys.weights_bytes <= free) & (blocks > 0) & (blocks * phys.block_size >= phys.max_model_len)
    return np.asarray(ok, dtype=bool)


def wave_bench(phys: Physics, ca: CoefficientArrays, shape: Shape) -> WaveFigures:
    """The figures of one closed-loop benchmark on every launch of ``phys``."""
    n_rows = len(phys)
    f64 = np.float64
    isl, osl = float(shape.input_len), float(shape.output_len)
    dp = phys.dp.astype(f64)
    k = phys.spec_k.astype(f64)
    q = 1.0 + k
    budget = phys.max_batched_tokens.astype(f64)
    seqs = phys.max_num_seqs.astype(f64)
    bs = phys.block_size.astype(f64)
    tau = tokens_per_decode(phys, ca)
    concurrency = np.broadcast_to(np.asarray(shape.concurrency, dtype=f64), (n_rows,))
    prompts = np.broadcast_to(np.asarray(shape.num_prompts, dtype=f64), (n_rows,))
    clients = concurrency / dp
    requests = prompts / dp
    blocks = kv_blocks(phys, ca)
    per_request_blocks = np.ceil((isl + osl + k) / bs)
    by_kv = np.floor(blocks / per_request_blocks)
    decode_steps = max(0.0, osl - 1.0) / tau
    # The token budget must carry every seat's decode (1 + k tokens a step) and, over a request's
    # life, its prefill: seats × (q + I/D) ≤ budget.
    by_budget = np.floor(budget / (q + isl / np.maximum(decode_steps, 1.0)))
    # Past the KV cache the scheduler admits on the first chunk's blocks and preempts as contexts grow:
    # about as many requests progress as fit at their mean context.
    by_kv_mean = np.floor(blocks / np.ceil((isl + KV_PREEMPT_CONTEXT * osl + k) / bs))
    kv_bound = np.minimum(clients, seqs) > by_kv
    kv_seats = np.where(kv_bound, np.maximum(by_kv_mean, 1.0), np.inf)
    seats = np.maximum(1.0, np.minimum.reduce([clients, seqs, kv_seats, by_budget]))
    queue = np.maximum(0.0, clients - seats)
    prefill_budget = np.maximum(budget - q * seats, 1.0)
    ramp_budget = np.maximum(budget - q * seats / 2.0, 1.0)
    a = prefill_budget / isl
    a_ramp = ramp_budget / isl
    waves = requests / seats
    ctx_mid = isl + osl / 2.0
    cap = float(ATTENTION_CONTEXT_CAP_TOKENS)

    def decode_batch(n: np.ndarray, ctx: float | np.ndarray) -> Batch:
        return Batch(decode_seqs=n, decode_context_tokens=n * ctx, decode_attended_tokens=n * np.minimum(ctx, cap))

    def mixed_batch(n: np.ndarray, ctx: float, pre: np.ndarray) -> Batch:
        chunked = pre < isl
        pre_seqs = np.where(pre <= 0, 0.0, np.where(chunked, 1.0, np.ceil(pre / isl)))
        pre_ctx = np.where(chunked & (pre > 0), (isl - pre) / 2.0, 0.0)
        pairs = pre * np.minimum(isl / 2.0, cap)
        return Batch(decode_seqs=n, decode_context_tokens=n * ctx, decode_attended_tokens=n * min(ctx, cap),
                     prefill_seqs=pre_seqs, prefill_tokens=pre, prefill_context_tokens=pre_ctx,
                     prefill_attended_pairs=pairs)

    # -- speculation draws a random number of tokens a step: finishes, and so the next wave's prefills,
    #    spread over more steps than the first wave's ramp (the predictor's groups of ``m`` requests
    #    share their draws, so a wave has about ``seats / m`` distinct finishing events)
    var_x = _tokens_variance(phys, ca, tau)
    sigma_steps = np.sqrt(decode_steps * var_x) / tau
    m = multiplicity_array(shape, phys)
    groups = np.maximum(seats / m, 1.0)
    ramp_steps = seats / a_ramp
    spacing = seats / a
    window = np.sqrt(spacing ** 2 + (SPREAD_WIDTH * sigma_steps) ** 2)
    events = window * (1.0 - np.exp(-groups / np.maximum(window, 1e-9)))
    per_engine = np.where(k > 0, np.maximum(spacing, np.minimum(events, groups)), spacing)
    per_engine = np.maximum(per_engine, 1.0)
    later_prefill = np.minimum(seats * isl / per_engine, prefill_budget)
    later_waves = np.maximum(waves - 1.0, 0.0)
    # DP engines run in lock-step: a step is slow when any engine prefills. Without speculation the
    # engines stay in step with each other; with it their finishes (and prefills) fall apart.
    # An engine's later-wave prefills fall in the window its finishes spread over; the node's mixed steps
    # are the union of the engines' over that window.
    span = np.minimum(np.maximum(window, per_engine), 1.0 + decode_steps)
    frac = np.clip(per_engine / span, 0.0, 1.0)
    node_mixed = np.where((k > 0) & (dp > 1), span * (1.0 - (1.0 - frac) ** dp), per_engine)
    node_mixed = np.maximum(node_mixed, per_engine)
    prefilling = np.clip(dp * per_engine / node_mixed, 1.0, dp)
    later_mixed = node_mixed
    t_dec = step_time(phys, ca, decode_batch(seats, ctx_mid)).total_s
    t_dec_half = step_time(phys, ca, decode_batch(seats / 2.0, ctx_mid)).total_s
    others_prefill = later_prefill * (prefilling - 1.0) / np.maximum(dp - 1.0, 1.0)
    t_mix = step_time(phys, ca, mixed_batch(np.maximum(seats - later_prefill / isl, 0.0), ctx_mid, later_prefill),
                      mixed_batch(np.maximum(seats - others_prefill / isl, 0.0), ctx_mid, others_prefill)).total_s
    t_ramp = step_time(phys, ca, mixed_batch(seats / 2.0, isl, ramp_budget)).total_s
    # -- steps and duration
    mixed_steps = later_waves * later_mixed
    ramp_down = np.where(k > 0, np.maximum(window, spacing), spacing)
    total_steps = ramp_steps + waves * (1.0 + decode_steps) + (ramp_down - spacing)
    # KV-bound launches preempt; a preempted request recomputes its prompt and what it had generated
    overload = np.where(kv_bound, np.maximum(np.minimum(clients, seqs) / seats - 1.0, 0.0), 0.0)
    recompute_steps = np.minimum(overload, 1.0) * KV_PREEMPT_RECOMPUTE * requests * (isl + osl / 2.0) / prefill_budget
    mixed_steps = mixed_steps + recompute_steps
    decode_full = np.maximum(total_steps - ramp_steps - mixed_steps - ramp_down, 0.0)
    duration = ramp_steps * t_ramp + mixed_steps * t_mix + decode_full * t_dec + ramp_down * t_dec_half
    throughput = prompts * osl / duration
    # -- TTFT: the first wave's ramp, later requests one mixed step, or the queue's wait
    step_mean = duration / np.maximum(total_steps, 1.0)
    wait_queue = queue / seats * (1.0 + decode_steps) * step_mean
    first_wave = np.minimum(clients, seats)
    tail = 0.05 * requests  # requests above the p95
    in_ramp = np.clip(1.0 - tail / np.maximum(first_wave, 1.0), 0.0, 1.0)
    ttft_ramp = (in_ramp * first_wave / a_ramp + 1.0) * t_ramp
    later = np.where(queue > 0, wait_queue + t_mix, t_mix)
    share_later = np.maximum(requests - first_wave, 0.0) / requests
    ttft = np.where(queue > 0, np.maximum(later, np.where(tail < first_wave, ttft_ramp, later)),
                    np.where(tail < first_wave, ttft_ramp, later))
    ttft = np.where(share_later >= 0.95, later, ttft)
    # Clients past the seats at the start wait for the first wave to finish: a whole request's life,
    # then their turn in the admissions that follow. When they are more than 5 % of the requests, the
    # p95 is among them.
    queued_share = queue / requests
    life = (1.0 + decode_steps) * step_mean
    position = np.clip(1.0 - tail / np.maximum(queue, 1e-9), 0.0, 1.0) * queue / a
    ttft = np.where((queue > 0) & (queued_share > 0.05), np.maximum(ttft, life + position * t_mix), ttft)
    # -- ITL: gaps that fall in mixed steps, else a late decode step
    gaps_total = np.maximum(requests * decode_steps, 1.0)
    gaps_mixed = mixed_steps * seats + ramp_steps * seats / 2.0
    share_mixed = np.clip(gaps_mixed / gaps_total, 0.0, 1.0)
    late = np.clip(1.0 - (0.05 - share_mixed) / np.maximum(1.0 - share_mixed, 1e-9), 0.0, 1.0)
    t_late = step_time(phys, ca, decode_batch(seats, isl + osl * late)).total_s
    itl = np.where(share_mixed >= 0.05, np.where(later_waves > 0, t_mix, t_ramp), t_late)
    tpot = duration / np.maximum(waves * decode_steps * tau + ramp_steps, 1.0)
    figures = WaveFigures(output_tok_s=throughput, ttft_p95_ms=ttft * 1e3, itl_p95_ms=itl * 1e3,
                          tpot_mean_ms=tpot * 1e3, seats=seats, decode_step_ms=t_dec * 1e3)
    if phys.pd is not None:
        for overlay in OVERLAYS:
            figures = overlay(phys, ca, shape, figures)
    return figures


OVERLAYS: list[Callable[[Physics, CoefficientArrays, Shape, WaveFigures], WaveFigures]] = []
"""Models of rows this wave model does not describe, each replacing their figures: a prefill/decode layout's
(:mod:`tuner.predict.disagg` registers itself here when imported)."""


GROUPS_PER_ENGINE = 48
"""The predictor's granularity (``tuner.engines.emulated.steady_state``): about this many streams per engine."""


def multiplicity_array(shape: Shape, phys: Physics) -> np.ndarray:
    """Requests per simulated stream, as :func:`tuner.engines.emulated.predict` groups them."""
    conc = np.asarray(shape.concurrency, dtype=np.float64)
    groups = np.ceil(conc / (GROUPS_PER_ENGINE * phys.dp.astype(np.float64)))
    return np.asarray(np.maximum(1.0, groups), dtype=np.float64)


def _tokens_variance(phys: Physics, ca: CoefficientArrays, tau: np.ndarray) -> np.ndarray:
    """Variance of the tokens one decode step emits (1 + accepted drafts, a truncated geometric)."""
    k = phys.spec_k.astype(np.float64)
    alpha = np.where(k > 0, ca.acceptance, 0.0)
    second = np.zeros(len(phys))
    for j in range(int(k.max()) + 1 if len(phys) else 1):
        pj = np.where(j < k, alpha ** j * (1.0 - alpha), np.where(j == k, alpha ** j, 0.0))
        second += (1.0 + j) ** 2 * pj
    return np.asarray(np.maximum(second - tau ** 2, 0.0), dtype=np.float64)


def prompts_for(concurrency: int | np.ndarray, num_prompts: int, per_concurrency: float) -> np.ndarray:
    """Prompts a ladder step sends: at least ``concurrency × per_concurrency`` (as :mod:`tuner.load.ladder`)."""
    wanted = np.ceil(np.asarray(concurrency, dtype=np.float64) * per_concurrency - 1e-9)
    return np.asarray(np.maximum(num_prompts, wanted), dtype=np.float64)
