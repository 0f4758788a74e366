"""The exact requests a :class:`~tuner.objective.Workload` sends.

The workload's YAML shape (kinds, lengths, arrivals) lives in :mod:`tuner.objective`; this module
draws its prompts and arrival gaps.

Lengths follow ``vllm bench serve --random-range-ratio r`` with ``length_distribution: uniform``:
each length is drawn uniformly from the integers in ``[floor(len * (1 - r)), ceil(len * (1 + r))]``
(at least 1). With ``normal`` the length is drawn from N(len, (r * len)²), rounded and clipped to
``[1, 2 * len]``. ``r = 0`` gives fixed lengths. Everything is drawn from ``random.Random(seed)``, so
the same workload and vocabulary give the same prompts on every machine.

Arrivals: ``concurrency`` caps the requests in flight (``vllm bench serve --max-concurrency``).
``request_rate`` (per second) paces the sends with gamma-distributed gaps of shape ``burstiness``
(1 = Poisson, < 1 burstier, as ``vllm bench serve --burstiness``); ``burst_size > 1`` sends that many
requests at each arrival instead (a burst), at ``request_rate / burst_size`` arrivals per second.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tuner.errors import LoadError
from tuner.objective import AgentSpec, Workload

__all__ = ["AgentSpec", "PromptSpec", "Workload", "arrival_gaps_s", "make_prompts", "make_warmup_prompts",
           "prompt_at"]

# Ids below this are avoided: tokenizers put their special tokens first.
_LOWEST_ORDINARY_ID = 100
# Warm-up prompts come from their own stream, so they never share a prefix with measured ones
# (a warm prefix cache would flatter the measured TTFT).
_WARMUP_SEED_OFFSET = 1_000_003
_PREFIX_SEED_OFFSET = 2_000_003


@dataclass(frozen=True)
class PromptSpec:
    """One request: the exact prompt token ids and the output length asked for."""

    token_ids: tuple[int, ...]
    output_len: int


def _length_bounds(mean: int, ratio: float) -> tuple[int, int]:
    low = max(1, math.floor(mean * (1.0 - ratio)))
    high = max(low, math.ceil(mean * (1.0 + ratio)))
    return low, high


def _draw_len(rng: random.Random, workload: Workload, mean: int) -> int:
    if workload.length_distribution == "normal" and workload.range_ratio > 0:
        value = round(rng.gauss(mean, workload.range_ratio * mean))
        return min(max(1, value), 2 * mean)
    low, high = _length_bounds(mean, workload.range_ratio)
    return rng.randint(low, high)


def _check_vocab(vocab_size: int) -> int:
    if vocab_size < 2:
        raise LoadError(f"vocab_size must be at least 2 to draw prompt ids, got {vocab_size}; "
                        "pass the served model's tokenizer vocabulary size")
    return min(_LOWEST_ORDINARY_ID, vocab_size // 2)


def _prefixes(workload: Workload, vocab_size: int) -> list[tuple[int, ...]]:
    if workload.kind != "shared_prefix":
        return [()]
    lowest_id = _check_vocab(vocab_size)
    rng = random.Random(workload.seed + _PREFIX_SEED_OFFSET)
    return [tuple(rng.randrange(lowest_id, vocab_size) for _ in range(workload.prefix_len))
            for _ in range(workload.num_prefixes)]


def prompt_at(workload: Workload, vocab_size: int, index: int, *, warmup: bool = False,
              prefixes: list[tuple[int, ...]] | None = None) -> PromptSpec:
    """Prompt number ``index`` of the measured (or warm-up) stream, drawn from its own seeded RNG.

    Each prompt depends only on ``(seed, index)``, so any process can build any prompt without the
    ones before it, and a longer run extends a shorter one.
    """
    lowest_id = _check_vocab(vocab_size)
    rng = random.Random(f"{workload.seed + (_WARMUP_SEED_OFFSET if warmup else 0)}:{index}")
    input_len = _draw_len(rng, workload, workload.input_len)
    output_len = _draw_len(rng, workload, workload.output_len)
    span = vocab_size - lowest_id
    draw = rng.random
    ids = tuple(lowest_id + int(draw() * span) for _ in range(input_len))
    if warmup or workload.kind != "shared_prefix":
        return PromptSpec(token_ids=ids, output_len=output_len)
    shared = prefixes if prefixes is not None else _prefixes(workload, vocab_size)
    return PromptSpec(token_ids=shared[index % len(shared)] + ids, output_len=output_len)


def make_prompts(workload: Workload, vocab_size: int, count: int | None = None,
                 start: int = 0) -> list[PromptSpec]:
    """Measured prompts ``start .. start + count`` (``count`` defaults to ``num_prompts``).

    Deterministic from ``workload.seed``; ids are drawn from ``[min(100, vocab_size // 2), vocab_size)``
    so special tokens are avoided.
    """
    n = workload.num_prompts if count is None else count
    _check_vocab(vocab_size)
    prefixes = _prefixes(workload, vocab_size)
    return [prompt_at(workload, vocab_size, i, prefixes=prefixes) for i in range(start, start + n)]


def make_warmup_prompts(workload: Workload, vocab_size: int) -> list[PromptSpec]:
    """The ``warmup_prompts`` prompts sent before the measured window (same lengths, other ids).

    Under ``shared_prefix`` they carry no shared prefix, so the measured window starts cold.
    """
    _check_vocab(vocab_size)
    return [prompt_at(workload, vocab_size, i, warmup=True) for i in range(workload.warmup_prompts)]


def arrival_gaps_s(workload: Workload, count: int, rng: random.Random, rate_scale: float = 1.0) -> list[float]:
    """Seconds to wait before each of ``count`` sends (the first is 0); all 0 when unpaced.

    ``rate_scale`` divides the rate (a client process that sends a share of the load).
    """
    if workload.request_rate is None:
        return [0.0] * count
    rate = workload.request_rate * rate_scale
    arrival_rate = rate / workload.burst_size
    shape = workload.burstiness
    gaps: list[float] = []
    for i in range(count):
        if i == 0 or i % workload.burst_size:
            gaps.append(0.0)
        else:
            # Gamma with mean 1/arrival_rate: shape k, scale 1/(k * rate); k = 1 is exponential.
            gaps.append(rng.expovariate(arrival_rate) if shape == 1.0
                        else rng.gammavariate(shape, 1.0 / (shape * arrival_rate)))
    return gaps
