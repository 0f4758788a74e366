"""A cheap response surface with a known optimum, for measuring samplers without launching vLLM.

The space is a realistic 4-GPU hardware profile (:data:`PROFILE`), drawn through the study's own
``tuner.search.space.suggest`` (define-by-run, conditional levers): a topology categorical (TP4, TP2×DP2,
with or without EP, DP4+EP, DP4), the cpu profile's scheduler levers, a GPU-memory share, a CUDA-graph
mode, an all-to-all backend that exists only under expert parallelism, and 0–3 draft tokens
(272 160 configurations). :data:`SMALL_PROFILE` searches only the cpu profile's levers, with topology,
all-to-all and CUDA graphs fixed at their best values (10 080 configurations).

:func:`evaluate` is a made-up but plausibly shaped serving model:

- throughput rises with max-num-seqs and saturates; DP+EP beats TP on a MoE; speculation helps most at low
  batch; fp8 KV helps at high batch; small prefill chunks cost a little;
- p95 ITL rises with batch size and draft tokens, so the ITL SLO binds near the optimum (the
  unconstrained best is infeasible);
- some configurations do not launch: DP4 without EP (weights do not fit), chunked prefill off with
  max-num-batched-tokens < max-model-len (vLLM rejects it), fp8 KV with block size 16, and an OOM
  corner (gpu-memory-utilization 0.95, 512 sequences, 16k batched tokens, bf16 KV);
- multiplicative log-normal noise (3 % by default) on every measured figure.

:func:`run_search` drives a sampler exactly as ``tuner.study.local.LocalLoop`` does: baselines enqueued
first, a configuration already launched is told again with its first result and does not count as a
launch, a failed launch is told COMPLETE with every constraint at +1 (value 0), or, to check that
this matters, as FAIL. It returns the *true* (noise-free) value of every launch, so "trials to reach
95 % of the feasible optimum" is measured on what the user would get, not on a lucky noisy reading.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from tuner.search.profile import HardwareProfile
from tuner.search.space import ServeConfig, build_config, suggest

Params = Mapping[str, Any]

TTFT_SLO_MS = 1500.0
ITL_SLO_MS = 40.0
CONSTRAINT_NAMES = ("p95_ttft_ms", "p95_itl_ms", "failed_fraction", "trial_ran")
"""The same names, in the same order, as ``tuner.objective.constraint_names`` for two SLOs."""

PROFILE_DATA: dict[str, Any] = {
    "name": "synthetic4",
    "description": "synthetic 4-GPU node for sampler benchmarks (benchmarks/surface.py)",
    "hardware": {"accelerator": "nvidia", "device_name": "synthetic", "device_count": 4,
                 "memory_per_device_gb": 80, "generation": "hopper"},
    "server": {"model": "synthetic", "fixed": {"max-model-len": 8192}},
    "topology": {"choices": ["tp4", "tp2-dp2", "tp2-dp2-ep", "dp4-ep", "dp4"]},
    "levers": {
        "max-num-seqs": {"choices": [8, 16, 32, 64, 128, 256, 512]},
        "max-num-batched-tokens": {"choices": [1024, 2048, 4096, 8192, 16384]},
        "block-size": {"choices": [16, 64, 128]},
        "kv-cache-dtype": {"choices": ["auto", "fp8"]},
        "enable-prefix-caching": {"choices": [True, False]},
        "enable-chunked-prefill": {"choices": [True, False]},
        "gpu-memory-utilization": {"choices": [0.85, 0.9, 0.95]},
        "compilation-config.cudagraph_mode": {"choices": ["FULL_AND_PIECEWISE", "PIECEWISE", "NONE"]},
        "all2all-backend": {"choices": ["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency"],
                            "when": {"topology.ep": [True]}},
    },
    "speculative": {"method": "ngram", "draft_tokens": {"choices": [0, 1, 2, 3]},
                    "config": {"prompt_lookup_max": 3}},
    "baselines": [{"name": "vllm-defaults",
                   "values": {"topology": "tp4", "max-num-seqs": 256, "max-num-batched-tokens": 8192,
                              "block-size": 64, "kv-cache-dtype": "auto", "enable-prefix-caching": True,
                              "enable-chunked-prefill": True, "gpu-memory-utilization": 0.9,
                              "compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE",
                              "speculative.draft_tokens": 0}}],
}
PROFILE = HardwareProfile.model_validate(PROFILE_DATA)

SMALL_FIXED: dict[str, Any] = {"topology": "dp4-ep", "all2all-backend": "deepep_high_throughput",
                               "compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE"}
"""What the small surface holds fixed (at their best values): it searches the cpu profile's levers only."""
SMALL_PROFILE = HardwareProfile.model_validate({
    **PROFILE_DATA, "name": "synthetic4-small", "topology": None,
    "server": {"model": "synthetic", "fixed": {"max-model-len": 8192, "data-parallel-size": 4,
                                               "enable-expert-parallel": True}},
    "description": "the synthetic node with topology, all-to-all and CUDA graphs fixed: the cpu profile's levers",
    "levers": {k: v for k, v in PROFILE_DATA["levers"].items() if k not in SMALL_FIXED},
    "baselines": [{"name": "vllm-defaults",
                   "values": {k: v for k, v in PROFILE_DATA["baselines"][0]["values"].items()
                              if k not in SMALL_FIXED}}],
})
PROFILES = {"large": PROFILE, "small": SMALL_PROFILE}

_TOPO_SPEED = {"tp4": 1.00, "tp2-dp2": 1.30, "tp2-dp2-ep": 1.55, "dp4-ep": 1.80, "dp4": 1.80}
_TOPO_ITL = {"tp4": 0.80, "tp2-dp2": 1.00, "tp2-dp2-ep": 1.10, "dp4-ep": 1.25, "dp4": 1.25}
_TOPO_TTFT = {"tp4": 0.70, "tp2-dp2": 0.90, "tp2-dp2-ep": 1.00, "dp4-ep": 1.10, "dp4": 1.10}
_A2A = {"allgather_reducescatter": (1.00, 1.00), "deepep_high_throughput": (1.12, 1.10),
        "deepep_low_latency": (1.05, 0.85)}
_GRAPH = {"FULL_AND_PIECEWISE": (1.00, 1.00), "PIECEWISE": (0.94, 1.08), "NONE": (0.78, 1.35)}
_ACCEPTED = (0.0, 0.8, 1.3, 1.6)
"""Mean accepted draft tokens per step for 0..3 draft tokens."""


@dataclass(frozen=True)
class Measurement:
    launched: bool
    output_tok_s: float
    p95_ttft_ms: float
    p95_itl_ms: float
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.launched and self.p95_ttft_ms <= TTFT_SLO_MS and self.p95_itl_ms <= ITL_SLO_MS

    def constraints(self) -> tuple[float, ...]:
        if not self.launched:
            return (1.0,) * len(CONSTRAINT_NAMES)
        return ((self.p95_ttft_ms - TTFT_SLO_MS) / TTFT_SLO_MS, (self.p95_itl_ms - ITL_SLO_MS) / ITL_SLO_MS, 0.0, 0.0)


def launch_failure(p: Params) -> str:
    """Why a configuration does not start ('' = it starts)."""
    if p["topology"] == "dp4":
        return "oom: weights do not fit one GPU without expert parallelism"
    if not p["enable-chunked-prefill"] and int(p["max-num-batched-tokens"]) < 8192:
        return "bad_flag: max-num-batched-tokens < max-model-len with chunked prefill off"
    if p["kv-cache-dtype"] == "fp8" and int(p["block-size"]) == 16:
        return "crash: fp8 KV cache needs block size >= 64"
    if (float(p["gpu-memory-utilization"]) >= 0.95 and int(p["max-num-seqs"]) >= 512
            and int(p["max-num-batched-tokens"]) >= 16384 and p["kv-cache-dtype"] == "auto"):
        return "oom: activation peak at 16k batched tokens with 0.95 memory share"
    return ""


def true_metrics(params: Params) -> Measurement:
    """The noise-free surface (levers the small profile does not search take their fixed values)."""
    p = {**SMALL_FIXED, **params} if "topology" not in params else params
    reason = launch_failure(p)
    if reason:
        return Measurement(False, 0.0, math.inf, math.inf, reason)
    topo = str(p["topology"])
    seqs = int(p["max-num-seqs"])
    tokens = int(p["max-num-batched-tokens"])
    draft = int(p.get("speculative.draft_tokens", 0))
    a2a_speed, a2a_itl = _A2A[str(p.get("all2all-backend", "allgather_reducescatter"))]
    graph_speed, graph_itl = _GRAPH[str(p["compilation-config.cudagraph_mode"])]

    speed = 9000.0 * _TOPO_SPEED[topo] * seqs / (seqs + 96.0)
    speed *= 1.0 - 0.22 * math.exp(-tokens / 3000.0)
    speed *= 1.0 + 0.45 * _ACCEPTED[draft] / (1.0 + seqs / 64.0) - 0.04 * draft
    speed *= (1.10 if seqs >= 128 else 1.02) if p["kv-cache-dtype"] == "fp8" else 1.0
    speed *= {16: 0.97, 64: 1.00, 128: 0.995}[int(p["block-size"])]
    speed *= 1.01 if p["enable-prefix-caching"] else 1.0
    gmu = float(p["gpu-memory-utilization"])
    speed *= (0.93 if seqs >= 256 else 1.0) if gmu <= 0.85 else (1.02 if gmu >= 0.95 else 1.0)
    speed *= a2a_speed * graph_speed
    if p.get("all2all-backend") == "deepep_high_throughput" and seqs < 64:
        speed *= 0.88

    itl = 11.0 * (1.0 + seqs / 160.0) * _TOPO_ITL[topo] * a2a_itl * graph_itl * (1.0 + 0.10 * draft)
    itl *= 0.95 if p["kv-cache-dtype"] == "fp8" else 1.0
    ttft = 160.0 * (4096.0 / tokens) ** 0.6 * (1.0 + seqs / 256.0) * _TOPO_TTFT[topo]
    ttft *= 1.4 if not p["enable-chunked-prefill"] else 1.0
    return Measurement(True, speed, ttft, itl)


def evaluate(p: Params, rng: random.Random, noise: float = 0.03) -> Measurement:
    """One noisy measurement of a launch."""
    true = true_metrics(p)
    if not true.launched:
        return true
    def jitter() -> float:
        return math.exp(rng.gauss(0.0, noise))

    return Measurement(True, true.output_tok_s * jitter(), true.p95_ttft_ms * jitter(), true.p95_itl_ms * jitter())


def all_params(profile: HardwareProfile = PROFILE) -> Iterable[dict[str, Any]]:
    """Every point of the space, conditional levers included only where active."""
    names = [n for n in profile.levers if not profile.levers[n].when]
    conditional = [n for n in profile.levers if profile.levers[n].when]
    topologies = profile.topology.choices if profile.topology else [""]
    draft = profile.speculative.draft_tokens.choices if profile.speculative else [0]
    for topo in topologies:
        ep = topo.endswith("-ep")
        extra = [n for n in conditional if ep]
        domains = [profile.levers[n].choices or [] for n in names + extra]
        for values in itertools.product(*domains, draft or [0]):
            point = dict(zip(names + extra, values[:-1], strict=True))
            if topo:
                point["topology"] = topo
            point["speculative.draft_tokens"] = values[-1]
            yield point


def optimum(profile: HardwareProfile = PROFILE) -> tuple[float, tuple[tuple[str, Any], ...], float, float]:
    """(best feasible true value, its params, feasible share of the space, share within 95 % of it)."""
    return _optimum(profile.name)


@functools.lru_cache(maxsize=4)
def _optimum(name: str) -> tuple[float, tuple[tuple[str, Any], ...], float, float]:
    profile = next(p for p in PROFILES.values() if p.name == name)
    best_value, best = -1.0, None
    values: list[float] = []
    total = 0
    for p in all_params(profile):
        total += 1
        m = true_metrics(p)
        if m.feasible:
            values.append(m.output_tok_s)
            if m.output_tok_s > best_value:
                best_value, best = m.output_tok_s, p
    assert best is not None
    near = sum(1 for v in values if v >= 0.95 * best_value)
    return best_value, tuple(sorted(best.items())), len(values) / total, near / total


def unconstrained_best(profile: HardwareProfile = PROFILE) -> float:
    return max(true_metrics(p).output_tok_s for p in all_params(profile))


# -- driving a sampler like the study does ------------------------------------------------------------
class Trace(list[float]):
    """True value of each launch, in order (0 = infeasible), and which launches did not start."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: list[bool] = []

    def append(self, value: float, launched: bool = True) -> None:  # type: ignore[override]
        super().append(value)
        self.failed.append(not launched)


SamplerFactory = Callable[[int], optuna.samplers.BaseSampler]
FailureMode = Literal["complete", "fail"]


def _baseline_params(profile: HardwareProfile) -> list[dict[str, Any]]:
    return [dict(b.values) for b in profile.baselines]


def run_search(make: SamplerFactory, seed: int, n_launches: int, *, failures: FailureMode = "complete",
               noise: float = 0.03, profile: HardwareProfile = PROFILE,
               enqueue: Sequence[Mapping[str, Any]] | None = None) -> Trace:
    """Drive ``make(seed)`` for ``n_launches`` launches; return each launch's true value (0 if infeasible).

    Mirrors ``Study._loop``: baselines first, duplicates re-told without a launch (at most 50 in a row,
    then the space counts as exhausted), failed launches told COMPLETE with every constraint at +1 and
    value 0, or FAIL when ``failures="fail"``.
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rng = random.Random(seed * 7919 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize", sampler=make(seed))
        for values in (enqueue if enqueue is not None else _baseline_params(profile)):
            study.enqueue_trial(dict(values))
        launched: dict[str, int] = {}
        results: dict[int, Measurement] = {}
        out = Trace()
        duplicates = 0
        while len(out) < n_launches and duplicates < 50:
            trial = study.ask()
            config: ServeConfig = suggest(profile, trial)
            key = config.key()
            if key in launched:
                first = results[launched[key]]
                _tell(study, trial, first, failures)
                duplicates += 1
                continue
            duplicates = 0
            m = evaluate(config.params, rng, noise)
            launched[key] = trial.number
            results[trial.number] = m
            _tell(study, trial, m, failures)
            true = true_metrics(config.params)
            out.append(true.output_tok_s if true.feasible else 0.0, launched=m.launched)
    return out


def _tell(study: optuna.Study, trial: optuna.Trial, m: Measurement, failures: FailureMode) -> None:
    if not m.launched and failures == "fail":
        study.tell(trial, state=TrialState.FAIL)
        return
    for name, margin in zip(CONSTRAINT_NAMES, m.constraints(), strict=True):
        trial.set_constraint(name, margin)
    study.tell(trial, m.output_tok_s if m.launched else 0.0)


def run_order(points: Sequence[Mapping[str, Any]], n_launches: int, profile: HardwareProfile = PROFILE) -> Trace:
    """A fixed list of configurations in order (a grid, as ``vllm bench sweep serve`` runs it)."""
    out = Trace()
    seen: set[str] = set()
    for p in points:
        if len(out) >= n_launches:
            break
        config = build_config(profile, p)
        if config.key() in seen:
            continue
        seen.add(config.key())
        true = true_metrics(config.params)
        out.append(true.output_tok_s if true.feasible else 0.0, launched=true.launched)
    return out


def sweep_grid(profile: HardwareProfile = PROFILE) -> list[dict[str, Any]]:
    """auto_tune.sh / sweep-style grid: (topology ×) max-num-seqs × max-num-batched-tokens, the rest at
    the baseline's values, in Cartesian order."""
    base = _baseline_params(profile)[0]
    topologies: list[str | None] = list(profile.topology.choices) if profile.topology else [None]
    seqs = profile.levers["max-num-seqs"].choices or []
    tokens = profile.levers["max-num-batched-tokens"].choices or []
    grid: list[dict[str, Any]] = []
    for t, s, b in itertools.product(topologies, seqs, tokens):
        point = {**base, "max-num-seqs": s, "max-num-batched-tokens": b}
        if t is not None:
            point["topology"] = t
        grid.append(point)
    return grid


def trials_to_reach(values: Sequence[float], target: float) -> int | None:
    """1-based launch count at which a launch first reached ``target`` (None = never)."""
    for i, v in enumerate(values, start=1):
        if v >= target:
            return i
    return None
