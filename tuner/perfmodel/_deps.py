"""The few names the performance model takes from the rest of dsv4-tune, imported in one place.

The memory model (weights, activations, graphs, KV bytes per token) is the feasibility model's;
the node is a hardware profile; the weights are a checkpoint of the catalog. Nothing else of the
tuner is imported by the performance model, so when those modules move only this file changes.
"""

from __future__ import annotations

from tuner.search.checkpoints import Checkpoint
from tuner.search.feasibility import (
    DEFAULT_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    GIB,
    N_LAYERS,
    VOCAB_SIZE,
    RankMemory,
    kv_bytes_per_token,
    rank_memory,
)
from tuner.search.profile import HardwareProfile, Topology

__all__ = [
    "DEFAULT_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
    "GIB",
    "N_LAYERS",
    "VOCAB_SIZE",
    "Checkpoint",
    "HardwareProfile",
    "RankMemory",
    "Topology",
    "kv_bytes_per_token",
    "rank_memory",
]
