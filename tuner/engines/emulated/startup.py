"""vLLM's start-up of DeepSeek-V4-Flash, as its log shows it, and the ways it fails.

The stages and their lines follow a real ``vllm serve`` log (vLLM 0.32: ``api_utils``, ``model.py``,
``scheduler.py``, ``core.py``, ``gpu_model_runner.py``, ``default_loader.py``, ``monitor.py``,
``gpu_worker.py``, ``kv_cache_utils.py``); progress bars are compressed to a few lines. Each stage
takes virtual time (realised at the start-up time scale):

- weights: the rank's share of the checkpoint at :data:`LOAD_BYTES_S` per rank;
- torch.compile: :data:`COMPILE_S` unless eager;
- KV profiling and allocation; then one line per engine, ``GPU KV cache size: N tokens, Maximum
  concurrency for L tokens per request: X.XXx``, from the memory model;
- CUDA-graph capture: :data:`CAPTURE_S_PER_SIZE` per captured size and graph kind.

Failures, as vLLM shows them: weights larger than the GPU → ``torch.OutOfMemoryError`` while
loading; no room for KV blocks, or fewer than max-model-len tokens → vLLM's ``ValueError``; both end
in ``RuntimeError: Engine core initialization failed`` and exit 1. A hang rule of the truth stops the
log in graph capture (only vLLM's "No available shared memory broadcast block" line repeats, every
60 virtual seconds) and the server never becomes ready.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tuner.engines.emulated._deps import GIB, Checkpoint
from tuner.engines.emulated.frontend import Frontend
from tuner.engines.emulated.truth import Truth
from tuner.engines.emulated.vllm_log import VllmLog
from tuner.perfmodel.capacity import Capacity, StartupVerdict
from tuner.perfmodel.serve_config import EmulatedConfig

__all__ = ["CAPTURE_S_PER_SIZE", "COMPILE_S", "LOAD_BYTES_S", "StartupPlan", "run_startup"]

LOAD_BYTES_S = 0.25e9
"""Checkpoint bytes a rank loads per second (assumption: a shared filesystem at ~1 GB/s for a node;
DSV4 recipes allow an hour, the profiles expect 20 minutes for the whole start)."""
COMPILE_S = 150.0
"""torch.compile of DSV4's graph, cold (assumption; the 0.26 GPU evidence log took 16 s for a tiny model)."""
PROFILE_S = 20.0
CAPTURE_S_PER_SIZE = 0.8
HEARTBEAT_S = 60.0
"""vLLM's shared-memory broadcast warns every 60 s while a worker does not answer."""

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class StartupPlan:
    """What the start-up needs to know."""

    config: EmulatedConfig
    frontend: Frontend
    checkpoint: Checkpoint
    capacity: Capacity
    verdict: StartupVerdict
    truth: Truth
    version: str
    nondefault_args: dict[str, object]


def _engines(config: EmulatedConfig) -> list[str]:
    return [f"EngineCore_DP{i}" for i in range(config.dp)] if config.dp > 1 else ["EngineCore"]


def _worker(config: EmulatedConfig, dp: int, tp: int) -> str:
    name = "Worker"
    if config.dp > 1:
        name += f"_DP{dp}"
    if config.tp > 1:
        name += f"_TP{tp}"
    if config.ep:
        name += f"_EP{dp * config.tp + tp}"
    return name


def _graph_kinds(config: EmulatedConfig) -> list[tuple[str, str]]:
    mode = config.cudagraph_mode
    return {
        "FULL_AND_PIECEWISE": [("mixed prefill-decode", "PIECEWISE"), ("decode", "FULL")],
        "PIECEWISE": [("mixed prefill-decode", "PIECEWISE")],
        "FULL_DECODE_ONLY": [("decode", "FULL")],
        "FULL": [("mixed prefill-decode", "FULL"), ("decode", "FULL")],
    }.get(mode, [])


def _bar(done: int, total: int) -> str:
    filled = round(10 * done / max(1, total))
    return "█" * filled + " " * (10 - filled)


def _fail(log: VllmLog, plan: StartupPlan, process: str, frames: list[str], error: str) -> int:
    """vLLM's failed start: the worker's traceback, the engine core's, the API server's; exit 1."""
    engine = _engines(plan.config)[0]
    log.error(process, "multiproc_executor.py:757", "WorkerProc failed to start.")
    log.plain(process, "Traceback (most recent call last):")
    for frame in frames:
        log.plain(process, frame)
    log.plain(process, error)
    log.error(engine, "core.py:1510", "EngineCore failed to start.")
    log.plain(engine, "Traceback (most recent call last):")
    log.plain(engine, '  File ".../vllm/v1/engine/core.py", line 1495, in run_engine_core')
    log.plain(engine, "Exception: WorkerProc initialization failed due to an exception in a background process. "
                      "See stack trace for root cause.")
    failed = {e: 1 for e in _engines(plan.config)}
    log.plain(None, "Traceback (most recent call last):")
    log.plain(None, '  File ".../vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup')
    log.plain(None, f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                    f"{failed}")
    return 1


async def run_startup(plan: StartupPlan, log: VllmLog, sleep_v: Sleep) -> int | None:
    """Print the start-up and wait its virtual time. ``None``: ready to serve; an int: exit with it.

    A hang never returns (the caller is stopped by a signal, as a hung vLLM is).
    """
    cfg, front, cap = plan.config, plan.frontend, plan.capacity
    api = "APIServer"
    log.plain(None, "")
    for line in ("", "       █     █     █▄   ▄█", f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {plan.version}",
                 f"  █▄█▀ █     █     █     █  model   {cfg.model}", "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀", ""):
        log.info(api, "api_utils.py:347", line)
    log.info(api, "api_utils.py:286", f"non-default args: {plan.nondefault_args}")
    await sleep_v(8.0)
    log.info(api, "model.py:733", "Resolved architecture: DeepseekV4ForCausalLM")
    log.info(api, "model.py:2152", f"Using max model len {cfg.max_model_len}")
    if cfg.enable_chunked_prefill:
        log.info(api, "scheduler.py:308",
                 f"Chunked prefill is enabled with max_num_batched_tokens={cfg.max_num_batched_tokens}.")
    spec = json.dumps({"method": cfg.spec_method, "num_speculative_tokens": cfg.spec_tokens}) \
        if cfg.speculative else None
    for engine in _engines(cfg):
        log.info(engine, "core.py:133", (
            f"Initializing a V1 LLM engine (v{plan.version}) with config: model='{cfg.model}', "
            f"speculative_config={spec}, tokenizer='{cfg.model}', tokenizer_mode={front.tokenizer_mode}, "
            f"trust_remote_code=True, max_seq_len={cfg.max_model_len}, tensor_parallel_size={cfg.tp}, "
            f"data_parallel_size={cfg.dp}, enable_expert_parallel={cfg.ep}, kv_cache_dtype={cfg.kv_cache_dtype}, "
            f"enable_prefix_caching={cfg.enable_prefix_caching}, served_model_name={front.model_name}, "
            f"compilation_config={{'cudagraph_mode': {cfg.cudagraph_mode}, "
            f"'max_cudagraph_capture_size': {cfg.max_capture_size or None}}}"))
    workers = [_worker(cfg, d, t) for d in range(cfg.dp) for t in range(cfg.tp)]
    for rank, worker in enumerate(workers):
        log.info(worker, "parallel_state.py:1906",
                 f"world_size={cfg.world} rank={rank} local_rank={rank} backend=nccl")
    lead = workers[0]
    log.info(lead, "gpu_model_runner.py:5040", f"Starting to load model {cfg.model}...")
    weights = cap.memory.weights_bytes
    load_s = weights / LOAD_BYTES_S
    shards = 46
    stop_at = shards if plan.verdict.ok or plan.verdict.stage != "load" else shards * 3 // 4
    for done in (0, shards // 4, shards // 2, 3 * shards // 4, shards):
        if done > stop_at:
            break
        log.plain(lead, f"Loading safetensors checkpoint shards: {100 * done // shards:3d}% Completed | "
                        f"{done}/{shards} [{_bar(done, shards)}]")
        if done < stop_at:
            await sleep_v(load_s / 4)
    if plan.verdict.stage == "load":
        return _fail(log, plan, lead, [
            '  File ".../vllm/model_executor/model_loader/default_loader.py", line 496, in load_weights',
            '  File ".../vllm/model_executor/layers/fused_moe/layer.py", line 1380, in weight_loader',
        ], plan.verdict.message)
    if plan.truth.failure(cfg, "oom_at_start") is not None:
        return _fail(log, plan, lead, [
            '  File ".../vllm/model_executor/model_loader/default_loader.py", line 496, in load_weights',
        ], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
           f"of {plan.config.gpu_memory_utilization * 100:.0f}% reserved and 1.12 GiB free.")
    log.info(lead, "default_loader.py:501", f"Loading weights took {load_s:.2f} seconds")
    log.info(lead, "gpu_model_runner.py:5150",
             f"Model loading took {weights / GIB:.2f} GiB memory and {load_s + 3.2:.6f} seconds")
    if not cfg.eager:
        await sleep_v(COMPILE_S)
        log.info(lead, "monitor.py:53", f"torch.compile took {COMPILE_S:.2f} s in total")
    await sleep_v(PROFILE_S)
    log.info(lead, "gpu_worker.py:760", f"Available KV cache memory: {max(0.0, cap.kv_gib):.2f} GiB")
    if plan.verdict.stage in ("kv", "max_len"):
        return _fail(log, plan, lead, [
            '  File ".../vllm/v1/worker/gpu_worker.py", line 781, in determine_available_memory',
            '  File ".../vllm/v1/core/kv_cache_utils.py", line 1030, in _check_enough_kv_cache_memory',
        ], plan.verdict.message)
    for engine in _engines(cfg):
        log.info(engine, "kv_cache_utils.py:2327",
                 f"GPU KV cache size: {cap.kv_tokens:,} tokens, Maximum concurrency for {cfg.max_model_len:,} "
                 f"tokens per request: {cap.max_concurrency(cfg.max_model_len):.2f}x")
    hang = plan.truth.failure(cfg, "hang")
    crash = plan.truth.failure(cfg, "crash_at_start")
    sizes = len(cfg.capture_sizes)
    capture_s = 0.0
    for kind, mode in _graph_kinds(cfg):
        hang_here = hang is not None and (kind.startswith("mixed") or len(_graph_kinds(cfg)) == 1)
        for done in (0, sizes // 3, 2 * sizes // 3, sizes):
            log.plain(lead, f"Capturing CUDA graphs ({kind}, {mode}): {100 * done // max(1, sizes):3d}%|"
                            f"{_bar(done, sizes)}| {done}/{sizes}")
            if hang_here and done >= sizes // 3:
                await _hang(log, _engines(cfg)[0], sleep_v)
            if crash is not None and done >= sizes // 3:
                return _fail(log, plan, lead, [
                    '  File ".../vllm/v1/worker/gpu_model_runner.py", line 6650, in capture_model',
                ], "RuntimeError: CUDA error: an illegal memory access was encountered")
            if done < sizes:
                await sleep_v(CAPTURE_S_PER_SIZE * sizes / 3)
        capture_s += CAPTURE_S_PER_SIZE * sizes
    if hang is not None and not _graph_kinds(cfg):
        await _hang(log, _engines(cfg)[0], sleep_v)
    if _graph_kinds(cfg):
        log.info(lead, "gpu_model_runner.py:6582",
                 f"Graph capturing finished in {capture_s:.0f} secs, took {0.5 + sizes / 1024:.2f} GiB")
    for engine in _engines(cfg):
        log.info(engine, "core.py:402", "init engine (profile, create kv cache, warmup model) took "
                                        f"{PROFILE_S + capture_s + (0 if cfg.eager else COMPILE_S):.2f} s")
    log.info(api, "entry.py:136", "Supported tasks: ['generate']")
    return None


async def _hang(log: VllmLog, engine: str, sleep_v: Sleep) -> None:
    while True:
        await sleep_v(HEARTBEAT_S)
        log.info(engine, "shm_broadcast.py:705", (
            "No available shared memory broadcast block found in 60 seconds. This typically happens when some "
            "processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache "
            "quantization)."))
