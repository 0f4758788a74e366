"""The independent truth's constants: public model figures, kernel and link efficiencies, memory overheads.

:data:`NOMINAL` is fitted to the 4xGH200 blog (three launches; six constants, by
``benchmarks/fit_independent_truth.py``); :func:`drawn` gives a seed's node: every efficiency off by a
factor, the W4A8 kernel's threshold, the DeepEP low-latency chunk, the expert skew and the memory the
allocator loses drawn anew. Nothing here is read from, or
copied from, the tuner's performance model.

Model figures (DeepSeek-V4-Flash, public: 284 B parameters, 13 B active, 43 layers, 256 routed experts,
6 active, FP4 experts and FP8 rest, about 167 GB on the Hub): the routed experts are 250 × 1.084 B
(284 − 13 = 250 experts' worth of the 256 − 6 inactive ones), the rest 6.5 B.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

__all__ = ["NOMINAL", "Constants", "drawn"]


@dataclass(frozen=True)
class Constants:
    # -- the model (public figures)
    layers: int = 43
    hidden: int = 4096
    experts: int = 256
    active_experts: int = 6
    routed_bytes: float = 256 * 1.084e9 * 0.53
    """FP4 with its group scales: 0.53 byte a parameter."""
    other_bytes: float = 6.5e9 + 2.0e9
    """The FP8 rest and the BF16 embeddings and head."""
    draft_bytes: float = 3.0e9
    routed_flop_per_token: float = 2 * 6 * 1.084e9
    other_flop_per_token: float = 2 * 6.5e9
    kv_bytes_per_token: float = 37_050.0
    """FP8 compressed attention, all layers, one replica."""
    kv_tp_replicated: float = 0.9
    """Share of a token's KV that every TP rank keeps (one latent KV head: TP replicates most of it, the blog)."""
    # -- kernels
    dense_eff: float = 0.4979
    hbm_eff: float = 0.78
    marlin_eff: float = 0.4681
    """Of the bf16 rate, at full occupancy."""
    humming_eff: float = 0.5439
    """Of the FP8 rate: W4A8 upcasts in the SMs, so it reaches a smaller share of a larger rate."""
    moe_half_tokens: float = 48.0
    """Tokens per expert at which a MoE kernel reaches half its full-occupancy rate."""
    humming_min_tokens_per_expert: float = 24.0
    """Below this the W4A8 kernel's tile heuristic falls back to a path no faster than Marlin."""
    humming_memory_penalty: float = 1.08
    marlin_tile: int = 16
    humming_tile: int = 64
    launch_s: float = 4.5e-6
    kernels_per_layer: int = 30
    attention_kernels_per_layer: int = 8
    graph_replay_s: float = 18e-6
    host_step_s: float = 1.8e-3
    host_seq_s: float = 2.5e-6
    host_overlap: float = 0.7
    prefix_hash_cost: float = 0.01
    """Host time hashing blocks for the prefix cache (a random workload never hits it)."""
    # -- communication
    link_eff: float = 0.6063
    allreduce_latency_s: float = 9e-6
    congestion: float = 0.16
    """All-to-all efficiency falls as (1 + congestion·(ranks − 2)^0.8·(1 + tokens/8192))."""
    agrs_latency_s: float = 35e-6
    ht_latency_s: float = 80e-6
    ll_latency_s: float = 22e-6
    ll_chunk_tokens: int = 256
    ll_eff: float = 0.6
    expert_skew: float = 1.25
    eplb_skew: float = 1.07
    eplb_cost: float = 0.02
    dp_sync_s: float = 2.5e-4
    dp_jitter: float = 0.025
    # -- speculation (DSpark on random prompts)
    acceptance: float = 0.58
    acceptance_decay: float = 0.82
    draft_flop_per_token: float = 2 * 0.9e9
    # -- memory
    act_bytes_per_token: float = 0.34e6
    gathered_act_bytes_per_token: float = 0.06e6
    """allgather_reducescatter materialises every DP rank's tokens in each rank's MoE buffers."""
    graph_bytes_per_size: float = 22e6
    context_bytes: float = 1.1 * 1024 ** 3
    nccl_bytes_per_doubling: float = 0.35 * 1024 ** 3
    ll_buffer_bytes: float = 2.4 * 1024 ** 3
    ht_buffer_bytes: float = 1.2 * 1024 ** 3
    eplb_bytes: float = 1.5 * 1024 ** 3
    lost_bytes: float = 0.9 * 1024 ** 3
    """Memory the allocator loses to fragmentation under load: what a start-up profile cannot see."""
    # -- the benchmark
    preempt_thrash: float = 0.1793
    # -- noise (never told to a search)
    noise_floor: float = 0.01
    noise_load: float = 0.025
    noise_spec: float = 0.03
    noise_dp: float = 0.006
    slow_launch_p: float = 0.06
    slow_launch_cost: float = 0.12
    latency_noise: float = 0.06


NOMINAL = Constants()

_EFFICIENCIES = ("dense_eff", "hbm_eff", "marlin_eff", "humming_eff", "link_eff", "acceptance")
_COSTS = ("launch_s", "host_step_s", "host_seq_s", "allreduce_latency_s", "agrs_latency_s", "ht_latency_s",
          "ll_latency_s", "kv_bytes_per_token", "congestion", "act_bytes_per_token", "graph_bytes_per_size")


def drawn(seed: int, base: Constants = NOMINAL, spread: float = 0.2) -> Constants:
    """Seed ``seed``'s node: ``base`` with its efficiencies and costs off by up to ±``spread`` and its
    thresholds and losses drawn from their ranges (seed-for-seed reproducible)."""
    rng = random.Random(f"independent-{seed}")
    values: dict[str, float | int] = {}
    for name in _EFFICIENCIES + _COSTS:
        values[name] = float(getattr(base, name)) * (1.0 + rng.uniform(-spread, spread))
    values["acceptance"] = min(float(values["acceptance"]), 0.85)
    values["humming_min_tokens_per_expert"] = rng.choice([12.0, 24.0, 48.0, 96.0])
    values["ll_chunk_tokens"] = rng.choice([128, 256])
    values["expert_skew"] = rng.uniform(1.12, 1.4)
    values["lost_bytes"] = rng.uniform(0.3, 1.4) * 1024 ** 3
    values["humming_memory_penalty"] = rng.uniform(1.0, 1.15)
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]
