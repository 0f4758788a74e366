"""The emulated node's side of prefill/decode disaggregation: a member of a P/D layout (issue 27).

A member is a server launched with ``--kv-transfer-config``; which side of a request it is comes from the
request, as with vLLM's NIXL connector and the router's protocol (``vllm-router --vllm-pd-disaggregation``):

- the router first sends the request to a prefill member with ``max_tokens: 1`` and ``kv_transfer_params:
  {do_remote_decode: true}``; that member prefills and answers with ``kv_transfer_params`` naming its
  blocks (``do_remote_prefill: true, remote_block_ids, remote_engine_id, ...``);
- then it sends the original request, with those ``kv_transfer_params``, to a decode member. That member
  receives the prompt's KV over the node's link (:func:`tuner.perfmodel.transfer.transfer_s`: a fixed cost per
  transfer plus the prompt's KV bytes at ``TRANSFER_EFFICIENCY`` of one GPU's link), then computes the last prompt token
  itself and decodes, as vLLM's decode instance does.

What the decode member's ``/metrics`` adds: NIXL's transfer histograms and failure counter
(``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_bytes_transferred``, ``vllm:nixl_num_failed_transfers``,
names and buckets of ``vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py``) when the connector is
NIXL's, and vLLM's ``vllm:external_prefix_cache_queries``/``_hits`` for any connector.

What it does not model: the prefill member keeps its blocks after it answered until the decode member has
pulled them (vLLM's NIXL holds them up to ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``); here they are freed at once.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.perfmodel.transfer import transfer_s

__all__ = ["NIXL_BYTES_BUCKETS", "NIXL_TIME_BUCKETS", "KvTransfer"]

NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
"""vLLM 0.32's ``vllm:nixl_xfer_time_seconds`` buckets."""
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
"""vLLM 0.32's ``vllm:nixl_bytes_transferred`` buckets (2 KiB to 8 GiB)."""
NIXL_CONNECTORS = frozenset({"NixlConnector", "NixlPullConnector", "NixlPushConnector"})


@dataclass(frozen=True)
class KvTransfer:
    """A member's connector: its name, the KV bytes one token moves, and the link it moves over."""

    connector: str
    kv_bytes_per_token: float
    link_bytes_s: float
    engine_id: str = ""

    @property
    def nixl(self) -> bool:
        return self.connector in NIXL_CONNECTORS

    def seconds(self, prompt_tokens: int) -> float:
        return transfer_s(prompt_tokens, self.kv_bytes_per_token, self.link_bytes_s)

    def bytes_of(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.kv_bytes_per_token

    @classmethod
    def from_config(cls, config: Any, *, kv_bytes_per_token: float, link_bytes_s: float) -> KvTransfer | None:
        """From vLLM's parsed ``--kv-transfer-config`` (a ``KVTransferConfig``, a mapping, or None)."""
        if config is None:
            return None
        name = config.get("kv_connector") if isinstance(config, Mapping) else getattr(config, "kv_connector", None)
        if not name:
            return None
        engine_id = (config.get("engine_id") if isinstance(config, Mapping)
                     else getattr(config, "engine_id", None)) or secrets.token_hex(8)
        return cls(connector=str(name), kv_bytes_per_token=kv_bytes_per_token, link_bytes_s=link_bytes_s,
                   engine_id=str(engine_id))

    def prefill_answer(self, block_ids: list[int], host: str, port: int, tp_size: int) -> dict[str, Any]:
        """The ``kv_transfer_params`` a prefill member answers with (NIXL's shape)."""
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": block_ids,
                "remote_engine_id": self.engine_id, "remote_host": host, "remote_port": port, "tp_size": tp_size}


def wants_remote_decode(params: Any) -> bool:
    """The request is a prefill for a decode member elsewhere (the router's first leg)."""
    return isinstance(params, Mapping) and bool(params.get("do_remote_decode"))


def has_remote_prefill(params: Any) -> bool:
    """The request's prompt was prefilled elsewhere and its KV is to be pulled (the router's second leg)."""
    return isinstance(params, Mapping) and bool(params.get("do_remote_prefill"))
