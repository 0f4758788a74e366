"""Memory of each launch on the independent truth: whether it starts, whether it survives load, its KV pool.

vLLM profiles a start-up with one dummy batch and hands what is left of ``util × HBM`` to the KV cache.
What that profile cannot see decides whether a launch fails on this node:

- buffers allocated outside the profiled budget (the CUDA context, NCCL's per-communicator buffers, DeepEP's
  dispatch buffers) must fit in the ``1 − util`` left over, or the start fails;
- under load, ``allgather_reducescatter`` materialises every DP rank's tokens in each rank's MoE
  buffers, and the allocator loses memory to fragmentation: a launch whose start-up fitted fails under
  load when these exceed what is left;
- a KV pool that cannot hold one ``max-model-len`` request is refused at start (vLLM's own check).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.engines.emulated.independent.constants import Constants
from tuner.engines.emulated.independent.hardware import Node
from tuner.engines.emulated.independent.launch import A2A, MODES, Launches

__all__ = ["Memory", "capture_sizes", "memory"]

START_OOM = "no memory left for the KV cache at start-up"
BUFFERS_OOM = "out of memory at start-up: buffers outside the profiled budget do not fit"
MAX_LEN = "max-model-len does not fit the KV cache"
LOAD_OOM = "out of memory under load (gathered MoE activations and fragmentation)"


def capture_sizes(limit: int) -> np.ndarray:
    """The batch sizes vLLM captures graphs for, up to ``limit``: 1, 2, 4, then by 8 to 256, then by 16."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max(limit, 0) + 1, 16)]
    return np.array([s for s in sizes if s <= limit], dtype=np.int64)


@dataclass(frozen=True)
class Memory:
    starts: np.ndarray
    survives_load: np.ndarray
    kv_tokens: np.ndarray
    """Tokens one DP engine's KV pool holds."""
    reason: tuple[str, ...]
    """Why a launch fails ("" where it runs)."""


def memory(x: Launches, node: Node, k: Constants) -> Memory:
    tp = x.tp.astype(np.float64)
    dp = x.dp.astype(np.float64)
    world = x.world.astype(np.float64)
    weights = (k.routed_bytes / x.expert_ranks + k.other_bytes / tp + np.where(x.spec_k > 0, k.draft_bytes / tp, 0.0)
               + np.where(x.eplb, k.eplb_bytes, 0.0))
    activations = x.budget * k.act_bytes_per_token
    sizes = np.array([capture_sizes(int(c)).size for c in x.capture], dtype=np.float64)
    graphs = np.where(x.mode == MODES["NONE"], 0.0,
                      sizes * k.graph_bytes_per_size * np.where(x.mode == MODES["FULL_AND_PIECEWISE"], 2.0, 1.0))
    budget = x.util * node.hbm_bytes
    kv_bytes = budget - weights - activations - graphs
    per_token = k.kv_bytes_per_token * (k.kv_tp_replicated + (1.0 - k.kv_tp_replicated) / tp)
    per_token = per_token * np.where(x.kv_fp8, 1.0, 2.0)
    kv_tokens = np.maximum(kv_bytes, 0.0) / per_token
    outside = (k.context_bytes + k.nccl_bytes_per_doubling * np.log2(np.maximum(world, 1.0))
               + np.where(x.a2a == A2A["deepep_low_latency"], k.ll_buffer_bytes, 0.0)
               + np.where(x.a2a == A2A["deepep_high_throughput"], k.ht_buffer_bytes, 0.0))
    spare = (1.0 - x.util) * node.hbm_bytes - outside
    under_load = k.lost_bytes + np.where(x.a2a == A2A["allgather_reducescatter"],
                                         (dp - 1.0) * x.budget * k.gathered_act_bytes_per_token, 0.0)
    fits_node = world <= node.gpus
    start_oom = kv_bytes <= 0
    buffers = spare < 0
    too_short = kv_tokens < x.max_len
    starts = fits_node & ~start_oom & ~buffers & ~too_short
    survives = starts & (spare >= under_load)
    reason = tuple("more GPUs than the node has" if not f else START_OOM if s else BUFFERS_OOM if b
                   else MAX_LEN if t else "" if v else LOAD_OOM
                   for f, s, b, t, v in zip(fits_node, start_oom, buffers, too_short, survives, strict=True))
    return Memory(starts=starts, survives_load=survives, kv_tokens=kv_tokens, reason=reason)
