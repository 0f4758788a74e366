"""One engine step on the independent truth: ``d`` decoding sequences and ``p`` prefill tokens, per launch.

The terms, and what sets them:

- **how the step runs**: a full CUDA graph (pure decode, a mode with full graphs, the batch within the
  captured sizes, and an all2all that graphs: DeepEP high-throughput does not), piecewise graphs
  (attention eager), or eager; a graphed batch is padded up to the next captured size;
- **weights and attention**: the larger of streaming the non-expert weights and computing them, joined
  smoothly (a 4-norm, not a hard roofline); the KV each decoding sequence reads;
- **the routed experts**: tokens per expert set the kernel's tile use (Marlin tiles 16 rows, the W4A8
  kernel 64) and how full the GPU is (tokens / (tokens + a half-occupancy count)); the W4A8 kernel runs
  at the FP8 rate only from a number of tokens per expert on, below it it is no faster than Marlin; the
  busiest rank sets the time (expert skew, less with EPLB);
- **communication**: the TP allreduce; under DP+EP an all-to-all whose efficiency falls with the ranks
  and the tokens (congestion), per backend (allgather/reduce-scatter moves every token to every rank,
  DeepEP only to the ranks its experts are on, the low-latency kernel in chunks of a fixed size);
- **the host**, overlapped only in part with the GPU.
"""

from __future__ import annotations

import numpy as np

from tuner.engines.emulated.independent.constants import Constants
from tuner.engines.emulated.independent.hardware import Node
from tuner.engines.emulated.independent.launch import A2A, MODES, Launches
from tuner.engines.emulated.independent.memory import capture_sizes

__all__ = ["step_s", "tokens_per_step"]


def _smooth_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a ** 4 + b ** 4) ** 0.25)


def _tile_use(m: np.ndarray, tile: int) -> np.ndarray:
    """Share of a kernel's rows doing work when ``m`` tokens go to an expert on average, in tiles of ``tile``
    rows: the experts' counts vary, so each wastes half a tile on average."""
    return np.asarray(m / (m + tile / 2.0))


def _padded(x: Launches, tokens: np.ndarray) -> np.ndarray:
    out = tokens.astype(np.float64).copy()
    for limit in np.unique(x.capture):
        rows = np.flatnonzero(x.capture == limit)
        sizes = capture_sizes(int(limit))
        if sizes.size == 0:
            continue
        need = np.ceil(tokens[rows] - 1e-9)
        idx = np.searchsorted(sizes, need, side="left")
        out[rows] = np.where(idx < sizes.size, sizes[np.minimum(idx, sizes.size - 1)], tokens[rows])
    return np.asarray(out, dtype=np.float64)


def tokens_per_step(x: Launches, k: Constants) -> np.ndarray:
    """Tokens a decoding sequence emits per step: 1 plus the accepted drafts (acceptance falls along the draft)."""
    out = np.ones(len(x))
    run = np.ones(len(x))
    for i in range(1, int(x.spec_k.max(initial=0)) + 1):
        run = run * k.acceptance * k.acceptance_decay ** (i - 1)
        out = out + np.where(x.spec_k >= i, run, 0.0)
    return out


def step_s(x: Launches, node: Node, k: Constants, d: np.ndarray, p: np.ndarray, context: float) -> np.ndarray:
    """Seconds of one step of one DP engine (the others run alike); ``context``: mean tokens a sequence holds."""
    tp = x.tp.astype(np.float64)
    dp = x.dp.astype(np.float64)
    q = 1.0 + x.spec_k
    tokens = d * q + p
    decode_only = p <= 0
    graphs_allowed = x.a2a != A2A["deepep_high_throughput"]
    full = (decode_only & graphs_allowed & (tokens <= x.capture)
            & np.isin(x.mode, (MODES["FULL_DECODE_ONLY"], MODES["FULL_AND_PIECEWISE"], MODES["FULL"])))
    piece = ~full & (tokens <= x.capture) & np.isin(x.mode, (MODES["PIECEWISE"], MODES["FULL_AND_PIECEWISE"]))
    eager = ~full & ~piece
    n = np.where(full | piece, _padded(x, tokens), tokens)
    # weights, attention and the per-token kernels of one engine
    other = _smooth_max(k.other_bytes / tp / (node.hbm_bytes_s * k.hbm_eff),
                        n * k.other_flop_per_token / tp / (node.fp8_flop_s * k.dense_eff))
    per_token_kv = k.kv_bytes_per_token * (k.kv_tp_replicated + (1.0 - k.kv_tp_replicated) / tp)
    attention = d * context * per_token_kv * np.where(x.kv_fp8, 1.0, 2.0) / (node.hbm_bytes_s * k.hbm_eff)
    # routed experts: every engine's tokens meet in the MoE under EP
    ranks = x.expert_ranks.astype(np.float64)
    moe_tokens = np.where(x.ep, n * dp, n)
    per_expert = moe_tokens * k.active_experts / k.experts
    touched = 1.0 - np.exp(-per_expert)
    stream = k.routed_bytes / ranks * touched / (node.hbm_bytes_s * k.hbm_eff)
    skew = np.where(x.ep & (ranks > 1), np.where(x.eplb, k.eplb_skew, k.expert_skew), 1.0)
    flops = moe_tokens * k.routed_flop_per_token / ranks * skew
    occupancy = per_expert / (per_expert + k.moe_half_tokens)
    marlin = _smooth_max(stream, flops / (node.bf16_flop_s * k.marlin_eff * occupancy
                                          * _tile_use(per_expert, k.marlin_tile)))
    w4a8 = _smooth_max(stream * k.humming_memory_penalty,
                       flops / (node.fp8_flop_s * k.humming_eff * occupancy * _tile_use(per_expert, k.humming_tile)))
    humming = np.where(per_expert >= k.humming_min_tokens_per_expert, w4a8, marlin * 1.05)
    moe = np.where(x.humming, humming, marlin) * (1.0 + np.where(x.eplb, k.eplb_cost, 0.0))
    # communication, per layer
    link_tp = np.array([node.link_for(int(t)) for t in x.tp], dtype=np.float64)
    allreduce = np.where(tp > 1, 2.0 * (k.allreduce_latency_s * (tp - 1.0)
                                        + 2.0 * (tp - 1.0) / tp * n * k.hidden * 2.0 / (link_tp * k.link_eff)), 0.0)
    world = x.world.astype(np.float64)
    link_w = np.array([node.link_for(int(w)) for w in x.world], dtype=np.float64)
    congestion = 1.0 + k.congestion * np.maximum(world - 2.0, 0.0) ** 0.8 * (1.0 + moe_tokens / 8192.0)
    ranks_hit = world * (1.0 - (1.0 - 1.0 / np.maximum(world, 1.0)) ** k.active_experts)
    sparse_bytes = n / tp * ranks_hit * (world - 1.0) / np.maximum(world, 1.0) * k.hidden * 3.0
    dense_bytes = (world - 1.0) / np.maximum(world, 1.0) * moe_tokens / tp * k.hidden * 3.0
    eff = k.link_eff / congestion
    agrs = k.agrs_latency_s + dense_bytes / (link_w * eff)
    ht = k.ht_latency_s + sparse_bytes / (link_w * eff)
    chunks = np.ceil(np.maximum(n / tp, 1.0) / k.ll_chunk_tokens)
    ll = chunks * k.ll_latency_s + sparse_bytes / (link_w * eff * k.ll_eff)
    a2a = np.select([x.a2a == A2A["allgather_reducescatter"], x.a2a == A2A["deepep_high_throughput"],
                     x.a2a == A2A["deepep_low_latency"]], [agrs, ht, ll], 0.0)
    comm = k.layers * (allreduce + 2.0 * a2a)
    # kernel launches
    launches = np.where(full, k.graph_replay_s,
                        np.where(piece, k.layers * (k.attention_kernels_per_layer * k.launch_s + k.graph_replay_s),
                                 k.layers * k.kernels_per_layer * k.launch_s))
    # drafting (DSpark drafts a block in one pass)
    draft = np.where(x.spec_k > 0, _smooth_max(k.draft_bytes / tp / (node.hbm_bytes_s * k.hbm_eff),
                                               d * x.spec_k * k.draft_flop_per_token / tp
                                               / (node.fp8_flop_s * k.dense_eff)) + 8 * k.launch_s, 0.0)
    gpu = other + attention + moe + comm + launches + draft + np.where(dp > 1, k.dp_sync_s * np.log2(dp), 0.0)
    host = (k.host_step_s + k.host_seq_s * (d + p / 1024.0) * np.where(eager, 1.6, 1.0)) * np.where(
        x.prefix, 1.0 + k.prefix_hash_cost, 1.0)
    total = np.maximum(gpu, host) + (1.0 - k.host_overlap) * np.minimum(gpu, host)
    return np.asarray(total * (1.0 + np.where(dp > 1, k.dp_jitter * np.log2(dp), 0.0)))
