"""Hardware profiles: the schema of ``search_spaces/<hw>.yaml`` (``--hw``) and the rules a profile must keep.

The folder is called ``search_spaces/`` because a hardware profile is, above all, the space of
launches legal on one node type; the thing in it is a *hardware profile*, in the CLI, the code
(:class:`HardwareProfile`) and the docs alike.

A profile states the node, the flags every trial gets, and the levers to search. A lever is named by
its vLLM option (``max-num-seqs``) or, for a field inside a JSON option, by a dotted name
(``compilation-config.cudagraph_mode``). :mod:`tuner.search.space` turns a profile into configurations.

Beyond plain levers a profile may declare:

- ``topology``: the TP × DP (× EP) shapes to try, spelled ``tp4``, ``dp4-ep``, ``tp2-dp2-ep``; each
  must use every GPU (TP × DP = ``hardware.device_count``). ``when`` conditions may name the derived
  keys ``topology.tp``, ``topology.dp`` and ``topology.ep``.
- ``env_for`` on a lever: environment a value needs (the blog's Humming W4A8 MoE backend).
- ``speculative.methods``: draft settings per method; :func:`bind_checkpoint` keeps the one the
  chosen checkpoint carries (DSpark for 0731, MTP for the preview), so a mismatch cannot be sampled.
- ``cudagraph``: derive ``max_cudagraph_capture_size`` from max-num-seqs × (1 + draft tokens),
  rounded to a multiple of 1 + k, so vLLM has nothing to round silently.
- ``disaggregation``: prefill/decode pools (issue 27): the ``disaggregation`` lever takes ``aggregated`` or
  one of the named ``layouts``, each a prefill pool and a decode pool with their own topology, max-num-seqs
  and batched tokens, joined by the profile's KV connector and a router (:mod:`tuner.search.pools`).
- ``guards``: the correctness gates every trial of this node runs by default (``run``; the profile
  knows the parsers it sets, so it knows which gates can pass), and the numerics the equivalence
  reference is recorded under (:func:`reference_requires`: the profile's fixed numerics, the first
  baseline's values for numerics levers, ``guards.reference`` to say otherwise).

Hardware rules (Blackwell-only values, MTP on Hopper capped at one draft token) are checked when a
profile loads; a profile that breaks one is a :class:`~tuner.errors.CatalogError` naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner import catalog
from tuner.errors import CatalogError, ProfileRuleError, UnknownNameError
from tuner.search.checkpoints import Checkpoint, load_checkpoint

Scalar = str | int | float | bool
DRAFT_TOKENS_PARAM = "speculative.draft_tokens"
SPECULATIVE_OPTION = "speculative-config"
TOPOLOGY_PARAM = "topology"
TOPOLOGY_KEYS = ("topology.tp", "topology.dp", "topology.ep")
CAPTURE_OPTION = "compilation-config.max_cudagraph_capture_size"
DISAGG_PARAM = "disaggregation"
"""The lever that picks one server (``aggregated``) or a prefill/decode layout of the profile."""
AGGREGATED = "aggregated"
POOL_ROLES = ("prefill", "decode")

Generation = Literal["cpu", "hopper", "blackwell", "blackwell_ultra", "blackwell_rtx", "cdna3", "other"]
_BLACKWELL_DC = frozenset({"blackwell", "blackwell_ultra"})
_AMD = frozenset({"cdna3"})
_NVIDIA = frozenset({"hopper", "blackwell", "blackwell_ultra", "blackwell_rtx"})

_GENERATIONS_OF_VALUES: tuple[tuple[str, tuple[str, ...], frozenset[str]], ...] = (
    # vllm/config/kernel.py MoEBackend docstrings (vLLM 0.32.0)
    ("moe-backend", ("flashinfer_trtllm", "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm"),
     _BLACKWELL_DC),
    ("moe-backend", ("flashinfer_b12x", "b12x"), frozenset({"blackwell_rtx"})),
    ("moe-backend", ("hpc",), frozenset({"hopper"})),
    ("moe-backend", ("aiter", "aiter_mega_moe", "aiter_triton_mxfp4_bf16", "flydsl"), _AMD),
    ("moe-backend", ("humming", "marlin"), _NVIDIA),
    # vllm/config/attention.py: quantized indexer caches need backend support; the dossier's
    # GB300 recipe (use_fp4_indexer_cache, renamed indexer_kv_dtype in 0.32) is Blackwell-only.
    ("attention-config.indexer_kv_dtype", ("mxfp4", "nvfp4"), _BLACKWELL_DC),
    ("sparse-indexer-topk-backend", ("deep_select",), _BLACKWELL_DC),
    ("all2all-backend", ("deepep_high_throughput", "deepep_low_latency"), _NVIDIA),
    ("all2all-backend", ("mori_high_throughput", "mori_low_latency"), _AMD),
)
VALUE_GENERATIONS: dict[tuple[str, str], frozenset[str]] = {
    (option, value): generations for option, values, generations in _GENERATIONS_OF_VALUES for value in values}
"""Lever values legal only on some GPU generations: (option, value) → generations."""

VALUES_NEEDING_EP: frozenset[tuple[str, str]] = frozenset({
    ("moe-backend", "flashinfer_moe_ep_cutedsl"),
    ("moe-backend", "flashinfer_moe_ep_mega_deep_gemm"),
    ("moe-backend", "aiter_mega_moe"),
})
"""Values vLLM accepts only with expert parallelism (kernel.py); rejected by the feasibility check."""

MAX_DRAFT_TOKENS: dict[tuple[str, str], int] = {
    # W4A16-FP8-MTP model card, "Honest limitations" 1: DeepGEMM's paged MQA logits kernel asserts
    # next_n in {1, 2} and vLLM passes next_n = k + 1, so k <= 1 (H200 and SM120 builds).
    ("mtp", "hopper"): 1,
    ("mtp", "blackwell_rtx"): 1,
}
"""(speculative method, generation) → most draft tokens that run."""


@dataclass(frozen=True)
class Topology:
    """One parallel shape: TP ranks per replica, DP replicas, expert parallelism on or off."""

    tp: int
    dp: int
    ep: bool

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def name(self) -> str:
        parts = [f"tp{self.tp}"] if self.tp > 1 or self.dp == 1 else []
        if self.dp > 1:
            parts.append(f"dp{self.dp}")
        if self.ep:
            parts.append("ep")
        return "-".join(parts)

    def derived(self) -> dict[str, Scalar]:
        return {"topology.tp": self.tp, "topology.dp": self.dp, "topology.ep": self.ep}


_TOPOLOGY_PART = re.compile(r"^(tp|dp)([1-9][0-9]*)$")


def parse_topology(text: str) -> Topology:
    """``"tp2-dp4-ep"`` → Topology(2, 4, True). Missing tp/dp mean 1; ``ep`` turns on EP."""
    tp = dp = 0
    ep = False
    for part in text.strip().lower().split("-"):
        match = _TOPOLOGY_PART.match(part)
        if part == "ep" and not ep:
            ep = True
        elif match and match.group(1) == "tp" and not tp:
            tp = int(match.group(2))
        elif match and match.group(1) == "dp" and not dp:
            dp = int(match.group(2))
        else:
            raise ValueError(f"topology {text!r}: cannot read {part!r}; write e.g. tp4, dp4-ep, tp2-dp2-ep")
    return Topology(tp=tp or 1, dp=dp or 1, ep=ep)


def topology_of(args: Mapping[str, Any]) -> Topology:
    """The topology a vLLM option mapping launches (defaults: TP 1, DP 1, EP off)."""
    return Topology(tp=int(args.get("tensor-parallel-size", 1)), dp=int(args.get("data-parallel-size", 1)),
                    ep=bool(args.get("enable-expert-parallel", False)))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    accelerator: Literal["cpu", "nvidia", "amd"] = "nvidia"
    device_name: str
    device_count: int = Field(ge=1)
    memory_per_device_gb: float = Field(gt=0)
    interconnect: str = "unknown"
    architecture: str = "unknown"
    generation: Generation = "other"
    """GPU generation, for the hardware rules (Blackwell-only values, MTP draft caps)."""


class Server(_Strict):
    host: str = "127.0.0.1"
    ready_timeout_s: float = Field(default=600.0, gt=0)
    model: str | None = None
    fixed: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint: str | None = None
    """Default checkpoint catalog name (``search_spaces/_checkpoints.yaml``) for ``--checkpoint``."""
    startup_stall_s: float | None = Field(default=600.0, gt=0)
    """The start-up watchdog: a launch whose log shows no progress for this long ends as ``hang`` (null:
    off). Longer than the slowest silent step of a normal start: for DSV4 on a GPU node, the cold
    torch.compile (docs/failure-classes.md says what the 600 s rests on)."""
    expected_launch_s: float = Field(default=900.0, gt=0)
    """Typical time from launch to /health 200 (a DSV4 load is 10–20 min); used to plan a budget."""
    expected_measure_s: float = Field(default=300.0, gt=0)
    """Typical time for guards + load ladder of one trial; used to plan a budget."""
    client_cpus: int = Field(default=0, ge=0)
    """Cores kept for the load generator and guards; the server runs on the others (0: no split).
    On the CPU build the server's OpenMP threads are bound to its cores too (tuner/affinity.py)."""
    night_budget_s: float = Field(default=8 * 3600.0, gt=0)
    """The budget of ``run`` given neither ``--trials`` nor ``--budget``: one night."""
    engine_version: str | None = None
    """The lowest engine (vLLM) version the profile's flags are written for; the pre-flight check
    refuses an older one (None: not checked)."""
    workload_scale: str | None = None
    """The scale of every objective's workload on this node: None (an objective's top level, the GPU
    node's workload) or the name of an objective's ``scales`` section (the CPU profile: ``demo``)."""
    engine: str | None = None
    """The engine that serves this node's trials (a name of :mod:`tuner.engines.registry`: ``llamacpp``
    for llama-server); None: vLLM. ``--engine`` overrides it."""


class Lever(_Strict):
    """One searchable lever. Exactly one of ``choices``, ``int`` or ``float``."""

    choices: list[Scalar] | None = None
    int_range: tuple[int, int] | None = Field(default=None, alias="int")
    float_range: tuple[float, float] | None = Field(default=None, alias="float")
    step: int | None = Field(default=None, ge=1)
    log: bool = False
    when: dict[str, list[Scalar]] | None = None
    env: str | None = None
    """If set, the value goes to this environment variable instead of a vLLM flag."""
    env_for: dict[str, dict[str, str]] = Field(default_factory=dict)
    """Environment a value needs, e.g. ``{humming: {VLLM_HUMMING_MOE_GEMM_TYPE: indexed}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def domain_size(self) -> int | None:
        """How many values the lever can take (``None`` for a continuous range)."""
        if self.choices is not None:
            return len(self.choices)
        if self.int_range is not None:
            return (self.int_range[1] - self.int_range[0]) // (self.step or 1) + 1
        return None

    def contains(self, value: Scalar) -> bool:
        if self.choices is not None:
            return value in self.choices
        if self.int_range is not None:
            low, high = self.int_range
            return (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
                    and (value - low) % (self.step or 1) == 0)
        assert self.float_range is not None
        return isinstance(value, (int, float)) and self.float_range[0] <= float(value) <= self.float_range[1]

    @model_validator(mode="after")
    def _one_domain(self) -> Lever:
        given = [x for x in (self.choices, self.int_range, self.float_range) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'choices', 'int: [low, high]' or 'float: [low, high]'")
        if self.choices is not None and len(self.choices) == 0:
            raise ValueError("'choices' is empty; list at least one value")
        for rng in (self.int_range, self.float_range):
            if rng is not None and rng[0] > rng[1]:
                raise ValueError(f"empty range [{rng[0]}, {rng[1]}]: low must not exceed high")
            if rng is not None and self.log and rng[0] <= 0:
                raise ValueError("a log-scale range must start above 0")
        for value in self.env_for:
            if self.choices is not None and value not in {str(c) for c in self.choices}:
                raise ValueError(f"env_for names {value!r}, which is not one of the choices")
        return self


class TopologyLever(_Strict):
    """The parallel shapes to search: ``choices: [tp4, tp2-dp2-ep, dp4-ep]``."""

    choices: list[str] = Field(min_length=1)

    def parsed(self) -> list[Topology]:
        return [parse_topology(c) for c in self.choices]


class SpeculativeVariant(_Strict):
    """Draft settings for one speculative method (picked by the checkpoint)."""

    draft_tokens: Lever
    config: dict[str, Any] = Field(default_factory=dict)


class Speculative(_Strict):
    """Speculative decoding: a method and its draft count, 0 meaning off.

    ``methods`` holds settings for other methods; :func:`bind_checkpoint` swaps in the one the
    checkpoint carries.
    """

    method: str
    draft_tokens: Lever
    config: dict[str, Any] = Field(default_factory=dict)
    methods: dict[str, SpeculativeVariant] = Field(default_factory=dict)

    def variant(self, method: str) -> SpeculativeVariant | None:
        if method == self.method:
            return SpeculativeVariant(draft_tokens=self.draft_tokens, config=self.config)
        return self.methods.get(method)


class CudagraphRule(_Strict):
    """Derive the CUDA-graph capture ceiling from max-num-seqs and the draft count.

    A uniform decode step of N sequences with k draft tokens is N·(1+k) tokens, so graphs above
    max-num-seqs·(1+k) are never replayed by decode; vLLM rounds capture sizes to multiples of 1+k
    under FULL decode graphs with speculation (config/compilation.py,
    ``adjust_cudagraph_sizes_for_spec_decode``). The derived size is min(max-num-seqs·(1+k), limit)
    rounded down to a multiple of 1+k. Not applied when cudagraph_mode is NONE or with enforce-eager.
    """

    limit: int = Field(default=512, ge=1)
    """Never capture above this many tokens (vLLM's default ceiling is 512; 1024 on SM100)."""


class Baseline(_Strict):
    name: str
    values: dict[str, Scalar] = Field(default_factory=dict)
    note: str = ""
    checkpoints: list[str] | None = None
    """Checkpoint names this baseline belongs to (``None`` = any)."""


NUMERICS_OPTIONS: dict[str, Scalar | None] = {
    # option → vLLM 0.32's default (vllm/config/*.py). An option that changes what the model computes:
    # the equivalence reference is recorded under one value of each, and every other value is compared with it.
    "dtype": "auto",
    "kv-cache-dtype": "auto",
    "quantization": None,
    "moe-backend": "auto",                           # the MoE kernel, and with it the quantization of its input
    "all2all-backend": "allgather_reducescatter",    # DeepEP low-latency dispatches in FP8
    "attention-config.indexer_kv_dtype": "auto",
}
"""Options that change numerics, with vLLM's default (an unset option means the default)."""


class ProfileGuards(_Strict):
    """The gates of a profile: which run by default, and the numerics their reference is recorded under."""

    run: list[str] = Field(default_factory=list)
    """Guard names (``guards/<name>.yaml``) every trial runs unless ``--guards`` says otherwise; the
    objective's guards are added. Empty: the objective's guards only."""
    reference: dict[str, list[Scalar | None]] = Field(default_factory=dict)
    """Allowed values per option for the launch that records the equivalence reference, where
    :func:`reference_requires`'s rule (fixed numerics, then the first baseline) is not what you want."""


class PoolSpec(_Strict):
    """One pool of a prefill/decode layout: ``instances`` servers of one topology, with their own seats and budget."""

    topology: str
    instances: int = Field(default=1, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1, alias="max-num-seqs")
    max_num_batched_tokens: int | None = Field(default=None, ge=1, alias="max-num-batched-tokens")
    options: dict[str, Any] = Field(default_factory=dict)
    """Other vLLM options of this pool's servers only (they win over the fixed flags and the levers)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def shape(self) -> Topology:
        return parse_topology(self.topology)

    @property
    def gpus(self) -> int:
        return self.instances * self.shape().world


class PdLayout(_Strict):
    """A prefill pool and a decode pool that share the node (``4p4d``: 4 GPUs prefill, 4 decode)."""

    prefill: PoolSpec
    decode: PoolSpec
    note: str = ""

    def pool(self, role: str) -> PoolSpec:
        return self.prefill if role == "prefill" else self.decode


class Disaggregation(_Strict):
    """Prefill/decode disaggregation: the KV connector, the router in front, and the layouts to search."""

    connector: str = "NixlConnector"
    """vLLM's ``kv_connector`` (``--kv-transfer-config``): NixlConnector, MooncakeConnector, ExampleConnector, ..."""
    connector_config: dict[str, Any] = Field(default_factory=dict)
    """``kv_connector_extra_config`` every member gets."""
    router: str = "vllm-router"
    """The router program (its P/D mode fronts the pools: docs/decisions.md, issue 27)."""
    aggregated: bool = True
    """Whether ``aggregated`` (one server on the whole node) is among the lever's values."""
    layouts: dict[str, PdLayout] = Field(min_length=1)

    def choices(self) -> list[str]:
        return ([AGGREGATED] if self.aggregated else []) + list(self.layouts)


class ModelFile(_Strict):
    """One weight file of an envelope: what it is and what it weighs."""

    file: str
    size_gb: float = Field(gt=0)
    """Decimal GB (10^9 bytes), as the file's publisher states it."""


class Envelope(_Strict):
    """A qualified launch of a unified-memory host: its baseline, its files, and what the tool cannot express."""

    baseline: str
    """The name of the profile's baseline that launches it."""
    backend: str
    target: ModelFile
    draft: ModelFile | None = None
    not_expressed: list[str] = Field(default_factory=list)
    """Parts of the recorded recipe that no lever of this engine spells (said wherever the envelope is shown)."""


class UnifiedMemory(_Strict):
    """The memory model of a host whose accelerator shares the host's memory (Strix Halo, a CPU).

    A launch fits when weights (target, plus the draft when drafting) + KV cache (context × bytes per
    token at the chosen K and V cache types, the draft's share added) + compute buffers (a base plus
    bytes per micro-batch token) ≤ ``host_limit_gib`` − ``reserve_gib``.
    """

    host_limit_gib: float = Field(gt=0)
    """What the server may use: the cgroup limit it runs under (memory.max), else the host's memory."""
    reserve_gib: float = Field(default=0.0, ge=0)
    """Kept for everything else on the host (the OS, the tuner)."""
    kv_bytes_per_token: dict[str, float]
    """Target KV bytes per token with K and V both at this cache type (``f16``, ``q8_0``, ``q4_0``...)."""
    draft_kv_fraction: float = Field(default=0.0, ge=0, lt=1)
    compute_base_gib: float = Field(default=0.5, ge=0)
    compute_bytes_per_ubatch_token: float = Field(default=0.0, ge=0)
    envelopes: dict[str, Envelope] = Field(default_factory=dict)


class HardwareProfile(_Strict):
    name: str
    description: str = ""
    hardware: Hardware
    server: Server = Field(default_factory=Server)
    topology: TopologyLever | None = None
    levers: dict[str, Lever] = Field(default_factory=dict)
    speculative: Speculative | None = None
    cudagraph: CudagraphRule | None = None
    baselines: list[Baseline] = Field(default_factory=list)
    guards: ProfileGuards = Field(default_factory=ProfileGuards)
    disaggregation: Disaggregation | None = None
    unified_memory: UnifiedMemory | None = None
    """A host whose accelerator shares the host's memory: the memory model of :mod:`tuner.search.unified`."""

    @model_validator(mode="before")
    @classmethod
    def _a_cpu_runs_the_demo_scale(cls, data: object) -> object:
        """A CPU profile that names no ``server.workload_scale`` runs the objectives' ``demo`` scale.

        The top level of an objective is a GPU node's workload, whose ladder steps through the KV knee
        of a catalogued checkpoint; a CPU host serves a tiny model, and would refuse to start for want
        of a checkpoint (a user's own CPU profile, or a test's)."""
        if isinstance(data, Mapping):
            hardware, server = data.get("hardware"), data.get("server") or {}
            if isinstance(hardware, Mapping) and hardware.get("accelerator") == "cpu" \
                    and isinstance(server, Mapping) and "workload_scale" not in server:
                return {**data, "server": {**server, "workload_scale": "demo"}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _a_baseline_without_a_layout_is_aggregated(cls, data: object) -> object:
        """A baseline that names no ``disaggregation`` value is one server (``aggregated``), as written before
        the lever existed: said explicitly, so a study that enqueues it never lets the sampler draw a layout."""
        if not isinstance(data, Mapping):
            return data
        section, baselines = data.get("disaggregation"), data.get("baselines")
        if not isinstance(section, Mapping) or section.get("aggregated") is False or not isinstance(baselines, list):
            return data
        filled = [{**b, "values": {DISAGG_PARAM: AGGREGATED, **(b.get("values") or {})}}
                  if isinstance(b, Mapping) and DISAGG_PARAM not in (b.get("values") or {}) else b for b in baselines]
        return {**data, "baselines": filled}

    @model_validator(mode="after")
    def _references_exist(self) -> HardwareProfile:
        for problem in profile_problems(self):
            raise problem
        draw_order(self)
        return self

    def param_names(self) -> list[str]:
        names = [DISAGG_PARAM] if self.disaggregation is not None else []
        names += [TOPOLOGY_PARAM] if self.topology is not None else []
        names += list(self.levers)
        if self.speculative is not None:
            names.append(DRAFT_TOKENS_PARAM)
        return names

    def topologies(self) -> list[Topology]:
        """The shapes this profile can launch (its fixed flags' shape if it has no topology lever)."""
        if self.topology is not None:
            return self.topology.parsed()
        return [topology_of(self.server.fixed)]

    def lever(self, name: str) -> Lever | None:
        """The domain of a param name (levers, ``topology`` and the draft count alike)."""
        if name == TOPOLOGY_PARAM and self.topology is not None:
            return Lever(choices=list(self.topology.choices))
        if name == DISAGG_PARAM and self.disaggregation is not None:
            return Lever(choices=list(self.disaggregation.choices()))
        if name == DRAFT_TOKENS_PARAM and self.speculative is not None:
            return self.speculative.draft_tokens
        return self.levers.get(name)


_TOPOLOGY_OPTIONS = ("tensor-parallel-size", "data-parallel-size", "enable-expert-parallel")


def _topology_problems(profile: HardwareProfile) -> list[ProfileRuleError]:
    out: list[ProfileRuleError] = []
    gpus = profile.hardware.device_count
    if profile.topology is not None:
        for i, text in enumerate(profile.topology.choices):
            try:
                shape = parse_topology(text)
            except ValueError as exc:
                out.append(ProfileRuleError(f"topology.choices[{i}]", str(exc), "use tpN, dpN and ep joined by '-'"))
                continue
            if shape.world != gpus:
                out.append(ProfileRuleError(
                    f"topology.choices[{i}]",
                    f"{text!r} uses TP {shape.tp} × DP {shape.dp} = {shape.world} GPUs, the node has {gpus}",
                    f"make TP × DP equal hardware.device_count ({gpus}), e.g. tp{gpus} or dp{gpus}-ep"))
        for option in _TOPOLOGY_OPTIONS:
            if option in profile.server.fixed or option in profile.levers:
                where = "server.fixed" if option in profile.server.fixed else "levers"
                out.append(ProfileRuleError(f"{where}.{option}", "set twice: the topology lever sets it",
                                            f"remove {option} from {where}"))
    else:
        shape = topology_of(profile.server.fixed)
        if "tensor-parallel-size" not in profile.levers and "data-parallel-size" not in profile.levers \
                and profile.hardware.accelerator != "cpu" and shape.world != gpus:
            out.append(ProfileRuleError(
                "server.fixed.tensor-parallel-size",
                f"TP {shape.tp} × DP {shape.dp} = {shape.world} GPUs, the node has {gpus}",
                "add a topology lever or fix tensor-parallel-size / data-parallel-size"))
    return out


def _generation_problems(profile: HardwareProfile) -> list[ProfileRuleError]:
    out: list[ProfileRuleError] = []
    gen = profile.hardware.generation
    for name, lever in profile.levers.items():
        for value in lever.choices or []:
            allowed = VALUE_GENERATIONS.get((name, str(value)))
            if allowed is not None and gen not in allowed:
                out.append(ProfileRuleError(
                    f"levers.{name}.choices", f"{value!r} runs only on {', '.join(sorted(allowed))} GPUs, "
                    f"this profile's hardware.generation is {gen!r}", f"remove {value!r} from the choices"))
    for name, value in _flatten(profile.server.fixed).items():
        allowed = VALUE_GENERATIONS.get((name, str(value)))
        if allowed is not None and gen not in allowed:
            out.append(ProfileRuleError(f"server.fixed.{name}", f"{value!r} runs only on "
                                        f"{', '.join(sorted(allowed))} GPUs, not {gen!r}", "remove it"))
    spec = profile.speculative
    if spec is not None:
        variants = {spec.method: SpeculativeVariant(draft_tokens=spec.draft_tokens, config=spec.config),
                    **spec.methods}
        for method, variant in variants.items():
            cap = MAX_DRAFT_TOKENS.get((method, gen))
            top = _max_int(variant.draft_tokens)
            if cap is not None and top is not None and top > cap:
                key = "speculative.draft_tokens" if method == spec.method else f"speculative.methods.{method}"
                out.append(ProfileRuleError(
                    key, f"{method} on {gen} runs at most {cap} draft token(s) (W4A16-FP8-MTP model card: "
                    f"DeepGEMM paged-MQA-logits asserts next_n <= 2), the lever reaches {top}",
                    f"limit the draft_tokens choices to 0..{cap}"))
    return out


def _max_int(lever: Lever) -> int | None:
    if lever.choices is not None:
        ints = [int(c) for c in lever.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        return max(ints) if ints else None
    if lever.int_range is not None:
        return lever.int_range[1]
    return None


def _flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _baseline_value_ok(profile: HardwareProfile, key: str, domain: Lever, value: Scalar) -> bool:
    if domain.contains(value):
        return True
    spec = profile.speculative
    if key == DRAFT_TOKENS_PARAM and spec is not None:
        return any(v.draft_tokens.contains(value) for v in spec.methods.values())
    return False


def _disaggregation_problems(profile: HardwareProfile) -> list[ProfileRuleError]:
    """The pools of every layout: readable topologies that sum to the node's GPUs, and no lever set twice."""
    section = profile.disaggregation
    if section is None:
        return []
    out: list[ProfileRuleError] = []
    gpus = profile.hardware.device_count
    if AGGREGATED in section.layouts:
        out.append(ProfileRuleError(f"disaggregation.layouts.{AGGREGATED}", f"{AGGREGATED!r} is the one-server value",
                                    "name the layout by its pools, e.g. 4p4d"))
    for name, layout in section.layouts.items():
        used = 0
        for role in POOL_ROLES:
            pool = layout.pool(role)
            try:
                used += pool.gpus
            except ValueError as exc:
                out.append(ProfileRuleError(f"disaggregation.layouts.{name}.{role}.topology", str(exc),
                                            "use tpN, dpN and ep joined by '-'"))
                used = -1
                break
            for option in _TOPOLOGY_OPTIONS:
                if option in pool.options:
                    out.append(ProfileRuleError(f"disaggregation.layouts.{name}.{role}.options.{option}",
                                                "set twice: the pool's topology sets it", f"remove {option}"))
        if used >= 0 and used != gpus:
            p, d = layout.prefill, layout.decode
            out.append(ProfileRuleError(
                f"disaggregation.layouts.{name}",
                f"the pools use {used} GPUs (prefill {p.instances} x {p.topology}, decode {d.instances} x "
                f"{d.topology}), the node has {gpus}",
                f"make the prefill and decode pools' GPUs sum to hardware.device_count ({gpus}), e.g. "
                f"prefill tp{gpus // 2} + decode dp{gpus - gpus // 2}-ep"))
    return out


def profile_problems(profile: HardwareProfile) -> list[ProfileRuleError]:
    """Every cross-field rule the profile breaks (empty = sound)."""
    out = _topology_problems(profile) + _generation_problems(profile) + _disaggregation_problems(profile)
    names = set(profile.param_names())
    if profile.topology is not None:
        names |= set(TOPOLOGY_KEYS)
    for lever_name, lever in profile.levers.items():
        for other in (lever.when or {}):
            if other not in names:
                out.append(ProfileRuleError(f"levers.{lever_name}.when", f"names unknown lever {other!r}",
                                            f"use one of: {', '.join(sorted(names))}"))
    for i, guard in enumerate(profile.guards.run):
        try:
            catalog.resolve("guards", guard)
        except (CatalogError, UnknownNameError):
            out.append(ProfileRuleError(f"guards.run[{i}]", f"no guard {guard!r}",
                                        f"use a guard name ({', '.join(catalog.known_names('guards'))}) "
                                        "or the path of a guard YAML file"))
    if profile.unified_memory is not None:
        names_of_baselines = {b.name for b in profile.baselines}
        for key, env in profile.unified_memory.envelopes.items():
            if env.baseline not in names_of_baselines:
                out.append(ProfileRuleError(f"unified_memory.envelopes.{key}.baseline",
                                            f"names no baseline of this profile ({env.baseline!r})",
                                            f"use one of: {', '.join(sorted(names_of_baselines)) or '(none)'}"))
    if len(set(profile.guards.run)) != len(profile.guards.run):
        out.append(ProfileRuleError("guards.run", "a guard is listed twice", "list each guard once"))
    if profile.cudagraph is not None and CAPTURE_OPTION in profile.levers:
        out.append(ProfileRuleError(f"levers.{CAPTURE_OPTION}", "set twice: the cudagraph rule derives it",
                                    "remove the lever or the cudagraph section"))
    for i, base in enumerate(profile.baselines):
        for key, value in base.values.items():
            domain = profile.lever(key)
            if domain is None:
                out.append(ProfileRuleError(f"baselines[{i}].values.{key}",
                                            f"baseline {base.name!r} sets unknown lever {key!r}",
                                            f"use one of: {', '.join(profile.param_names())}"))
            elif not _baseline_value_ok(profile, key, domain, value):
                out.append(ProfileRuleError(f"baselines[{i}].values.{key}",
                                            f"baseline {base.name!r} sets {value!r}, outside the lever's domain",
                                            "add the value to the lever's choices or change the baseline"))
    return out


def reference_requires(profile: HardwareProfile) -> dict[str, list[Scalar | None]]:
    """The numerics the equivalence reference is recorded under: option → allowed values (None = unset).

    For each option of :data:`NUMERICS_OPTIONS`: the value ``server.fixed`` sets; else, for a lever,
    the value the profile's first baseline sets (the recipe the night starts from), else vLLM's
    default; ``guards.reference`` overrides any of them. An unset option stands for vLLM's default, so
    it is allowed wherever the default is. Options the profile neither fixes nor searches are left out:
    every launch has vLLM's default there.
    """
    fixed = _flatten(profile.server.fixed)
    first = profile.baselines[0].values if profile.baselines else {}
    out: dict[str, list[Scalar | None]] = {}
    for option, default in NUMERICS_OPTIONS.items():
        value: Scalar | None
        if option in fixed:
            value = fixed[option]
        elif option in profile.levers:
            value = first.get(option, default)
        else:
            continue
        out[option] = [value, None] if value == default and value is not None else [value]
    out.update({option: list(values) for option, values in profile.guards.reference.items()})
    return out


def draw_order(profile: HardwareProfile) -> list[str]:
    """Levers (and the draft count) in an order where every ``when`` names something drawn earlier.

    Declaration order is kept wherever the conditions allow it. A cycle is a profile error.
    """
    nodes = list(profile.levers) + ([DRAFT_TOKENS_PARAM] if profile.speculative is not None else [])
    deps = {name: [d for d in (profile.levers[name].when or {}) if d in nodes and d != name]
            if name in profile.levers else [] for name in nodes}
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(nodes):
        ready = next((n for n in nodes if n not in placed and all(d in placed for d in deps[n])), None)
        if ready is None:
            stuck = sorted(n for n in nodes if n not in placed)
            raise ValueError(f"levers {stuck} have 'when' conditions that depend on each other in a cycle")
        order.append(ready)
        placed.add(ready)
    return order


def load_profile(name_or_path: str) -> HardwareProfile:
    """A hardware profile by catalog name or path; every problem is a CatalogError naming the key."""
    path = catalog.resolve("search_spaces", name_or_path)
    data = catalog.read_yaml(path)
    if not isinstance(data, dict):
        raise CatalogError(path, "(top level)", f"expected a mapping of keys, got {type(data).__name__}",
                           "start the file with the keys of a hardware profile (see search_spaces/cpu.yaml)")
    try:
        profile = HardwareProfile.model_validate(data)
    except ValidationError as exc:
        rule = _rule_error(exc)
        if rule is not None:
            raise CatalogError(path, rule.key, rule.problem, rule.fix) from exc
        raise catalog.format_validation_error(path, exc, HardwareProfile) from exc
    if not Path(name_or_path).suffix and profile.name != name_or_path:
        raise CatalogError(path, "name", f"profile name {profile.name!r} differs from its file name",
                           f"set name: {name_or_path}")
    return profile


def _rule_error(exc: ValidationError) -> ProfileRuleError | None:
    for error in exc.errors():
        found = (error.get("ctx") or {}).get("error")
        if isinstance(found, ProfileRuleError):
            return found
    return None


def bind_checkpoint(profile: HardwareProfile, checkpoint: Checkpoint) -> HardwareProfile:
    """The profile as it serves ``checkpoint``: its repo and revision, and its own draft method.

    The speculative section keeps only the variant for the method the checkpoint carries (DSpark for
    0731, MTP for the preview and the W4A16-FP8-MTP quant); a checkpoint without a draft, or one whose
    method the profile has no settings for, turns speculation off. Baselines meant for other
    checkpoints are dropped.
    """
    fixed = dict(profile.server.fixed)
    if checkpoint.revision:
        fixed["revision"] = checkpoint.revision
    server = profile.server.model_copy(update={"model": checkpoint.repo, "fixed": fixed,
                                               "checkpoint": checkpoint.name})
    spec: Speculative | None = None
    if profile.speculative is not None and checkpoint.draft_method is not None:
        variant = profile.speculative.variant(checkpoint.draft_method)
        if variant is not None:
            spec = Speculative(method=checkpoint.draft_method, draft_tokens=variant.draft_tokens,
                               config=variant.config)
    baselines: list[Baseline] = []
    for base in profile.baselines:
        if base.checkpoints is not None and checkpoint.name not in base.checkpoints:
            continue
        values = dict(base.values)
        draft = values.get(DRAFT_TOKENS_PARAM)
        if draft is not None and (spec is None or not spec.draft_tokens.contains(draft)):
            values.pop(DRAFT_TOKENS_PARAM)
            if spec is not None:
                values[DRAFT_TOKENS_PARAM] = 0
        baselines.append(base.model_copy(update={"values": values}))
    return profile.model_copy(update={"server": server, "speculative": spec, "baselines": baselines})


@dataclass(frozen=True)
class BoundProfile:
    """A hardware profile as a command serves it: bound to its checkpoint (:func:`bound_profile`)."""

    profile: HardwareProfile
    """Bound to :attr:`checkpoint` (its repo, revision, draft method and baselines); :attr:`raw` when none."""
    raw: HardwareProfile
    """The profile as its file reads (the objective's scale and the engine come from it)."""
    checkpoint: Checkpoint | None
    """``--checkpoint``, else the profile's ``server.checkpoint``; None when neither names one."""
    source: str
    """What was asked for: a catalog name or a YAML path (the profile's name when given loaded)."""


def bound_profile(hw: str | HardwareProfile, checkpoint: str | None = None) -> BoundProfile:
    """Load ``hw`` (a catalog name, a path, or a profile already loaded) and bind the checkpoint it serves.

    The one place that reads "which checkpoint": ``checkpoint`` (``--checkpoint``) wins over the profile's
    ``server.checkpoint``; a profile that names none (the CPU demo, the tiny GPU evidence profiles: the
    model comes with ``--model``) stays unbound.
    """
    raw = load_profile(hw) if isinstance(hw, str) else hw
    name = checkpoint or raw.server.checkpoint
    ckpt = load_checkpoint(name) if name else None
    return BoundProfile(profile=bind_checkpoint(raw, ckpt) if ckpt is not None else raw, raw=raw, checkpoint=ckpt,
                        source=hw if isinstance(hw, str) else raw.name)
