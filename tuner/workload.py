"""What load a trial is measured under, and the exact requests it sends.

A :class:`Workload` is read from YAML (inside an objective, or its own file), so it is a pydantic
model that rejects unknown keys. Three kinds:

- ``random``: token-id prompts over ``/v1/completions``. Sending ids rather than text makes every
  input length exact, whatever the tokenizer does, the way ``vllm bench serve --dataset-name random``
  does.
- ``shared_prefix``: the same, but every prompt starts with one of ``num_prefixes`` fixed prefixes
  of ``prefix_len`` tokens (prompt ``i`` uses prefix ``i % num_prefixes``), to exercise prefix caching.
  ``input_len`` is the length of the part after the prefix.
- ``agent``: multi-turn coding-agent sessions over ``/v1/chat/completions``, with tool definitions
  and reasoning on; see :mod:`tuner.agent_workload` and the ``agent`` block.

Lengths follow ``vllm bench serve --random-range-ratio r`` with ``length_distribution: uniform``:
each length is drawn uniformly from the integers in ``[floor(len * (1 - r)), ceil(len * (1 + r))]``
(at least 1). With ``normal`` the length is drawn from N(len, (r * len)²), rounded and clipped to
``[1, 2 * len]``. ``r = 0`` gives fixed lengths. Everything is drawn from ``random.Random(seed)``, so
the same workload and vocabulary give the same prompts on every machine.

Arrivals: ``concurrency`` caps the requests in flight (``vllm bench serve --max-concurrency``).
``request_rate`` (per second) paces the sends with gamma-distributed gaps of shape ``burstiness``
(1 = Poisson, < 1 burstier, as ``vllm bench serve --burstiness``); ``burst_size > 1`` sends that many
requests at each arrival instead (a burst), at ``request_rate / burst_size`` arrivals per second.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from tuner.errors import LoadError

__all__ = ["AgentSpec", "PromptSpec", "Workload", "arrival_gaps_s", "make_prompts", "make_warmup_prompts",
           "prompt_at"]

# Ids below this are avoided: tokenizers put their special tokens first.
_LOWEST_ORDINARY_ID = 100
# Warm-up prompts come from their own stream, so they never share a prefix with measured ones
# (a warm prefix cache would flatter the measured TTFT).
_WARMUP_SEED_OFFSET = 1_000_003
_PREFIX_SEED_OFFSET = 2_000_003


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


@dataclass(frozen=True)
class PromptSpec:
    """One request: the exact prompt token ids and the output length asked for."""

    token_ids: tuple[int, ...]
    output_len: int


def _length_bounds(mean: int, ratio: float) -> tuple[int, int]:
    low = max(1, math.floor(mean * (1.0 - ratio)))
    high = max(low, math.ceil(mean * (1.0 + ratio)))
    return low, high


def _draw_len(rng: random.Random, workload: Workload, mean: int) -> int:
    if workload.length_distribution == "normal" and workload.range_ratio > 0:
        value = round(rng.gauss(mean, workload.range_ratio * mean))
        return min(max(1, value), 2 * mean)
    low, high = _length_bounds(mean, workload.range_ratio)
    return rng.randint(low, high)


def _check_vocab(vocab_size: int) -> int:
    if vocab_size < 2:
        raise LoadError(f"vocab_size must be at least 2 to draw prompt ids, got {vocab_size}; "
                        "pass the served model's tokenizer vocabulary size")
    return min(_LOWEST_ORDINARY_ID, vocab_size // 2)


def _prefixes(workload: Workload, vocab_size: int) -> list[tuple[int, ...]]:
    if workload.kind != "shared_prefix":
        return [()]
    lowest_id = _check_vocab(vocab_size)
    rng = random.Random(workload.seed + _PREFIX_SEED_OFFSET)
    return [tuple(rng.randrange(lowest_id, vocab_size) for _ in range(workload.prefix_len))
            for _ in range(workload.num_prefixes)]


def prompt_at(workload: Workload, vocab_size: int, index: int, *, warmup: bool = False,
              prefixes: list[tuple[int, ...]] | None = None) -> PromptSpec:
    """Prompt number ``index`` of the measured (or warm-up) stream, drawn from its own seeded RNG.

    Each prompt depends only on ``(seed, index)``, so any process can build any prompt without the
    ones before it, and a longer run extends a shorter one.
    """
    lowest_id = _check_vocab(vocab_size)
    rng = random.Random(f"{workload.seed + (_WARMUP_SEED_OFFSET if warmup else 0)}:{index}")
    input_len = _draw_len(rng, workload, workload.input_len)
    output_len = _draw_len(rng, workload, workload.output_len)
    span = vocab_size - lowest_id
    draw = rng.random
    ids = tuple(lowest_id + int(draw() * span) for _ in range(input_len))
    if warmup or workload.kind != "shared_prefix":
        return PromptSpec(token_ids=ids, output_len=output_len)
    shared = prefixes if prefixes is not None else _prefixes(workload, vocab_size)
    return PromptSpec(token_ids=shared[index % len(shared)] + ids, output_len=output_len)


def make_prompts(workload: Workload, vocab_size: int, count: int | None = None,
                 start: int = 0) -> list[PromptSpec]:
    """Measured prompts ``start .. start + count`` (``count`` defaults to ``num_prompts``).

    Deterministic from ``workload.seed``; ids are drawn from ``[min(100, vocab_size // 2), vocab_size)``
    so special tokens are avoided.
    """
    n = workload.num_prompts if count is None else count
    _check_vocab(vocab_size)
    prefixes = _prefixes(workload, vocab_size)
    return [prompt_at(workload, vocab_size, i, prefixes=prefixes) for i in range(start, start + n)]


def make_warmup_prompts(workload: Workload, vocab_size: int) -> list[PromptSpec]:
    """The ``warmup_prompts`` prompts sent before the measured window (same lengths, other ids).

    Under ``shared_prefix`` they carry no shared prefix, so the measured window starts cold.
    """
    _check_vocab(vocab_size)
    return [prompt_at(workload, vocab_size, i, warmup=True) for i in range(workload.warmup_prompts)]


def arrival_gaps_s(workload: Workload, count: int, rng: random.Random, rate_scale: float = 1.0) -> list[float]:
    """Seconds to wait before each of ``count`` sends (the first is 0); all 0 when unpaced.

    ``rate_scale`` divides the rate (a client process that sends a share of the load).
    """
    if workload.request_rate is None:
        return [0.0] * count
    rate = workload.request_rate * rate_scale
    arrival_rate = rate / workload.burst_size
    shape = workload.burstiness
    gaps: list[float] = []
    for i in range(count):
        if i == 0 or i % workload.burst_size:
            gaps.append(0.0)
        else:
            # Gamma with mean 1/arrival_rate: shape k, scale 1/(k * rate); k = 1 is exponential.
            gaps.append(rng.expovariate(arrival_rate) if shape == 1.0
                        else rng.gammavariate(shape, 1.0 / (shape * arrival_rate)))
    return gaps
