"""The emulated node's performance model: the blog's calibration points, and the physics it must keep.

Calibration (``docs/emulator.md``): on gh200x4 at random ISL/OSL 1024/1024, ``2 × conc`` prompts, as
the blog ran ``vllm bench serve``: TP4 + EP 5,856 output tok/s at c2048 (KV cache full); DP4 + EP
12,802 at c2752; the Humming W4A8 MoE backend about +40% over DP4 + EP.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tuner.engines.emulated import BenchmarkShape, predict
from tuner.perfmodel import NOMINAL, EmulatedConfig, EngineBatch, capacity, node_model, perturbed, step_time
from tuner.search.checkpoints import load_checkpoint
from tuner.search.profile import HardwareProfile, load_profile

BASE = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 128000, "max-num-batched-tokens": 8192}
TP4 = {**BASE, "tensor-parallel-size": 4, "enable-expert-parallel": True, "gpu-memory-utilization": 0.92,
       "max-num-seqs": 2048}
DP4 = {**BASE, "data-parallel-size": 4, "enable-expert-parallel": True, "gpu-memory-utilization": 0.95,
       "max-num-seqs": 1024, "compilation-config": {"max_cudagraph_capture_size": 1024}}
DP4_HUMMING = {**DP4, "moe-backend": "humming"}


@pytest.fixture(scope="module")
def gh200() -> HardwareProfile:
    return load_profile("gh200x4")


@pytest.fixture(scope="module")
def blog(gh200: HardwareProfile) -> dict[str, float]:
    """The three blog runs, predicted once for the module (about a second each)."""
    ckpt = load_checkpoint("0731")
    return {
        "tp4": predict(gh200, TP4, BenchmarkShape(1024, 1024, 2048, 4096), checkpoint=ckpt).output_tok_s,
        "dp4": predict(gh200, DP4, BenchmarkShape(1024, 1024, 2752, 5504), checkpoint=ckpt).output_tok_s,
        "humming": predict(gh200, DP4_HUMMING, BenchmarkShape(1024, 1024, 2752, 5504), checkpoint=ckpt).output_tok_s,
    }


def test_tp4_reproduces_the_blogs_first_cut(blog: dict[str, float]) -> None:
    assert blog["tp4"] == pytest.approx(5856, rel=0.05)


def test_dp4_ep_reproduces_the_blogs_data_parallel_attention(blog: dict[str, float]) -> None:
    assert blog["dp4"] == pytest.approx(12802, rel=0.05)


def test_humming_gains_about_forty_percent_over_dp4(blog: dict[str, float]) -> None:
    assert blog["humming"] / blog["dp4"] == pytest.approx(1.40, abs=0.05)


def _model(profile: HardwareProfile, options: dict[str, Any], coefficients: Any = NOMINAL) -> Any:
    return node_model(profile, EmulatedConfig.from_options(options), load_checkpoint("0731"), coefficients)


def _decode(seqs: int, context: int = 1536) -> EngineBatch:
    return EngineBatch(decode_seqs=seqs, decode_context_tokens=seqs * context,
                       decode_attended_tokens=seqs * min(context, 2048))


def test_more_kv_memory_raises_the_knee(gh200: HardwareProfile) -> None:
    ckpt = load_checkpoint("0731")
    low = capacity(gh200, EmulatedConfig.from_options({**DP4, "gpu-memory-utilization": 0.88}), ckpt, NOMINAL)
    high = capacity(gh200, EmulatedConfig.from_options(DP4), ckpt, NOMINAL)
    assert high.kv_tokens > low.kv_tokens
    shape = BenchmarkShape(1024, 1024, 64, 64)
    assert predict(gh200, DP4, shape, checkpoint=ckpt).max_concurrency > \
        predict(gh200, {**DP4, "gpu-memory-utilization": 0.88}, shape, checkpoint=ckpt).max_concurrency


def test_tensor_parallelism_replicates_the_kv_cache(gh200: HardwareProfile) -> None:
    """One latent KV head: every TP rank holds the replica's whole cache, each DP rank its own."""
    ckpt = load_checkpoint("0731")
    tp4 = capacity(gh200, EmulatedConfig.from_options({**TP4, "gpu-memory-utilization": 0.95}), ckpt, NOMINAL)
    dp4 = capacity(gh200, EmulatedConfig.from_options(DP4), ckpt, NOMINAL)
    # Per rank TP4 has more room (DP4 replicates the attention weights, "claws back a little KV") ...
    assert dp4.kv_tokens < tp4.kv_tokens < 1.5 * dp4.kv_tokens
    # ... but TP4 has one cache for the node and DP4 four.
    shape = BenchmarkShape(1024, 1024, 64, 64)
    assert predict(gh200, DP4, shape, checkpoint=ckpt).max_concurrency > \
        2.5 * predict(gh200, {**TP4, "gpu-memory-utilization": 0.95}, shape, checkpoint=ckpt).max_concurrency


def test_fp8_kv_doubles_the_capacity_of_auto(gh200: HardwareProfile) -> None:
    ckpt = load_checkpoint("0731")
    fp8 = capacity(gh200, EmulatedConfig.from_options(DP4), ckpt, NOMINAL)
    auto = capacity(gh200, EmulatedConfig.from_options({**DP4, "kv-cache-dtype": "auto"}), ckpt, NOMINAL)
    assert fp8.kv_tokens / auto.kv_tokens == pytest.approx(2.0, rel=0.01)


def test_cuda_graphs_help_decode_at_small_batch(gh200: HardwareProfile) -> None:
    graphs = step_time(_model(gh200, DP4), [_decode(8)] * 4).total_s
    eager = step_time(_model(gh200, {**DP4, "enforce-eager": True}), [_decode(8)] * 4).total_s
    assert eager > 1.05 * graphs
    # A batch above the largest captured size runs eagerly either way.
    small_capture = _model(gh200, {**DP4, "compilation-config": {"max_cudagraph_capture_size": 64}})
    assert step_time(small_capture, [_decode(512)] * 4).kernels_s > step_time(_model(gh200, DP4),
                                                                             [_decode(512)] * 4).kernels_s


def _seconds_per_token(profile: HardwareProfile, options: dict[str, Any], seqs: int) -> float:
    model = _model(profile, options)
    k = model.config.spec_tokens
    alpha = NOMINAL.acceptance(model.config.spec_method) if k else 0.0
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if k else 1.0
    return step_time(model, [_decode(seqs)] * model.config.dp).total_s / (seqs * tokens)


def test_speculation_helps_at_low_batch_and_hurts_when_compute_bound(gh200: HardwareProfile) -> None:
    spec = {**DP4, "speculative-config": {"method": "dspark", "num_speculative_tokens": 3}}
    assert _seconds_per_token(gh200, spec, 1) < 0.8 * _seconds_per_token(gh200, DP4, 1)
    assert _seconds_per_token(gh200, spec, 600) > 1.1 * _seconds_per_token(gh200, DP4, 600)


def test_moe_is_compute_bound_past_the_blogs_critical_batch(gh200: HardwareProfile) -> None:
    """Blog: bf16 roofline ~146 FLOP/byte → critical batch ~1,300 (our count: ~1,600) over the EP group."""
    model = _model(gh200, DP4)
    small = step_time(model, [_decode(64)] * 4).moe_s
    large = step_time(model, [_decode(800)] * 4).moe_s
    assert large / small > 5  # memory-bound below, compute-bound above: time grows with the batch


def test_a_perturbed_node_differs_from_the_prior_and_is_reproducible() -> None:
    a, b, other = perturbed(7), perturbed(7), perturbed(8)
    assert a == b and a != other and a != NOMINAL
    for f in dataclasses.fields(NOMINAL):
        nominal = getattr(NOMINAL, f.name)
        if nominal:
            assert 0.69 <= getattr(a, f.name) / nominal <= 1.31, f.name


def test_a_dropped_backend_gain_makes_humming_no_faster_than_marlin(gh200: HardwareProfile) -> None:
    truth = perturbed(3, spread=0.0, drop_backend_gain="humming")
    batch = [_decode(700)] * 4
    humming = step_time(_model(gh200, DP4_HUMMING, truth), batch).moe_s
    marlin = step_time(_model(gh200, DP4, truth), batch).moe_s
    assert humming == pytest.approx(marlin, rel=0.02)
    assert step_time(_model(gh200, DP4_HUMMING), batch).moe_s < 0.8 * step_time(_model(gh200, DP4), batch).moe_s


def test_a_doubled_all2all_doubles_the_expert_parallel_communication(gh200: HardwareProfile) -> None:
    batch = [_decode(700)] * 4
    base = step_time(_model(gh200, DP4, perturbed(1, spread=0.0)), batch).comm_s
    doubled = step_time(_model(gh200, DP4, perturbed(1, spread=0.0, comm_factor={"all2all": 2.0})), batch).comm_s
    tp_only = step_time(_model(gh200, TP4, perturbed(1, spread=0.0, comm_factor={"all2all": 2.0})), [_decode(700)])
    assert doubled > 1.8 * base
    assert tp_only.comm_s == pytest.approx(step_time(_model(gh200, TP4, perturbed(1, spread=0.0)),
                                                     [_decode(700)]).comm_s)


def test_h200_decode_latency_at_batch_one_matches_the_w4a16_model_card() -> None:
    """Model card (8×H200, TP=2 per replica, bs=1, 256/256): TPOT 8.93 ms without MTP, 6.02 ms with MTP k=1."""
    profile = load_profile("h200x8")
    ckpt = load_checkpoint("w4a16-fp8-mtp")
    card = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 4096, "gpu-memory-utilization": 0.80,
            "enable-prefix-caching": False, "tensor-parallel-size": 2, "data-parallel-size": 4, "max-num-seqs": 256}
    mtp = {**card, "speculative-config": {"method": "mtp", "num_speculative_tokens": 1}}
    plain = predict(profile, card, BenchmarkShape(256, 256, 1, 4), checkpoint=ckpt).tpot_mean_ms
    drafted = predict(profile, mtp, BenchmarkShape(256, 256, 1, 4), checkpoint=ckpt).tpot_mean_ms
    assert plain == pytest.approx(8.93, rel=0.2)
    assert drafted == pytest.approx(6.02, rel=0.2)
    assert plain / drafted == pytest.approx(1.49, rel=0.15)


@pytest.mark.parametrize("hw", ["h200x8", "b200x8", "gb300x4", "h100x8", "rtxpro6000x8"])
def test_every_gpu_profiles_recipe_baselines_serve_a_sensible_throughput(hw: str) -> None:
    """Not calibrated points: sanity bounds (per GPU between 300 and 20,000 output tok/s at c512)."""
    profile = load_profile(hw)
    ckpt = load_checkpoint(profile.server.checkpoint)
    gpus = profile.hardware.device_count
    options = {**BASE, "max-model-len": 32768, "data-parallel-size": gpus, "enable-expert-parallel": True,
               "gpu-memory-utilization": 0.9, "max-num-seqs": 256}
    result = predict(profile, options, BenchmarkShape(1024, 1024, 512, 512), checkpoint=ckpt)
    assert 300 * gpus < result.output_tok_s < 20000 * gpus
    assert result.ttft_p50_ms > 0 and result.itl_p50_ms > 0
