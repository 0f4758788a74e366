"""Chat-probe helpers shared by the tool-call and reasoning guards and by the trained fixture.

The fixture trains on exactly the conversations built here, so the guard and the fixture can
never disagree on what a round trip sends back.

The checks judge structure and meaning, not wording: a parsed call, arguments valid for the tool's
schema and carrying what the user said, a number stated in any format, a fact of a tool result
echoed, and no chat-template markup left in what the client reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.guards.specs import ChatProbe, ExpectedCall, ToolRoundTrip

__all__ = [
    "RAW_MARKUP", "answer_problem", "assistant_echo", "call_problem", "chat_payload", "facts_problem",
    "markup_problem", "mentions", "numbers_in", "raw_markup_in", "schema_problems", "states_number",
    "tool_result_message",
]

# Markup that must never reach the client's content when the parsers work.
RAW_MARKUP: tuple[str, ...] = ("｜DSML｜", "<tool_call>", "</tool_call>", "<think>", "</think>")
"""Markup a chat template or a parser must consume: none of it may reach ``content`` or the reasoning."""
_PLACEHOLDER_CALL_ID = "call_0"


def thinking_kwargs(thinking: bool) -> dict[str, bool]:
    """``chat_template_kwargs`` that turn thinking on or off for every server the gates speak to: DeepSeek V4's
    ``thinking`` (vLLM's DSV4 renderer reads it, or ``enable_thinking``) and ``enable_thinking``, which
    llama-server also reads to decide whether to parse a reasoning block out of the answer."""
    return {"thinking": thinking, "enable_thinking": thinking}


THINKING_OFF = thinking_kwargs(False)


def chat_payload(probe: ChatProbe, messages: Sequence[Mapping[str, Any]] | None = None,
                 max_tokens: int | None = None) -> dict[str, Any]:
    """The request body of one probe turn (greedy, thinking as the probe says)."""
    payload: dict[str, Any] = {
        "messages": [dict(m) for m in (messages if messages is not None else probe.messages)],
        "temperature": 0.0,
        "max_tokens": max_tokens if max_tokens is not None else probe.max_tokens,
        "chat_template_kwargs": thinking_kwargs(probe.thinking),
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
    for key, value in expected.arguments_mention.items():
        if not _argument_mentions(args.get(key), value):
            return (f"argument {key} of {name} is {args.get(key)!r}: it does not carry {value!r} from the "
                    f"user's request (arguments {args!r})")
    if expected.arguments is not None and args != expected.arguments:
        return f"arguments of {name} are {args!r}, expected {expected.arguments!r}"
    markup = raw_markup_in(message.get("content"))
    if markup:
        return f"raw {markup!r} markup left in content beside the parsed call"
    return None


def _argument_mentions(value: Any, fact: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, (dict, list)):
        return mentions(json.dumps(value, ensure_ascii=False), fact)
    return mentions(str(value), fact)


# ---------------------------------------------------------------- meaning, whatever the wording

_GROUPED = re.compile(r"(?<![\d.])-?\d{1,3}(?:[,\u00a0\u202f\u2009 ]\d{3})+(?:\.\d+)?(?![\d])")
_PLAIN = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?")
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_WORD_NUMBER = re.compile(
    r"\b(" + "|".join(t for t in _TENS if t) + r")(?:[\s-]+(" + "|".join(_UNITS[1:10]) + r"))?\b"
    r"|\b(" + "|".join(_UNITS) + r")\b", re.IGNORECASE)


def numbers_in(text: str) -> set[float]:
    """Every number ``text`` states: digits with or without thousands separators, and number words below 100.

    "522,250", "522 250" and "522250" all give 522250.0; "forty-two" gives 42.0; "**42**" gives 42.0.
    Both readings of a digit run are kept ("1,234" gives 1234 and also 1 and 234), so a stated number is
    never missed; a check asks whether the expected number is among them.
    """
    found: set[float] = set()
    for match in _GROUPED.finditer(text):
        found.add(float(re.sub(r"[,\u00a0\u202f\u2009 ]", "", match.group(0))))
    for match in _PLAIN.finditer(text):
        found.add(float(match.group(0)))
    for match in _WORD_NUMBER.finditer(text):
        tens, unit, alone = match.groups()
        if alone:
            found.add(float(_UNITS.index(alone.lower())))
        else:
            found.add(float(10 * _TENS.index(tens.lower()) + (_UNITS.index(unit.lower()) if unit else 0)))
    return found


def states_number(text: str, value: float) -> bool:
    """Whether ``text`` states ``value`` (as a number, in any of the formats :func:`numbers_in` reads)."""
    return any(abs(n - float(value)) <= 1e-9 * max(1.0, abs(float(value))) for n in numbers_in(text))


def _as_number(fact: Any) -> float | None:
    if isinstance(fact, bool):
        return None
    if isinstance(fact, (int, float)):
        return float(fact)
    if isinstance(fact, str) and re.fullmatch(r"-?\d+(?:\.\d+)?", fact.strip()):
        return float(fact.strip())
    return None


def mentions(text: str, fact: Any) -> bool:
    """Whether ``text`` states ``fact``: a number as a number, text case-insensitively."""
    number = _as_number(fact)
    if number is not None:
        return states_number(text, number)
    return str(fact).casefold() in text.casefold()


def facts_problem(content: str, round_trip: ToolRoundTrip) -> str | None:
    """Why an answer to a tool result does not use it (None when it states enough of its facts)."""
    if round_trip.expect_facts:
        stated = [f for f in round_trip.expect_facts if mentions(content, f)]
        if len(stated) < round_trip.min_facts:
            return (f"the answer {content[:160]!r} states none of the tool result's facts "
                    f"{round_trip.expect_facts!r} (needs {round_trip.min_facts})" if not stated else
                    f"the answer {content[:160]!r} states only {stated!r} of the tool result's facts "
                    f"{round_trip.expect_facts!r} (needs {round_trip.min_facts})")
    if round_trip.expect_content_contains is not None and round_trip.expect_content_contains not in content:
        return f"the answer {content[:160]!r} lacks {round_trip.expect_content_contains!r}"
    return None


def markup_problem(message: Mapping[str, Any], fields: Iterable[str] = ("content", "reasoning")) -> str | None:
    """Raw template or parser markup left in the message's content or reasoning (None when clean)."""
    for where in fields:
        text = message.get(where)
        if where == "reasoning" and not text:
            text = message.get("reasoning_content")
        markup = raw_markup_in(text if isinstance(text, str) else None)
        if markup:
            return f"raw {markup!r} markup left in {where}: {str(text)[:160]!r}"
    return None


def answer_problem(message: Mapping[str, Any], *, what: str = "answer") -> str | None:
    """Why a message is not a plain answer: no content, a tool call instead, markup, or cut at max_tokens."""
    content = message.get("content") or ""
    if message.get("tool_calls"):
        calls = [(c.get("function") or {}).get("name") for c in message.get("tool_calls") or []]
        return f"the {what} is another tool call ({calls}), not an answer"
    markup = markup_problem(message)
    if markup:
        return markup
    if not content.strip():
        truncated = " (cut at max_tokens: raise the probe's max_tokens)" if message.get("finish_reason") == "length" \
            else ""
        return f"the {what} has no content{truncated}"
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
