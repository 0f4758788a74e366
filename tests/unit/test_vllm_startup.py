# ruff: noqa: E501  (log lines are quoted as vLLM prints them)
"""Start-up phases read off vLLM's log: the real 2x H200 log of 2026-11-30 (vLLM 0.26, a compile that
missed the cache) and vLLM 0.26's own phrasings of a cache hit and a CUDA-graph capture."""

from __future__ import annotations

from pathlib import Path

from tuner.engines.vllm.startup import startup_phases

H200_LOG = Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200x2-tiny-gpu" / "trial-0000-server.log"

# vLLM 0.26's format strings (compilation/backends.py, v1/worker/gpu_model_runner.py, v1/engine/core.py,
# v1/core/kv_cache_utils.py) as a warm TP1 launch prints them.
WARM_TP1 = """\
(EngineCore pid=2211) INFO 12-02 01:10:03 [default_loader.py:431] Loading weights took 1.84 seconds
(EngineCore pid=2211) INFO 12-02 01:10:04 [gpu_model_runner.py:5348] Model loading took 2.56 GiB memory and 2.411200 seconds
(EngineCore pid=2211) INFO 12-02 01:10:07 [backends.py:1156] Dynamo bytecode transform time: 2.95 s
(EngineCore pid=2211) INFO 12-02 01:10:08 [backends.py:293] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.912 s
(EngineCore pid=2211) INFO 12-02 01:10:09 [monitor.py:53] torch.compile took 4.41 s in total
(EngineCore pid=2211) INFO 12-02 01:10:10 [kv_cache_utils.py:2177] GPU KV cache size: 1,302,528 tokens
(EngineCore pid=2211) INFO 12-02 01:10:10 [kv_cache_utils.py:2179] Maximum concurrency for 4,096 tokens per request: 318.00x
(EngineCore pid=2211) INFO 12-02 01:10:24 [gpu_model_runner.py:6845] Graph capturing finished in 14 secs, took 0.88 GiB
(EngineCore pid=2211) INFO 12-02 01:10:24 [core.py:341] init engine (profile, create kv cache, warmup model) took 19.73 s (compilation: 4.41 s)
"""


def test_the_cold_compile_on_the_h200_machine() -> None:
    phases = startup_phases(H200_LOG.read_text(errors="replace"))
    assert phases["compile_cache"] == "miss" and phases["inductor_compile_s"] == 11.49
    assert phases["torch_compile_s"] == 16.19 and phases["dynamo_s"] == 2.72
    assert phases["weights_load_s"] == 0.21 and phases["model_load_s"] == 0.58
    assert "graph_capture_s" not in phases  # it hung before the capture (docs/evidence/h200.md)


def test_a_warm_launch_loads_its_graphs_from_the_cache() -> None:
    phases = startup_phases(WARM_TP1)
    assert phases["compile_cache"] == "hit" and phases["cache_load_s"] == 0.912
    assert phases["inductor_compile_s"] == 0
    assert phases["graph_capture_s"] == 14 and phases["graph_memory_gib"] == 0.88
    assert phases["init_engine_s"] == 19.73 and phases["kv_cache_tokens"] == 1_302_528


def test_an_eager_launch_has_no_compile_and_no_capture() -> None:
    eager = "\n".join(line for line in WARM_TP1.splitlines()
                      if "compile" not in line and "Dynamo" not in line and "Graph capturing" not in line)
    phases = startup_phases(eager)
    assert "compile_cache" not in phases and "graph_capture_s" not in phases and "torch_compile_s" not in phases
    assert phases["model_load_s"] == 2.41


def test_both_compiled_and_loaded_ranges_are_mixed() -> None:
    text = WARM_TP1 + ("(EngineCore pid=2211) INFO 12-02 01:10:08 [backends.py:394] Compiling a graph for compile "
                       "range (8193, 16384) takes 6.02 s\n")
    assert startup_phases(text)["compile_cache"] == "mixed"


def test_the_compile_key_is_the_cache_folder_each_launch_used() -> None:
    # two launches with one key share their compiled graphs; the H200 run's four launches had four keys
    # because each got its own VLLM_API_KEY, which vLLM 0.26 hashes (tuner.store.study_api_key)
    line = ("(EngineCore pid=1062) INFO 12-02 01:16:39 [backends.py:1094] Using cache directory: "
            "/root/.cache/vllm/torch_compile_cache/b78477c0bd/rank_0_0/backbone for vLLM's torch.compile\n")
    assert startup_phases(line + WARM_TP1)["compile_key"] == "b78477c0bd"
    assert "compile_key" not in startup_phases(WARM_TP1)
