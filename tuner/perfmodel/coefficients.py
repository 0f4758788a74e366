"""Every tunable number of the performance model, in one frozen dataclass.

:data:`NOMINAL` is the prior: the values that reproduce the blog's three measurements on gh200x4
(see ``docs/emulator.md`` for the calibration table and where each value comes from).
:func:`perturbed` draws a *true* node that differs from the prior the way a real node differs from
a model of it: every kernel and backend efficiency off by up to ±``spread``, optionally one backend's
advertised gain missing, optionally one kind of communication costing ``comm_factor`` times more.
A search benchmark then runs against the truth while the tuner believes the prior.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MOE_BACKENDS", "NOMINAL", "Coefficients", "MoeBackend", "moe_backend", "perturbed"]


@dataclass(frozen=True)
class MoeBackend:
    """How a MoE backend computes: the precision its tensor cores run at, and its efficiency field."""

    name: str
    math: str
    """``bf16`` (weight-only dequant, Marlin), ``fp8`` (W4A8, e.g. Humming) or ``fp4`` (native FP4)."""
    mfu_field: str


MOE_BACKENDS: Mapping[str, MoeBackend] = {b.name: b for b in (
    MoeBackend("marlin", "bf16", "moe_mfu_marlin"),
    MoeBackend("triton", "bf16", "moe_mfu_triton"),
    MoeBackend("emulation", "bf16", "moe_mfu_triton"),
    MoeBackend("humming", "fp8", "moe_mfu_humming"),
    MoeBackend("deep_gemm", "fp8", "moe_mfu_fp8"),
    MoeBackend("deep_gemm_mega_moe", "fp8", "moe_mfu_fp8"),
    MoeBackend("cutlass", "fp8", "moe_mfu_fp8"),
    MoeBackend("hpc", "fp8", "moe_mfu_fp8"),
    MoeBackend("flashinfer_trtllm", "fp4", "moe_mfu_fp4"),
    MoeBackend("flashinfer_cutlass", "fp4", "moe_mfu_fp4"),
    MoeBackend("flashinfer_cutedsl", "fp4", "moe_mfu_fp4"),
    MoeBackend("flashinfer_moe_ep_cutedsl", "fp4", "moe_mfu_fp4"),
    MoeBackend("flashinfer_moe_ep_mega_deep_gemm", "fp4", "moe_mfu_fp4"),
    MoeBackend("flashinfer_b12x", "fp4", "moe_mfu_fp4"),
    MoeBackend("b12x", "fp4", "moe_mfu_fp4"),
    MoeBackend("aiter", "fp8", "moe_mfu_aiter"),
    MoeBackend("aiter_mega_moe", "fp8", "moe_mfu_aiter"),
    MoeBackend("aiter_triton_mxfp4_bf16", "bf16", "moe_mfu_aiter"),
    MoeBackend("flydsl", "bf16", "moe_mfu_aiter"),
)}
"""MoE backends of vLLM 0.32 (config/kernel.py) by the precision their GEMMs run at."""

_AUTO_BY_GENERATION = {
    # blog: "vLLM's default on Hopper ... picks Marlin"; model card: on SM120 the NVFP4 kernels are not
    # auto-selected and route through Marlin; Blackwell data-centre parts run FP4 natively.
    "hopper": "marlin", "blackwell_rtx": "marlin", "blackwell": "flashinfer_trtllm",
    "blackwell_ultra": "flashinfer_trtllm", "cdna3": "aiter_triton_mxfp4_bf16",
}


def moe_backend(name: str, generation: str) -> MoeBackend:
    """The backend ``--moe-backend name`` runs on this GPU generation (``auto`` resolved)."""
    chosen = _AUTO_BY_GENERATION.get(generation, "triton") if name == "auto" else name
    return MOE_BACKENDS.get(chosen, MoeBackend(chosen, "bf16", "moe_mfu_triton"))


@dataclass(frozen=True)
class Coefficients:
    """Efficiencies and fixed costs. Rates are fractions of the node's sustained peaks (``hardware.py``)."""

    # -- memory streams: share of HBM bandwidth a kernel achieves
    weight_stream_eff: float = 0.80
    """Weights read by GEMMs at small batch (memory-bound decode)."""
    kv_read_eff: float = 0.55
    """Paged, compressed KV read by attention."""
    activation_stream_eff: float = 0.50
    """Per-token elementwise kernels (norms, activations, FP8 quantisation, sampling)."""
    # -- compute: share of the sustained peak of the precision the GEMM runs at
    dense_mfu: float = 0.45
    """Attention projections, shared expert, head: FP8 block-scaled GEMMs."""
    attention_mfu: float = 0.40
    moe_mfu_marlin: float = 0.31
    """W4A16 Marlin on bf16 tensor cores (vLLM's default MoE on Hopper); fitted to the blog's DP4 + EP 12,802."""
    moe_mfu_humming: float = 0.38
    """W4A8 Humming on fp8 tensor cores; fitted to the blog's "+40%" (with the EP imbalance, ~34% of the roof;
    blog: the fixed kernels' MoE bucket is "still at 30% of its roof")."""
    moe_mfu_triton: float = 0.15
    moe_mfu_fp8: float = 0.25
    moe_mfu_fp4: float = 0.22
    moe_mfu_aiter: float = 0.20
    ep_imbalance: float = 0.12
    """The busiest EP rank's extra MoE work over the mean, without EPLB."""
    eplb_imbalance: float = 0.03
    # -- per-token traffic that runs on the full batch under TP, on 1/N of it under DP
    elementwise_bytes_per_token: float = 7.0e6
    """43 layers × hidden 4096 × 2 B × ~20 passes (blog: act+quant ~2 ms of real data movement per step)."""
    # -- kernels, launches and the host
    kernels_per_layer: float = 24.0
    """Blog: the act+quant bucket alone is "~520 tiny kernel launches per step" (12 a layer)."""
    kernel_floor_s: float = 2.5e-6
    """The least a kernel costs, even replayed from a CUDA graph."""
    launch_s: float = 5.0e-6
    """Extra per kernel launched eagerly from Python (no CUDA graph)."""
    attention_kernels_per_layer: float = 4.0
    """Kernels left outside PIECEWISE graphs (attention runs eagerly between the graph pieces)."""
    graph_replay_s: float = 40e-6
    host_step_s: float = 1.0e-3
    """Per-step host work the GPU waits for (input preparation, sampling sync)."""
    engine_cpu_per_seq_s: float = 10e-6
    """Engine-core CPU per scheduled request per step (scheduler, output processing); overlapped with
    the GPU by async scheduling, so it only shows when it exceeds the GPU step."""
    frontend_token_s: float = 125e-6
    """API-server CPU per streamed token (detokenise, build the SSE chunk, send), split over
    --api-server-count processes (vLLM's default: one per DP engine); pipelined with the engine.
    An assumption fitted to the blog's TP4 5,856 (one API server caps near 8,000 tok/s)."""
    # -- communication
    allreduce_eff: float = 0.40
    nccl_latency_factor: float = 3.0
    """NCCL's latency over a custom one-shot allreduce (--disable-custom-all-reduce)."""
    a2a_eff_allgather_reducescatter: float = 0.25
    """Blog: comms at c2048 "10.8 ms against ~3 ms at the wire rate" (the model: 10.3 ms)."""
    a2a_eff_deepep_high_throughput: float = 0.60
    a2a_eff_deepep_low_latency: float = 0.35
    a2a_eff_other: float = 0.45
    a2a_latency_allgather_reducescatter: float = 2.0
    a2a_latency_deepep_high_throughput: float = 6.0
    a2a_latency_deepep_low_latency: float = 1.0
    """Per-layer latency of the dispatch + combine, in units of the node's link latency."""
    # -- speculative decoding: per-position acceptance of the draft's tokens
    accept_dspark: float = 0.60
    accept_mtp: float = 0.70
    """Model card: MTP acceptance 70% on random prompts (89% on its calibration workload)."""
    accept_ngram: float = 0.25
    accept_other: float = 0.50
    draft_weight_read_fraction: float = 0.5
    # -- memory the feasibility model does not know exactly
    kv_bytes_per_token_factor: float = 1.0
    """True KV bytes per token over the feasibility model's (1.0: the prior is right)."""
    transient_gib_per_1k_tokens: float = 0.30
    """Memory a step allocates outside vLLM's profiled budget, per 1,000 batched tokens (workspaces,
    collective buffers, fragmentation): what kills a launch at gpu-memory-utilization 0.97 under load."""

    def moe_mfu(self, backend: MoeBackend) -> float:
        return float(getattr(self, backend.mfu_field))

    def acceptance(self, method: str | None) -> float:
        if method is None:
            return 0.0
        return float(getattr(self, f"accept_{method}", self.accept_other))

    def a2a(self, backend: str) -> tuple[float, float]:
        """(bandwidth efficiency, latency in link latencies) of an all2all backend."""
        eff = getattr(self, f"a2a_eff_{backend}", self.a2a_eff_other)
        lat = getattr(self, f"a2a_latency_{backend}", self.a2a_latency_allgather_reducescatter)
        return float(eff), float(lat)

    def to_json(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coefficients:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown coefficient(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(cls(), **{k: float(v) for k, v in data.items()})


NOMINAL = Coefficients()

_NOT_PERTURBED = frozenset({"kernels_per_layer", "attention_kernels_per_layer", "nccl_latency_factor"})
_MEMORY_FIELDS = frozenset({"kv_bytes_per_token_factor", "transient_gib_per_1k_tokens"})
_FRACTIONS = frozenset(f.name for f in dataclasses.fields(Coefficients)
                       if f.name.endswith(("_eff", "_mfu")) or "_mfu_" in f.name or "_eff_" in f.name
                       or f.name.startswith("accept_"))


def perturbed(seed: int, spread: float = 0.3, *, base: Coefficients = NOMINAL,
              drop_backend_gain: str | None = None, comm_factor: float | Mapping[str, float] = 1.0) -> Coefficients:
    """A "true" node: ``base`` with every coefficient off by a factor in [1 − spread, 1 + spread].

    - Memory terms move by a third of ``spread`` (a ±30% KV error would move the knee by ±30%).
    - ``drop_backend_gain="humming"``: that MoE backend is no faster than vLLM's default on the
      same node (its FLOP advantage is eaten; a "gain that does not show up here").
    - ``comm_factor``: communication costs that many times more: a float for all of it, or a mapping
      ``{"allreduce": 2.0}`` / ``{"all2all": 2.0}`` for one kind (a topology whose links are worse).

    The same seed gives the same node on every machine.
    """
    rng = random.Random(seed)
    values: dict[str, float] = {}
    for f in dataclasses.fields(base):
        value = float(getattr(base, f.name))
        if f.name in _NOT_PERTURBED:
            values[f.name] = value
            continue
        width = spread / 3.0 if f.name in _MEMORY_FIELDS else spread
        value *= 1.0 + rng.uniform(-width, width)
        if f.name in _FRACTIONS:
            value = min(value, 0.95)
        values[f.name] = value
    out = dataclasses.replace(base, **values)
    if drop_backend_gain is not None:
        out = _without_gain(out, drop_backend_gain)
    factors = {"allreduce": comm_factor, "all2all": comm_factor} if isinstance(comm_factor, (int, float)) \
        else dict(comm_factor)
    unknown = sorted(set(factors) - {"allreduce", "all2all"})
    if unknown:
        raise ValueError(f"comm_factor names {unknown}; use 'allreduce' and/or 'all2all'")
    changes: dict[str, float] = {}
    for f in dataclasses.fields(out):
        kind = "allreduce" if f.name == "allreduce_eff" else "all2all" if f.name.startswith("a2a_eff_") else None
        if kind is not None and kind in factors:
            changes[f.name] = float(getattr(out, f.name)) / float(factors[kind])
    return dataclasses.replace(out, **changes)


_FP_RATIO = {"bf16": 1.0, "fp8": 2.0, "fp4": 4.0}


def _without_gain(coeffs: Coefficients, backend_name: str) -> Coefficients:
    """Make ``backend_name`` deliver the rate of Marlin on bf16 (the Hopper default), whatever its math."""
    backend = MOE_BACKENDS.get(backend_name)
    if backend is None:
        raise ValueError(f"drop_backend_gain: unknown MoE backend {backend_name!r}; known: {sorted(MOE_BACKENDS)}")
    ratio = _FP_RATIO[backend.math]
    rate = coeffs.moe_mfu_marlin / ratio
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError("drop_backend_gain needs a positive Marlin efficiency")
    return dataclasses.replace(coeffs, **{backend.mfu_field: rate})
