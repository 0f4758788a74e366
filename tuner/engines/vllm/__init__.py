"""vLLM behind the engine seam: argv, readiness, metric names, log diagnosis, argument validation.

    engine.py     VllmEngine (the Engine), the OpenMP core binding, the version of a vLLM command
    argv.py       --engine-cmd for vLLM, and argv with the rules of ``vllm serve --config``
    validate.py   vLLM's own parser, run before a launch (``--prevalidate``)
    logs.py       failure classes, stalls and KV capacity read off the server log
    metrics.py    vLLM's Prometheus names and what they say about a window
"""

from __future__ import annotations

from tuner.engines.vllm.argv import DEFAULT_VLLM_CMD, TRUE_ONLY_FLAGS, options_to_argv, redact_argv, resolve_vllm_cmd
from tuner.engines.vllm.engine import OMP_BIND_ENV, VllmEngine, local_ranks, omp_bind_env, vllm_version_of
from tuner.engines.vllm.logs import CLASSIFY_TAIL_BYTES, classify_startup_failure, describe_stall, kv_tokens_from_log
from tuner.engines.vllm.metrics import VLLM_METRICS, VllmMetrics

__all__ = [
    "CLASSIFY_TAIL_BYTES",
    "DEFAULT_VLLM_CMD",
    "OMP_BIND_ENV",
    "TRUE_ONLY_FLAGS",
    "VLLM_METRICS",
    "VllmEngine",
    "VllmMetrics",
    "classify_startup_failure",
    "describe_stall",
    "kv_tokens_from_log",
    "local_ranks",
    "omp_bind_env",
    "options_to_argv",
    "redact_argv",
    "resolve_vllm_cmd",
    "vllm_version_of",
]
