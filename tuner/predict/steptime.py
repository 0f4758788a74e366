"""The emulated node's step time (:func:`tuner.perfmodel.step_time`), for many launches at once.

The same roofline, term by term (``tuner/perfmodel/step.py`` states the equations), on
numpy arrays: one row per launch (:class:`~tuner.predict.table.Physics`), every DP engine running the
same batch (the DP balancer spreads a closed-loop benchmark evenly). ``tests/unit/test_predict.py``
checks that both give the same seconds on a sample of launches and batches, so a change to one that
the other does not follow fails there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.perfmodel import Coefficients
from tuner.perfmodel.architecture import (
    ATTENTION_FLOPS_PER_PAIR,
    DENSE_FLOPS_PER_TOKEN,
    EXPERTS_PER_TOKEN,
    HIDDEN_SIZE,
    N_LAYERS,
    ROUTED_EXPERTS,
    ROUTED_FLOPS_PER_TOKEN,
)
from tuner.predict.table import Physics

__all__ = ["Batch", "CoefficientArrays", "StepArrays", "coefficient_arrays", "step_time"]

_BF16_BYTES = 2


@dataclass(frozen=True)
class Batch:
    """What each DP engine runs in one step (arrays of one value per launch, or scalars)."""

    decode_seqs: np.ndarray | float = 0.0
    decode_context_tokens: np.ndarray | float = 0.0
    decode_attended_tokens: np.ndarray | float = 0.0
    prefill_seqs: np.ndarray | float = 0.0
    prefill_tokens: np.ndarray | float = 0.0
    prefill_context_tokens: np.ndarray | float = 0.0
    prefill_attended_pairs: np.ndarray | float = 0.0


@dataclass(frozen=True)
class CoefficientArrays:
    """:class:`Coefficients` with the per-launch choices (MoE backend, all2all, draft method) resolved."""

    c: Coefficients
    moe_mfu: np.ndarray
    a2a_eff: np.ndarray
    a2a_latency: np.ndarray
    acceptance: np.ndarray
    kv_factor: float


def coefficient_arrays(phys: Physics, c: Coefficients) -> CoefficientArrays:
    moe_cache: dict[str, float] = {}
    moe = np.array([moe_cache.setdefault(f, float(getattr(c, f))) for f in phys.moe_field], dtype=np.float64)
    a2a_cache: dict[str, tuple[float, float]] = {}
    pairs = [a2a_cache.setdefault(b, c.a2a(b)) for b in phys.a2a_backend]
    eff = np.array([p[0] for p in pairs], dtype=np.float64)
    lat = np.array([p[1] for p in pairs], dtype=np.float64)
    acc = np.array([c.acceptance(m) for m in phys.spec_method], dtype=np.float64)
    return CoefficientArrays(c=c, moe_mfu=moe, a2a_eff=eff, a2a_latency=lat, acceptance=acc,
                             kv_factor=float(c.kv_bytes_per_token_factor))


@dataclass(frozen=True)
class StepArrays:
    total_s: np.ndarray
    gpu_s: np.ndarray
    cpu_s: np.ndarray


def _padded(phys: Physics, tokens: np.ndarray) -> np.ndarray:
    """The captured size each batch of ``tokens`` is padded to (itself when none fits)."""
    out = tokens.astype(np.float64).copy()
    need = np.ceil(tokens - 1e-9)
    for g, sizes in enumerate(phys.capture_sizes):
        if sizes.size == 0:
            continue
        rows = np.flatnonzero(phys.capture_group == g)
        if rows.size == 0:
            continue
        idx = np.searchsorted(sizes, need[rows], side="left")
        out[rows] = np.where(idx < sizes.size, sizes[np.minimum(idx, sizes.size - 1)], tokens[rows])
    return np.asarray(out, dtype=np.float64)


def tokens_per_decode(phys: Physics, ca: CoefficientArrays) -> np.ndarray:
    """Expected tokens a decode step emits per sequence: (1 − α^(k+1)) / (1 − α)."""
    k = phys.spec_k.astype(np.float64)
    alpha = np.where(k > 0, ca.acceptance, 0.0)
    safe = np.where(alpha < 1.0, alpha, 0.5)
    return np.where(k > 0, np.where(alpha < 1.0, (1.0 - safe ** (k + 1)) / (1.0 - safe), 1.0 + k), 1.0)


def step_time(phys: Physics, ca: CoefficientArrays, batch: Batch, others: Batch | None = None) -> StepArrays:
    """One lock-step of every launch: one DP engine runs ``batch``, the others ``others`` (default: the same).

    With ``others``, ``batch`` must be the slower engine's (the one that sets the step, e.g. the one
    with a prefill chunk); the MoE and the collectives see every engine's tokens.
    """
    if others is None:
        return _step_time(phys, ca, batch, None)
    return _step_time(phys, ca, batch, others)


def _executed(phys: Physics, ca: CoefficientArrays, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(executed tokens, eager, piecewise) of one engine's batch."""
    n = len(phys)
    dec = np.broadcast_to(np.asarray(batch.decode_seqs, dtype=np.float64), (n,))
    pre_tok = np.broadcast_to(np.asarray(batch.prefill_tokens, dtype=np.float64), (n,))
    tokens = dec * (1.0 + phys.spec_k) + pre_tok
    eager = phys.eager | (tokens > phys.max_capture)
    full = ~eager & (pre_tok == 0) & phys.mode_full
    piece = ~eager & ~full & phys.mode_piecewise
    eager = ~full & ~piece
    return np.where(tokens <= 0, 0.0, np.where(eager, tokens, _padded(phys, tokens))), eager, piece


def _step_time(phys: Physics, ca: CoefficientArrays, batch: Batch, others: Batch | None) -> StepArrays:
    c = ca.c
    dev = phys.node.device
    n = len(phys)
    f64 = np.float64

    def arr(value: np.ndarray | float) -> np.ndarray:
        return np.broadcast_to(np.asarray(value, dtype=f64), (n,))

    dec = arr(batch.decode_seqs)
    dec_ctx = arr(batch.decode_context_tokens)
    dec_att = arr(batch.decode_attended_tokens)
    pre_seqs = arr(batch.prefill_seqs)
    pre_tok = arr(batch.prefill_tokens)
    pre_ctx = arr(batch.prefill_context_tokens)
    pre_pairs = arr(batch.prefill_attended_pairs)
    tp = phys.tp.astype(f64)
    dp = phys.dp.astype(f64)
    world = phys.world.astype(f64)
    k = phys.spec_k.astype(f64)
    q = 1.0 + k
    tokens = dec * q + pre_tok
    idle = tokens <= 0
    hbm = dev.hbm_bytes_s
    fp8 = dev.fp8_flop_s if dev.fp8_flop_s > 0 else dev.bf16_flop_s
    # -- how the batch runs: eager, piecewise graphs, or a full decode graph
    eager = phys.eager | (tokens > phys.max_capture)
    uniform = pre_tok == 0
    full = ~eager & uniform & phys.mode_full
    piece = ~eager & ~full & phys.mode_piecewise
    eager = ~full & ~piece
    executed = np.where(eager, tokens, _padded(phys, tokens))
    # -- one engine's terms
    dense = np.maximum(executed * DENSE_FLOPS_PER_TOKEN / tp / (fp8 * c.dense_mfu),
                       phys.non_expert_bytes / (hbm * c.weight_stream_eff))
    kv_bpt = phys.kv_bytes_per_token * ca.kv_factor
    attention = np.maximum((dec_ctx + pre_ctx) * kv_bpt / (hbm * c.kv_read_eff),
                           (dec_att * q + pre_pairs) * ATTENTION_FLOPS_PER_PAIR / tp
                           / (dev.bf16_flop_s * c.attention_mfu))
    elementwise = executed * c.elementwise_bytes_per_token / (hbm * c.activation_stream_eff)
    kernels_n = N_LAYERS * c.kernels_per_layer
    kernels = kernels_n * c.kernel_floor_s + np.where(
        eager, kernels_n * c.launch_s,
        np.where(piece, N_LAYERS * c.attention_kernels_per_layer * c.launch_s + (N_LAYERS + 1) * c.graph_replay_s,
                 c.graph_replay_s))
    # drafting
    params = phys.draft_params
    passes = np.where(phys.mtp, k, 1.0)
    per_pass = dec * np.where(phys.mtp, 1.0, k)
    d_mem = phys.draft_bytes * c.draft_weight_read_fraction / (hbm * c.weight_stream_eff)
    d_comp = per_pass * 2.0 * params / tp / (fp8 * c.dense_mfu)
    d_kern = c.kernels_per_layer * (c.kernel_floor_s + np.where(phys.eager, c.launch_s, 0.0))
    draft = np.where((k > 0) & (dec > 0), passes * (np.maximum(d_mem, d_comp) + d_kern), 0.0)
    host = np.full(n, c.host_step_s)
    # an idle engine runs a dummy batch
    dense = np.where(idle, 0.0, dense)
    attention = np.where(idle, 0.0, attention)
    elementwise = np.where(idle, 0.0, elementwise)
    kernels = np.where(idle, kernels_n * c.kernel_floor_s, kernels)
    draft = np.where(idle, 0.0, draft)
    host = np.where(idle, c.host_step_s * 0.25, host)
    executed = np.where(idle, 0.0, executed)
    # -- the MoE over all engines' tokens
    if others is None:
        tokens_all = executed * dp
        busiest = executed
        others_dec = dec
        others_pre = pre_seqs
    else:
        other_executed = _executed(phys, ca, others)[0]
        tokens_all = executed + (dp - 1.0) * other_executed
        busiest = np.maximum(executed, np.where(dp > 1, other_executed, 0.0))
        others_dec = np.broadcast_to(np.asarray(others.decode_seqs, dtype=f64), (n,))
        others_pre = np.broadcast_to(np.asarray(others.prefill_seqs, dtype=f64), (n,))
    imbalance = np.where(phys.ep & (world > 1), np.where(phys.eplb, c.eplb_imbalance, c.ep_imbalance), 0.0)
    moe_compute = tokens_all * ROUTED_FLOPS_PER_TOKEN / world * (1.0 + imbalance) / (
        phys.moe_peak_flop_s * ca.moe_mfu)
    miss = 1.0 - EXPERTS_PER_TOKEN / ROUTED_EXPERTS
    touched = np.where(tokens_all > 0, 1.0 - miss ** tokens_all, 0.0)
    moe = np.where(tokens_all > 0, np.maximum(moe_compute, phys.routed_bytes * touched / (hbm * c.weight_stream_eff)),
                   0.0)
    # -- communication
    count = phys.node.device_count

    def group_link(group: np.ndarray) -> np.ndarray:
        if dev.mesh and count > 1:
            return dev.link_bytes_s * np.minimum(1.0, (group - 1.0) / (count - 1.0))
        return np.full(n, dev.link_bytes_s)

    ar_latency = dev.link_latency_s * np.where(phys.custom_allreduce, 1.0, c.nccl_latency_factor)
    ar_moved = 2.0 * (tp - 1.0) / tp * busiest * HIDDEN_SIZE * _BF16_BYTES
    ar_link = group_link(tp)
    allreduce = np.where((tp > 1) & (busiest > 0),
                         2.0 * (ar_latency + ar_moved / (np.where(ar_link > 0, ar_link, 1.0) * c.allreduce_eff)), 0.0)
    ranks_hit = world * (1.0 - (1.0 - 1.0 / world) ** EXPERTS_PER_TOKEN)
    remote = ranks_hit * (world - 1.0) / world
    moved = np.where(phys.a2a_sparse, busiest * remote * HIDDEN_SIZE * (1 + _BF16_BYTES),
                     2.0 * (world - 1.0) / world * tokens_all * HIDDEN_SIZE * _BF16_BYTES / tp)
    a2a_link = group_link(world)
    a2a = np.where((dp > 1) & (tokens_all > 0),
                   ca.a2a_latency * dev.link_latency_s + moved / (np.where(a2a_link > 0, a2a_link, 1.0) * ca.a2a_eff),
                   0.0)
    comm = N_LAYERS * (allreduce + a2a)
    gpu = dense + attention + elementwise + kernels + draft + host + moe + comm
    # -- the CPU side, pipelined
    engine_cpu = c.engine_cpu_per_seq_s * np.maximum(dec + pre_seqs, np.where(dp > 1, others_dec + others_pre, 0.0))
    tpd = tokens_per_decode(phys, ca)
    streamed = dec * tpd + pre_seqs + (dp - 1.0) * (others_dec * tpd + others_pre)
    frontend = streamed * c.frontend_token_s / phys.api_servers
    cpu = np.maximum(engine_cpu, frontend)
    return StepArrays(total_s=np.maximum(gpu, cpu), gpu_s=gpu, cpu_s=cpu)
