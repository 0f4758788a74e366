"""The YAML shape every guard file shares (``guards/<name>.yaml``: one file per guard, one ``kind`` per file).

Each kind's own model (``ToolCallSpec``, ``NeedleSpec``, ...) lives in its kind's module; the probe
shapes that several kinds share live here. Pydantic models with ``extra="forbid"``: a typo in a key
is a :class:`~tuner.errors.CatalogError` naming the file and the key. Thresholds follow the house
sign: a measured value at or below its threshold passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.catalog import format_validation_error, read_yaml
from tuner.errors import CatalogError

__all__ = ["ChatProbe", "ExpectedCall", "StrictModel", "ToolRoundTrip", "read_spec"]


class StrictModel(BaseModel):
    """A YAML mapping: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatProbe(StrictModel):
    """One chat request. ``thinking`` becomes ``chat_template_kwargs.thinking``."""

    name: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    thinking: bool = False
    max_tokens: int = Field(default=128, ge=1)


class ExpectedCall(StrictModel):
    """The tool call a probe must produce. ``arguments``, when given, must match exactly as JSON."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | None = None


class ToolRoundTrip(StrictModel):
    """Send ``tool_result`` back as the tool message; the final answer must contain the text."""

    tool_result: str
    expect_content_contains: str = Field(min_length=1)
    max_tokens: int = Field(default=64, ge=1)


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
