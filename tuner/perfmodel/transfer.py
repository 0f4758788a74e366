"""A prefill/decode layout's KV transfer: what moving one prompt's KV from a prefill member to a decode member costs.

The emulated node's decode member waits :func:`transfer_s` before it decodes (``tuner/engines/emulated/disagg.py``
holds the protocol: the connector, NIXL's parameters and histograms); the prior prices a layout with the same
two constants (``tuner/predict/disagg.py``).
"""

from __future__ import annotations

__all__ = ["TRANSFER_EFFICIENCY", "TRANSFER_LATENCY_S", "transfer_s"]

TRANSFER_EFFICIENCY = 0.5
"""Share of one GPU's link bandwidth a KV transfer reaches (assumption: NIXL over NVLink moves many small
per-layer block descriptors, not one large buffer)."""
TRANSFER_LATENCY_S = 2e-3
"""Fixed cost of one transfer: the notification, the descriptor post and the handshake's share (assumption)."""


def transfer_s(prompt_tokens: int, kv_bytes_per_token: float, link_bytes_s: float) -> float:
    """Seconds to move ``prompt_tokens`` tokens of KV from a prefill member to a decode member."""
    return TRANSFER_LATENCY_S + prompt_tokens * kv_bytes_per_token / (link_bytes_s * TRANSFER_EFFICIENCY)
