"""Memory and KV capacity of one launch, from the feasibility model, and the :class:`NodeModel` built on it.

The performance model does not keep a memory model of its own: :func:`tuner.search.feasibility.rank_memory`
says what each rank holds and what is left for the KV cache, and
:func:`~tuner.search.feasibility.kv_bytes_per_token` how much one cached token costs. The truth may
scale the bytes per token (``Coefficients.kv_bytes_per_token_factor``) so that the tuner's own KV
refit has something to learn. vLLM allocates whole blocks: the capacity it logs is
``blocks × block_size`` tokens, and its "maximum concurrency" is that over max-model-len.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.perfmodel._deps import (
    GIB,
    Checkpoint,
    HardwareProfile,
    RankMemory,
    kv_bytes_per_token,
    rank_memory,
)
from tuner.perfmodel.coefficients import Coefficients
from tuner.perfmodel.hardware import NodeSpec, node_spec
from tuner.perfmodel.serve_config import EmulatedConfig
from tuner.perfmodel.step import NodeModel

__all__ = ["Capacity", "StartupVerdict", "capacity", "node_model", "startup_verdict"]

DRIVER_RESERVED_FRACTION = 0.015
"""Share of a GPU's memory the driver and CUDA context hold before vLLM starts (assumption; a
"96 GB" GH200 shows ~94.5 GiB free)."""


@dataclass(frozen=True)
class Capacity:
    """What one rank holds, and how many tokens its KV cache has."""

    memory: RankMemory
    kv_bytes_per_token: float
    num_blocks: int
    block_size: int

    @property
    def kv_tokens(self) -> int:
        """Tokens per rank (= per DP engine: TP ranks of a replica hold the same cache)."""
        return self.num_blocks * self.block_size

    @property
    def kv_gib(self) -> float:
        return max(0, self.memory.kv_bytes) / GIB

    def max_concurrency(self, tokens_per_request: int) -> float:
        """vLLM's "Maximum concurrency for N tokens per request": cached tokens over N."""
        return self.kv_tokens / max(1, tokens_per_request)


def capacity(profile: HardwareProfile, config: EmulatedConfig, checkpoint: Checkpoint,
             coefficients: Coefficients) -> Capacity:
    args = config.feasibility_args()
    memory = rank_memory(profile, args, checkpoint)
    per_token = kv_bytes_per_token(args, checkpoint) * coefficients.kv_bytes_per_token_factor
    blocks = max(0, int(memory.kv_bytes / per_token) // config.block_size) if memory.kv_bytes > 0 else 0
    return Capacity(memory=memory, kv_bytes_per_token=per_token, num_blocks=blocks, block_size=config.block_size)


def node_model(profile: HardwareProfile, config: EmulatedConfig, checkpoint: Checkpoint,
               coefficients: Coefficients, node: NodeSpec | None = None) -> NodeModel:
    """The step-time model of this launch (weights per rank as the feasibility model places them)."""
    memory = capacity(profile, config, checkpoint, coefficients)
    return NodeModel(node=node or node_spec(profile), config=config, coefficients=coefficients,
                     routed_expert_bytes_rank=float(memory.memory.routed_experts_bytes),
                     non_expert_bytes_rank=float(memory.memory.non_expert_bytes),
                     draft_bytes_rank=float(memory.memory.draft_bytes),
                     kv_bytes_per_token_rank=memory.kv_bytes_per_token)


@dataclass(frozen=True)
class StartupVerdict:
    """Whether vLLM would get through start-up, and if not, where and with which words."""

    ok: bool
    stage: str = ""
    """``load`` (weights do not fit the GPU), ``kv`` (no room for blocks), ``max_len`` (one request does not fit)."""
    message: str = ""


def startup_verdict(node: NodeSpec, config: EmulatedConfig, cap: Capacity, checkpoint: Checkpoint) -> StartupVerdict:
    """vLLM's start-up memory checks, in vLLM's words (gpu_worker / kv_cache_utils)."""
    device = node.memory_per_device_bytes
    free = device * (1.0 - DRIVER_RESERVED_FRACTION)
    weights = cap.memory.weights_bytes
    if weights > free:
        tried = min(weights - free + 1.75 * GIB, 8 * GIB)
        return StartupVerdict(False, "load", (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried / GIB:.2f} GiB. GPU 0 has a "
            f"total capacity of {device / GIB:.2f} GiB of which {max(0.0, free - weights + tried) / (1 << 20):.2f} "
            f"MiB is free. Including non-PyTorch memory, this process has {free / GIB:.2f} GiB memory in use. "
            f"Of the allocated memory {(weights - tried) / GIB:.2f} GiB is allocated by PyTorch, and 0 bytes is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"))
    if cap.memory.kv_bytes <= 0 or cap.num_blocks == 0:
        return StartupVerdict(False, "kv", (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite "
            "its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."))
    if cap.kv_tokens < config.max_model_len:
        needed = config.max_model_len * cap.kv_bytes_per_token
        estimate = cap.kv_tokens
        return StartupVerdict(False, "max_len", (
            f"ValueError: To serve at least one request with the model's max seq len ({config.max_model_len}), "
            f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({cap.kv_gib:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{estimate}. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
            "backend) or decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."))
    return StartupVerdict(True)

