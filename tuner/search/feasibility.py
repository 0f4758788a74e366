"""Will this launch fit, and how much KV cache will it have? A pure memory model of DSV4-Flash.

Nothing here launches or imports vLLM: :func:`check` reads a profile, a :class:`ServeConfig`, a
checkpoint and a workload, and returns a :class:`Feasibility`. A configuration that cannot fit (or
that vLLM would refuse, or silently change) is pruned before a 10–20 minute launch, with its reason.

Per-rank residency (bytes on one GPU), for TP size t, DP size d, world w = t·d:

- routed experts: ``routed_experts_gb / w`` with expert parallelism (EP spans TP × DP), else
  ``routed_experts_gb / t`` (TP-sliced inside each replica);
- everything else (attention, shared experts, embeddings): ``non_expert_gb / t`` — replicated on
  every DP rank, which is what "the weights get replicated, which claws back a little KV cache"
  (blog) costs;
- the draft module (only when speculating): ``draft_gb / t``;
- activations: ``NON_TORCH_BYTES`` + ``ACTIVATION_BYTES_PER_TOKEN`` · max-num-batched-tokens
  + fp32 logits for max-num-seqs · (1+k) rows;
- CUDA graphs: ``CUDAGRAPH_BASE_BYTES`` + ``CUDAGRAPH_BYTES_PER_SIZE`` · capture ceiling.

KV budget per rank = gpu-memory-utilization · device memory − residency (or
``kv-cache-memory-bytes`` when set). DSV4 has one latent KV head (dossier: "CSA + HCA · 1 KV head"),
so under TP every rank of a replica holds the *same* cache (blog: "naive tensor parallelism for MLA
has to replicate the KV cache"), while each DP rank owns its cache (dossier: "Each DP rank owns an
independent cache"). Tokens per rank = budget / bytes per token; distinct tokens in total =
tokens per rank · d. Max concurrency = d · min(max-num-seqs, tokens per rank / ⌈ISL+OSL+k⌉_block).

Units: device memory in the profiles is the vendor's "GB", which for HBM parts is GiB (an "80 GB"
H100 shows 79.6 GiB); checkpoint sizes are the Hub's decimal GB. The calibration against the
reference texts is in ``docs/feasibility.md``.

Calibration on the node: every launched trial's server log states the KV capacity vLLM actually
allocated (``GPU KV cache size: N tokens``; the engine reads it: ``Engine.kv_tokens_from_log``).
:func:`fit_kv_bytes_per_token` turns those figures into the bytes per token that make this model
predict them, and a study uses the fit instead of the blog's constant from then on
(:class:`KvCalibration`), so a wrong constant costs one launch, not a night of wrongly pruned
configurations. A fit more than :data:`REFIT_FACTOR` away from the prior is trusted to prune only
once :data:`REFIT_AGREEING` launches agree on it; until then it may only widen what fits.

Learning from failures: a launch that ran out of memory although the model said it fits teaches a
:class:`MemoryLesson` (:func:`lesson_from_oom`): the configurations that need at least as much memory
with at most as much room (at start-up) or at most as much headroom (under load) are refused too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.objective import Workload
from tuner.search.checkpoints import Checkpoint
from tuner.search.profile import (
    CAPTURE_OPTION,
    MAX_DRAFT_TOKENS,
    SPECULATIVE_OPTION,
    VALUES_NEEDING_EP,
    HardwareProfile,
    Topology,
    topology_of,
)
from tuner.search.space import ServeConfig

GIB = 1 << 30
GB = 10**9

N_LAYERS = 43
"""Dossier / model card: 43 decoder layers, each with 1 shared + 256 routed experts, top-6."""

KV_BYTES_PER_TOKEN_FP8 = 26_400
"""Effective KV bytes per token per rank with an FP8 cache (all 43 layers, compressed CSA/HCA entries,
indexer keys, BF16 RoPE dims, block rounding). Fitted to the blog's DP4 + EP knee: 688 sequences per
rank of 1024 + 1024 tokens on a 96 GB GH200 at utilization 0.95 (c2752 over 4 ranks). See
docs/feasibility.md."""

KV_DTYPE_FACTOR: Mapping[str, float] = {
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_ds_mla": 1.0, "fp8_inc": 1.0,
    "auto": 2.0, "bfloat16": 2.0, "float16": 2.0,
}
"""KV size relative to FP8 (assumption: auto/BF16 stores every entry in 2 bytes)."""

NON_TORCH_BYTES = int(1.5 * GIB)
"""CUDA context, NCCL buffers, allocator slack (assumption; typical vLLM non-torch memory)."""
ACTIVATION_BYTES_PER_TOKEN = 256 * 1024
"""Peak activation + MoE workspace per batched token (assumption: hidden 4096 × bf16 × ~32 live buffers)."""
VOCAB_SIZE = 129_280
"""Logit rows are fp32 over this vocabulary (assumption: the DeepSeek-V3 tokenizer size)."""
CUDAGRAPH_BASE_BYTES = int(0.5 * GIB)
CUDAGRAPH_BYTES_PER_SIZE = 1 << 20
"""CUDA-graph pool: a base plus ~1 MiB per captured token of the ceiling (assumption)."""
MODEL_FREE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})
"""Speculative methods that need no draft weights (vllm/config/speculative.py)."""
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_BATCHED_TOKENS = 8192
DEFAULT_CAPTURE_LIMIT = 512

REFIT_FACTOR = 2.0
"""A refit of the KV bytes per token within this factor of the prior prunes at once: the prior's own
uncertainty spans it (the dtype factor the model assumes for a BF16 cache is 2; the blog's knee may not
be the exact KV knee). Further off, the model's structure is in doubt, not its constant."""
REFIT_AGREEING = 2
"""Launches whose own fits agree that a refit further off than :data:`REFIT_FACTOR` needs before it prunes."""
REFIT_AGREEMENT = 0.2
"""Two launches agree when each one's fit is within this fraction of the median fit."""


@dataclass(frozen=True)
class RankMemory:
    """Bytes one GPU holds, by kind."""

    routed_experts_bytes: int
    non_expert_bytes: int
    draft_bytes: int
    activation_bytes: int
    cudagraph_bytes: int
    usable_bytes: int
    """What vLLM may use: utilization × device memory (or device memory with kv-cache-memory-bytes)."""
    kv_bytes: int
    """What is left for the KV cache (negative = does not fit)."""

    @property
    def weights_bytes(self) -> int:
        return self.routed_experts_bytes + self.non_expert_bytes + self.draft_bytes

    def as_gib(self) -> dict[str, float]:
        return {name: round(value / GIB, 2) for name, value in (
            ("routed_experts", self.routed_experts_bytes), ("non_expert", self.non_expert_bytes),
            ("draft", self.draft_bytes), ("activation", self.activation_bytes),
            ("cudagraph", self.cudagraph_bytes), ("usable", self.usable_bytes), ("kv", self.kv_bytes))}


@dataclass(frozen=True)
class Feasibility:
    """The verdict on one configuration. ``reason`` is empty when ``ok``."""

    ok: bool
    reason: str
    topology: Topology
    memory: RankMemory
    kv_tokens_per_rank: int
    kv_tokens_total: int
    max_concurrency: int
    """Sequences of the workload's ISL+OSL that fit at once over all DP ranks (also capped by max-num-seqs)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    rules: tuple[str, ...] = field(default_factory=tuple)
    """The short names of the rules broken, in the order of ``reason`` (``memory``, ``kv_capacity``, ...)."""


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _workload_tokens(workload: Workload) -> int:
    """Longest request of the workload: ISL + OSL at the top of the random range."""
    top = 1.0 + workload.range_ratio
    return math.ceil(workload.input_len * top) + math.ceil(workload.output_len * top)


def _draft(args: Mapping[str, Any]) -> tuple[str | None, int]:
    spec = args.get(SPECULATIVE_OPTION)
    if not isinstance(spec, Mapping):
        return None, 0
    return (str(spec.get("method")) if spec.get("method") is not None else None,
            int(spec.get("num_speculative_tokens", 0)))


def rank_memory(profile: HardwareProfile, args: Mapping[str, Any], checkpoint: Checkpoint) -> RankMemory:
    """Per-rank bytes of one launch (see the module docstring for the model)."""
    shape = topology_of(args)
    method, draft_tokens = _draft(args)
    experts = checkpoint.routed_experts_gb * GB / (shape.world if shape.ep else shape.tp)
    non_expert = checkpoint.non_expert_gb * GB / shape.tp
    draft = checkpoint.draft_gb * GB / shape.tp if method is not None and draft_tokens > 0 else 0.0
    seqs = int(args.get("max-num-seqs", DEFAULT_MAX_NUM_SEQS))
    batched = int(args.get("max-num-batched-tokens", DEFAULT_BATCHED_TOKENS))
    activation = NON_TORCH_BYTES + ACTIVATION_BYTES_PER_TOKEN * batched + seqs * (1 + draft_tokens) * VOCAB_SIZE * 4
    compilation = args.get("compilation-config")
    compilation = compilation if isinstance(compilation, Mapping) else {}
    eager = args.get("enforce-eager") is True or compilation.get("cudagraph_mode") == "NONE"
    capture = int(compilation.get("max_cudagraph_capture_size",
                                  min(2 * seqs * (1 + draft_tokens), DEFAULT_CAPTURE_LIMIT)))
    graphs = 0 if eager else CUDAGRAPH_BASE_BYTES + CUDAGRAPH_BYTES_PER_SIZE * capture
    device = profile.hardware.memory_per_device_gb * GIB
    if profile.hardware.accelerator == "cpu":
        # The CPU build's KV budget is VLLM_CPU_KVCACHE_SPACE, which the cpu profile states as its memory.
        return RankMemory(routed_experts_bytes=int(experts), non_expert_bytes=int(non_expert),
                          draft_bytes=int(draft), activation_bytes=0, cudagraph_bytes=0,
                          usable_bytes=int(device), kv_bytes=int(device))
    resident = int(experts + non_expert + draft) + activation + graphs
    explicit_kv = args.get("kv-cache-memory-bytes")
    if explicit_kv is not None:
        usable = int(device)
        kv = int(explicit_kv) if resident + int(explicit_kv) <= device else int(device) - resident - int(explicit_kv)
    else:
        usable = int(float(args.get("gpu-memory-utilization", 0.9)) * device)
        kv = usable - resident
    return RankMemory(routed_experts_bytes=int(experts), non_expert_bytes=int(non_expert), draft_bytes=int(draft),
                      activation_bytes=activation, cudagraph_bytes=graphs, usable_bytes=usable, kv_bytes=kv)


def _kv_scale(args: Mapping[str, Any], checkpoint: Checkpoint) -> float:
    """Bytes per token relative to the FP8 base: the cache dtype and the draft's own KV."""
    dtype = str(args.get("kv-cache-dtype", "auto"))
    method, draft_tokens = _draft(args)
    extra = checkpoint.draft_kv_fraction if method is not None and draft_tokens > 0 else 0.0
    return KV_DTYPE_FACTOR.get(dtype, 1.0) * (1.0 + extra)


def kv_bytes_per_token(args: Mapping[str, Any], checkpoint: Checkpoint, base: float | None = None) -> float:
    """Bytes per token per rank; ``base`` (FP8, no draft) overrides the checkpoint's or the default."""
    chosen = base if base is not None else (checkpoint.kv_bytes_per_token or KV_BYTES_PER_TOKEN_FP8)
    return chosen * _kv_scale(args, checkpoint)


def prior_kv_bytes_per_token(checkpoint: Checkpoint) -> float:
    """The FP8 bytes per token before any launch: the checkpoint's own figure, else the blog's fit."""
    return float(checkpoint.kv_bytes_per_token or KV_BYTES_PER_TOKEN_FP8)


@dataclass(frozen=True)
class KvCalibration:
    """The FP8 bytes per token fitted to launched trials, how many it rests on, and whether it may prune.

    Within :data:`REFIT_FACTOR` of the prior the fit is used as it is. Further off it is *trusted* only
    once :data:`REFIT_AGREEING` launches agree on it (their own fits within :data:`REFIT_AGREEMENT` of
    the median); until then pruning uses the smaller of the fit and the prior (:attr:`pruning_base`):
    a doubtful fit may widen what fits, never narrow it.
    """

    base: float
    trials: int
    spread: float
    """(max − min) / median of the per-trial fits: large means the other memory terms are off."""
    prior: float = KV_BYTES_PER_TOKEN_FP8
    agreeing: int = 1
    """Launches whose own fit is within :data:`REFIT_AGREEMENT` of the median (``base``)."""

    @property
    def ratio(self) -> float:
        """The fit over the prior (> 1: the node holds fewer tokens than the prior says)."""
        return self.base / self.prior

    @property
    def trusted(self) -> bool:
        far = max(self.ratio, 1 / self.ratio) > REFIT_FACTOR
        return not far or self.agreeing >= REFIT_AGREEING

    @property
    def pruning_base(self) -> float:
        """The bytes per token pruning uses: the fit when trusted, else the more permissive of fit and prior."""
        return self.base if self.trusted else min(self.base, self.prior)

    def describe(self) -> str:
        text = f"KV bytes/token {self.base:,.0f} fitted to {self.trials} launched trial(s)"
        if max(self.ratio, 1 / self.ratio) > REFIT_FACTOR:
            text += f", {self.ratio:.2f}× the prior {self.prior:,.0f}, {self.agreeing} agreeing"
            if not self.trusted:
                text += (f"; more than {REFIT_FACTOR:g}× off, it prunes only once {REFIT_AGREEING} launches "
                         f"agree: pruning uses {self.pruning_base:,.0f} until then")
        return text


def fit_kv_bytes_per_token(profile: HardwareProfile, checkpoint: Checkpoint,
                           observations: Sequence[tuple[Mapping[str, Any], int]]) -> KvCalibration | None:
    """Median FP8 base bytes per token that reproduce the observed ``(args, tokens per rank)`` pairs.

    An observation whose predicted KV budget is not positive (the model thought it would not fit,
    yet it launched) says the weight or activation terms are off, not the per-token size: skipped.
    """
    fits = []
    for args, tokens in observations:
        budget = rank_memory(profile, args, checkpoint).kv_bytes
        if tokens > 0 and budget > 0:
            fits.append(budget / tokens / _kv_scale(args, checkpoint))
    if not fits:
        return None
    middle = statistics.median(fits)
    agreeing = sum(1 for f in fits if abs(f - middle) <= REFIT_AGREEMENT * middle)
    return KvCalibration(base=middle, trials=len(fits), spread=(max(fits) - min(fits)) / middle,
                         prior=prior_kv_bytes_per_token(checkpoint), agreeing=agreeing)


def _rule_violations(profile: HardwareProfile, config: ServeConfig, checkpoint: Checkpoint,
                     workload: Workload, *, gpus: int | None = None) -> list[tuple[str, str]]:
    """The rules a configuration breaks, as ``(rule, reason)`` (``gpus``: a pool's, else the node's)."""
    args = config.args
    shape = topology_of(args)
    gpus = profile.hardware.device_count if gpus is None else gpus
    out: list[tuple[str, str]] = []
    if profile.hardware.accelerator != "cpu" and shape.world != gpus:
        out.append(("topology", f"topology {shape.name} uses {shape.world} GPUs, the node has {gpus}"))
    method, draft_tokens = _draft(args)
    if method is not None and draft_tokens > 0:
        if method in MODEL_FREE_METHODS:
            pass
        elif checkpoint.draft_method is None:
            out.append(("draft", f"checkpoint {checkpoint.name} carries no draft module; {method} cannot run"))
        elif method != checkpoint.draft_method:
            out.append(("draft", f"checkpoint {checkpoint.name} carries {checkpoint.draft_method}, not {method} "
                                 "(dossier: 0731 uses DSpark, the preview MTP)"))
        cap = MAX_DRAFT_TOKENS.get((method, profile.hardware.generation))
        if cap is not None and draft_tokens > cap:
            out.append(("draft_tokens", f"{method} on {profile.hardware.generation} runs at most {cap} draft "
                                        f"token(s), asked {draft_tokens}"))
    for (option, value) in VALUES_NEEDING_EP:
        if str(args.get(option)) == value and not shape.ep:
            out.append(("needs_ep", f"{option} {value} needs expert parallelism; topology {shape.name} has none"))
    max_len = args.get("max-model-len")
    need = _workload_tokens(workload)
    if max_len is not None and need > int(max_len):
        out.append(("max_model_len", f"workload needs {need} tokens per request, max-model-len is {max_len}"))
    batched = args.get("max-num-batched-tokens")
    if args.get("enable-chunked-prefill") is False and batched is not None and max_len is not None \
            and int(batched) < int(max_len):
        out.append(("chunked_prefill", f"chunked prefill off needs max-num-batched-tokens ({batched}) >= "
                                       f"max-model-len ({max_len})"))
    seqs = args.get("max-num-seqs")
    if batched is not None and seqs is not None and int(batched) < int(seqs):
        out.append(("batched_tokens", f"max-num-batched-tokens ({batched}) < max-num-seqs ({seqs}): vLLM refuses "
                                      "(config/scheduler.py)"))
    compilation = args.get("compilation-config")
    if isinstance(compilation, Mapping) and draft_tokens > 0:
        query_len = 1 + draft_tokens
        sizes = list(compilation.get("cudagraph_capture_sizes") or [])
        top = compilation.get("max_cudagraph_capture_size")
        odd = [s for s in [*sizes, *([top] if top is not None else [])] if int(s) % query_len]
        if odd:
            out.append(("capture_sizes", f"capture sizes {odd} are not multiples of 1+k={query_len}; vLLM would "
                                         "round them silently"))
    return out


def check(profile: HardwareProfile, config: ServeConfig, checkpoint: Checkpoint, workload: Workload,
          calibration: KvCalibration | None = None) -> Feasibility:
    """The memory and rule verdict on one configuration (pure; no GPU, no vLLM).

    ``calibration`` (fitted to this node's launched trials) replaces the default bytes per token, as far
    as it is trusted to prune (:attr:`KvCalibration.pruning_base`).

    A prefill/decode layout (``config.disaggregation``) is judged pool by pool: each member must fit its own
    GPUs; the verdict's KV and concurrency are the decode pool's (it holds the running requests), its
    reasons name the pool.
    """
    if config.disaggregation is not None:
        return _check_pools(profile, config, checkpoint, workload, calibration)
    return _check_one(profile, config, checkpoint, workload, calibration)


def _check_pools(profile: HardwareProfile, config: ServeConfig, checkpoint: Checkpoint, workload: Workload,
                 calibration: KvCalibration | None) -> Feasibility:
    launch = config.disaggregation
    assert launch is not None
    verdicts = {}
    for member in launch.members:
        if member.index == 0:  # the members of a pool are alike
            one = ServeConfig(args=member.args, env=config.env, params=config.params)
            verdicts[member.role] = _check_one(profile, one, checkpoint, workload, calibration, gpus=len(member.gpus))
    decode = verdicts["decode"]
    instances = len(launch.pool("decode"))
    reasons = [f"{role} pool ({launch.pool_topologies.get(role)}): {v.reason}" for role, v in verdicts.items()
               if not v.ok]
    rules = tuple(f"{rule}" for v in verdicts.values() for rule in v.rules)
    notes = (f"prefill/decode {launch.describe()}; KV moved by {launch.connector}",
             *(f"{role}: {note}" for role, v in verdicts.items() for note in v.notes))
    return Feasibility(ok=not reasons, reason="; ".join(reasons), topology=decode.topology, memory=decode.memory,
                       kv_tokens_per_rank=decode.kv_tokens_per_rank,
                       kv_tokens_total=decode.kv_tokens_total * instances,
                       max_concurrency=decode.max_concurrency * instances, notes=notes, rules=rules)


def _check_one(profile: HardwareProfile, config: ServeConfig, checkpoint: Checkpoint, workload: Workload,
               calibration: KvCalibration | None = None, *, gpus: int | None = None) -> Feasibility:
    args = config.args
    shape = topology_of(args)
    memory = rank_memory(profile, args, checkpoint)
    reasons = _rule_violations(profile, config, checkpoint, workload, gpus=gpus)
    per_token = kv_bytes_per_token(args, checkpoint, calibration.pruning_base if calibration else None)
    kv_tokens = max(0, int(memory.kv_bytes / per_token))
    block = int(args.get("block-size", 16))
    _, draft_tokens = _draft(args)
    per_seq = _round_up(_workload_tokens(workload) + draft_tokens, block)
    seqs = int(args.get("max-num-seqs", DEFAULT_MAX_NUM_SEQS))
    per_rank_concurrency = min(seqs, kv_tokens // per_seq)
    if memory.kv_bytes <= 0:
        reasons.insert(0, ("memory",
            f"does not fit: weights {memory.weights_bytes / GIB:.1f} GiB + activations and graphs "
            f"{(memory.activation_bytes + memory.cudagraph_bytes) / GIB:.1f} GiB per rank exceed the "
            f"{memory.usable_bytes / GIB:.1f} GiB usable ({shape.name})"))
    else:
        max_len = args.get("max-model-len")
        if max_len is not None and kv_tokens < int(max_len):
            reasons.append(("kv_capacity", f"KV cache holds {kv_tokens} tokens per rank, less than max-model-len "
                                           f"{max_len} (vLLM refuses to start)"))
        elif per_rank_concurrency < 1:
            reasons.append(("kv_capacity", f"KV cache holds {kv_tokens} tokens per rank, not one {per_seq}-token "
                                           "request"))
    notes: list[str] = [calibration.describe()] if calibration else []
    if shape.tp > 1:
        notes.append(f"KV replicated on the {shape.tp} TP ranks of each replica (1 latent KV head)")
    if args.get(CAPTURE_OPTION.split(".")[0]) and draft_tokens > 0:
        notes.append(f"CUDA-graph sizes in multiples of {1 + draft_tokens}")
    return Feasibility(ok=not reasons, reason="; ".join(text for _, text in reasons), topology=shape, memory=memory,
                       kv_tokens_per_rank=kv_tokens, kv_tokens_total=kv_tokens * shape.dp,
                       max_concurrency=max(0, per_rank_concurrency) * shape.dp, notes=tuple(notes),
                       rules=tuple(rule for rule, _ in reasons))


# -- learning from launches that ran out of memory ---------------------------------------------------------
OomPhase = Literal["start", "load"]


MEMORY_ENV = ("VLLM_CPU_KVCACHE_SPACE",)
"""Environment variables that size the KV pool themselves (the CPU build's KV space in GiB): a memory lesson
holds them fixed, as it holds the topology (a 99999 GiB KV space that fails teaches nothing about 1 GiB)."""


def memory_args(config: ServeConfig) -> dict[str, Any]:
    """A configuration's arguments as a memory lesson reads them: its flags, and the pool-sizing variables
    of :data:`MEMORY_ENV` it sets (as ``env:NAME``)."""
    return {**config.args, **{f"env:{name}": config.env[name] for name in MEMORY_ENV if name in config.env}}


def _memory_shape(args: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a memory lesson holds fixed: the topology, the KV dtype, the draft method, the all2all backend
    (DeepEP allocates its own buffers) and the pool-sizing variables (:func:`memory_args`): levers that change
    what a device holds by more than a step of the others."""
    shape = topology_of(args)
    method, _ = _draft(args)
    return (shape.tp, shape.dp, shape.ep, str(args.get("kv-cache-dtype", "auto")), method,
            str(args.get("all2all-backend", "")), *(str(args.get(f"env:{name}", "")) for name in MEMORY_ENV))


def _knobs(args: Mapping[str, Any]) -> tuple[float, int, int, int, int]:
    """(utilization, batched tokens, max-num-seqs, draft tokens, max-model-len) with vLLM's defaults."""
    _, draft_tokens = _draft(args)
    return (float(args.get("gpu-memory-utilization", 0.9)),
            int(args.get("max-num-batched-tokens", DEFAULT_BATCHED_TOKENS)),
            int(args.get("max-num-seqs", DEFAULT_MAX_NUM_SEQS)), draft_tokens, int(args.get("max-model-len", 0)))


@dataclass(frozen=True)
class MemoryLesson:
    """What one launch that ran out of memory teaches about its neighbourhood.

    Every configuration of the same memory shape (:func:`_memory_shape`) that needs at least as much
    (max-num-batched-tokens, max-num-seqs, draft tokens, and at start-up max-model-len, each ≥) with no
    more room is refused: at start-up, a gpu-memory-utilization ≤ the one that failed (less room for the
    same weights, activations and KV); under load, ≥ it (less headroom outside vLLM's pool for what it
    does not profile: transient buffers, fragmentation, collectives).
    """

    trial: int | None
    during: OomPhase
    shape: tuple[Any, ...]
    utilization: float
    batched_tokens: int
    max_num_seqs: int
    draft_tokens: int
    max_model_len: int
    evidence: str

    def covers(self, args: Mapping[str, Any]) -> bool:
        if args.get("kv-cache-memory-bytes") is not None or _memory_shape(args) != self.shape:
            return False
        util, batched, seqs, draft, max_len = _knobs(args)
        hungrier = batched >= self.batched_tokens and seqs >= self.max_num_seqs and draft >= self.draft_tokens
        if self.during == "start":
            return hungrier and max_len >= self.max_model_len and util <= self.utilization
        return hungrier and util >= self.utilization

    def describe(self) -> str:
        who = f"trial {self.trial}" if self.trial is not None else "a launch"
        when = "at start-up" if self.during == "start" else "under load"
        room = "no more room" if self.during == "start" else "no more headroom"
        return (f"{who} ran out of memory {when} at gpu-memory-utilization {self.utilization:g}, "
                f"max-num-batched-tokens {self.batched_tokens}, max-num-seqs {self.max_num_seqs}; this "
                f"configuration has the same topology and needs at least as much with {room}")

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "during": self.during, "gpu_memory_utilization": self.utilization,
                "max_num_batched_tokens": self.batched_tokens, "max_num_seqs": self.max_num_seqs,
                "draft_tokens": self.draft_tokens, "evidence": self.evidence}


def lesson_from_oom(args: Mapping[str, Any], *, during: OomPhase, trial: int | None = None,
                    evidence: str = "") -> MemoryLesson:
    """The lesson of a launch of ``args`` that ran out of memory ``during`` start-up or the load."""
    util, batched, seqs, draft, max_len = _knobs(args)
    return MemoryLesson(trial=trial, during=during, shape=_memory_shape(args), utilization=util,
                        batched_tokens=batched, max_num_seqs=seqs, draft_tokens=draft, max_model_len=max_len,
                        evidence=evidence)
