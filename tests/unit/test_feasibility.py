"""The DSV4 memory model against the reference texts' fit / no-fit cases and concurrencies."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.load.workload import Workload
from tuner.search.checkpoints import load_checkpoint
from tuner.search.feasibility import GB, GIB, check
from tuner.search.profile import bind_checkpoint, load_profile
from tuner.search.space import FixedParams, ServeConfig, build_config, suggest

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


# --- calibration on the node: vLLM's logged KV capacity replaces the blog's constant ----------------

GPU_LOG = """\
(EngineCore_DP0 pid=11) INFO 11-30 [kv_cache_utils.py:1087] GPU KV cache size: 1,412,608 tokens
(EngineCore_DP0 pid=11) INFO 11-30 [kv_cache_utils.py:1091] Maximum concurrency for 2,048 tokens per request: 689.75x
(EngineCore_DP1 pid=12) INFO 11-30 [kv_cache_utils.py:1087] GPU KV cache size: 1,409,024 tokens
"""


def test_the_kv_capacity_is_read_from_the_server_log() -> None:
    from tuner.engines.vllm.logs import kv_tokens_from_log

    assert kv_tokens_from_log(GPU_LOG) == 1_409_024  # the smallest engine under DP binds
    cpu = "INFO [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 1,024 ..."
    assert kv_tokens_from_log(cpu) == 1_048_576
    assert kv_tokens_from_log("INFO loading weights\n") is None


def test_a_fit_reproduces_the_observed_capacity() -> None:
    from tuner.search.feasibility import fit_kv_bytes_per_token

    profile, ckpt, config = _gh200("blog-dp4-ep")
    default = check(profile, config, ckpt, BLOG)
    observed = default.kv_tokens_per_rank * 2 // 3  # the node holds 2/3 of what the blog's constant predicts
    fitted = fit_kv_bytes_per_token(profile, ckpt, [(config.args, observed)])
    assert fitted is not None and fitted.trials == 1 and fitted.spread == 0 and fitted.trusted
    again = check(profile, config, ckpt, BLOG, fitted)
    assert abs(again.kv_tokens_per_rank - observed) <= 1
    assert fitted.describe() in again.notes
    # a launch the model thought could not fit says nothing about bytes per token
    no_ep = ServeConfig(args={k: v for k, v in config.args.items() if k != "enable-expert-parallel"})
    assert fit_kv_bytes_per_token(profile, ckpt, [(no_ep.args, 1000)]) is None


def test_prelaunch_learns_from_a_launch_and_prunes_by_the_fit() -> None:
    """A configuration the blog's constant lets through is pruned once the node shows less KV."""
    from tuner.objective import load_objective
    from tuner.search.prelaunch import PreLaunch

    profile, ckpt, config = _gh200("blog-dp4-ep")
    objective = load_objective("throughput")
    long_ctx = ServeConfig(args={**config.args, "max-model-len": 1_200_000})
    checks = PreLaunch(profile, ckpt, objective, "off")
    ctx: Any = None  # prevalidation is off, so the context is not read
    assert checks.check(long_ctx, ctx) is None  # 1.41 M tokens per rank by default
    checks.observe(config.args, 1_000_000)  # what vLLM logged on this node: 1.41x the prior's bytes/token
    refusal = checks.check(long_ctx, ctx)
    assert refusal is not None and refusal.failure_class == "infeasible" and refusal.rule == "kv_capacity"
    assert "fitted to 1 launched trial" in refusal.reason and "less than max-model-len" in refusal.reason
    assert refusal.evidence["kv_bytes_per_token_fp8"] == checks.calibration.base  # type: ignore[union-attr]
    checks.observe(config.args, None)  # a trial that never got ready teaches nothing
    assert checks.calibration is not None and checks.calibration.trials == 1


def test_a_refit_far_from_the_prior_prunes_only_once_launches_agree() -> None:
    """Finding 5 of issue 14: one launch that logged a tenth of the KV the model expects must not make every
    point infeasible. Beyond REFIT_FACTOR of the prior, the fit prunes only once REFIT_AGREEING launches agree;
    until then pruning uses the prior (a doubtful fit may widen what fits, never narrow it)."""
    from tuner.objective import load_objective
    from tuner.search.feasibility import REFIT_AGREEING, REFIT_FACTOR
    from tuner.search.prelaunch import PreLaunch

    profile, ckpt, config = _gh200("blog-dp4-ep")
    long_ctx = ServeConfig(args={**config.args, "max-model-len": 1_000_000})
    checks = PreLaunch(profile, ckpt, load_objective("throughput"), "off")
    ctx: Any = None
    assert REFIT_FACTOR == 2.0 and REFIT_AGREEING == 2
    checks.observe(config.args, 141_000, trial=0)  # 10x fewer tokens than the prior predicts
    fit = checks.calibration
    assert fit is not None and fit.ratio > 9 and not fit.trusted and fit.pruning_base == fit.prior
    assert checks.check(long_ctx, ctx) is None  # still judged by the prior
    assert "prunes only once 2 launches agree" in fit.describe()
    # a second launch of another configuration that disagrees (3x off the first) does not make it trusted
    other = ServeConfig(args={**config.args, "gpu-memory-utilization": 0.92})
    disagreeing = check(profile, other, ckpt, BLOG).kv_tokens_per_rank // 3
    checks.observe(other.args, disagreeing, trial=1)
    assert checks.calibration is not None and not checks.calibration.trusted
    assert checks.check(long_ctx, ctx) is None
    # a third launch agreeing with the first: two agree, so the fit prunes, and says what it rests on
    checks.observe(config.args, 141_500, trial=2)
    assert checks.calibration is not None and checks.calibration.trusted and checks.calibration.agreeing == 2
    refusal = checks.check(long_ctx, ctx)
    assert refusal is not None and refusal.rule == "kv_capacity" and "2 agreeing" in refusal.reason
    assert refusal.evidence["kv_fit_trusted"] is True
    # a fit that says the node holds MORE than the prior widens at once (it cannot prune more)
    wide = PreLaunch(profile, ckpt, load_objective("throughput"), "off")
    wide.observe(config.args, 14_100_000, trial=0)
    assert wide.calibration is not None and not wide.calibration.trusted
    assert wide.calibration.pruning_base == wide.calibration.base < wide.calibration.prior
