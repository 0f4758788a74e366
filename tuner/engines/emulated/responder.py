"""A deterministic "competent model": what a correctly served chat model would answer to simple probes.

It is not a language model; it answers the kinds of questions correctness gates ask, the way a
model that follows its chat template would, so gates can pass on a correct launch and fail on a
broken one:

- a tool result in the conversation → an answer that repeats the result's facts;
- tools offered → a call of the one tool whose required arguments it can fill from the user's
  words (a city after "in"/"for", a number, a quoted string, a path), arguments valid for the schema;
- arithmetic ("What is 17 + 25?") → the right number;
- a pass code / needle hidden in a long text → the code;
- anything else → a short, plain answer.

With thinking on it also reasons, briefly, before answering. Its wording varies from question to
question (one of a few phrasings, chosen by a hash of the question), as a real model's does: a gate
may check what an answer means, never how it is worded. :func:`garble` is what a configuration with
broken numerics makes of the same answer (the emulator's trap table decides when).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.engines.emulated.hashing import stable_hash

__all__ = ["ModelTurn", "ToolCall", "garble", "respond"]

_NUMBER_WORDS = {w: i for i, w in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"))}
_OPS: dict[str, tuple[str, Callable[[float, float], float]]] = {
    "+": ("plus", operator.add), "-": ("minus", operator.sub), "*": ("times", operator.mul),
    "x": ("times", operator.mul), "×": ("times", operator.mul),
    "/": ("divided by", lambda a, b: a / b if b else float("nan")),
}
_WORD_OPS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
_ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s*([+\-*/x×])\s*(-?\d+(?:\.\d+)?)")
_WORD_ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s+(plus|minus|times|multiplied by|divided by)\s+(-?\d+(?:\.\d+)?)", re.I)
_PASS_CODE = re.compile(r"pass ?code is\s+([A-Za-z0-9-]+)", re.I)
_PLACE = re.compile(r"\b(?:in|for|of|at|to|near)\s+((?:[A-Z][\w'-]+)(?:\s+[A-Z][\w'-]+)*)")
_PROPER = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z][\w'-]+)")
_QUOTED = re.compile(r"[\"“']([^\"”']{1,80})[\"”']")
_PATH = re.compile(r"((?:[\w.-]+/)+[\w.-]+|\b[\w-]+\.(?:py|md|txt|json|yaml|yml|toml|js|ts|rs|go|c|h|cpp|java)\b)")
_INT = re.compile(r"-?\d+")
_PLACE_WORDS = ("city", "location", "place", "town", "destination", "country", "region", "where")
_STOPWORDS = frozenset((
    "what", "is", "the", "a", "an", "of", "in", "for", "to", "how", "many", "much", "who", "when", "which", "does",
    "do", "are", "please", "tell", "me", "about", "with", "on", "at", "and", "or", "be", "it"))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]

    def arguments_json(self) -> str:
        return json.dumps(dict(self.arguments), ensure_ascii=False)


@dataclass(frozen=True)
class ModelTurn:
    """One assistant turn before any parser sees it."""

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _pick(options: Sequence[str], *key: Any) -> str:
    """One of several phrasings, chosen by a hash of ``key``: the same question is always worded the same way."""
    return options[stable_hash("wording", *key) % len(options)]


def _arithmetic(text: str) -> tuple[str, str] | None:
    match = _ARITH.search(text)
    if match is None:
        word = _WORD_ARITH.search(text)
        if word is None:
            return None
        a_text, op_word, b_text = word.groups()
        op = _WORD_OPS[op_word.lower()]
    else:
        a_text, op, b_text = match.groups()
    a, b = float(a_text), float(b_text)
    name, fn = _OPS[op]
    x, y, result = _format_number(a), _format_number(b), _format_number(fn(a, b))
    symbol = {"plus": "+", "minus": "-", "times": "×", "divided by": "÷"}[name]
    reasoning = _pick((f"The user wants {x} {name} {y}. {x} {symbol} {y} = {result}. Quick check: that is right.",
                       f"Compute {x} {symbol} {y}: the result is {result}.",
                       f"{x} {name} {y}... that gives {result}. I'll state it plainly."), text, "r")
    answer = _pick((f"{x} {symbol} {y} = **{result}**", f"It comes to {result}.", f"**{result}**"), text, "a")
    return reasoning, answer


def _integer(text: str, prop: str) -> int | None:
    near = re.search(rf"(\d+)\s+{re.escape(prop.rstrip('s'))}", text, re.I)
    if near:
        return int(near.group(1))
    digits = _INT.search(text)
    if digits:
        return int(digits.group(0))
    for word in re.findall(r"[a-z]+", text.lower()):
        if word in _NUMBER_WORDS:
            return _NUMBER_WORDS[word]
    return None


def _string(text: str, prop: str, schema: Mapping[str, Any]) -> str | None:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return next((str(v) for v in enum if str(v).lower() in text.lower()), None)
    lowered = prop.lower()
    if any(w in lowered for w in _PLACE_WORDS):
        place = _PLACE.search(text)
        if place:
            return place.group(1)
        proper = _PROPER.search(text)
        return proper.group(1) if proper else None
    if any(w in lowered for w in ("path", "file", "dir", "folder")):
        path = _PATH.search(text)
        return path.group(1) if path else None
    quoted = _QUOTED.search(text)
    if quoted:
        return quoted.group(1)
    if any(w in lowered for w in ("query", "text", "q", "question", "search", "topic", "name", "subject")):
        words = [w for w in re.findall(r"[\w'-]+", text) if w.lower() not in _STOPWORDS]
        return " ".join(words[:6]) if words else None
    proper = _PROPER.search(text)
    return proper.group(1) if proper else None


def _fill(text: str, parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """Arguments for a JSON-schema ``parameters`` object from ``text``; None when a required one is unknown."""
    props = parameters.get("properties") or {}
    required = [str(r) for r in parameters.get("required") or []]
    args: dict[str, Any] = {}
    for name, schema in props.items():
        schema = schema if isinstance(schema, Mapping) else {}
        kind = schema.get("type", "string")
        value: Any = None
        if kind == "integer":
            value = _integer(text, name)
        elif kind == "number":
            number = _integer(text, name)
            value = None if number is None else float(number)
        elif kind == "boolean":
            lowered = text.lower()
            value = True if re.search(r"\b(yes|true|enable|on)\b", lowered) else \
                False if re.search(r"\b(no|false|disable|off)\b", lowered) else None
        elif kind == "string":
            value = _string(text, name, schema)
        if value is not None:
            args[name] = value
        elif name in required:
            return None
    return args


def _choose_tool(text: str, tools: Sequence[Mapping[str, Any]], forced: str | None) -> ToolCall | None:
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", text)}
    best: tuple[int, int, ToolCall] | None = None
    for order, tool in enumerate(tools):
        function = tool.get("function") or {}
        name = str(function.get("name", ""))
        if forced is not None and name != forced:
            continue
        args = _fill(text, function.get("parameters") or {})
        if args is None:
            continue
        vocabulary = set(re.findall(r"[a-z]+", (name + " " + str(function.get("description", ""))).lower()))
        score = len(words & vocabulary)
        if best is None or score > best[0]:
            best = (score, -order, ToolCall(name, args))
    return best[2] if best else None


def _tool_results(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(tool name, result) of the tool messages after the last user message."""
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    for msg in messages:
        role = msg.get("role")
        if role == "user":
            results = []
        elif role == "assistant":
            for call in msg.get("tool_calls") or []:
                names[str(call.get("id", ""))] = str((call.get("function") or {}).get("name", "the tool"))
        elif role == "tool":
            results.append((names.get(str(msg.get("tool_call_id", "")), "the tool"), _text(msg.get("content"))))
    return results


def _facts(result: str) -> str:
    try:
        data = json.loads(result)
    except (json.JSONDecodeError, TypeError):
        return result.strip()[:400]
    if isinstance(data, Mapping):
        return ", ".join(f"{str(k).replace('_', ' ')} is {v if not isinstance(v, (dict, list)) else json.dumps(v)}"
                         for k, v in data.items())
    return json.dumps(data)


def respond(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, *,
            thinking: bool, tool_choice: Any = "auto") -> ModelTurn:
    """The answer to the conversation's last turn (see the module docstring)."""
    user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    results = _tool_results(messages)
    if results:
        name, result = results[-1]
        facts = _facts(result)
        answer = _pick((f"According to {name}, {facts}.", f"Here is what I found: {facts}.",
                        f"The {name} result says {facts}."), user, result)
        thought = _pick((f"{name} returned {result.strip()[:200]}. I can answer now.",
                         f"The tool answered: {result.strip()[:200]}. Summarize it for the user."), user, result)
        return ModelTurn(answer, thought if thinking else None)
    forced = None
    if isinstance(tool_choice, Mapping):
        forced = str((tool_choice.get("function") or {}).get("name", "")) or None
    if tools:  # rendered into the prompt even with tool_choice "none": the model still calls (notes/dsv4-parsers)
        call = _choose_tool(user, tools, forced)
        if call is not None:
            first = next(iter(call.arguments.values()), "")
            plan = _pick((f"The user asks about {first}; {call.name} can tell me, so I will call it.",
                          f"To answer this I should look it up with {call.name} ({call.arguments_json()}).",
                          f"I don't know this offhand. Calling {call.name} for {first}."), user, call.name)
            return ModelTurn("", plan if thinking else None, (call,))
    code = _PASS_CODE.search(user)
    if code is not None and re.search(r"pass ?code|code", user.split("\n")[-1], re.I):
        return ModelTurn(code.group(1), f"The text says the pass code is {code.group(1)}." if thinking else None)
    arithmetic = _arithmetic(user)
    if arithmetic is not None:
        worked, answer = arithmetic
        return ModelTurn(answer, worked if thinking else None)
    if re.search(r"\b(hello|hi|hey)\b", user, re.I):
        return ModelTurn("Hello! How can I help you today?", "The user greets me." if thinking else None)
    topic = " ".join(w for w in re.findall(r"[\w'-]+", user)[:12] if w.lower() not in _STOPWORDS)[:80]
    answer = f"Here is a short answer about {topic or 'that'}."
    reasoning = f"The user asks about {topic or 'something'}. I will answer briefly." if thinking else None
    return ModelTurn(answer, reasoning)


_FILLER = ("lorem", "ipsum", "delta", "vector", "quartz", "ember", "tundra", "glyph", "orbit", "sable")


def garble(turn: ModelTurn, seed: int) -> ModelTurn:
    """What broken numerics make of an answer: words and digits replaced, tool calls lost."""
    def scramble(text: str) -> str:
        out = []
        for i, word in enumerate(text.split()):
            h = stable_hash(seed, i, word) & 0xFFFF
            if any(ch.isdigit() for ch in word):
                out.append(str(h % 997))
            elif h % 3:
                out.append(_FILLER[h % len(_FILLER)])
            else:
                out.append(word[::-1])
        return " ".join(out)

    content = turn.content
    if turn.tool_calls:
        content = " ".join(f"{c.name} {json.dumps(dict(c.arguments))}" for c in turn.tool_calls)
    reasoning = scramble(turn.reasoning) if turn.reasoning else turn.reasoning
    return ModelTurn(scramble(content) or _FILLER[seed % len(_FILLER)], reasoning, ())
