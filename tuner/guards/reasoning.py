"""Reasoning gate: thinking output split from the answer, and carried across a tool round trip.

Split probes (thinking on) must come back with reasoning in ``reasoning``/``reasoning_content`` and
an answer in ``content``, both present, with no chat-template markup (``<think>``, DSML) left in
either; with ``expect_number`` the answer must state that number, in any wording. With ``stream``
(the default) the same holds for the text assembled from the streamed deltas, which vLLM's reasoning
parser splits with separate code.

Carry probes follow DeepSeek V4's contract: in a thinking-mode tool round trip the client sends the
turn's reasoning back (``reasoning_content``), and the server must render it into the next prompt.
The first turn must reason and call the tool (parsed, schema-valid, carrying what the user asked
for); the gate then reads the prompt the server actually rendered (``return_prompt_text``, or the
prompt token ids detokenized; llama-server: its ``/apply-template`` of the same request) and requires
the reasoning in it, and the final answer must state the
tool result's facts.

Nothing here checks wording: a model that reasons and answers in its own words passes. Exact text
(``expect_reasoning_contains``, ``expect_content_contains``) is for a model known word for word.
"""

from __future__ import annotations

import functools
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
    states_number,
    tool_result_message,
)
from tuner.guards.http import GuardClient, first_message, message_reasoning
from tuner.guards.specs import ChatProbe, ExpectedCall, StrictModel, ToolRoundTrip

__all__ = ["KIND", "ReasoningCarryProbe", "ReasoningGuard", "ReasoningSpec", "ReasoningSplitProbe"]

log = logging.getLogger(__name__)


class ReasoningSplitProbe(ChatProbe):
    """Thinking on: reasoning and an answer must come back in separate fields."""

    thinking: bool = True
    expect_number: float | None = None
    """The answer must state this number (any format, any words around it)."""
    expect_reasoning_contains: str | None = Field(default=None, min_length=1)
    expect_content_contains: str | None = Field(default=None, min_length=1)


class ReasoningCarryProbe(ChatProbe):
    """Thinking on, with tools: the reasoning of the tool-call turn must reach the next prompt."""

    thinking: bool = True
    expect_call: ExpectedCall
    round_trip: ToolRoundTrip
    carry_field: Literal["reasoning_content", "reasoning"] = "reasoning_content"
    """The assistant-message field the reasoning is sent back in (DeepSeek's contract: reasoning_content)."""
    expect_reasoning_contains: str | None = Field(default=None, min_length=1)


class ReasoningSpec(StrictModel):
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


class ReasoningGuard(SpecGuard[ReasoningSpec]):
    kind = "reasoning"

    def run(self, target: GuardTarget) -> GuardResult:
        probes = ProbeLog()
        every: list[ReasoningSplitProbe | ReasoningCarryProbe] = [*self.spec.split_probes, *self.spec.carry_probes]
        with GuardClient(target, self.spec.timeout_s) as client:
            for probe in every:
                probes.check(probe.name, {"probe": probe.name},
                             functools.partial(_check, client, probe, self.spec.stream))
        return probes.result(self, f"{len(every)} probe(s) split and carried")


KIND = GuardKind("reasoning", ReasoningSpec, ReasoningGuard)


def _check(client: GuardClient, probe: ReasoningSplitProbe | ReasoningCarryProbe, stream: bool,
           record: dict[str, Any]) -> str | None:
    if isinstance(probe, ReasoningCarryProbe):
        return _run_carry(client, probe, record)
    problem = _run_split(client, probe, record)
    if problem is None and stream:
        problem = _run_split(client, probe, record, streamed=True)
    return problem


def _reasoning_problem(message: dict[str, Any], expect_reasoning: str | None) -> str | None:
    """Why the message's reasoning is not split off cleanly (None when it is)."""
    reasoning = message_reasoning(message)
    content = message.get("content") or ""
    if not reasoning:
        markup = markup_problem(message, ("content",))
        left = f"; {markup}" if markup else ""
        cut = " (cut at max_tokens: raise the probe's max_tokens)" if message.get("finish_reason") == "length" else ""
        return f"no reasoning field in the response{left}{cut} (content: {content[:160]!r})"
    if expect_reasoning is not None and expect_reasoning not in reasoning:
        return f"reasoning {reasoning[:160]!r} lacks {expect_reasoning!r}"
    return markup_problem(message)


def _run_split(client: GuardClient, probe: ReasoningSplitProbe, record: dict[str, Any], *,
               streamed: bool = False) -> str | None:
    message = client.chat_stream(chat_payload(probe)) if streamed else first_message(client.chat(chat_payload(probe)))
    prefix = "streamed: " if streamed else ""
    record["streamed_response" if streamed else "response"] = {"reasoning": message_reasoning(message),
                                                               "content": message.get("content")}
    problem = _reasoning_problem(message, probe.expect_reasoning_contains) or answer_problem(message)
    if problem is not None:
        return prefix + problem
    content = message.get("content") or ""
    if probe.expect_number is not None and not states_number(content, probe.expect_number):
        return f"{prefix}the answer {content[:160]!r} does not state {probe.expect_number:g}"
    if probe.expect_content_contains is not None and probe.expect_content_contains not in content:
        return f"{prefix}the answer {content[:160]!r} lacks {probe.expect_content_contains!r}"
    return None


def _run_carry(client: GuardClient, probe: ReasoningCarryProbe, record: dict[str, Any]) -> str | None:
    message = first_message(client.chat(chat_payload(probe)))
    reasoning = message_reasoning(message)
    record["response"] = {"reasoning": reasoning, "content": message.get("content"),
                          "tool_calls": message.get("tool_calls")}
    problem = _reasoning_problem(message, probe.expect_reasoning_contains)
    if problem is None:
        problem = call_problem(message, probe.expect_call, probe.tools)
    if problem is not None:
        return f"first turn: {problem}"
    echo = assistant_echo(message, reasoning=reasoning, carry_field=probe.carry_field)
    follow_up = [*probe.messages, echo, tool_result_message(echo, probe.round_trip.tool_result)]
    payload = {**chat_payload(probe, follow_up, probe.round_trip.max_tokens),
               "return_prompt_text": True, "return_token_ids": True}
    body = client.chat(payload)
    rendered = client.rendered_prompt(payload, body)
    assert reasoning is not None
    record["reasoning_in_next_prompt"] = reasoning in rendered
    if reasoning not in rendered:
        return (f"the reasoning sent back as {probe.carry_field!r} is missing from the next prompt the server "
                f"rendered ({len(rendered)} chars); DeepSeek V4 requires it preserved across tool turns")
    final = first_message(body)
    content = final.get("content") or ""
    record["round_trip_response"] = {"reasoning": message_reasoning(final), "content": content}
    problem = answer_problem(final, what="answer to the tool result") or facts_problem(content, probe.round_trip)
    return f"round trip: {problem}" if problem is not None else None
