"""Chat-probe helpers shared by the tool-call and reasoning guards and by the trained fixture.

The fixture trains on exactly the conversations built here, so the guard and the fixture can
never disagree on what a round trip sends back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.guards.specs import ChatProbe, ExpectedCall

__all__ = [
    "RAW_MARKUP", "assistant_echo", "call_problem", "chat_payload", "raw_markup_in", "schema_problems",
    "tool_result_message",
]

# Markup that must never reach the client's content when the parsers work.
RAW_MARKUP: tuple[str, ...] = ("｜DSML｜", "<tool_call>", "</tool_call>", "<think>", "</think>")
_PLACEHOLDER_CALL_ID = "call_0"


def chat_payload(probe: ChatProbe, messages: Sequence[Mapping[str, Any]] | None = None,
                 max_tokens: int | None = None) -> dict[str, Any]:
    """The request body of one probe turn (greedy, thinking as the probe says)."""
    payload: dict[str, Any] = {
        "messages": [dict(m) for m in (messages if messages is not None else probe.messages)],
        "temperature": 0.0,
        "max_tokens": max_tokens if max_tokens is not None else probe.max_tokens,
        "chat_template_kwargs": {"thinking": probe.thinking},
    }
    if probe.tools:
        payload["tools"] = [dict(t) for t in probe.tools]
        payload["tool_choice"] = "auto"
    return payload


def assistant_echo(message: Mapping[str, Any], *, reasoning: str | None,
                   carry_field: str = "reasoning_content") -> dict[str, Any]:
    """The assistant turn a client sends back: its tool calls as returned, and its reasoning if any."""
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        calls.append({"id": call.get("id") or f"{_PLACEHOLDER_CALL_ID}{i}", "type": "function",
                      "function": {"name": function.get("name", ""),
                                   "arguments": function.get("arguments") or "{}"}})
    echo: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if calls:
        echo["tool_calls"] = calls
    if reasoning:
        echo[carry_field] = reasoning
    return echo


def tool_result_message(echo: Mapping[str, Any], content: str) -> dict[str, Any]:
    calls = echo.get("tool_calls") or [{"id": _PLACEHOLDER_CALL_ID}]
    return {"role": "tool", "tool_call_id": calls[0]["id"], "content": content}


def raw_markup_in(text: str | None) -> str | None:
    """The first raw markup token found in ``text``, or None."""
    if not text:
        return None
    return next((m for m in RAW_MARKUP if m in text), None)


def call_problem(message: Mapping[str, Any], expected: ExpectedCall,
                 tools: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the message's first tool call is not the expected one (None when it is)."""
    calls = message.get("tool_calls") or []
    if not calls:
        markup = raw_markup_in(message.get("content"))
        where = f"raw {markup!r} markup left in content" if markup else "no tool call in the response"
        return f"{where}; expected a parsed call of {expected.name} (content: {str(message.get('content'))[:160]!r})"
    function = calls[0].get("function") or {}
    name = function.get("name")
    if name != expected.name:
        return f"tool call names {name!r}, expected {expected.name!r}"
    raw_args = function.get("arguments")
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
    except ValueError:
        return f"arguments of {name} are not JSON: {str(raw_args)[:160]!r}"
    if not isinstance(args, dict):
        return f"arguments of {name} are not a JSON object: {args!r}"
    schema = _tool_schema(tools, expected.name)
    problems = schema_problems(args, schema) if schema is not None else []
    if problems:
        return f"arguments of {name} break its schema: {'; '.join(problems[:3])}"
    if expected.arguments is not None and args != expected.arguments:
        return f"arguments of {name} are {args!r}, expected {expected.arguments!r}"
    markup = raw_markup_in(message.get("content"))
    if markup:
        return f"raw {markup!r} markup left in content beside the parsed call"
    return None


def _tool_schema(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            params = function.get("parameters")
            return params if isinstance(params, Mapping) else None
    return None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


def schema_problems(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Check ``value`` against the JSON-schema subset tool definitions use.

    Covers type (one or a list), enum, required, properties, additionalProperties: false and items.
    """
    problems: list[str] = []
    wanted = schema.get("type")
    if wanted is not None:
        names = [wanted] if isinstance(wanted, str) else list(wanted)
        if not any(_is_type(value, n) for n in names):
            return [f"{path} is {type(value).__name__}, schema wants {'/'.join(names)}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}={value!r} not in enum {schema['enum']!r}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        problems += [f"{path}.{k} is required" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            problems += [f"{path}.{k} is not allowed" for k in value if k not in props]
        for key, sub in props.items():
            if key in value and isinstance(sub, Mapping):
                problems += schema_problems(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{path}[{i}]")
    return problems


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    kinds = _JSON_TYPES.get(name)
    return kinds is not None and isinstance(value, kinds)
