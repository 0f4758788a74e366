"""How long one engine step of DeepSeek-V4-Flash takes on a node: a roofline, term by term.

Pure arithmetic: no I/O, no clock. :func:`step_time` takes the batches every DP engine runs in one
step (vLLM runs the DP engines of a MoE model in lock-step: the expert layers are one collective)
and returns the step's duration with its breakdown. For a rank of a replica with TP ``t`` in a
world of ``w = t·d`` GPUs, and ``T`` the tokens its replica runs (decode sequences × (1 + k) plus
prefill tokens), ``T_all`` the sum over replicas:

- dense (attention projections, shared expert, head; FP8):
  ``max(T·F_dense / t / (fp8 · dense_mfu), non_expert_bytes / t / (HBM · weight_eff))``
- MoE (routed experts, spread over all ``w`` ranks by EP or by vLLM's TP-across-DP):
  ``max(T_all·F_routed / w · (1 + imbalance) / (peak(backend) · moe_mfu(backend)),
  expert_bytes_rank · touched(T_all) / (HBM · weight_eff))``; ``peak`` is bf16 for Marlin (W4A16),
  fp8 for Humming (W4A8), fp4 for native Blackwell kernels: the blog's "the available FLOPs
  doubles, and the critical batch size doubles with it".
- attention: ``max(Σ context · kv_bytes_per_token / (HBM · kv_eff), pairs · F_pair / t / (bf16 · attn_mfu))``.
  Every TP rank reads the whole latent KV (one KV head: replicated under TP).
- elementwise: ``T · bytes_per_token / (HBM · act_eff)``: the full replica batch on *every* TP rank,
  1/N of the node's batch under DP (blog: "every per-token kernel ... now runs on 1/N of the batch").
- kernels: ``layers · kernels_per_layer · kernel_floor``, plus a launch cost per kernel run eagerly:
  all of them without CUDA graphs, the attention kernels under PIECEWISE graphs, none for a decode
  batch replayed from a FULL graph; graph batches are padded to the next captured size.
- communication, per layer: two TP allreduces of ``T × hidden × 2 B``, and with DP>1 the MoE
  dispatch + combine (allgather/reduce-scatter of every replica's tokens, or DeepEP's per-expert
  sends), each ``latency + bytes / (link · eff)``.
- speculative drafting: the draft's weights and FLOPs per pass (MTP: k sequential passes; DSpark:
  one pass for all k tokens).
- host: a fixed per-step cost the GPU waits for.

The GPU step is the slowest rank's sum of these terms (no overlap assumed). The CPU runs beside it
(async scheduling; separate API-server processes): the engine core's per-request work and the API
servers' per-token streaming. The step is the larger of the GPU and the CPU time. Coefficients are in
:class:`~tuner.perfmodel.coefficients.Coefficients`; node rates in ``hardware.py``; memory and
KV bytes per token come from the feasibility model (:mod:`tuner.perfmodel.capacity`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.perfmodel.architecture import (
    ATTENTION_FLOPS_PER_PAIR,
    DENSE_FLOPS_PER_TOKEN,
    DRAFT_ACTIVE_PARAMS,
    EXPERTS_PER_TOKEN,
    HIDDEN_SIZE,
    N_LAYERS,
    ROUTED_FLOPS_PER_TOKEN,
    experts_touched_fraction,
)
from tuner.perfmodel.coefficients import Coefficients, MoeBackend, moe_backend
from tuner.perfmodel.hardware import NodeSpec
from tuner.perfmodel.serve_config import EmulatedConfig

__all__ = ["EngineBatch", "NodeModel", "StepTime", "step_time"]

_FULL_DECODE_MODES = frozenset({"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})
_PIECEWISE_MODES = frozenset({"PIECEWISE", "FULL_AND_PIECEWISE"})
_BF16_BYTES = 2


@dataclass(frozen=True)
class EngineBatch:
    """What one DP engine runs in one step, counted in (virtual) requests and tokens."""

    decode_seqs: int = 0
    decode_context_tokens: int = 0
    """Σ of the decoding sequences' cached tokens (what attention reads)."""
    decode_attended_tokens: int = 0
    """Σ of min(context, attention cap) over the decoding sequences (what attention computes on)."""
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_context_tokens: int = 0
    """Σ of the cached tokens before each prefill chunk (read by the chunk's attention)."""
    prefill_attended_pairs: float = 0.0
    """Σ over prefill tokens of the entries each attends to (capped)."""

    @property
    def seqs(self) -> int:
        return self.decode_seqs + self.prefill_seqs

    @property
    def empty(self) -> bool:
        return self.decode_seqs == 0 and self.prefill_tokens == 0


@dataclass(frozen=True)
class StepTime:
    """One step's duration and where it went (seconds; the slowest engine's per-engine terms)."""

    total_s: float
    dense_s: float
    moe_s: float
    attention_s: float
    elementwise_s: float
    kernels_s: float
    comm_s: float
    draft_s: float
    host_s: float
    cpu_s: float = 0.0
    """The CPU side (engine core, API servers), overlapped with the GPU: the step is the larger."""

    def as_ms(self) -> dict[str, float]:
        return {name: round(getattr(self, name) * 1e3, 3) for name in (
            "total_s", "dense_s", "moe_s", "attention_s", "elementwise_s", "kernels_s", "comm_s", "draft_s",
            "host_s", "cpu_s")}


@dataclass(frozen=True)
class NodeModel:
    """Everything :func:`step_time` needs about one launch on one node."""

    node: NodeSpec
    config: EmulatedConfig
    coefficients: Coefficients
    routed_expert_bytes_rank: float
    non_expert_bytes_rank: float
    draft_bytes_rank: float
    kv_bytes_per_token_rank: float
    """True KV bytes per cached token on one rank (what attention reads)."""

    @property
    def backend(self) -> MoeBackend:
        return moe_backend(self.config.moe_backend, self.node.generation)

    @property
    def query_tokens_per_decode(self) -> int:
        return 1 + (self.config.spec_tokens if self.config.speculative else 0)

    def peak_flop_s(self, math_dtype: str) -> float:
        dev = self.node.device
        if math_dtype == "fp4" and dev.fp4_flop_s > 0:
            return dev.fp4_flop_s
        if math_dtype in ("fp4", "fp8") and dev.fp8_flop_s > 0:
            return dev.fp8_flop_s
        return dev.bf16_flop_s

    def group_link_bytes_s(self, group: int) -> float:
        """Bandwidth one GPU has towards ``group - 1`` peers: all of it behind a switch or one PCIe
        link; on a point-to-point mesh (GH200) only the links to those peers."""
        dev = self.node.device
        if dev.mesh and self.node.device_count > 1:
            return dev.link_bytes_s * min(1.0, (group - 1) / (self.node.device_count - 1))
        return dev.link_bytes_s


def _graph_path(model: NodeModel, batch: EngineBatch, tokens: int) -> str:
    """``full``, ``piecewise`` or ``eager``: how vLLM runs this batch under the cudagraph mode."""
    cfg = model.config
    if cfg.eager or tokens > cfg.max_capture_size:
        return "eager"
    uniform_decode = batch.prefill_tokens == 0
    if uniform_decode and cfg.cudagraph_mode in _FULL_DECODE_MODES:
        return "full"
    if cfg.cudagraph_mode in _PIECEWISE_MODES:
        return "piecewise"
    return "eager"


def _engine_terms(model: NodeModel, batch: EngineBatch) -> tuple[float, float, float, float, float, float, int]:
    """(dense, attention, elementwise, kernels, draft, host, executed tokens) of one engine's batch."""
    c = model.coefficients
    cfg = model.config
    dev = model.node.device
    q = model.query_tokens_per_decode
    tokens = batch.decode_seqs * q + batch.prefill_tokens
    if tokens == 0:
        # An idle DP engine still runs a dummy batch in lock-step with the others.
        return 0.0, 0.0, 0.0, N_LAYERS * c.kernels_per_layer * c.kernel_floor_s, 0.0, c.host_step_s * 0.25, 0
    path = _graph_path(model, batch, tokens)
    executed = cfg.padded_tokens(tokens) if path != "eager" else tokens
    hbm = dev.hbm_bytes_s
    dense_compute = executed * DENSE_FLOPS_PER_TOKEN / cfg.tp / (model.peak_flop_s("fp8") * c.dense_mfu)
    dense_memory = model.non_expert_bytes_rank / (hbm * c.weight_stream_eff)
    dense = max(dense_compute, dense_memory)
    kv_tokens = batch.decode_context_tokens + batch.prefill_context_tokens
    attention_memory = kv_tokens * model.kv_bytes_per_token_rank / (hbm * c.kv_read_eff)
    pairs = batch.decode_attended_tokens * q + batch.prefill_attended_pairs
    attention_compute = pairs * ATTENTION_FLOPS_PER_PAIR / cfg.tp / (dev.bf16_flop_s * c.attention_mfu)
    attention = max(attention_memory, attention_compute)
    elementwise = executed * c.elementwise_bytes_per_token / (hbm * c.activation_stream_eff)
    kernels_n = N_LAYERS * c.kernels_per_layer
    kernels = kernels_n * c.kernel_floor_s
    if path == "eager":
        kernels += kernels_n * c.launch_s
    elif path == "piecewise":
        kernels += N_LAYERS * c.attention_kernels_per_layer * c.launch_s + (N_LAYERS + 1) * c.graph_replay_s
    else:
        kernels += c.graph_replay_s
    draft = _draft_time(model, batch) if batch.decode_seqs else 0.0
    return dense, attention, elementwise, kernels, draft, c.host_step_s, executed


def _draft_time(model: NodeModel, batch: EngineBatch) -> float:
    cfg = model.config
    if not cfg.speculative:
        return 0.0
    c = model.coefficients
    method = cfg.spec_method or ""
    passes = cfg.spec_tokens if method == "mtp" else 1
    tokens_per_pass = batch.decode_seqs * (1 if method == "mtp" else cfg.spec_tokens)
    params = DRAFT_ACTIVE_PARAMS.get(method, 0.0)
    memory = model.draft_bytes_rank * c.draft_weight_read_fraction / (model.node.device.hbm_bytes_s
                                                                     * c.weight_stream_eff)
    compute = tokens_per_pass * 2.0 * params / cfg.tp / (model.peak_flop_s("fp8") * c.dense_mfu)
    kernels = c.kernels_per_layer * (c.kernel_floor_s + (c.launch_s if cfg.eager else 0.0))
    return passes * (max(memory, compute) + kernels)


def _moe_time(model: NodeModel, tokens_all: int) -> float:
    if tokens_all <= 0:
        return 0.0
    c = model.coefficients
    cfg = model.config
    backend = model.backend
    imbalance = (c.eplb_imbalance if cfg.eplb else c.ep_imbalance) if cfg.ep and cfg.world > 1 else 0.0
    flops = tokens_all * ROUTED_FLOPS_PER_TOKEN / cfg.world * (1.0 + imbalance)
    compute = flops / (model.peak_flop_s(backend.math) * c.moe_mfu(backend))
    touched = experts_touched_fraction(tokens_all)
    memory = model.routed_expert_bytes_rank * touched / (model.node.device.hbm_bytes_s * c.weight_stream_eff)
    return max(compute, memory)


def _comm_time(model: NodeModel, engine_tokens: Sequence[int]) -> float:
    c = model.coefficients
    cfg = model.config
    dev = model.node.device
    per_layer = 0.0
    busiest = max(engine_tokens, default=0)
    if cfg.tp > 1 and busiest > 0:
        size = busiest * HIDDEN_SIZE * _BF16_BYTES
        moved = 2.0 * (cfg.tp - 1) / cfg.tp * size
        latency = dev.link_latency_s * (1.0 if cfg.custom_allreduce else c.nccl_latency_factor)
        per_layer += 2.0 * (latency + moved / (model.group_link_bytes_s(cfg.tp) * c.allreduce_eff))
    tokens_all = sum(engine_tokens)
    if cfg.dp > 1 and tokens_all > 0:
        eff, latency_units = c.a2a(cfg.all2all_backend)
        world = cfg.world
        if cfg.all2all_backend.startswith(("deepep", "pplx", "flashinfer", "mori")):
            ranks_hit = world * (1.0 - (1.0 - 1.0 / world) ** EXPERTS_PER_TOKEN)
            remote = ranks_hit * (world - 1) / world
            moved = busiest * remote * HIDDEN_SIZE * (1 + _BF16_BYTES)  # fp8 dispatch, bf16 combine
        else:
            moved = 2.0 * (world - 1) / world * tokens_all * HIDDEN_SIZE * _BF16_BYTES / cfg.tp
        per_layer += latency_units * dev.link_latency_s + moved / (model.group_link_bytes_s(world) * eff)
    return N_LAYERS * per_layer


def step_time(model: NodeModel, batches: Sequence[EngineBatch]) -> StepTime:
    """The duration of one lock-step over all DP engines (one batch per engine; empty ones idle)."""
    terms = [_engine_terms(model, b) for b in batches]
    if not terms:
        terms = [_engine_terms(model, EngineBatch())]
    executed = [t[6] for t in terms]
    slowest = max(terms, key=lambda t: sum(t[:6]))
    dense, attention, elementwise, kernels, draft, host, _ = slowest
    moe = _moe_time(model, sum(executed))
    comm = _comm_time(model, executed)
    gpu = dense + attention + elementwise + kernels + draft + host + moe + comm
    cpu = _cpu_time(model, batches)
    total = max(gpu, cpu)
    if not math.isfinite(total) or total <= 0:
        raise ValueError(f"step time {total!r} for batches {batches!r}")
    return StepTime(total_s=total, dense_s=dense, moe_s=moe, attention_s=attention, elementwise_s=elementwise,
                    kernels_s=kernels, comm_s=comm, draft_s=draft, host_s=host, cpu_s=cpu)


def _cpu_time(model: NodeModel, batches: Sequence[EngineBatch]) -> float:
    """The CPU side, pipelined with the GPU: the busiest engine core, and the API servers' streaming."""
    c = model.coefficients
    cfg = model.config
    engine_cpu = max((c.engine_cpu_per_seq_s * b.seqs for b in batches), default=0.0)
    k = cfg.spec_tokens if cfg.speculative else 0
    alpha = c.acceptance(cfg.spec_method) if k else 0.0
    tokens_per_decode = (1.0 - alpha ** (k + 1)) / (1.0 - alpha) if k and alpha < 1.0 else 1.0 + k
    streamed = sum(b.decode_seqs * tokens_per_decode + b.prefill_seqs for b in batches)
    frontend = streamed * c.frontend_token_s / cfg.api_servers
    return max(engine_cpu, frontend)
