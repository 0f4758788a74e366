"""The emulated node's figures in docs/emulator.md, computed from the model itself (``tuner.engines.emulated``).

The calibration points are the reference texts' figures (``../shared/reference/``: the blog and the
W4A16-FP8-MTP model card), written here as constants with their source, beside what the emulator's
predictor (``predict``, the steady-state benchmark in virtual time) and step model (``step_time``) give
for the same launch and benchmark. ``tests/unit/test_emulated_perf.py`` holds the model to these
points within tolerances; this file keeps the figures the page prints.

    .venv/bin/python docs/evidence/emulator/measure.py      # writes calibration.json beside this file
                                                            # (about 25 s of CPU)

``tests/unit/test_evidence_data.py`` checks that the committed file is what the model says now, so the
tables in docs/emulator.md cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tuner.engines.emulated import BenchmarkShape, predict  # noqa: E402
from tuner.perfmodel import NOMINAL, EmulatedConfig, EngineBatch, architecture, node_model, step_time  # noqa: E402
from tuner.search import feasibility  # noqa: E402
from tuner.search.checkpoints import load_checkpoint  # noqa: E402
from tuner.search.profile import bind_checkpoint, load_profile  # noqa: E402
from tuner.search.space import build_config  # noqa: E402

OUT = HERE / "calibration.json"

# The blog's launches on gh200x4 (0731, fp8 KV, block 256), as tests/unit/test_emulated_perf.py has them.
BASE = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 128000, "max-num-batched-tokens": 8192}
TP4 = {**BASE, "tensor-parallel-size": 4, "enable-expert-parallel": True, "gpu-memory-utilization": 0.92,
       "max-num-seqs": 2048}
DP4 = {**BASE, "data-parallel-size": 4, "enable-expert-parallel": True, "gpu-memory-utilization": 0.95,
       "max-num-seqs": 1024, "compilation-config": {"max_cudagraph_capture_size": 1024}}
DP4_HUMMING = {**DP4, "moe-backend": "humming"}
# The model card's H200 throughput table: 8×H200, TP=2 per replica, bs=1, random 256/256.
CARD = {"kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 4096, "gpu-memory-utilization": 0.80,
        "enable-prefix-caching": False, "tensor-parallel-size": 2, "data-parallel-size": 4, "max-num-seqs": 256}
CARD_MTP = {**CARD, "speculative-config": {"method": "mtp", "num_speculative_tokens": 1}}

# The reference texts' figures (inputs, quoted from ../shared/reference/).
BLOG_TP4 = (5856.0, "blog: \"5,856 output tokens/second, 1,464 per GPU\" (TP4, c2048, KV cache pinned at 100%)")
BLOG_DP4 = (12802.0, "blog: \"12,802 output tokens/second at c2752, 3,201 per GPU\"")
BLOG_HUMMING_GAIN = (0.40, "blog: \"We speed up our DP attention baseline by about 40%\"")
BLOG_COMMS_MS = (10.8, "blog: \"Comms costs way more than it ought to: 10.8 ms\" (decode step, per rank, at c2048)")
CARD_TPOT_MS = ((8.93, 6.02), "model card: \"1.49× at bs=1, k=1 (TPOT 6.02 ms vs 8.93 ms, same artifact)\"")

# Uncalibrated profiles: their own baselines (and h200x8's recipe-dep with Humming), at the knee.
PROFILE_LAUNCHES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("h200x8", "recipe-tp8", {}),
    ("h200x8", "recipe-dep", {}),
    ("h200x8", "recipe-dep", {"moe-backend": "humming"}),
    ("h100x8", "recipe-dep", {}),
    ("b200x8", "recipe-dep", {}),
    ("gb300x4", "dossier-official", {}),
    ("rtxpro6000x8", "dossier-verified-tp8", {}),
)


def _pct(model: float, reference: float) -> float:
    return round(100.0 * (model / reference - 1.0), 1)


def _decode(seqs: int, context: int) -> EngineBatch:
    return EngineBatch(decode_seqs=seqs, decode_context_tokens=seqs * context,
                       decode_attended_tokens=seqs * min(context, architecture.ATTENTION_CONTEXT_CAP_TOKENS))


def blog_points() -> dict[str, Any]:
    gh200 = load_profile("gh200x4")
    ckpt = load_checkpoint("0731")
    tp4 = predict(gh200, TP4, BenchmarkShape(1024, 1024, 2048, 4096), checkpoint=ckpt)
    dp4 = predict(gh200, DP4, BenchmarkShape(1024, 1024, 2752, 5504), checkpoint=ckpt)
    humming = predict(gh200, DP4_HUMMING, BenchmarkShape(1024, 1024, 2752, 5504), checkpoint=ckpt)
    uncapped = predict(gh200, TP4, BenchmarkShape(1024, 1024, 2048, 4096), checkpoint=ckpt,
                       coefficients=dataclasses.replace(NOMINAL, frontend_token_s=0.0))
    # The blog's profile: steady-state decode at c2048, 512 sequences per DP rank, mid-output context.
    model = node_model(gh200, EmulatedConfig.from_options(DP4_HUMMING), ckpt, NOMINAL)
    comms_ms = step_time(model, [_decode(2048 // 4, 1024 + 1024 // 2)] * 4).comm_s * 1e3
    h200 = load_profile("h200x8")
    w4a16 = load_checkpoint("w4a16-fp8-mtp")
    plain = predict(h200, CARD, BenchmarkShape(256, 256, 1, 4), checkpoint=w4a16).tpot_mean_ms
    drafted = predict(h200, CARD_MTP, BenchmarkShape(256, 256, 1, 4), checkpoint=w4a16).tpot_mean_ms
    gain = humming.output_tok_s / dp4.output_tok_s - 1.0
    tp4_cfg = EmulatedConfig.from_options(TP4)
    points = [
        {"point": "TP4 + EP, util 0.92, 2048 seqs, c2048 (KV pinned at 100 %)", "unit": "output tok/s",
         "reference": BLOG_TP4[0], "source": BLOG_TP4[1], "model": round(tp4.output_tok_s),
         "difference_pct": _pct(tp4.output_tok_s, BLOG_TP4[0])},
        {"point": "DP4 + EP, util 0.95, 1024 seqs/rank, graphs to 1024, c2752", "unit": "output tok/s",
         "reference": BLOG_DP4[0], "source": BLOG_DP4[1], "model": round(dp4.output_tok_s),
         "difference_pct": _pct(dp4.output_tok_s, BLOG_DP4[0])},
        {"point": "DP4 + EP + Humming W4A8, c2752", "unit": "gain over DP4 + EP (%)",
         "reference": round(100 * BLOG_HUMMING_GAIN[0], 1), "source": BLOG_HUMMING_GAIN[1],
         "reference_output_tok_s": round(BLOG_DP4[0] * (1 + BLOG_HUMMING_GAIN[0]), -2),
         "model": round(100 * gain, 1), "model_output_tok_s": round(humming.output_tok_s),
         "difference_pct": round(100 * (gain - BLOG_HUMMING_GAIN[0]), 1)},
        {"point": "decode step, DP4 + EP + Humming, c2048: comms", "unit": "ms",
         "reference": BLOG_COMMS_MS[0], "source": BLOG_COMMS_MS[1], "model": round(comms_ms, 1),
         "difference_pct": _pct(comms_ms, BLOG_COMMS_MS[0])},
        {"point": "H200 TP2 × 4, W4A16-FP8-MTP, bs=1, TPOT without / with MTP k=1", "unit": "ms",
         "reference": list(CARD_TPOT_MS[0]), "source": CARD_TPOT_MS[1],
         "model": [round(plain, 2), round(drafted, 2)],
         "difference_pct": [_pct(plain, CARD_TPOT_MS[0][0]), _pct(drafted, CARD_TPOT_MS[0][1])]},
    ]
    tp4_detail = {"running_mean": round(tp4.running_mean), "max_concurrency": tp4.max_concurrency,
                  "preemptions": tp4.preemptions, "api_servers": tp4_cfg.api_servers,
                  "frontend_token_us": round(NOMINAL.frontend_token_s * 1e6, 3),
                  "api_server_cap_tok_s": round(tp4_cfg.api_servers / NOMINAL.frontend_token_s),
                  "output_tok_s_without_the_api_server_cost": round(uncapped.output_tok_s)}
    return {"points": points, "tp4": tp4_detail,
            "dp4": {"output_tok_s": round(dp4.output_tok_s), "max_concurrency": dp4.max_concurrency}}


MULTIPLICITIES = (1, 8, 64)
"""Virtual requests per stream for the granularity check on the DP4 + EP point (1: one request per stream)."""


def multiplicity_sweep() -> dict[str, Any]:
    gh200 = load_profile("gh200x4")
    ckpt = load_checkpoint("0731")
    rates = {m: predict(gh200, DP4, BenchmarkShape(1024, 1024, 2752, 5504), checkpoint=ckpt,
                        multiplicity=m).output_tok_s for m in MULTIPLICITIES}
    return {"point": "DP4 + EP, c2752", "output_tok_s": {str(m): round(r) for m, r in rates.items()},
            "max_deviation_pct": round(max(abs(100.0 * (r / rates[1] - 1.0)) for r in rates.values()), 1)}


def profile_launch(hw: str, baseline: str, change: dict[str, Any]) -> dict[str, Any]:
    profile = load_profile(hw)
    ckpt = load_checkpoint(profile.server.checkpoint)
    profile = bind_checkpoint(profile, ckpt)
    values = next(b.values for b in profile.baselines if b.name == baseline)
    options = {**build_config(profile, values).args, **change}
    cfg = EmulatedConfig.from_options(options)
    knee = predict(profile, options, BenchmarkShape(1024, 1024, 1, 1), checkpoint=ckpt).max_concurrency
    result = predict(profile, options, BenchmarkShape(1024, 1024, knee, 2 * knee), checkpoint=ckpt)
    gpus = profile.hardware.device_count
    return {"profile": hw, "baseline": baseline, "changed": change, "checkpoint": profile.server.checkpoint,
            "topology": cfg.topology_name, "moe_backend": cfg.moe_backend,
            "speculative": f"{cfg.spec_method} k={cfg.spec_tokens}" if cfg.speculative else None,
            "max_num_seqs": cfg.max_num_seqs, "concurrency": knee,
            "output_tok_s": round(result.output_tok_s), "per_gpu_tok_s": round(result.output_tok_s / gpus)}


def measure() -> dict[str, Any]:
    architecture_figures = {
        "routed_gflop_per_token": round(architecture.ROUTED_FLOPS_PER_TOKEN / 1e9, 1),
        "dense_gflop_per_token": round(architecture.DENSE_FLOPS_PER_TOKEN / 1e9, 1),
        "routed_active_params_b": round(
            architecture.ROUTED_PARAMS * architecture.EXPERTS_PER_TOKEN / architecture.ROUTED_EXPERTS / 1e9, 2),
        "kv_bytes_per_token_fp8": feasibility.KV_BYTES_PER_TOKEN_FP8,
    }
    return {"workload": "vllm bench serve random 1024/1024, 2 × concurrency prompts (the blog's)",
            "architecture": architecture_figures, "blog": blog_points(), "multiplicity": multiplicity_sweep(),
            "profiles": [profile_launch(*launch) for launch in PROFILE_LAUNCHES]}


def main() -> int:
    OUT.write_text(json.dumps(measure(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
