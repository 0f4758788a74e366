"""Launches as the independent truth reads them: vLLM's own flags, many launches at once (numpy arrays).

The truth sees what a node sees: the ``vllm serve`` options of each launch (as a mapping of flag name to
value, ``compilation-config`` and ``speculative-config`` as mappings), not the tuner's levers or tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["A2A", "MODES", "Launches", "parse"]

MODES = {"NONE": 0, "PIECEWISE": 1, "FULL_DECODE_ONLY": 2, "FULL_AND_PIECEWISE": 3, "FULL": 4}
A2A = {"none": 0, "allgather_reducescatter": 1, "deepep_high_throughput": 2, "deepep_low_latency": 3}
_DEFAULT_CAPTURE = 512


@dataclass(frozen=True)
class Launches:
    """One row per launch."""

    tp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    seqs: np.ndarray
    """max-num-seqs, per DP engine."""
    budget: np.ndarray
    """max-num-batched-tokens."""
    util: np.ndarray
    mode: np.ndarray
    capture: np.ndarray
    humming: np.ndarray
    a2a: np.ndarray
    eplb: np.ndarray
    prefix: np.ndarray
    spec_k: np.ndarray
    kv_fp8: np.ndarray
    max_len: np.ndarray

    def __len__(self) -> int:
        return int(self.tp.size)

    @property
    def world(self) -> np.ndarray:
        return np.asarray(self.tp * self.dp)

    @property
    def expert_ranks(self) -> np.ndarray:
        """GPUs the routed experts are split over: the whole world under EP, the TP group otherwise."""
        return np.asarray(np.where(self.ep, self.tp * self.dp, self.tp))


def _get(options: Mapping[str, Any], name: str, default: Any) -> Any:
    value = options.get(name, options.get(name.replace("-", "_"), default))
    return default if value is None else value


def parse(launches: Sequence[Mapping[str, Any]]) -> Launches:
    cols: dict[str, list[Any]] = {name: [] for name in Launches.__dataclass_fields__}
    for options in launches:
        compilation = _get(options, "compilation-config", {}) or {}
        speculative = _get(options, "speculative-config", {}) or {}
        enforce_eager = bool(_get(options, "enforce-eager", False))
        mode = "NONE" if enforce_eager else str(compilation.get("cudagraph_mode", "FULL_AND_PIECEWISE")).upper()
        moe = str(_get(options, "moe-backend", "auto")).lower()
        dp = int(_get(options, "data-parallel-size", 1))
        ep = bool(_get(options, "enable-expert-parallel", False))
        a2a = str(_get(options, "all2all-backend", "allgather_reducescatter")) if ep and dp > 1 else "none"
        cols["tp"].append(int(_get(options, "tensor-parallel-size", 1)))
        cols["dp"].append(dp)
        cols["ep"].append(ep)
        cols["seqs"].append(int(_get(options, "max-num-seqs", 256)))
        cols["budget"].append(int(_get(options, "max-num-batched-tokens", 8192)))
        cols["util"].append(float(_get(options, "gpu-memory-utilization", 0.9)))
        cols["mode"].append(MODES.get(mode, MODES["FULL_AND_PIECEWISE"]))
        cols["capture"].append(int(compilation.get("max_cudagraph_capture_size", _DEFAULT_CAPTURE)))
        cols["humming"].append(moe in ("humming", "w4a8"))
        cols["a2a"].append(A2A.get(a2a, A2A["allgather_reducescatter"]))
        cols["eplb"].append(bool(_get(options, "enable-eplb", False)) and ep)
        cols["prefix"].append(bool(_get(options, "enable-prefix-caching", True)))
        cols["spec_k"].append(int(speculative.get("num_speculative_tokens", 0)) if speculative else 0)
        cols["kv_fp8"].append(str(_get(options, "kv-cache-dtype", "auto")).startswith("fp8"))
        cols["max_len"].append(int(_get(options, "max-model-len", 8192)))
    ints = {"tp", "dp", "seqs", "budget", "mode", "capture", "a2a", "spec_k", "max_len"}
    bools = {"ep", "humming", "eplb", "prefix", "kv_fp8"}
    return Launches(**{name: np.asarray(values, dtype=np.int64 if name in ints else bool if name in bools
                                        else np.float64) for name, values in cols.items()})
