"""DeepSeek-V4-Flash as the performance model sees it: how much work one token costs.

Facts come from the reference texts (``../shared/reference/``); each constant says which.
The layer count and vocabulary are the feasibility model's (:mod:`tuner.search.feasibility`),
not repeated here.
"""

from __future__ import annotations

from tuner.perfmodel._deps import N_LAYERS, VOCAB_SIZE

__all__ = [
    "ACTIVE_PARAMS",
    "ATTENTION_CONTEXT_CAP_TOKENS",
    "ATTENTION_FLOPS_PER_PAIR",
    "DENSE_FLOPS_PER_TOKEN",
    "DRAFT_ACTIVE_PARAMS",
    "EXPERTS_PER_TOKEN",
    "HIDDEN_SIZE",
    "NATIVE_CONTEXT_TOKENS",
    "N_LAYERS",
    "ROUTED_EXPERTS",
    "ROUTED_FLOPS_PER_TOKEN",
    "ROUTED_PARAMS",
    "VOCAB_SIZE",
    "experts_touched_fraction",
]

TOTAL_PARAMS = 284e9
"""Dossier / model card: "284B total · 13B active"."""
ACTIVE_PARAMS = 13e9
ROUTED_EXPERTS = 256
"""Dossier: "one shared expert and 256 routed experts; six routed experts activate per token"."""
EXPERTS_PER_TOKEN = 6
HIDDEN_SIZE = 4096
"""Model card: "Hidden size 4096"."""
ROUTED_PARAMS = 264e9
"""Routed-expert parameters, solved from the W4A16 card's sizes (``search_spaces/_checkpoints.yaml``)."""
NATIVE_CONTEXT_TOKENS = 1_048_576
"""Dossier: "Native context 1,048,576 tokens" (vLLM's max-model-len when none is given)."""

ROUTED_FLOPS_PER_TOKEN = 2.0 * ROUTED_PARAMS * EXPERTS_PER_TOKEN / ROUTED_EXPERTS
"""2 FLOPs per active routed parameter: 6 of 256 experts → 6.19 B parameters, 12.4 GFLOP."""
DENSE_FLOPS_PER_TOKEN = 2.0 * (ACTIVE_PARAMS - ROUTED_PARAMS * EXPERTS_PER_TOKEN / ROUTED_EXPERTS)
"""The rest of the 13 B active parameters (attention projections, shared expert, head): 13.6 GFLOP."""

ATTENTION_FLOPS_PER_PAIR = 4.0 * 64 * 512 * N_LAYERS
"""One query attending one cached entry, all layers: QK and PV over 64 heads × 512 latent dims
(assumption; the texts give "1 KV head" and compressed attention, not the head shapes)."""
ATTENTION_CONTEXT_CAP_TOKENS = 2048
"""Compressed sparse attention attends a bounded number of entries per query (assumption: a
top-2048 selection, as DeepSeek's sparse attention of V3.2); KV *reads* still scale with the context."""

DRAFT_ACTIVE_PARAMS = {"mtp": 0.85e9, "dspark": 1.2e9}
"""Active parameters of one draft pass: MTP is one extra layer plus the head (~0.3 B + 0.53 B);
DSpark's drafter is an assumption of the same order."""


def experts_touched_fraction(tokens: float) -> float:
    """Share of a layer's routed experts that at least one of ``tokens`` routes to (uniform routing).

    With few tokens most expert weights are never read in a step (memory-bound decode reads only
    the touched ones); past ~1,000 tokens every expert is read.
    """
    if tokens <= 0:
        return 0.0
    miss = 1.0 - EXPERTS_PER_TOKEN / ROUTED_EXPERTS
    return float(1.0 - miss ** tokens)
