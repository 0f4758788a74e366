"""The YAML shape every guard file shares (``guards/<name>.yaml``: one file per guard, one ``kind`` per file).

Each kind's own model (``ToolCallSpec``, ``NeedleSpec``, ...) lives in its kind's module; the probe
shapes that several kinds share live here. Pydantic models with ``extra="forbid"``: a typo in a key
is a :class:`~tuner.errors.CatalogError` naming the file and the key. Thresholds follow the house
sign: a measured value at or below its threshold passes.

What a chat probe expects is structure and meaning, never wording: a parsed call of a named tool
with schema-valid arguments that mention what the user said (``arguments_mention``), an answer
that states a number (``expect_number``), an answer that echoes a fact of the tool result
(``expect_facts``). Exact text (``expect_content_contains``, ``expect_reasoning_contains``,
``arguments``) is there for a model whose answers are known word for word (the test suite's trained
fixture); the shipped probes never use it, because a competent model words its answers its own way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.catalog import format_validation_error, read_yaml
from tuner.errors import CatalogError

__all__ = ["ChatProbe", "ExpectedCall", "StrictModel", "ToolRoundTrip", "read_spec"]

Fact = str | int | float


class StrictModel(BaseModel):
    """A YAML mapping: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatProbe(StrictModel):
    """One chat request. ``thinking`` becomes ``chat_template_kwargs.thinking``.

    ``max_tokens`` must leave a real model room to finish: a thinking probe of DeepSeek V4 reasons
    for hundreds of tokens before it answers, and an answer cut at ``max_tokens`` fails the probe
    with "truncated".
    """

    name: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    thinking: bool = False
    max_tokens: int = Field(default=128, ge=1)


class ExpectedCall(StrictModel):
    """The tool call a probe must produce: its function's name, with arguments valid for the tool's schema.

    ``arguments_mention`` (meaning): each named argument must carry the value the user gave, a
    string case-insensitively inside the argument's text ("Paris" in "Paris, France"), a number
    equal as a number. ``arguments`` (wording): the arguments must equal these exactly as JSON.
    """

    name: str = Field(min_length=1)
    arguments_mention: dict[str, Fact] = Field(default_factory=dict)
    arguments: dict[str, Any] | None = None


class ToolRoundTrip(StrictModel):
    """Send ``tool_result`` back as the tool message; the final answer must use it.

    ``expect_facts``: values of the tool result; the answer must state at least ``min_facts`` of
    them (numbers as numbers, whatever their formatting: 522250, 522,250 and 522 250 are one number;
    text case-insensitively). ``expect_content_contains``: exact text, for a model known word for word.
    """

    tool_result: str
    expect_facts: list[Fact] = Field(default_factory=list)
    min_facts: int = Field(default=1, ge=1)
    expect_content_contains: str | None = Field(default=None, min_length=1)
    max_tokens: int = Field(default=64, ge=1)

    @model_validator(mode="after")
    def _something_expected(self) -> ToolRoundTrip:
        if not self.expect_facts and self.expect_content_contains is None:
            raise ValueError("a round trip needs expect_facts (values of the tool result the answer must "
                             "state) or expect_content_contains")
        if self.expect_facts and self.min_facts > len(self.expect_facts):
            raise ValueError(f"min_facts is {self.min_facts}, but expect_facts lists {len(self.expect_facts)}")
        return self


def read_spec(path: Path, models: Mapping[str, type[BaseModel]]) -> BaseModel:
    """Read one guard file as the model its ``kind`` names; every problem is a CatalogError naming file, key and fix."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise CatalogError(path, "(top level)", f"expected a mapping of keys, got {type(data).__name__}",
                           "start the file with `kind:` and the keys of that guard kind")
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in models:
        raise CatalogError(path, "kind", f"unknown or missing guard kind {kind!r}",
                           f"use one of: {', '.join(sorted(models))}")
    model = models[kind]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(path, exc, model) from exc
