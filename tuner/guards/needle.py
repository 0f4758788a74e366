"""Long-context gate: a needle hidden at several depths must be retrieved at the allocated context.

The haystack is the spec's filler sentences, cycled; the needle sentence goes in at ``depth``
(0 = start, 1 = end) and the question follows. The number of sentences is the largest whose
rendered prompt fits the budget: ``context_tokens``, or ``context_fraction`` of the context the
trial really allocated, less the answer's ``max_tokens``. The allocated context is the server's
``max_model_len`` (read from ``/v1/models``), capped by the KV capacity the server logged at start-up
(``GuardTarget.kv_cache_tokens``) when that is smaller. Counting uses the server's own ``/tokenize``
of the chat request, so the prompt is what the server will see; the count is extrapolated from a
short prompt and then searched in a narrow bracket, so a 100k-token prompt takes about a dozen
``/tokenize`` calls.

The answer must state the code: a code of digits as a number, whatever its formatting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from tuner.guards.api import GuardKind, GuardResult, GuardTarget, ProbeFailure, ProbeLog, SpecGuard
from tuner.guards.chat import THINKING_OFF, mentions
from tuner.guards.http import GuardClient, first_message
from tuner.guards.specs import StrictModel

__all__ = ["KIND", "Needle", "NeedleGuard", "NeedleSpec", "allocated_context", "budget_tokens", "fit_sentences",
           "needle_messages"]

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
    """Or: prompt length as a fraction of the context the trial allocated (max-model-len, capped by the
    KV capacity the server logged), less ``max_tokens``."""
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
                  count_tokens: Callable[[Messages], int], *, hint: int | None = None) -> tuple[int, int]:
    """The most filler sentences whose prompt stays within ``budget_tokens``; and that prompt's length.

    Prompts grow monotonically with the sentence count. The count is guessed (``hint``, or extrapolated
    from the bare question and a 64-sentence prompt), bracketed by galloping from the guess, then
    bisected, so the number of ``count_tokens`` calls grows with the log of the guess's error only.
    """
    counted: dict[int, int] = {}

    def tokens(n: int) -> int:
        if n not in counted:
            counted[n] = count_tokens(needle_messages(spec, needle, n))
        return counted[n]

    if tokens(0) > budget_tokens:
        return 0, tokens(0)
    if hint is None:
        sample = 64
        per_sentence = max(1e-9, (tokens(sample) - tokens(0)) / sample)
        hint = int((budget_tokens - tokens(0)) / per_sentence)
    guess = max(0, hint)
    step = 4
    if tokens(guess) <= budget_tokens:
        lo, hi = guess, guess + step
        while tokens(hi) <= budget_tokens:
            lo, step = hi, step * 2
            hi = lo + step
    else:
        lo, hi = max(0, guess - step), guess
        while tokens(lo) > budget_tokens:
            hi, step = lo, step * 2
            lo = max(0, hi - step)
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if tokens(mid) <= budget_tokens:
            lo = mid
        else:
            hi = mid
    return lo, tokens(lo)


def allocated_context(max_model_len: int, kv_cache_tokens: int | None) -> int:
    """The longest context the trial can serve one request: max-model-len, or the KV capacity if smaller."""
    return min(max_model_len, kv_cache_tokens) if kv_cache_tokens else max_model_len


def budget_tokens(spec: NeedleSpec, allocated: int | None) -> int:
    """The prompt budget: ``context_tokens``, or ``context_fraction`` × ``allocated`` less the answer's tokens."""
    if spec.context_tokens is not None:
        return spec.context_tokens
    assert spec.context_fraction is not None and allocated is not None
    return max(64, int(spec.context_fraction * allocated) - spec.max_tokens)


class NeedleGuard(SpecGuard[NeedleSpec]):
    kind = "needle"

    def run(self, target: GuardTarget) -> GuardResult:
        probes = ProbeLog()
        sizing: dict[str, Any] = {"kv_cache_tokens": target.kv_cache_tokens}
        with GuardClient(target, self.spec.timeout_s) as client:
            try:
                if self.spec.context_tokens is None:
                    sizing["max_model_len"] = client.served_context()
                    sizing["allocated_tokens"] = allocated_context(sizing["max_model_len"], target.kv_cache_tokens)
                budget = budget_tokens(self.spec, sizing.get("allocated_tokens"))
            except ProbeFailure as exc:
                return GuardResult(self.name, self.kind, False, str(exc), {"probes": [], **sizing})
            hint: list[int] = []
            for needle in self.spec.needles:
                probes.check(f"depth {needle.depth:g}", {"depth": needle.depth, "code": needle.code},
                             functools.partial(self._probe, client, needle, budget, hint))
        longest = max((int(r.get("prompt_tokens", 0)) for r in probes.records), default=0)
        return probes.result(self, f"{len(self.spec.needles)} needle(s) retrieved from prompts of up to {longest} "
                             f"tokens (budget {budget})", context_tokens=budget, longest_prompt_tokens=longest,
                             **sizing)

    def _probe(self, client: GuardClient, needle: Needle, budget: int, hint: list[int],
               record: dict[str, Any]) -> str | None:
        def count(messages: Messages) -> int:
            return len(client.tokenize_chat({"messages": messages, "add_generation_prompt": True,
                                             "chat_template_kwargs": THINKING_OFF}))

        n_sentences, prompt_tokens = fit_sentences(self.spec, needle, budget, count, hint=hint[-1] if hint else None)
        hint.append(n_sentences)
        record["prompt_tokens"] = prompt_tokens
        body = client.chat({"messages": needle_messages(self.spec, needle, n_sentences), "temperature": 0.0,
                            "max_tokens": self.spec.max_tokens, "chat_template_kwargs": THINKING_OFF})
        content = first_message(body).get("content") or ""
        record["answer"] = content[:200]
        if not mentions(content, needle.code):
            return f"answer {content[:120]!r} lacks the code {needle.code!r} ({prompt_tokens} prompt tokens)"
        return None


KIND = GuardKind("needle", NeedleSpec, NeedleGuard)
