"""A DeepSeek-V4-Flash node written without the prior's model: what a launch measures, or why it fails.

Effects the prior lacks or writes otherwise, each in its module:

- kernel gains that appear only above a batch size: the W4A8 MoE kernel tiles 64 rows and runs at the
  FP8 rate only from a number of tokens per expert on (``step``);
- all-to-all cost that grows with DP x EP and with the batch (congestion), per backend; DeepEP
  high-throughput keeps decode out of full CUDA graphs, the low-latency kernel dispatches in chunks (``step``);
- chunked-prefill interference, and preemption with recompute once the KV pool is over-committed (``bench``);
- CUDA-graph padding to vLLM's captured sizes, and eager steps past the largest (``step``);
- launches the start-up profile says fit but that fail under load (gathered MoE activations,
  fragmentation), buffers outside the profiled budget, a KV pool too small for max-model-len (``memory``);
- noise that grows with load, DP and speculation, and launches that run slow, never told to a search
  (``bench.noise``; :func:`measure` draws it).

Calibrated to the 4xGH200 blog's three launches (TP4 5,856 tok/s at c2048 -> DP4+EP 12,802 at c2752 ->
W4A8 MoE about +40 %): :func:`calibration_points`, checked by ``tests/test_independent_truth.py``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.engines.emulated.independent.bench import figures, noise
from tuner.engines.emulated.independent.constants import NOMINAL, Constants
from tuner.engines.emulated.independent.hardware import node_named
from tuner.engines.emulated.independent.launch import Launches, parse
from tuner.engines.emulated.independent.memory import memory

__all__ = ["Evaluation", "LaunchResult", "calibration_points", "evaluate", "evaluate_parsed", "measure"]


@dataclass(frozen=True)
class LaunchResult:
    started: bool
    tokens_per_s: float
    reason: str = ""
    ttft_p95_ms: float = math.nan
    itl_p95_ms: float = math.nan


@dataclass(frozen=True)
class Evaluation:
    """Many launches, each at a few concurrencies: arrays of shape (launches, steps)."""

    starts: np.ndarray
    survives_load: np.ndarray
    reason: tuple[str, ...]
    output_tok_s: np.ndarray
    ttft_p95_ms: np.ndarray
    itl_p95_ms: np.ndarray
    noise_sd: np.ndarray
    kv_tokens: np.ndarray


def evaluate(launches: Sequence[Mapping[str, Any]], node: str, concurrency: np.ndarray, *,
             constants: Constants = NOMINAL, input_len: int = 1024, output_len: int = 1024) -> Evaluation:
    """Every launch (its ``vllm serve`` options) at each of its concurrencies (``concurrency``: launches × steps)."""
    return evaluate_parsed(parse(launches), node, concurrency, constants=constants, input_len=input_len,
                           output_len=output_len)


def evaluate_parsed(x: Launches, node: str, concurrency: np.ndarray, *, constants: Constants = NOMINAL,
                    input_len: int = 1024, output_len: int = 1024) -> Evaluation:
    """:func:`evaluate` on launches parsed once (:func:`~tuner.engines.emulated.independent.launch.parse`)."""
    spec = node_named(node)
    mem = memory(x, spec, constants)
    conc = np.asarray(concurrency, dtype=np.float64).reshape(len(x), -1)
    cols = [figures(x, spec, constants, mem, conc[:, j], input_len, output_len) for j in range(conc.shape[1])]
    return Evaluation(starts=mem.starts, survives_load=mem.survives_load, reason=mem.reason,
                      output_tok_s=np.stack([f.output_tok_s for f in cols], axis=1),
                      ttft_p95_ms=np.stack([f.ttft_p95_ms for f in cols], axis=1),
                      itl_p95_ms=np.stack([f.itl_p95_ms for f in cols], axis=1),
                      noise_sd=np.stack([noise(x, constants, f.running) for f in cols], axis=1),
                      kv_tokens=mem.kv_tokens)


def measure(options: Mapping[str, Any], node: str = "gh200x4", concurrency: int = 2048, *,
            constants: Constants = NOMINAL, rng: random.Random | None = None) -> LaunchResult:
    """One launch at one concurrency (random 1024/1024): its figures, or why it did not run."""
    ev = evaluate([options], node, np.array([[concurrency]]), constants=constants)
    if not ev.survives_load[0]:
        return LaunchResult(False, 0.0, ev.reason[0])
    rate = float(ev.output_tok_s[0, 0])
    if rng is not None:
        rate *= math.exp(rng.gauss(0.0, float(ev.noise_sd[0, 0])))
        if rng.random() < constants.slow_launch_p:
            rate *= 1.0 - constants.slow_launch_cost
    return LaunchResult(True, rate, "", float(ev.ttft_p95_ms[0, 0]), float(ev.itl_p95_ms[0, 0]))


def calibration_points() -> dict[str, tuple[dict[str, Any], int]]:
    """The blog's three launches on 4xGH200, each with the concurrency it was measured at."""
    base: dict[str, Any] = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 128000,
                            "max-num-batched-tokens": 8192, "enable-expert-parallel": True,
                            "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                                   "max_cudagraph_capture_size": 1024}}
    tp4 = {**base, "tensor-parallel-size": 4, "max-num-seqs": 2048, "gpu-memory-utilization": 0.92}
    dp4 = {**base, "data-parallel-size": 4, "max-num-seqs": 1024, "gpu-memory-utilization": 0.95,
           "all2all-backend": "allgather_reducescatter"}
    return {"TP4": (tp4, 2048), "DP4+EP": (dp4, 2752), "DP4+EP+W4A8": ({**dp4, "moe-backend": "humming"}, 2752)}
