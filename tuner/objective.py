"""Objectives: what to maximize or minimize, under which SLOs, on which workload.

This module holds the whole YAML shape of an objective (``objectives/<name>.yaml``): the
:class:`Objective` itself, its :class:`Workload` (and the agent block, :class:`AgentSpec`), and its
concurrency :class:`LadderSpec`. :mod:`tuner.load` turns that shape into requests and windows; the
shape lives here, below it, so that every layer can read an objective without the load generator.

An SLO is a limit on one key of the load summary (the ``vllm bench serve`` result keys), so its
unit is in its name: ``p95_ttft_ms: 2000``. Margins follow Optuna's sign: a margin ≤ 0 passes.
Margins are relative (``(value - limit) / limit``) so constraints on different scales compare.

A workload (inside an objective, or its own file) has three kinds:

- ``random``: token-id prompts over ``/v1/completions``. Sending ids rather than text makes every
  input length exact, whatever the tokenizer does, the way ``vllm bench serve --dataset-name random``
  does.
- ``shared_prefix``: the same, but every prompt starts with one of ``num_prefixes`` fixed prefixes
  of ``prefix_len`` tokens (prompt ``i`` uses prefix ``i % num_prefixes``), to exercise prefix caching.
  ``input_len`` is the length of the part after the prefix.
- ``agent``: multi-turn coding-agent sessions over ``/v1/chat/completions``, with tool definitions
  and reasoning on; see :mod:`tuner.load.agent` and the ``agent`` block.

How lengths are drawn and arrivals paced is described in :mod:`tuner.load.workload`.

Scale: an objective's top level is its workload on the node a GPU profile names (the blog's random
1024/1024 for ``throughput``, the dossier's 40 coding agents for ``agent``). A ``scales:`` section
holds other scales; a hardware profile picks one with ``server.workload_scale`` (the CPU profile:
``demo``), and :meth:`Objective.at_scale` resolves it, so ``plan``, ``run`` and the report show one
workload. An objective file without ``scales`` (a user's own, given by path) is used as it is on any
profile, and ``--slo`` overrides either.

A ladder may name its steps relative to the KV knee (``knee_fractions``): a step at fraction ``f`` runs
``f ×`` the trial's own predicted maximum concurrency (the feasibility model's, per configuration), so
the ladder goes through the knee of whatever configuration the trial launches. The study resolves it
per trial (:meth:`Objective.for_knee`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner import catalog

__all__ = ["AgentSpec", "LadderSpec", "Objective", "ObjectiveScale", "Score", "Workload", "constraint_names",
           "failed_score", "load_objective", "score"]

_LATENCY_KEY = re.compile(r"^(mean|median|p\d{1,2}(\.\d+)?)_(ttft|tpot|itl|e2el|queue)_ms$")
_RATE_KEYS = {"output_throughput", "total_token_throughput", "request_throughput"}
ENERGY_METRICS = {"tokens_per_joule": "maximize", "usd_per_mtok": "minimize"}
"""Metrics from the GPUs' power (:mod:`tuner.load.power`), with the only direction that makes sense."""
METRIC_KEYS = _RATE_KEYS | {"request_goodput"} | set(ENERGY_METRICS)
_GOODPUT_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


# -- the workload ----------------------------------------------------------------------------------
class AgentSpec(BaseModel, extra="forbid", frozen=True):
    """One coding-agent session: a shared system prompt with tools, a task, then tool round trips.

    Lengths are in words of generated text (about one token each with a BPE tokenizer; the server's
    ``usage`` is what the results report). Turn ``t`` (from 0) sends roughly
    ``system_len + tools * tool_schema_len + context_len + t * (output_len + tool_result_len)``.
    """

    turns: int = Field(default=4, gt=0, description="requests per session, each after the previous answer")
    system_len: int = Field(default=2048, ge=0, description="system prompt, shared by every session")
    tools: int = Field(default=8, ge=0, description="tool definitions sent with every request")
    tool_schema_len: int = Field(default=64, ge=0, description="words of description per tool")
    context_len: int = Field(default=24576, gt=0, description="first user message: task + repository context")
    tool_result_len: int = Field(default=1024, ge=0, description="tool output appended after each turn")
    reasoning: bool = Field(default=True, description="ask for thinking (chat_template_kwargs.thinking)")
    reasoning_effort: Literal["low", "medium", "high", "max"] | None = "high"
    tool_choice: Literal["auto", "none", "omit"] = Field(
        default="auto", description="'auto' needs --enable-auto-tool-choice on the server; 'omit' sends no tools")
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class Workload(BaseModel, extra="forbid", frozen=True):
    """Prompt/output lengths and how hard to push: the load of one measured window."""

    kind: Literal["random", "shared_prefix", "agent"] = "random"
    input_len: int = Field(default=128, gt=0, description="prompt length, tokens (mean)")
    output_len: int = Field(default=64, gt=0, description="max_tokens per request (mean)")
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0,
                               description="uniform: lengths in [len*(1-r), len*(1+r)]; normal: std = r*len")
    length_distribution: Literal["uniform", "normal"] = "uniform"
    prefix_len: int = Field(default=0, ge=0, description="shared_prefix: tokens of shared prefix")
    num_prefixes: int = Field(default=1, gt=0, description="shared_prefix: distinct prefixes")
    num_prompts: int = Field(default=32, gt=0, description="requests in the measured window")
    concurrency: int = Field(default=8, gt=0, description="most requests (agent: sessions) in flight at once")
    request_rate: float | None = Field(default=None, gt=0.0,
                                       description="arrivals per second; None = no pacing")
    burstiness: float = Field(default=1.0, gt=0.0, description="gamma shape of the gaps; 1 = Poisson")
    burst_size: int = Field(default=1, gt=0, description="requests sent together at each arrival")
    warmup_prompts: int = Field(default=2, ge=0, description="sent first, not measured")
    warmup_waves: int = Field(default=1, ge=1, description=(
        "most warm-up waves: more than 1 sends waves (each at least one request per stream of the first step) "
        "until the server's own generation rate is steady (issue 31: a first repeat that ran cold)"))
    warmup_steady_within: float = Field(default=0.1, gt=0.0, lt=1.0, description=(
        "steady: a wave's server generation tok/s within this share of the wave before it"))
    seed: int = 0
    ignore_eos: bool = True
    agent: AgentSpec | None = None

    @model_validator(mode="after")
    def _kind_matches_fields(self) -> Workload:
        if self.kind == "shared_prefix" and self.prefix_len == 0:
            raise ValueError("kind shared_prefix needs prefix_len > 0")
        if self.kind != "shared_prefix" and self.prefix_len:
            raise ValueError(f"prefix_len is only used by kind shared_prefix (kind is {self.kind})")
        if self.kind != "agent" and self.agent is not None:
            raise ValueError(f"an agent block is only used by kind agent (kind is {self.kind})")
        return self

    @property
    def agent_spec(self) -> AgentSpec:
        """The agent block, or the default one (kind agent without a block)."""
        return self.agent or AgentSpec()

    def scaled(self, length_factor: float) -> Workload:
        """The same workload with every length multiplied by ``length_factor`` (at least 1 token).

        For running a GPU-sized shape (e.g. the dossier's 32K prompts) on a small demo model.
        """
        def s(n: int) -> int:
            return max(1, round(n * length_factor)) if n else 0

        update: dict[str, object] = {"input_len": s(self.input_len), "output_len": s(self.output_len),
                                     "prefix_len": s(self.prefix_len)}
        if self.agent is not None:
            a = self.agent
            update["agent"] = a.model_copy(update={
                "system_len": s(a.system_len), "tool_schema_len": s(a.tool_schema_len),
                "context_len": s(a.context_len), "tool_result_len": s(a.tool_result_len)})
        return self.model_copy(update=update)


# -- the concurrency ladder --------------------------------------------------------------------------
class LadderSpec(BaseModel, extra="forbid", frozen=True):
    """How to step concurrency inside one launch (``ladder:`` in an objective)."""

    start: int = Field(default=1, gt=0, description="first step's concurrency")
    factor: float = Field(default=2.0, gt=1.0, description="each step multiplies concurrency by this")
    max: int = Field(default=256, gt=0, description="highest concurrency tried")
    steps: tuple[int, ...] | None = Field(default=None,
                                          description="explicit concurrencies; overrides start/factor/max")
    knee_fractions: tuple[float, ...] | None = Field(
        default=None, description="steps as fractions of the trial's predicted KV knee (its max concurrency); "
        "resolved per trial into steps")
    prompts_per_concurrency: float = Field(
        default=4.0, gt=0.0, description="each step sends at least concurrency × this requests (and num_prompts)")
    min_gain: float = Field(default=0.05, ge=0.0, description="a step must beat the best by this fraction")
    min_requests: int = Field(
        default=0, ge=0, description="each step sends at least this many requests: a window long enough to rank on")
    min_window_s: float = Field(
        default=0.0, ge=0.0, description="a step whose measured window is shorter is not ranked while a "
        "longer one is (issue 31: a 0.64 s window of 64 requests won a study)")
    patience: int = Field(default=1, gt=0, description="steps without gain before the ladder stops")
    early_stop: bool = Field(default=True, description="cut a step once its SLO is clearly lost")
    stop_on_client_saturation: bool = True
    gauge_interval_s: float = Field(default=0.5, gt=0.0, description="how often gauges are scraped in a window")
    client_processes: int | Literal["auto"] = Field(
        default=1, description="load-generator processes; 'auto' adds one per ~streams_per_process streams")
    streams_per_process: int = Field(default=512, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LadderSpec:
        if self.steps is not None and (not self.steps or any(s <= 0 for s in self.steps)):
            raise ValueError("steps must be a non-empty list of positive concurrencies")
        if self.knee_fractions is not None:
            if self.steps is not None:
                raise ValueError("give steps or knee_fractions, not both")
            if not self.knee_fractions or any(f <= 0 for f in self.knee_fractions):
                raise ValueError("knee_fractions must be a non-empty list of positive fractions, e.g. [0.5, 1.0, 1.5]")
        if self.steps is None and self.start > self.max:
            raise ValueError(f"start ({self.start}) is above max ({self.max})")
        if isinstance(self.client_processes, int) and self.client_processes <= 0:
            raise ValueError("client_processes must be positive or 'auto'")
        return self

    @property
    def relative(self) -> bool:
        """The steps are fractions of the trial's KV knee, still to be resolved (explicit ``steps`` win)."""
        return self.knee_fractions is not None and self.steps is None

    def steps_for_knee(self, knee: int) -> tuple[int, ...]:
        """The node concurrencies of a knee-relative ladder for a configuration whose knee is ``knee``."""
        assert self.knee_fractions is not None
        return tuple(sorted({max(1, round(f * max(1, knee))) for f in self.knee_fractions}))

    def for_knee(self, knee: int) -> LadderSpec:
        """This ladder with its knee fractions turned into steps (unchanged when it has none)."""
        if not self.relative:
            return self
        return self.model_copy(update={"steps": self.steps_for_knee(knee), "knee_fractions": None})


# -- the objective ----------------------------------------------------------------------------------
class ObjectiveScale(BaseModel, extra="forbid", frozen=True):
    """What changes with the node's scale (``scales.<name>`` in an objective); unset keys keep the top level's."""

    description: str | None = None
    slos: dict[str, float] | None = None
    max_failed_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    workload: Workload | None = None
    ladder: LadderSpec | None = None
    no_ladder: bool = Field(default=False, description="this scale runs one step at workload.concurrency")
    goodput_slos: dict[str, float] | None = None


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    scale: str | None = None
    """The scale this objective was resolved at (None: its top level, the node scale)."""
    scales: dict[str, ObjectiveScale] = Field(default_factory=dict)
    """Other scales of the same objective, picked by a hardware profile's ``server.workload_scale``."""
    direction: Literal["maximize", "minimize"] = "maximize"
    metric: str = "output_throughput"
    slos: dict[str, float] = Field(default_factory=dict)
    """Upper limits on latency keys, e.g. ``p95_ttft_ms: 2000``."""
    max_failed_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    workload: Workload = Field(default_factory=Workload)
    ladder: LadderSpec | None = None
    """Concurrency ladder inside one launch; None = one step at ``workload.concurrency``."""
    goodput_slos: dict[str, float] = Field(default_factory=dict)
    """Per-request limits (``ttft_ms``, ``tpot_ms``, ``e2el_ms``) a request must meet to count as goodput."""
    guards: list[str] = Field(default_factory=list)
    """Correctness gates every trial must pass (names in ``guards/`` or YAML paths)."""
    gpu_hour_usd: float | None = Field(default=None, gt=0)
    """Price of one GPU-hour; with it every window reports ``usd_per_mtok`` (``--gpu-hour-usd`` overrides)."""

    @model_validator(mode="before")
    @classmethod
    def _energy_metric_direction(cls, data: object) -> object:
        """An energy metric has one sensible direction: filled in when absent, an error when reversed."""
        metric = data.get("metric") if isinstance(data, Mapping) else None
        if isinstance(data, Mapping) and isinstance(metric, str) and metric in ENERGY_METRICS:
            wanted = ENERGY_METRICS[str(data["metric"])]
            if "direction" not in data:
                return {**data, "direction": wanted}
            if data["direction"] != wanted:
                raise ValueError(f"metric {data['metric']} is only ever {wanted}d; set direction: {wanted} "
                                 "(or leave direction out)")
        return data

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in METRIC_KEYS and not _LATENCY_KEY.match(value):
            raise ValueError(f"unknown metric {value!r}; use one of {sorted(METRIC_KEYS)} or a latency "
                             "key such as p95_itl_ms")
        return value

    @field_validator("slos")
    @classmethod
    def _slo_keys_have_units(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if not _LATENCY_KEY.match(key):
                raise ValueError(
                    f"SLO {key!r} has no recognised unit/statistic; write it as <stat>_<metric>_ms, "
                    "e.g. p95_ttft_ms, p99_itl_ms, median_e2el_ms")
            if limit <= 0:
                raise ValueError(f"SLO {key} must be a positive number of milliseconds, got {limit}")
        return value

    @field_validator("goodput_slos")
    @classmethod
    def _goodput_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key, limit in value.items():
            if key not in _GOODPUT_KEYS:
                raise ValueError(f"goodput SLO {key!r} unknown; use {', '.join(_GOODPUT_KEYS)}")
            if limit <= 0:
                raise ValueError(f"goodput SLO {key} must be a positive number of milliseconds")
        return value

    @model_validator(mode="after")
    def _goodput_needs_limits(self) -> Objective:
        if self.metric == "request_goodput" and not self.goodput_slos:
            raise ValueError("metric request_goodput needs goodput_slos (e.g. ttft_ms: 2000, tpot_ms: 100)")
        return self

    @model_validator(mode="after")
    def _scales_resolve(self) -> Objective:
        for name in self.scales:
            try:
                self.at_scale(name)
            except ValueError as exc:
                raise ValueError(f"scales.{name}: {exc}") from exc
        return self

    def with_slos(self, overrides: Mapping[str, float]) -> Objective:
        slos = {**self.slos, **overrides}
        return Objective.model_validate({**self.model_dump(), "slos": slos})

    def with_price(self, gpu_hour_usd: float | None) -> Objective:
        """The objective at this GPU-hour price (``--gpu-hour-usd``); None keeps the objective's own."""
        if gpu_hour_usd is None:
            return self
        return Objective.model_validate({**self.model_dump(), "gpu_hour_usd": gpu_hour_usd})

    def at_scale(self, name: str | None) -> Objective:
        """The objective at scale ``name`` (a ``scales`` entry), with no ``scales`` left.

        None, or a name this objective has no section for (a user's own file), gives the top level.
        """
        if name is None or name not in self.scales:
            return self.model_copy(update={"scales": {}})
        section = self.scales[name]
        data = self.model_dump()
        data.update({"scales": {}, "scale": name})
        for key in ("description", "slos", "max_failed_fraction", "workload", "ladder", "goodput_slos"):
            value = getattr(section, key)
            if value is not None:
                data[key] = value.model_dump() if isinstance(value, BaseModel) else value
        if section.no_ladder:
            data["ladder"] = None
        return Objective.model_validate(data)

    @property
    def knee_relative(self) -> bool:
        """The ladder's steps are fractions of each trial's KV knee (resolved per trial: :meth:`for_knee`)."""
        return self.ladder is not None and self.ladder.relative

    def for_knee(self, knee: int) -> Objective:
        """The objective a trial whose configuration has KV knee ``knee`` runs: its ladder in node concurrencies."""
        if self.ladder is None or not self.ladder.relative:
            return self
        return self.model_copy(update={"ladder": self.ladder.for_knee(knee)})


@dataclass(frozen=True)
class Score:
    value: float
    constraints: tuple[float, ...]
    """One margin per SLO (in ``objective.slos`` order), then the failed-request fraction margin."""
    violations: tuple[str, ...]

    @property
    def feasible(self) -> bool:
        return all(c <= 0 for c in self.constraints)


def constraint_names(objective: Objective) -> list[str]:
    return [*objective.slos, "failed_fraction", "trial_ran"]


def score(objective: Objective, summary: Mapping[str, float]) -> Score:
    """Objective value and SLO margins of one completed load run."""
    # An energy figure is absent where no power was read: that is no measurement, never a free 0.
    value = float(summary.get(objective.metric, math.nan if objective.metric in ENERGY_METRICS else 0.0))
    if math.isnan(value):
        value = failed_score(objective).value
    margins: list[float] = []
    violations: list[str] = []
    for key, limit in objective.slos.items():
        observed = float(summary.get(key, float("inf")))
        # No sample (NaN) or no key (inf) cannot pass an SLO; Optuna refuses NaN, so use a finite margin.
        margin = (observed - limit) / limit if math.isfinite(observed) else 1.0
        margins.append(margin)
        if margin > 0:
            violations.append(f"{key} {observed:.1f} > {limit:g}")
    total = float(summary.get("completed", 0)) + float(summary.get("failed", 0))
    failed_fraction = float(summary.get("failed", 0)) / total if total else 1.0
    margins.append(failed_fraction - objective.max_failed_fraction)
    if failed_fraction > objective.max_failed_fraction:
        violations.append(f"failed requests {failed_fraction:.1%} > {objective.max_failed_fraction:.1%}")
    margins.append(0.0)
    return Score(value=value, constraints=tuple(margins), violations=tuple(violations))


def failed_score(objective: Objective) -> Score:
    """What a trial that produced no measurement scores: worst value, every constraint violated."""
    worst = 0.0 if objective.direction == "maximize" else 1e12
    return Score(value=worst, constraints=tuple([1.0] * len(constraint_names(objective))), violations=())


def load_objective(name_or_path: str) -> Objective:
    return catalog.load_model(catalog.resolve("objectives", name_or_path), Objective)
