"""Tool-call gate: the server must parse the model's tool call into ``message.tool_calls``.

Each probe sends a chat request with tools; the first call must name the expected function with
JSON arguments that validate against its schema and carry what the user asked for
(``arguments_mention``; exact ``arguments`` only for a model known word for word). Raw DSML (or
other tool markup) left in ``content`` or the reasoning fails. With ``round_trip``, the tool result
is sent back and the final answer must be a plain answer (content, no call, no markup) that states
the tool result's facts (``expect_facts``), in whatever words. With ``stream`` (the default), the
probe is sent again streamed, and the call assembled from its deltas must pass the same check and
match the non-streamed call.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from tuner.guards.api import GuardKind, GuardResult, GuardTarget, ProbeLog, SpecGuard
from tuner.guards.chat import (
    answer_problem,
    assistant_echo,
    call_problem,
    chat_payload,
    facts_problem,
    markup_problem,
    tool_result_message,
)
from tuner.guards.http import GuardClient, first_message, message_reasoning
from tuner.guards.specs import ChatProbe, ExpectedCall, StrictModel, ToolRoundTrip

__all__ = ["KIND", "ToolCallGuard", "ToolCallProbe", "ToolCallSpec"]

log = logging.getLogger(__name__)


class ToolCallProbe(ChatProbe):
    expect_call: ExpectedCall
    round_trip: ToolRoundTrip | None = None

    @model_validator(mode="after")
    def _needs_tools(self) -> ToolCallProbe:
        if not self.tools:
            raise ValueError("a tool_call probe needs at least one entry in tools")
        return self


class ToolCallSpec(StrictModel):
    kind: Literal["tool_call"]
    description: str = ""
    timeout_s: float = Field(default=120.0, gt=0)
    probes: list[ToolCallProbe] = Field(min_length=1)
    stream: bool = True
    """Also send each probe streamed and check the call assembled from the deltas (agents stream;
    vLLM's streaming tool parser is separate code from the non-streamed one)."""


class ToolCallGuard(SpecGuard[ToolCallSpec]):
    kind = "tool_call"

    def run(self, target: GuardTarget) -> GuardResult:
        probes = ProbeLog()
        with GuardClient(target, self.spec.timeout_s) as client:
            for probe in self.spec.probes:
                probes.check(probe.name, {"probe": probe.name},
                             functools.partial(_check, client, probe, self.spec.stream))
        return probes.result(self, f"{len(self.spec.probes)} probe(s) parsed and answered")


KIND = GuardKind("tool_call", ToolCallSpec, ToolCallGuard)


def _check(client: GuardClient, probe: ToolCallProbe, stream: bool, record: dict[str, Any]) -> str | None:
    problem = _run_probe(client, probe, record)
    if problem is None and stream:
        problem = _run_streamed(client, probe, record)
    return problem


def _run_probe(client: GuardClient, probe: ToolCallProbe, record: dict[str, Any]) -> str | None:
    message = first_message(client.chat(chat_payload(probe)))
    record["response"] = _summary(message)
    problem = call_problem(message, probe.expect_call, probe.tools) or markup_problem(message, ("reasoning",))
    if problem is not None or probe.round_trip is None:
        return problem
    echo = assistant_echo(message, reasoning=message_reasoning(message))
    follow_up = [*probe.messages, echo, tool_result_message(echo, probe.round_trip.tool_result)]
    final = first_message(client.chat(chat_payload(probe, follow_up, probe.round_trip.max_tokens)))
    record["round_trip_response"] = _summary(final)
    problem = answer_problem(final, what="answer to the tool result") or facts_problem(
        final.get("content") or "", probe.round_trip)
    return f"round trip: {problem}" if problem is not None else None


def _run_streamed(client: GuardClient, probe: ToolCallProbe, record: dict[str, Any]) -> str | None:
    streamed = client.chat_stream(chat_payload(probe))
    record["streamed_response"] = _summary(streamed)
    problem = call_problem(streamed, probe.expect_call, probe.tools) or markup_problem(streamed, ("reasoning",))
    if problem is not None:
        return f"streamed: {problem}"
    whole, pieces = record["response"]["tool_calls"][0], record["streamed_response"]["tool_calls"][0]
    if whole["name"] != pieces["name"] or _arguments(whole) != _arguments(pieces):
        return f"streamed call {pieces} differs from the non-streamed call {whole}"
    return None


def _arguments(call: dict[str, Any]) -> Any:
    raw = call.get("arguments")
    return json.loads(raw) if isinstance(raw, str) else raw  # parseable: call_problem checked it


def _summary(message: dict[str, Any]) -> dict[str, Any]:
    calls = [{"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
             for c in message.get("tool_calls") or []]
    return {"content": message.get("content"), "reasoning": message_reasoning(message), "tool_calls": calls,
            "finish_reason": message.get("finish_reason")}
