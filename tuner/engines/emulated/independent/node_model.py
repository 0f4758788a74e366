"""Decode throughput of a DeepSeek-V4-Flash node, written without the prior's wave model.

Effects the prior lacks, each a term below:

- kernel gains that appear only above a batch size (the W4A8 MoE kernel pays off from batch 64);
- all-to-all cost that grows with DP x EP and with the batch;
- chunked-prefill interference, and preemption once the KV pool is over-committed;
- CUDA-graph padding: a batch is padded up to the next captured size;
- launches the memory arithmetic says fit but that fail (fragmentation at high utilisation),
  and the reverse (a TP1 launch the arithmetic refuses that starts because weights are shared);
- noise that grows with load, never told to a guide.

Calibrated to the 4xGH200 blog's figures (TP4 5,856 tok/s -> DP4+EP 12,802 tok/s -> W4A8 MoE
+40 %); ``calibration_points`` gives the three launches, a test checks them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LaunchResult", "calibration_points", "measure"]

_GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_W4A8_FROM_BATCH = 64
_HBM_GIB = 96.0
_SCALE = 0.8756  # fits the blog's DP4+EP figure
_WEIGHTS_GIB = 160.0  # whole model at FP8, split across the tensor-parallel group


@dataclass(frozen=True)
class LaunchResult:
    started: bool
    tokens_per_s: float
    reason: str = ""


def _padded(batch: int, cudagraph: bool) -> int:
    if not cudagraph:
        return batch
    return next((size for size in _GRAPH_SIZES if size >= batch), batch)


def _step_ms(tp: int, dp: int, ep: bool, batch: int, moe: str, cudagraph: bool) -> float:
    padded = _padded(batch, cudagraph)
    launch = 0.0 if cudagraph else 9.0
    dense = 11.0 / tp + 1.8 * math.log2(tp) if tp > 1 else 11.0
    per_token = 0.19 / tp
    if moe == "w4a8" and batch >= _W4A8_FROM_BATCH:
        per_token *= 0.64
    all_to_all = 0.0
    if ep and dp * tp > 1:
        all_to_all = 0.9 + 0.0022 * dp * tp * padded ** 0.8
    all_reduce = 0.02926 * padded * math.log2(tp)
    return launch + dense + per_token * padded + all_reduce + all_to_all


def _kv_capacity(tp: int, shards: int, utilisation: float, kv_fp8: bool) -> float:
    free_gib = _HBM_GIB * utilisation - _WEIGHTS_GIB / shards
    return max(free_gib, 0.0) * tp * (2.0 if kv_fp8 else 1.0) * 20.0  # sequences of 4k context


def measure(options: Mapping[str, Any], gpus: int = 4, rng: random.Random | None = None) -> LaunchResult:
    """Tokens/s a launch gives under saturating decode load, or why it failed to start."""
    tp = int(options.get("tensor-parallel-size", 1))
    dp = int(options.get("data-parallel-size", 1))
    ep = bool(options.get("enable-expert-parallel", False))
    batch = int(options.get("max-num-seqs", 256))
    utilisation = float(options.get("gpu-memory-utilization", 0.9))
    moe = str(options.get("moe-backend", "auto")).lower()
    cudagraph = str(options.get("compilation-config.cudagraph_mode", "FULL_AND_PIECEWISE")).upper() != "NONE"
    kv_fp8 = str(options.get("kv-cache-dtype", "auto")).startswith("fp8")
    chunk = int(options.get("max-num-batched-tokens", 8192))
    if tp * dp > gpus:
        return LaunchResult(False, 0.0, "more GPUs than the node has")
    if utilisation >= 0.96 and batch >= 256:
        return LaunchResult(False, 0.0, "out of memory under load (fragmentation)")
    capacity = _kv_capacity(tp, tp * dp if ep else tp, utilisation, kv_fp8)
    if capacity <= 0.0 and not (tp == 1 and dp > 1 and ep):
        return LaunchResult(False, 0.0, "weights do not fit")
    capacity = max(capacity, 24.0)
    running = min(batch, capacity)
    preempted = max(batch - capacity, 0.0) / batch
    step = _step_ms(tp, dp, ep, int(running), moe, cudagraph)
    interference = 1.0 - min(0.25, chunk / 65536.0)
    rate = _SCALE * dp * running / step * 1000.0 * interference * (1.0 - 0.6 * preempted)
    if rng is not None:
        rate *= 1.0 + rng.gauss(0.0, 0.01 + 0.05 * running / 512.0)
    return LaunchResult(True, rate)


def calibration_points() -> dict[str, dict[str, Any]]:
    """The blog's three launches on 4xGH200."""
    base = {"max-num-seqs": 256, "gpu-memory-utilization": 0.9, "max-num-batched-tokens": 8192}
    return {
        "TP4": {**base, "tensor-parallel-size": 4},
        "DP4+EP": {**base, "data-parallel-size": 4, "enable-expert-parallel": True},
        "DP4+EP+W4A8": {**base, "data-parallel-size": 4, "enable-expert-parallel": True, "moe-backend": "w4a8"},
    }
