# ruff: noqa: E501  (log lines are quoted as captured)
"""Failure reading against log excerpts captured on the 2x H200 machine (vLLM 0.26.0, CUDA).

Source: the evidence study of docs/evidence/h200.md. Machine paths are shortened to ``…``; nothing
else is edited. Several of these reproduce bugs the GPU run showed (docs/evidence/h200.md, "Bugs
found"); they failed before the fixes and now guard against regressions.
"""

from __future__ import annotations

import sys

import pytest

from tuner.engines.vllm.logs import classify_startup_failure
from tuner.failures import FailureClass

# A TP2 launch with torch.compile + CUDA graphs that stalled after compilation (GPU memory flat at
# ~3 GB on both GPUs, SM use 0 % for 60 s) until dsv4-tune's 180 s ready timeout stopped it.
HUNG_TP2_COMPILE_TAIL = """\
(APIServer pid=1035) WARNING 11-30 00:49:59 [system_utils.py:299] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(Worker_TP0 pid=1550) Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]
(Worker_TP0 pid=1550) Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  5.04it/s]
(Worker_TP0 pid=1550) Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  5.03it/s]
(Worker_TP0 pid=1550)
(Worker_TP0 pid=1550) INFO 11-30 00:51:21 [default_loader.py:430] Loading weights took 0.21 seconds
(Worker_TP0 pid=1550) INFO 11-30 00:51:21 [unquantized.py:375] Using TritonExperts MoE backend
(Worker_TP0 pid=1550) INFO 11-30 00:51:22 [gpu_model_runner.py:5347] Model loading took 0.26 GiB memory and 0.578329 seconds
(Worker_TP0 pid=1550) INFO 11-30 00:51:25 [backends.py:1155] Dynamo bytecode transform time: 2.72 s
(Worker_TP0 pid=1550) INFO 11-30 00:51:25 [flashinfer_all_reduce.py:121] Auto-selected flashinfer allreduce backend: mnnvl
(Worker_TP0 pid=1550) …/torch/distributed/c10d_logger.py:83: UserWarning: barrier(): using the device under current context. You can specify `device_id` in `init_process_group` to mute this warning.
(Worker_TP0 pid=1550)   return func(*args, **kwargs)
[rank0]:[W1130 00:51:25.878518424 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank. This can cause a hang if rank to GPU mapping is heterogeneous. You can specify device_id in init_process_group()
(Worker_TP0 pid=1550) INFO 11-30 00:51:25 [flashinfer_all_reduce.py:170] Initialized FlashInfer Allreduce norm fusion workspace with backend=mnnvl
(Worker_TP0 pid=1550) INFO 11-30 00:51:33 [backends.py:378] Cache the graph of compile range (1, 8192) for later use
(Worker_TP0 pid=1550) INFO 11-30 00:51:37 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 11.49 s
(Worker_TP0 pid=1550) INFO 11-30 00:51:38 [monitor.py:53] torch.compile took 16.19 s in total
(EngineCore pid=1438) INFO 11-30 00:52:23 [shm_broadcast.py:705] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
"""

# What the tool's pre-launch validator said about a legal launch on that machine (vLLM 0.26 keeps
# its serve parser in vllm.entrypoints.openai.cli_args; the tool imports the 0.32 path).
VALIDATOR_ON_026 = "ModuleNotFoundError: No module named 'vllm.entrypoints.launchers'"


@pytest.mark.parametrize("returncode", [-9, -15, 1])
def test_hung_tp2_start_is_neither_oom_nor_bad_flag(returncode: int) -> None:
    """The WARNING about ``OSError: Too many open files`` and the torch warnings decide nothing."""
    diag = classify_startup_failure(HUNG_TP2_COMPILE_TAIL, returncode)
    assert diag.failure_class == FailureClass.CRASH


def test_rank_prefixed_torch_warning_is_not_the_reason() -> None:
    diag = classify_startup_failure(HUNG_TP2_COMPILE_TAIL, -9)
    assert "Guessing device ID" not in diag.reason


def test_timeout_reason_names_the_last_progress() -> None:
    from tuner.engines.vllm.logs import describe_stall

    text = describe_stall(HUNG_TP2_COMPILE_TAIL)
    # the last progress, not the worker's "No available shared memory broadcast block" (a silence, not a place)
    assert text == "torch.compile took 16.19 s in total"


@pytest.fixture
def vllm_026_layout(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The installed vLLM, rearranged as 0.26 has it: serve parser only at the openai path."""
    pytest.importorskip("vllm", reason="vLLM is not importable here")
    import importlib

    try:
        parser_module = importlib.import_module("vllm.entrypoints.launchers.cli_args")
    except ModuleNotFoundError:
        parser_module = importlib.import_module("vllm.entrypoints.openai.cli_args")
    from tuner.engines.vllm import validate as vllm_validate

    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers.cli_args", None)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers", None)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.cli_args", parser_module)
    vllm_validate._parser.cache_clear()
    yield vllm_validate
    vllm_validate._parser.cache_clear()


def test_validator_reads_the_026_serve_parser(vllm_026_layout) -> None:  # type: ignore[no-untyped-def]
    problems = vllm_026_layout.validate_options({"model": "some/hub-model", "max-num-seqs": 64,
                                                 "tensor-parallel-size": 2})
    assert problems == []


def test_auto_prevalidation_is_skipped_when_the_parser_cannot_be_built_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("vllm", reason="vLLM is not importable here")
    from tuner.engines import default_engine
    from tuner.engines.vllm import validate as vllm_validate
    from tuner.objective import load_objective
    from tuner.search.prelaunch import PreLaunch
    from tuner.search.profile import load_profile

    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers.cli_args", None)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.launchers", None)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.cli_args", None)
    monkeypatch.setattr(vllm_validate, "_REPORTED", set())
    vllm_validate._parser.cache_clear()
    caplog.set_level("WARNING", logger=vllm_validate.__name__)
    try:
        assert vllm_validate.vllm_available() is False
        checks = PreLaunch(load_profile("cpu"), None, load_objective("throughput"), "auto", default_engine())
        assert checks.validate is False
        assert checks.validation_note.startswith("OFF (--prevalidate auto)")
    finally:
        vllm_validate._parser.cache_clear()
    said = [r.getMessage() for r in caplog.records if "pre-launch checks off" in r.getMessage()]
    assert len(said) == 1, said  # once, though asked twice
    assert "serve argument parser (cli_args) was not found" in said[0] and "--prevalidate off" in said[0]
