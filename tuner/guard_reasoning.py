"""Reasoning gate: thinking output split from the answer, and carried across a tool round trip.

Split probes (thinking on) must come back with the reasoning in ``reasoning``/``reasoning_content``
and the answer in ``content``, with no ``<think>`` markup in either; with ``stream`` (the default) the
same holds for the text assembled from the streamed deltas.

Carry probes follow DeepSeek V4's contract: in a thinking-mode tool-call round trip the client sends
the turn's reasoning back (``reasoning_content``), and the server must render it into the next
prompt. The gate reads the prompt the server actually rendered (``return_prompt_text``, or the
prompt token ids detokenized) and requires the reasoning in it, then requires the final answer.
"""

from __future__ import annotations

import logging
from typing import Any

from tuner.guard_api import GuardResult, GuardTarget
from tuner.guard_chat import assistant_echo, call_problem, chat_payload, raw_markup_in, tool_result_message
from tuner.guard_http import GuardClient, ProbeFailure, first_message, message_reasoning
from tuner.guard_specs import ReasoningCarryProbe, ReasoningSpec, ReasoningSplitProbe

__all__ = ["ReasoningGuard"]

log = logging.getLogger(__name__)

_THINK_MARKUP = ("<think>", "</think>")


class ReasoningGuard:
    kind = "reasoning"

    def __init__(self, name: str, spec: ReasoningSpec) -> None:
        self.name = name
        self.spec = spec

    def run(self, target: GuardTarget) -> GuardResult:
        evidence: dict[str, Any] = {"probes": []}
        failures: list[str] = []
        probes: list[ReasoningSplitProbe | ReasoningCarryProbe] = [*self.spec.split_probes,
                                                                   *self.spec.carry_probes]
        with GuardClient(target, self.spec.timeout_s) as client:
            for probe in probes:
                record: dict[str, Any] = {"probe": probe.name}
                evidence["probes"].append(record)
                try:
                    if isinstance(probe, ReasoningCarryProbe):
                        problem = _run_carry(client, probe, record)
                    else:
                        problem = _run_split(client, probe, record)
                        if problem is None and self.spec.stream:
                            problem = _run_split(client, probe, record, streamed=True)
                except ProbeFailure as exc:
                    problem = str(exc)
                record["passed"] = problem is None
                if problem is not None:
                    record["problem"] = problem
                    failures.append(f"{probe.name}: {problem}")
        detail = "; ".join(failures) if failures else f"{len(probes)} probe(s) split and carried"
        return GuardResult(self.name, self.kind, not failures, detail, evidence)


def _split_problem(message: dict[str, Any], expect_reasoning: str) -> str | None:
    reasoning = message_reasoning(message)
    content = message.get("content") or ""
    if not reasoning:
        markup = raw_markup_in(content)
        left = f" and raw {markup!r} left in content" if markup else ""
        return f"no reasoning field in the response{left} (content: {content[:160]!r})"
    if expect_reasoning not in reasoning:
        return f"reasoning {reasoning[:160]!r} lacks {expect_reasoning!r}"
    for text, where in ((reasoning, "reasoning"), (content, "content")):
        leaked = next((m for m in _THINK_MARKUP if m in text), None)
        if leaked:
            return f"{leaked!r} left in {where}: {text[:160]!r}"
    return None


def _run_split(client: GuardClient, probe: ReasoningSplitProbe, record: dict[str, Any], *,
               streamed: bool = False) -> str | None:
    message = client.chat_stream(chat_payload(probe)) if streamed else first_message(client.chat(chat_payload(probe)))
    prefix = "streamed: " if streamed else ""
    record["streamed_response" if streamed else "response"] = {"reasoning": message_reasoning(message),
                                                               "content": message.get("content")}
    problem = _split_problem(message, probe.expect_reasoning_contains)
    if problem is not None:
        return prefix + problem
    content = message.get("content") or ""
    if probe.expect_content_contains not in content:
        return f"{prefix}content {content[:160]!r} lacks {probe.expect_content_contains!r}"
    return None


def _run_carry(client: GuardClient, probe: ReasoningCarryProbe, record: dict[str, Any]) -> str | None:
    message = first_message(client.chat(chat_payload(probe)))
    reasoning = message_reasoning(message)
    record["response"] = {"reasoning": reasoning, "content": message.get("content"),
                          "tool_calls": message.get("tool_calls")}
    problem = _split_problem(message, probe.expect_reasoning_contains)
    if problem is None:
        problem = call_problem(message, probe.expect_call, probe.tools)
    if problem is not None:
        return f"first turn: {problem}"
    echo = assistant_echo(message, reasoning=reasoning, carry_field=probe.carry_field)
    follow_up = [*probe.messages, echo, tool_result_message(echo, probe.round_trip.tool_result)]
    payload = {**chat_payload(probe, follow_up, probe.round_trip.max_tokens),
               "return_prompt_text": True, "return_token_ids": True}
    body = client.chat(payload)
    rendered = body.get("prompt_text")
    if not isinstance(rendered, str) or not rendered:
        ids = body.get("prompt_token_ids") or []
        rendered = client.detokenize([int(t) for t in ids]) if ids else ""
    assert reasoning is not None
    record["reasoning_in_next_prompt"] = reasoning in rendered
    if reasoning not in rendered:
        return (f"the reasoning sent back as {probe.carry_field!r} is missing from the next prompt the server "
                f"rendered ({len(rendered)} chars); DeepSeek V4 requires it preserved across tool turns")
    final = first_message(body)
    content = final.get("content") or ""
    record["round_trip_response"] = {"reasoning": message_reasoning(final), "content": content}
    if probe.round_trip.expect_content_contains not in content:
        return f"round trip answer {content[:160]!r} lacks {probe.round_trip.expect_content_contains!r}"
    return None
