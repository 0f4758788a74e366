"""The DSV4 memory model against the reference texts' fit / no-fit cases and concurrencies."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.checkpoints import load_checkpoint
from tuner.feasibility import GB, GIB, check
from tuner.space import FixedParams, ServeConfig, bind_checkpoint, build_config, load_profile, suggest
from tuner.workload import Workload

BLOG = Workload(input_len=1024, output_len=1024)


def _gh200(baseline: str, ckpt: str = "preview") -> tuple[Any, Any, ServeConfig]:
    checkpoint = load_checkpoint(ckpt)
    profile = bind_checkpoint(load_profile("gh200x4"), checkpoint)
    values = next(b.values for b in profile.baselines if b.name == baseline)
    return profile, checkpoint, build_config(profile, values)


def test_weights_are_160_to_167_gb() -> None:
    for name in ("0731", "preview", "w4a16-fp8-mtp"):
        assert 159 <= load_checkpoint(name).size_gb <= 167


def test_replicated_without_ep_does_not_fit_on_96gb() -> None:
    profile, ckpt, config = _gh200("blog-dp4-ep")
    args = {k: v for k, v in config.args.items() if k != "enable-expert-parallel"}
    verdict = check(profile, ServeConfig(args=args), ckpt, BLOG)
    assert not verdict.ok
    assert verdict.reason.startswith("does not fit")
    assert verdict.memory.weights_bytes > 96 * GIB


def test_dp4_ep_fits_on_96gb_near_the_blog_knee() -> None:
    profile, ckpt, config = _gh200("blog-dp4-ep")
    verdict = check(profile, config, ckpt, BLOG)
    assert verdict.ok, verdict.reason
    assert verdict.topology.dp == 4 and verdict.topology.ep
    # blog: 12,802 tok/s at c2752 = the KV knee with 1024 seqs allowed per rank
    assert abs(verdict.max_concurrency - 2752) / 2752 < 0.05
    assert verdict.kv_tokens_total == 4 * verdict.kv_tokens_per_rank


def test_tp4_replicates_kv_and_saturates_below_2048() -> None:
    profile, ckpt, config = _gh200("blog-tp4")
    verdict = check(profile, config, ckpt, BLOG)
    assert verdict.ok
    assert verdict.kv_tokens_total == verdict.kv_tokens_per_rank  # one replica: KV copied on 4 ranks
    # blog: at c2048 "the KV cache pinned at 100%" -> capacity below 2048 full-length requests
    assert verdict.max_concurrency < 2048
    dp_profile, dp_ckpt, dp_config = _gh200("blog-dp4-ep")
    dp = check(dp_profile, dp_config, dp_ckpt, BLOG)
    assert dp.max_concurrency > 2 * verdict.max_concurrency  # DP attention: 2.2x throughput story


def test_experts_shard_over_ep_and_slice_over_tp() -> None:
    profile, ckpt, config = _gh200("blog-dp4-ep")
    dp_ep = check(profile, config, ckpt, BLOG).memory
    tp4 = check(profile, build_config(profile, {"topology": "tp4"}), ckpt, BLOG).memory
    assert dp_ep.routed_experts_bytes == pytest.approx(ckpt.routed_experts_gb * GB / 4, rel=1e-6)
    assert tp4.routed_experts_bytes == dp_ep.routed_experts_bytes
    assert dp_ep.non_expert_bytes == pytest.approx(4 * tp4.non_expert_bytes, rel=1e-6)


def test_model_card_topologies_fit() -> None:
    ckpt = load_checkpoint("w4a16-fp8-mtp")
    short = Workload(input_len=256, output_len=256)
    h200 = bind_checkpoint(load_profile("h200x8"), ckpt)
    card = next(b for b in h200.baselines if b.name == "model-card-tp2x4")
    assert check(h200, build_config(h200, card.values), ckpt, short).ok
    rtx = bind_checkpoint(load_profile("rtxpro6000x8"), ckpt)
    card = next(b for b in rtx.baselines if b.name == "model-card-tp2x4")
    assert check(rtx, build_config(rtx, card.values), ckpt, short).ok


def test_draft_weights_count_only_when_drafting() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("h200x8"), ckpt)
    off = check(profile, suggest(profile, FixedParams({"speculative.draft_tokens": 0})), ckpt, BLOG)
    on = check(profile, suggest(profile, FixedParams({"speculative.draft_tokens": 7})), ckpt, BLOG)
    assert off.memory.draft_bytes == 0 and on.memory.draft_bytes > 0
    assert on.kv_tokens_per_rank < off.kv_tokens_per_rank


def test_wrong_draft_method_and_hopper_cap_are_rejected() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("h200x8"), ckpt)
    config = suggest(profile, FixedParams({}))
    args = {**config.args, "speculative-config": {"method": "mtp", "num_speculative_tokens": 2}}
    verdict = check(profile, ServeConfig(args=args), ckpt, BLOG)
    assert not verdict.ok
    assert "carries dspark, not mtp" in verdict.reason
    assert "at most 1 draft" in verdict.reason


def test_ep_only_backend_without_ep_is_rejected() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("b200x8"), ckpt)
    bad = suggest(profile, FixedParams({"topology": "tp8", "moe-backend": "flashinfer_moe_ep_mega_deep_gemm"}))
    good = suggest(profile, FixedParams({"topology": "dp8-ep", "moe-backend": "flashinfer_moe_ep_mega_deep_gemm"}))
    assert "needs expert parallelism" in check(profile, bad, ckpt, BLOG).reason
    assert check(profile, good, ckpt, BLOG).ok


def test_chunked_prefill_rule_and_capture_rounding() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("mi325x1"), ckpt)
    short = Workload(input_len=1024, output_len=1024)
    off_small = suggest(profile, FixedParams({"enable-chunked-prefill": False, "max-num-batched-tokens": 256}))
    off_big = suggest(profile, FixedParams({"enable-chunked-prefill": False, "max-num-batched-tokens": 4096}))
    assert "chunked prefill off" in check(profile, off_small, ckpt, short).reason
    assert check(profile, off_big, ckpt, short).ok
    config = suggest(profile, FixedParams({"speculative.draft_tokens": 3}))
    args = {**config.args, "compilation-config": {"max_cudagraph_capture_size": 30}}
    assert "multiples of 1+k=4" in check(profile, ServeConfig(args=args), ckpt, short).reason


def test_workload_longer_than_context_is_rejected() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("mi325x1"), ckpt)
    verdict = check(profile, suggest(profile, FixedParams({})), ckpt, Workload(input_len=4000, output_len=1000))
    assert not verdict.ok and "max-model-len" in verdict.reason


def test_h100_tp2_dp4_without_ep_does_not_fit() -> None:
    ckpt = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("h100x8"), ckpt)
    args = {**suggest(profile, FixedParams({})).args, "tensor-parallel-size": 2, "data-parallel-size": 4}
    args.pop("enable-expert-parallel", None)
    assert not check(profile, ServeConfig(args=args), ckpt, BLOG).ok
