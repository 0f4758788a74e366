"""The YAML shape of a guard (``guards/<name>.yaml``): one file per guard, one ``kind`` per file.

Pydantic models with ``extra="forbid"``: a typo in a key is a :class:`~tuner.errors.CatalogError`
naming the file and the key. Thresholds follow the house sign: a measured value at or below its
threshold passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.catalog import format_validation_error, read_yaml
from tuner.errors import CatalogError

__all__ = [
    "ChatProbe", "EquivalenceProbe", "EquivalenceSpec", "EquivalenceThresholds", "ExpectedCall", "GuardSpec",
    "Needle", "NeedleSpec", "ReasoningCarryProbe", "ReasoningSpec", "ReasoningSplitProbe", "ToolCallProbe",
    "ToolCallSpec", "ToolRoundTrip", "load_spec",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatProbe(_Strict):
    """One chat request. ``thinking`` becomes ``chat_template_kwargs.thinking``."""

    name: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    thinking: bool = False
    max_tokens: int = Field(default=128, ge=1)


class ExpectedCall(_Strict):
    """The tool call a probe must produce. ``arguments``, when given, must match exactly as JSON."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | None = None


class ToolRoundTrip(_Strict):
    """Send ``tool_result`` back as the tool message; the final answer must contain the text."""

    tool_result: str
    expect_content_contains: str = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1)


class ToolCallProbe(ChatProbe):
    expect_call: ExpectedCall
    round_trip: ToolRoundTrip | None = None

    @model_validator(mode="after")
    def _needs_tools(self) -> ToolCallProbe:
        if not self.tools:
            raise ValueError("a tool_call probe needs at least one entry in tools")
        return self


class ToolCallSpec(_Strict):
    kind: Literal["tool_call"]
    description: str = ""
    timeout_s: float = Field(default=120.0, gt=0)
    probes: list[ToolCallProbe] = Field(min_length=1)
    stream: bool = True
    """Also send each probe streamed and check the call assembled from the deltas (agents stream;
    vLLM's streaming tool parser is separate code from the non-streamed one)."""


class ReasoningSplitProbe(ChatProbe):
    """Thinking on: reasoning and content must come back in separate fields."""

    thinking: bool = True
    expect_reasoning_contains: str = Field(min_length=1)
    expect_content_contains: str = Field(min_length=1)


class ReasoningCarryProbe(ChatProbe):
    """Thinking on, with tools: the reasoning of the tool-call turn must reach the next prompt."""

    thinking: bool = True
    expect_reasoning_contains: str = Field(min_length=1)
    expect_call: ExpectedCall
    round_trip: ToolRoundTrip
    carry_field: Literal["reasoning_content", "reasoning"] = "reasoning_content"
    """The assistant-message field the reasoning is sent back in (DeepSeek's contract: reasoning_content)."""


class ReasoningSpec(_Strict):
    kind: Literal["reasoning"]
    description: str = ""
    timeout_s: float = Field(default=120.0, gt=0)
    split_probes: list[ReasoningSplitProbe] = Field(default_factory=list)
    carry_probes: list[ReasoningCarryProbe] = Field(default_factory=list)
    stream: bool = True
    """Also send each split probe streamed: the reasoning parser splits streams with separate code."""

    @model_validator(mode="after")
    def _some_probe(self) -> ReasoningSpec:
        if not self.split_probes and not self.carry_probes:
            raise ValueError("a reasoning guard needs split_probes or carry_probes")
        return self


class EquivalenceProbe(_Strict):
    name: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)


class EquivalenceThresholds(_Strict):
    """Drift, in nats, of teacher-forced logprobs against the reference (calibrated: docs/guards.md)."""

    max_mean_drift_nats: float = Field(ge=0)
    """Mean |Δ logprob| per scored token, over all probes."""
    max_token_drift_nats: float = Field(ge=0)
    """Largest |Δ logprob| of any single token."""
    max_tie_gap_nats: float = Field(ge=0)
    """Greedy output may leave the reference only where the reference's top two were this close."""


class EquivalenceSpec(_Strict):
    kind: Literal["equivalence"]
    description: str = ""
    timeout_s: float = Field(default=120.0, gt=0)
    probes: list[EquivalenceProbe] = Field(min_length=1)
    thresholds: EquivalenceThresholds
    top_logprobs: int = Field(default=5, ge=2, le=20)
    reference_requires: dict[str, list[Any]] = Field(default_factory=dict)
    """Only a trial whose args take one of these values may record the reference (absent arg = null)."""


class Needle(_Strict):
    depth: float = Field(ge=0.0, le=1.0)
    code: str = Field(min_length=1)


class NeedleSpec(_Strict):
    kind: Literal["needle"]
    description: str = ""
    timeout_s: float = Field(default=300.0, gt=0)
    context_tokens: int | None = Field(default=None, ge=64)
    """Prompt length in tokens (fixed)."""
    context_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    """Or: prompt length as a fraction of the trial's --max-model-len."""
    needles: list[Needle] = Field(min_length=1)
    filler: list[str] = Field(min_length=1)
    needle_template: str = Field(min_length=1)
    question: str = Field(min_length=1)
    max_tokens: int = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _one_length(self) -> NeedleSpec:
        if (self.context_tokens is None) == (self.context_fraction is None):
            raise ValueError("set exactly one of context_tokens and context_fraction")
        if "{code}" not in self.needle_template:
            raise ValueError("needle_template must contain {code}")
        return self


GuardSpec = Union[ToolCallSpec, ReasoningSpec, EquivalenceSpec, NeedleSpec]  # noqa: UP007 (a runtime alias)
_MODELS: dict[str, type[ToolCallSpec | ReasoningSpec | EquivalenceSpec | NeedleSpec]] = {
    "tool_call": ToolCallSpec, "reasoning": ReasoningSpec, "equivalence": EquivalenceSpec, "needle": NeedleSpec,
}


def load_spec(path: Path) -> GuardSpec:
    """Read one guard file; every problem is a CatalogError naming file, key and fix."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CatalogError(path, "(top level)", f"expected a mapping of keys, got {type(data).__name__}",
                           "start the file with `kind:` and the keys of that guard kind")
    kind = data.get("kind")
    if kind not in _MODELS:
        raise CatalogError(path, "kind", f"unknown or missing guard kind {kind!r}",
                           f"use one of: {', '.join(sorted(_MODELS))}")
    model = _MODELS[kind]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(path, exc, model) from exc
