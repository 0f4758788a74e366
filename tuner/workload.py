"""What load a trial is measured under, and the exact prompts it sends.

A :class:`Workload` is read from YAML (inside an objective, or its own file), so it is a pydantic
model that rejects unknown keys. :func:`make_prompts` turns it into token-id prompts: sending ids
rather than text makes every input length exact, whatever the tokenizer does, the way
``vllm bench serve --dataset-name random`` does.

Lengths follow ``vllm bench serve --random-range-ratio r``: each length is drawn uniformly from the
integers in ``[floor(len * (1 - r)), ceil(len * (1 + r))]`` (at least 1). Everything is drawn from a
``random.Random(seed)``, so the same workload and vocabulary give the same prompts on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from tuner.errors import LoadError

__all__ = ["PromptSpec", "Workload", "make_prompts", "make_warmup_prompts"]

# Ids below this are avoided: tokenizers put their special tokens first.
_LOWEST_ORDINARY_ID = 100
# Warm-up prompts come from their own stream, so they never share a prefix with measured ones
# (a warm prefix cache would flatter the measured TTFT).
_WARMUP_SEED_OFFSET = 1_000_003


class Workload(BaseModel, extra="forbid", frozen=True):
    """Prompt/output lengths and how hard to push: the load of one measured window."""

    kind: Literal["random"] = "random"
    input_len: int = Field(default=128, gt=0, description="prompt length, tokens (mean)")
    output_len: int = Field(default=64, gt=0, description="max_tokens per request (mean)")
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0,
                               description="lengths uniform in [len*(1-r), len*(1+r)]")
    num_prompts: int = Field(default=32, gt=0, description="requests in the measured window")
    concurrency: int = Field(default=8, gt=0, description="most requests in flight at once")
    request_rate: float | None = Field(default=None, gt=0.0,
                                       description="Poisson arrivals per second; None = no pacing")
    warmup_prompts: int = Field(default=2, ge=0, description="sent first, not measured")
    seed: int = 0
    ignore_eos: bool = True


@dataclass(frozen=True)
class PromptSpec:
    """One request: the exact prompt token ids and the output length asked for."""

    token_ids: tuple[int, ...]
    output_len: int


def _length_bounds(mean: int, ratio: float) -> tuple[int, int]:
    low = max(1, math.floor(mean * (1.0 - ratio)))
    high = max(low, math.ceil(mean * (1.0 + ratio)))
    return low, high


def _draw(workload: Workload, vocab_size: int, count: int, seed: int) -> list[PromptSpec]:
    if vocab_size < 2:
        raise LoadError(f"vocab_size must be at least 2 to draw prompt ids, got {vocab_size}; "
                        "pass the served model's tokenizer vocabulary size")
    lowest_id = min(_LOWEST_ORDINARY_ID, vocab_size // 2)
    rng = random.Random(seed)
    in_low, in_high = _length_bounds(workload.input_len, workload.range_ratio)
    out_low, out_high = _length_bounds(workload.output_len, workload.range_ratio)
    prompts: list[PromptSpec] = []
    for _ in range(count):
        input_len = rng.randint(in_low, in_high)
        output_len = rng.randint(out_low, out_high)
        ids = tuple(rng.randrange(lowest_id, vocab_size) for _ in range(input_len))
        prompts.append(PromptSpec(token_ids=ids, output_len=output_len))
    return prompts


def make_prompts(workload: Workload, vocab_size: int) -> list[PromptSpec]:
    """The ``num_prompts`` measured prompts, deterministic from ``workload.seed``.

    Ids are drawn from ``[min(100, vocab_size // 2), vocab_size)`` so special tokens are avoided.
    """
    return _draw(workload, vocab_size, workload.num_prompts, workload.seed)


def make_warmup_prompts(workload: Workload, vocab_size: int) -> list[PromptSpec]:
    """The ``warmup_prompts`` prompts sent before the measured window (same lengths, other ids)."""
    return _draw(workload, vocab_size, workload.warmup_prompts, workload.seed + _WARMUP_SEED_OFFSET)
