"""Long-context gate: a needle hidden at several depths must be retrieved at the allocated context.

The haystack is the spec's filler sentences, cycled; the needle sentence goes in at ``depth``
(0 = start, 1 = end) and the question follows. The number of sentences is the largest whose
rendered prompt fits the budget: ``context_tokens``, or ``context_fraction`` of the server's
``max_model_len`` (read from ``/v1/models``, i.e. what the trial really allocated). Counting uses
the server's own ``/tokenize`` of the chat request, so the prompt is what the server will see.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from tuner.guards.api import GuardKind, GuardResult, GuardTarget, ProbeFailure, ProbeLog, SpecGuard
from tuner.guards.http import GuardClient, first_message
from tuner.guards.specs import StrictModel

__all__ = ["KIND", "Needle", "NeedleGuard", "NeedleSpec", "fit_sentences", "needle_messages"]

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]


class Needle(StrictModel):
    depth: float = Field(ge=0.0, le=1.0)
    code: str = Field(min_length=1)


class NeedleSpec(StrictModel):
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


def needle_messages(spec: NeedleSpec, needle: Needle, n_sentences: int) -> Messages:
    """The one-user-turn conversation with ``n_sentences`` of filler and the needle at its depth."""
    sentences = [spec.filler[i % len(spec.filler)] for i in range(n_sentences)]
    sentences.insert(round(needle.depth * n_sentences), spec.needle_template.format(code=needle.code))
    return [{"role": "user", "content": " ".join(sentences) + "\n\n" + spec.question}]


def fit_sentences(spec: NeedleSpec, needle: Needle, budget_tokens: int,
                  count_tokens: Callable[[Messages], int]) -> tuple[int, int]:
    """The most filler sentences whose prompt stays within ``budget_tokens``; and that prompt's length."""
    lo, lo_tokens = 0, count_tokens(needle_messages(spec, needle, 0))
    if lo_tokens > budget_tokens:
        return 0, lo_tokens
    hi = 1
    while True:
        tokens = count_tokens(needle_messages(spec, needle, hi))
        if tokens > budget_tokens:
            break
        lo, lo_tokens, hi = hi, tokens, hi * 2
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        tokens = count_tokens(needle_messages(spec, needle, mid))
        if tokens <= budget_tokens:
            lo, lo_tokens = mid, tokens
        else:
            hi = mid
    return lo, lo_tokens


class NeedleGuard(SpecGuard[NeedleSpec]):
    kind = "needle"

    def run(self, target: GuardTarget) -> GuardResult:
        probes = ProbeLog()
        with GuardClient(target, self.spec.timeout_s) as client:
            try:
                budget = self._budget_tokens(client)
            except ProbeFailure as exc:
                return GuardResult(self.name, self.kind, False, str(exc), {"probes": []})
            for needle in self.spec.needles:
                probes.check(f"depth {needle.depth:g}", {"depth": needle.depth, "code": needle.code},
                             functools.partial(self._probe, client, needle, budget))
        return probes.result(self, f"{len(self.spec.needles)} needle(s) retrieved at {budget} prompt tokens",
                             context_tokens=budget)

    def _budget_tokens(self, client: GuardClient) -> int:
        if self.spec.context_tokens is not None:
            return self.spec.context_tokens
        assert self.spec.context_fraction is not None
        max_model_len = _served_max_model_len(client)
        return max(64, int(self.spec.context_fraction * max_model_len) - self.spec.max_tokens)

    def _probe(self, client: GuardClient, needle: Needle, budget: int, record: dict[str, Any]) -> str | None:
        def count(messages: Messages) -> int:
            return len(client.tokenize_chat({"messages": messages, "add_generation_prompt": True,
                                             "chat_template_kwargs": {"thinking": False}}))

        n_sentences, prompt_tokens = fit_sentences(self.spec, needle, budget, count)
        record["prompt_tokens"] = prompt_tokens
        body = client.chat({"messages": needle_messages(self.spec, needle, n_sentences), "temperature": 0.0,
                            "max_tokens": self.spec.max_tokens, "chat_template_kwargs": {"thinking": False}})
        content = first_message(body).get("content") or ""
        record["answer"] = content[:200]
        if needle.code not in content:
            return f"answer {content[:120]!r} lacks the code {needle.code!r} ({prompt_tokens} prompt tokens)"
        return None


KIND = GuardKind("needle", NeedleSpec, NeedleGuard)


def _served_max_model_len(client: GuardClient) -> int:
    for entry in client.get("/v1/models").get("data") or []:
        if isinstance(entry, dict) and entry.get("id") == client.target.model and entry.get("max_model_len"):
            return int(entry["max_model_len"])
    raise ProbeFailure(f"/v1/models names no max_model_len for {client.target.model!r}")
