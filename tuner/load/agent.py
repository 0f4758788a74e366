"""Multi-turn coding-agent sessions over ``/v1/chat/completions`` (the dossier's agent shape).

A session is one agent working one task: a system prompt shared by every session (so prefix
caching and prefix-aware routing have something to find), the same tool definitions on every
request, a long first user message (task + repository context), then ``turns`` requests. After
each answer the session appends the assistant message (with its ``reasoning_content`` and
``tool_calls`` when the server returned them: DeepSeek-V4 requires reasoning to be carried across
tool-call round trips) and a tool result, so each turn's prompt grows by the last answer and one
tool output, as a real agent's does.

Text is drawn from a fixed list of code-ish words with ``random.Random(seed, session)``; lengths
are in words, about one token each for a BPE tokenizer. The server's ``usage.prompt_tokens`` is
what the results count.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from tuner.objective import AgentSpec, Workload

__all__ = ["AgentSession", "AgentTurnReply", "make_tools", "merge_tool_call_deltas", "session_count"]

_WORDS_TEXT = """
    def class return import from self value index result error buffer config request response handler
    client server stream token batch cache queue worker thread process module package function method
    argument parameter default option path file folder line column offset length count total size limit
    timeout retry status message header body payload schema field record table query filter sort group
    merge split join parse format encode decode read write open close start stop check test assert raise
    except finally while for if else elif with async await yield lambda none true false int str float
    list dict set tuple bytes object type name key item data
"""
_WORDS = tuple(_WORDS_TEXT.split())
_SHARED_SEED = 0x5EED
_TOOL_NAMES = ("read_file", "write_file", "run_tests", "grep", "list_dir", "apply_patch", "run_shell",
               "git_diff", "search_docs", "open_url", "python", "lint")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def make_tools(spec: AgentSpec, seed: int) -> list[dict[str, Any]]:
    """The ``spec.tools`` OpenAI function definitions every request carries (same for all sessions)."""
    rng = random.Random(seed * 7919 + _SHARED_SEED + 1)
    tools = []
    for i in range(spec.tools):
        name = _TOOL_NAMES[i % len(_TOOL_NAMES)] + ("" if i < len(_TOOL_NAMES) else f"_{i}")
        tools.append({"type": "function", "function": {
            "name": name, "description": _text(rng, spec.tool_schema_len),
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "file or folder path"},
                "query": {"type": "string", "description": "what to look for"}},
                "required": ["path"]}}})
    return tools


def session_count(workload: Workload, requests: int) -> int:
    """Sessions needed for about ``requests`` requests (each session makes ``turns`` of them)."""
    turns = workload.agent_spec.turns
    return max(1, -(-requests // turns))


@dataclass(frozen=True)
class AgentTurnReply:
    """What one streamed answer carried, accumulated from its deltas."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass
class AgentSession:
    """One agent's conversation; :meth:`body` is the next request, :meth:`add_reply` extends it."""

    workload: Workload
    index: int
    model: str
    system_prompt: str
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    _rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def create(cls, workload: Workload, index: int, model: str, *, warmup: bool = False) -> AgentSession:
        spec = workload.agent_spec
        shared = random.Random(workload.seed * 7919 + _SHARED_SEED)
        system = "You are a coding agent. " + _text(shared, spec.system_len)
        rng = random.Random(f"{workload.seed}:{'warm' if warmup else 'session'}:{index}")
        session = cls(workload=workload, index=index, model=model, system_prompt=system,
                      tools=make_tools(spec, workload.seed) if spec.tool_choice != "omit" else [], _rng=rng)
        session.messages = [{"role": "system", "content": system},
                            {"role": "user", "content": "Task: " + _text(rng, spec.context_len)}]
        return session

    def body(self) -> dict[str, Any]:
        spec = self.workload.agent_spec
        body: dict[str, Any] = {
            "model": self.model, "messages": list(self.messages), "max_tokens": self.workload.output_len,
            "temperature": spec.temperature, "top_p": spec.top_p, "ignore_eos": self.workload.ignore_eos,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = self.tools
            body["tool_choice"] = spec.tool_choice
        if spec.reasoning:
            body["chat_template_kwargs"] = {"thinking": True}
            if spec.reasoning_effort is not None:
                body["reasoning_effort"] = spec.reasoning_effort
        return body

    def add_reply(self, reply: AgentTurnReply, turn: int) -> None:
        """Append the answer and a tool result, as the agent would before its next request."""
        spec = self.workload.agent_spec
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning:
            assistant["reasoning_content"] = reply.reasoning
        result = f"Tool output (turn {turn}): " + _text(self._rng, spec.tool_result_len)
        if reply.tool_calls:
            assistant["tool_calls"] = list(reply.tool_calls)
            self.messages.append(assistant)
            for call in reply.tool_calls:
                self.messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        else:
            self.messages.append(assistant)
            self.messages.append({"role": "user", "content": result})


def merge_tool_call_deltas(calls: dict[int, dict[str, Any]], deltas: Any) -> None:
    """Fold streamed ``delta.tool_calls`` pieces into whole calls, keyed by their ``index``."""
    if not isinstance(deltas, list):
        return
    for piece in deltas:
        if not isinstance(piece, dict):
            continue
        idx = piece.get("index", 0)
        call = calls.setdefault(idx if isinstance(idx, int) else 0,
                                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        if isinstance(piece.get("id"), str):
            call["id"] = piece["id"]
        fn = piece.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call["function"]["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["function"]["arguments"] += fn["arguments"]


def dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
