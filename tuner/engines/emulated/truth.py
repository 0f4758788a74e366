"""The emulated node's truth: how it really performs, which launches fail, which give wrong answers.

The tuner never reads this; it is what the node *is*. It holds:

- ``coefficients``: the performance model's numbers (:data:`~.coefficients.NOMINAL` by default, or a
  :func:`~.coefficients.perturbed` node so that a search benchmark's truth differs from its prior);
- ``failures``: launches that fail the way vLLM does — a hang in CUDA-graph capture, an
  out-of-memory under load, a crash at start-up — each with the condition that triggers it
  (start-up out-of-memory needs no rule: it follows from the memory model);
- ``traps``: launches with a numerics bug: their logprobs drift far and their answers come out
  garbled, so a correctness gate must refuse them;
- ``drift``: how far correct launches with other numerics (FP8 KV cache, another MoE precision,
  another tensor-parallel layout) move the logprobs.

Conditions (``when``) name vLLM options as the tuner spells them (``moe-backend``,
``compilation-config.cudagraph_mode``, ``data-parallel-size`` …) and give a list of values or a
comparison (``{">=": 0.97}``). A truth is JSON (``DSV4_EMULATOR_TRUTH_FILE``) or a seed
(``DSV4_EMULATOR_TRUTH_SEED``: the nominal tables with perturbed coefficients).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.engines.emulated.pseudo_model import Numerics
from tuner.perfmodel.coefficients import NOMINAL, Coefficients, moe_backend, perturbed
from tuner.perfmodel.serve_config import EmulatedConfig

__all__ = ["FAILURE_KINDS", "Drift", "FailureRule", "TrapRule", "Truth", "nominal_truth", "truth_from_seed"]

FAILURE_KINDS = ("hang", "oom_under_load", "crash_at_start", "oom_at_start")

_FIELDS = {
    "tensor-parallel-size": "tp", "data-parallel-size": "dp", "enable-expert-parallel": "ep", "enable-eplb": "eplb",
    "max-num-seqs": "max_num_seqs", "max-num-batched-tokens": "max_num_batched_tokens",
    "gpu-memory-utilization": "gpu_memory_utilization", "kv-cache-dtype": "kv_cache_dtype",
    "block-size": "block_size", "max-model-len": "max_model_len", "enable-prefix-caching": "enable_prefix_caching",
    "compilation-config.cudagraph_mode": "cudagraph_mode", "moe-backend": "moe_backend",
    "all2all-backend": "all2all_backend", "speculative-config.method": "spec_method",
    "speculative-config.num_speculative_tokens": "spec_tokens",
}
_COMPARE = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b,
            "<": lambda a, b: a < b, "!=": lambda a, b: a != b}


def _matches(config: EmulatedConfig, when: Mapping[str, Any]) -> bool:
    for option, condition in when.items():
        value = getattr(config, _FIELDS[option])
        if isinstance(condition, Mapping):
            for op, bound in condition.items():
                if not _COMPARE[op](float(value), float(bound)):
                    return False
        elif str(value).lower() not in {str(c).lower() for c in condition}:
            return False
    return True


def _check_when(when: Mapping[str, Any], where: str) -> None:
    for option, condition in when.items():
        if option not in _FIELDS:
            raise ValueError(f"{where}: unknown option {option!r}; use one of {sorted(_FIELDS)}")
        if isinstance(condition, Mapping):
            bad = sorted(set(condition) - set(_COMPARE))
            if bad:
                raise ValueError(f"{where}.{option}: unknown comparison {bad}; use {sorted(_COMPARE)}")
        elif not isinstance(condition, Sequence) or isinstance(condition, str):
            raise ValueError(f"{where}.{option}: give a list of values or a comparison like {{'>=': 0.97}}")


@dataclass(frozen=True)
class FailureRule:
    kind: str
    when: Mapping[str, Any]
    note: str = ""
    min_batched_tokens: int = 0
    """``oom_under_load``: the engine dies at the first step that runs at least this many tokens."""

    def matches(self, config: EmulatedConfig) -> bool:
        return _matches(config, self.when)


@dataclass(frozen=True)
class TrapRule:
    name: str
    when: Mapping[str, Any]
    drift_nats: float
    """Scale of the logprob perturbation (mean |Δ| ≈ 0.8 × this)."""
    garble: bool = True
    """Chat answers come out wrong (words and numbers replaced, tool calls lost)."""
    note: str = ""

    def matches(self, config: EmulatedConfig) -> bool:
        return _matches(config, self.when)


@dataclass(frozen=True)
class Drift:
    """Logprob perturbation scales (nats) of correct launches whose numerics differ from the reference."""

    kv_fp8: float = 0.015
    """FP8 KV cache against a bf16 one (the notes measured 5e-4 on a memorised fixture, 0.1 on untrained
    text; a real checkpoint sits between: an assumption)."""
    moe_fp8: float = 0.012
    """W4A8 (FP8 activations) MoE against W4A16 (bf16): the blog calls DeepSeek's FP8 path the
    trained arithmetic, so small."""
    moe_fp4: float = 0.012
    layout: float = 0.0025
    """Another tensor-parallel size: another reduction order."""


@dataclass(frozen=True)
class Truth:
    coefficients: Coefficients = NOMINAL
    failures: tuple[FailureRule, ...] = ()
    traps: tuple[TrapRule, ...] = ()
    drift: Drift = field(default_factory=Drift)
    seed: int | None = None

    def failure(self, config: EmulatedConfig, kind: str) -> FailureRule | None:
        return next((r for r in self.failures if r.kind == kind and r.matches(config)), None)

    def trap(self, config: EmulatedConfig) -> TrapRule | None:
        return next((t for t in self.traps if t.matches(config)), None)

    def numerics(self, config: EmulatedConfig, generation: str) -> Numerics:
        """The logprob perturbations of this launch (see :mod:`~.pseudo_model`)."""
        d = self.drift
        kv = config.kv_cache_dtype.lower()
        parts: list[tuple[str, str, float]] = []
        if kv.startswith("fp8"):
            parts.append(("kv", kv, d.kv_fp8))
        math_dtype = moe_backend(config.moe_backend, generation).math
        if math_dtype != "bf16":
            parts.append(("moe", math_dtype, d.moe_fp8 if math_dtype == "fp8" else d.moe_fp4))
        if config.tp > 1:
            parts.append(("layout", f"tp{config.tp}", d.layout))
        trap = self.trap(config)
        if trap is not None:
            parts.append(("trap", trap.name, trap.drift_nats))
        return Numerics(tuple(parts))

    def with_faults(self, faults: Sequence[str]) -> Truth:
        """The same truth with each named failure forced on every launch (``DSV4_EMULATOR_FAULT``)."""
        rules = list(self.failures)
        traps = list(self.traps)
        for fault in faults:
            if fault == "trap":
                traps.insert(0, TrapRule("injected", {}, drift_nats=1.0, garble=True, note="DSV4_EMULATOR_FAULT=trap"))
            elif fault in FAILURE_KINDS:
                rules.insert(0, FailureRule(fault, {}, note=f"DSV4_EMULATOR_FAULT={fault}", min_batched_tokens=1))
            else:
                raise ValueError(f"DSV4_EMULATOR_FAULT: unknown fault {fault!r}; use {', '.join(FAILURE_KINDS)}, trap")
        return replace(self, failures=tuple(rules), traps=tuple(traps))

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "coefficients": self.coefficients.to_json(),
            "failures": [{"kind": r.kind, "when": dict(r.when), "note": r.note,
                          "min_batched_tokens": r.min_batched_tokens} for r in self.failures],
            "traps": [{"name": t.name, "when": dict(t.when), "drift_nats": t.drift_nats, "garble": t.garble,
                       "note": t.note} for t in self.traps],
            "drift": dict(self.drift.__dict__),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "truth") -> Truth:
        unknown = sorted(set(data) - {"seed", "coefficients", "failures", "traps", "drift"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}")
        base = nominal_truth()
        coefficients = Coefficients.from_json(data["coefficients"]) if "coefficients" in data else base.coefficients
        failures = base.failures
        if "failures" in data:
            failures = tuple(_failure(r, f"{where}.failures[{i}]") for i, r in enumerate(data["failures"]))
        traps = base.traps
        if "traps" in data:
            traps = tuple(_trap(t, f"{where}.traps[{i}]") for i, t in enumerate(data["traps"]))
        drift = Drift(**{k: float(v) for k, v in (data.get("drift") or {}).items()})
        seed = data.get("seed")
        return cls(coefficients, failures, traps, drift, None if seed is None else int(seed))

    @classmethod
    def load(cls, path: Path) -> Truth:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")), where=str(path))


def _failure(data: Mapping[str, Any], where: str) -> FailureRule:
    kind = str(data.get("kind"))
    if kind not in FAILURE_KINDS:
        raise ValueError(f"{where}.kind: {kind!r} is not one of {FAILURE_KINDS}")
    when = dict(data.get("when") or {})
    _check_when(when, f"{where}.when")
    return FailureRule(kind, when, str(data.get("note", "")), int(data.get("min_batched_tokens", 0)))


def _trap(data: Mapping[str, Any], where: str) -> TrapRule:
    when = dict(data.get("when") or {})
    _check_when(when, f"{where}.when")
    return TrapRule(str(data["name"]), when, float(data["drift_nats"]), bool(data.get("garble", True)),
                    str(data.get("note", "")))


NOMINAL_FAILURES = (
    FailureRule("hang", {"compilation-config.cudagraph_mode": ["FULL"], "data-parallel-size": {">": 1}},
                note="FULL CUDA graphs with DP > 1: capture of the mixed prefill-decode graphs waits on a DP "
                     "collective that the other engines never join (the hang issue #14 saw)"),
    FailureRule("oom_under_load", {"gpu-memory-utilization": {">=": 0.97}}, min_batched_tokens=4096,
                note="at 0.97 the pool leaves < 1.5 GiB of a 96 GB GPU for what vLLM's profile run does not "
                     "see (collective buffers, allocator fragmentation): the first large mixed batch fails"),
)
NOMINAL_TRAPS = (
    TrapRule("humming-deepep-ll-scales", {"moe-backend": ["humming"], "all2all-backend": ["deepep_low_latency"]},
             drift_nats=1.0, garble=True,
             note="DeepEP low-latency dispatch hands Humming FP8 activations whose per-128 scales its "
                  "group-scaled path does not apply (the kernel bug the blog fixed in its fork)"),
    TrapRule("kv-fp8-e5m2", {"kv-cache-dtype": ["fp8_e5m2"]}, drift_nats=0.4, garble=False,
             note="an e5m2 KV cache keeps 2 mantissa bits: answers survive, logprobs do not"),
)


def nominal_truth() -> Truth:
    """The prior: nominal coefficients, the nominal failure and trap tables."""
    return Truth(NOMINAL, NOMINAL_FAILURES, NOMINAL_TRAPS, Drift(), None)


def truth_from_seed(seed: int, spread: float = 0.3, **kwargs: Any) -> Truth:
    """A node whose coefficients differ from the prior (:func:`~.coefficients.perturbed`), same tables."""
    return replace(nominal_truth(), coefficients=perturbed(seed, spread, **kwargs), seed=seed)
