"""What one launch runs, as the performance model reads it: from vLLM's parsed arguments or from the tuner's
option mapping.

:class:`EmulatedConfig` holds the levers that change speed, memory and numerics; what only the emulated
node's HTTP side needs (address, keys, served names, parsers) is its ``Frontend``
(``tuner/engines/emulated/frontend.py``). Defaults are vLLM 0.32's
for a GPU launch of DeepSeek-V4-Flash where the two differ from a library default (block size 64:
FlashMLA's page; max-model-len: the model's native 1,048,576 tokens).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.perfmodel._deps import DEFAULT_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, Topology
from tuner.perfmodel.architecture import NATIVE_CONTEXT_TOKENS

__all__ = ["CUDAGRAPH_MODES", "EmulatedConfig", "default_capture_sizes"]

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.32's parser default (``--gpu-memory-utilization``)."""
DEFAULT_BLOCK_SIZE = 64
DEFAULT_CAPTURE_LIMIT = 512
"""vLLM's default ceiling of CUDA-graph capture sizes (config/compilation.py)."""


def default_capture_sizes(limit: int, step_multiple: int = 1) -> tuple[int, ...]:
    """vLLM's default capture sizes up to ``limit``: 1, 2, 4, then every 8 to 248, then every 16.

    Under speculation every size is a multiple of ``1 + k`` (vLLM rounds them; config/compilation.py).
    """
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, limit + 1, 16)]
    if step_multiple > 1:
        sizes = sorted({max(step_multiple, s - s % step_multiple) for s in sizes})
    out = tuple(s for s in sizes if s <= max(limit, 1))
    return out if out else (max(1, limit),)


@dataclass(frozen=True)
class EmulatedConfig:
    """The levers of one launch that the performance, memory and numerics models read."""

    model: str = "deepseek-ai/DeepSeek-V4-Flash-0731"
    tp: int = 1
    dp: int = 1
    ep: bool = False
    eplb: bool = False
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    """Per DP engine, in requests."""
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None
    kv_cache_dtype: str = "auto"
    block_size: int = DEFAULT_BLOCK_SIZE
    max_model_len: int = NATIVE_CONTEXT_TOKENS
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    capture_sizes: tuple[int, ...] = ()
    """Batch sizes (tokens) captured as CUDA graphs; empty when eager."""
    moe_backend: str = "auto"
    all2all_backend: str = "allgather_reducescatter"
    spec_method: str | None = None
    spec_tokens: int = 0
    draft_sample_method: str | None = None
    custom_allreduce: bool = True
    api_server_count: int = 0
    """API server processes (0: vLLM's default, one per DP engine)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Other options as given (for the truth table's rules and the log's config line)."""

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def api_servers(self) -> int:
        return self.api_server_count if self.api_server_count > 0 else self.dp

    @property
    def speculative(self) -> bool:
        return self.spec_method is not None and self.spec_tokens > 0

    @property
    def eager(self) -> bool:
        return self.cudagraph_mode == "NONE"

    @property
    def max_capture_size(self) -> int:
        return max(self.capture_sizes) if self.capture_sizes else 0

    @property
    def topology_name(self) -> str:
        """``tp4``, ``dp4-ep``, ``tp2-dp2-ep``: the hardware profile's name of this shape (:class:`Topology`)."""
        return Topology(tp=self.tp, dp=self.dp, ep=self.ep).name

    def padded_tokens(self, tokens: int) -> int:
        """The captured size a uniform batch of ``tokens`` is padded to (itself when none fits)."""
        for size in self.capture_sizes:
            if size >= tokens:
                return size
        return tokens

    def feasibility_args(self) -> dict[str, Any]:
        """The launch in the option names the feasibility model reads (``tuner.search.feasibility``)."""
        compilation: dict[str, Any] = {"cudagraph_mode": self.cudagraph_mode}
        if self.capture_sizes:
            compilation["max_cudagraph_capture_size"] = self.max_capture_size
        args: dict[str, Any] = {
            "tensor-parallel-size": self.tp, "data-parallel-size": self.dp, "enable-expert-parallel": self.ep,
            "max-num-seqs": self.max_num_seqs, "max-num-batched-tokens": self.max_num_batched_tokens,
            "gpu-memory-utilization": self.gpu_memory_utilization, "kv-cache-dtype": self.kv_cache_dtype,
            "block-size": self.block_size, "max-model-len": self.max_model_len,
            "compilation-config": compilation, "enforce-eager": self.eager,
        }
        if self.kv_cache_memory_bytes is not None:
            args["kv-cache-memory-bytes"] = self.kv_cache_memory_bytes
        if self.speculative:
            args["speculative-config"] = {"method": self.spec_method, "num_speculative_tokens": self.spec_tokens}
        return args

    @classmethod
    def from_options(cls, options: Mapping[str, Any], model: str | None = None) -> EmulatedConfig:
        """From the tuner's option mapping (``{"tensor-parallel-size": 4, "compilation-config": {...}}``)."""
        opts = {str(k).replace("_", "-"): v for k, v in options.items()}
        compilation = _as_mapping(opts.get("compilation-config"))
        spec = _as_mapping(opts.get("speculative-config"))
        return _build(
            model=model or str(opts.get("model", cls.model)),
            tp=opts.get("tensor-parallel-size"), dp=opts.get("data-parallel-size"),
            ep=opts.get("enable-expert-parallel"), eplb=opts.get("enable-eplb"),
            max_num_seqs=opts.get("max-num-seqs"), max_num_batched_tokens=opts.get("max-num-batched-tokens"),
            gpu_memory_utilization=opts.get("gpu-memory-utilization"),
            kv_cache_memory_bytes=opts.get("kv-cache-memory-bytes"), kv_cache_dtype=opts.get("kv-cache-dtype"),
            block_size=opts.get("block-size"), max_model_len=opts.get("max-model-len"),
            enable_prefix_caching=opts.get("enable-prefix-caching"),
            enable_chunked_prefill=opts.get("enable-chunked-prefill"),
            cudagraph_mode=compilation.get("cudagraph_mode"), enforce_eager=opts.get("enforce-eager"),
            capture_sizes=compilation.get("cudagraph_capture_sizes"),
            max_capture_size=compilation.get("max_cudagraph_capture_size"),
            moe_backend=opts.get("moe-backend"), all2all_backend=opts.get("all2all-backend"),
            spec=spec, disable_custom_all_reduce=opts.get("disable-custom-all-reduce"),
            api_server_count=opts.get("api-server-count"),
            extra={k: v for k, v in opts.items() if k not in _KNOWN_OPTIONS},
        )

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> EmulatedConfig:
        """From the namespace vLLM's own ``vllm serve`` parser returned."""
        compilation = getattr(ns, "compilation_config", None)
        mode = getattr(compilation, "cudagraph_mode", None) if compilation is not None else None
        spec = _as_mapping(getattr(ns, "speculative_config", None))
        model = getattr(ns, "model_tag", None) or getattr(ns, "model", None) or cls.model
        return _build(
            model=str(model), tp=ns.tensor_parallel_size, dp=ns.data_parallel_size,
            ep=ns.enable_expert_parallel, eplb=getattr(ns, "enable_eplb", False),
            max_num_seqs=ns.max_num_seqs, max_num_batched_tokens=ns.max_num_batched_tokens,
            gpu_memory_utilization=ns.gpu_memory_utilization, kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
            kv_cache_dtype=ns.kv_cache_dtype, block_size=ns.block_size, max_model_len=ns.max_model_len,
            enable_prefix_caching=ns.enable_prefix_caching, enable_chunked_prefill=ns.enable_chunked_prefill,
            cudagraph_mode=getattr(mode, "name", mode), enforce_eager=ns.enforce_eager,
            capture_sizes=getattr(compilation, "cudagraph_capture_sizes", None),
            max_capture_size=getattr(compilation, "max_cudagraph_capture_size", None),
            moe_backend=getattr(ns, "moe_backend", None), all2all_backend=getattr(ns, "all2all_backend", None),
            spec=spec, disable_custom_all_reduce=getattr(ns, "disable_custom_all_reduce", False),
            api_server_count=getattr(ns, "api_server_count", None),
            extra={"numa-bind": getattr(ns, "numa_bind", None)},
        )


_KNOWN_OPTIONS = frozenset({
    "model", "tensor-parallel-size", "data-parallel-size", "enable-expert-parallel", "enable-eplb", "max-num-seqs",
    "max-num-batched-tokens", "gpu-memory-utilization", "kv-cache-memory-bytes", "kv-cache-dtype", "block-size",
    "max-model-len", "enable-prefix-caching", "enable-chunked-prefill", "compilation-config", "enforce-eager",
    "moe-backend", "all2all-backend", "speculative-config", "disable-custom-all-reduce", "api-server-count",
})


def _as_mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        loaded = json.loads(value)
        return dict(loaded) if isinstance(loaded, dict) else {}
    if isinstance(value, Mapping):
        return dict(value)
    return {}


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _build(*, model: str, tp: Any, dp: Any, ep: Any, eplb: Any, max_num_seqs: Any, max_num_batched_tokens: Any,
           gpu_memory_utilization: Any, kv_cache_memory_bytes: Any, kv_cache_dtype: Any, block_size: Any,
           max_model_len: Any, enable_prefix_caching: Any, enable_chunked_prefill: Any, cudagraph_mode: Any,
           enforce_eager: Any, capture_sizes: Any, max_capture_size: Any, moe_backend: Any, all2all_backend: Any,
           spec: Mapping[str, Any], disable_custom_all_reduce: Any, api_server_count: Any,
           extra: Mapping[str, Any]) -> EmulatedConfig:
    seqs = int(_pick(max_num_seqs, DEFAULT_MAX_NUM_SEQS))
    method = spec.get("method")
    k = int(spec.get("num_speculative_tokens") or 0) if method is not None else 0
    mode = "NONE" if enforce_eager else str(_pick(cudagraph_mode, "FULL_AND_PIECEWISE")).upper()
    if mode not in CUDAGRAPH_MODES:
        raise ValueError(f"unknown cudagraph_mode {mode!r}; vLLM knows {', '.join(CUDAGRAPH_MODES)}")
    sizes: tuple[int, ...] = ()
    if mode != "NONE":
        query = 1 + k
        if capture_sizes:
            sizes = tuple(sorted({max(query, int(s) - int(s) % query) for s in capture_sizes}))
        else:
            # The feasibility model's default ceiling: min(2 · max-num-seqs · (1 + k), 512).
            limit = int(_pick(max_capture_size, min(2 * seqs * query, DEFAULT_CAPTURE_LIMIT)))
            sizes = default_capture_sizes(limit, query)
    return EmulatedConfig(
        model=model, tp=int(_pick(tp, 1)), dp=int(_pick(dp, 1)), ep=bool(ep), eplb=bool(eplb),
        max_num_seqs=seqs, max_num_batched_tokens=int(_pick(max_num_batched_tokens, DEFAULT_BATCHED_TOKENS)),
        gpu_memory_utilization=float(_pick(gpu_memory_utilization, DEFAULT_GPU_MEMORY_UTILIZATION)),
        kv_cache_memory_bytes=None if kv_cache_memory_bytes is None else int(kv_cache_memory_bytes),
        kv_cache_dtype=str(_pick(kv_cache_dtype, "auto")), block_size=int(_pick(block_size, DEFAULT_BLOCK_SIZE)),
        max_model_len=int(_pick(max_model_len, NATIVE_CONTEXT_TOKENS)),
        enable_prefix_caching=bool(_pick(enable_prefix_caching, True)),
        enable_chunked_prefill=bool(_pick(enable_chunked_prefill, True)),
        cudagraph_mode=mode, capture_sizes=sizes, moe_backend=str(_pick(moe_backend, "auto")),
        all2all_backend=str(_pick(all2all_backend, "allgather_reducescatter")),
        spec_method=str(method) if method is not None and k > 0 else None, spec_tokens=k,
        draft_sample_method=spec.get("draft_sample_method"),
        custom_allreduce=not bool(disable_custom_all_reduce), api_server_count=int(_pick(api_server_count, 0)),
        extra=dict(extra),
    )
