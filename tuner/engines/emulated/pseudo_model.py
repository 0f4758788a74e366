"""A deterministic pseudo language model: next-token logprobs from a hash of the context.

Two launches with the same numerics give identical logprobs and greedy tokens, as two correct vLLM
launches of one checkpoint do. A launch whose numerics differ (FP8 KV cache, another MoE kernel
precision, another parallel layout, or a trap of the truth table) adds a small deterministic
perturbation to every logprob: ``δ = Σ_components scale_c · N(0, 1)``, each normal drawn from a hash
of (component value, context, token), so the same launch always drifts the same way. The reference
values (bf16 KV, bf16 MoE math, TP 1) add nothing. ``scale`` is chosen so the mean |Δ| between two
launches is about 0.8 · scale (the mean of |N(0, 1)|).

Long outputs nobody scores (the load generator's 1,024-token answers) use :func:`filler_ids`, a
cheap cyclic walk over a fixed English text, instead of the per-token model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from tuner.engines.emulated.hashing import stable_hash
from tuner.engines.emulated.tokenizer import TOKENIZER, VOCAB_SIZE

__all__ = ["TOP_K", "Numerics", "PseudoModel", "filler_ids"]

TOP_K = 20
"""Candidates with a real probability mass at each position; every other token shares the rest."""
_CONTEXT = 3
"""The pseudo-model looks at the last three tokens."""
_REST_MASS = 0.04

_FILLER_TEXT = (
    "the river bends twice before it reaches the old mill, and the road follows it through the valley. "
    "in spring the water runs high and the fields along the bank turn green early. the village keeps its "
    "records in a small stone building near the bridge, where the clerk writes down every boat that passes. "
    "most days are quiet, but on market days the square fills with carts, and the bakers sell bread until "
    "noon. in the evening the lamps are lit one by one, and the sound of the river carries across the roofs. "
)
_FILLER = tuple(TOKENIZER.encode(_FILLER_TEXT * 4))
_VOCAB_IDS = tuple(sorted(set(_FILLER)))


def filler_ids(seed: int, count: int) -> list[int]:
    """``count`` tokens of plain English text, starting at a place chosen by ``seed``."""
    n = len(_FILLER)
    start = seed % n
    return [_FILLER[(start + i) % n] for i in range(count)]


@dataclass(frozen=True)
class Numerics:
    """How a launch computes, as far as its logits are concerned, and how far each part moves them."""

    components: tuple[tuple[str, str, float], ...] = ()
    """(component, value, scale in nats): e.g. ("kv", "fp8", 0.015)."""

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple((c, v) for c, v, _ in self.components)


def _gauss(*key: object) -> float:
    return random.Random(stable_hash(*key)).gauss(0.0, 1.0)


class PseudoModel:
    """Logprobs and greedy tokens of one launch (see the module docstring)."""

    def __init__(self, numerics: Numerics = Numerics()) -> None:
        self.numerics = numerics
        self._active = tuple((c, v, s) for c, v, s in numerics.components if s > 0)

    @staticmethod
    @lru_cache(maxsize=8192)
    def _base(context: tuple[int, ...]) -> tuple[tuple[int, float], ...]:
        rng = random.Random(stable_hash("pseudo-lm", context))
        ids = rng.sample(_VOCAB_IDS, TOP_K)
        top = 0.35 + 0.6 * rng.random()
        weights = [top] + [(1.0 - top - _REST_MASS) * w for w in _decay(rng, TOP_K - 1)]
        return tuple((i, math.log(w)) for i, w in zip(ids, weights, strict=True))

    def _delta(self, context: tuple[int, ...], token: int) -> float:
        return sum(scale * _gauss(component, value, context, token) for component, value, scale in self._active)

    def top(self, context: Sequence[int]) -> list[tuple[int, float]]:
        """The candidates after ``context``, best first, with this launch's logprobs."""
        ctx = tuple(context[-_CONTEXT:])
        out = [(i, lp + self._delta(ctx, i)) for i, lp in self._base(ctx)]
        out.sort(key=lambda kv: -kv[1])
        return out

    def logprob(self, context: Sequence[int], token: int) -> float:
        ctx = tuple(context[-_CONTEXT:])
        for i, lp in self._base(ctx):
            if i == token:
                return lp + self._delta(ctx, token)
        rest = math.log(_REST_MASS / (VOCAB_SIZE - TOP_K)) - 0.5 * abs(_gauss("rest", ctx, token))
        return rest + self._delta(ctx, token)

    def rank(self, context: Sequence[int], token: int) -> int:
        lp = self.logprob(context, token)
        return 1 + sum(1 for _, other in self.top(context) if other > lp)

    def greedy(self, context: Sequence[int], count: int) -> list[int]:
        seq = list(context)
        out = []
        for _ in range(count):
            token = self.top(seq)[0][0]
            out.append(token)
            seq.append(token)
        return out


def _decay(rng: random.Random, n: int) -> list[float]:
    raw = [math.exp(-0.45 * i) * (0.6 + 0.8 * rng.random()) for i in range(n)]
    total = sum(raw)
    return [r / total for r in raw]
