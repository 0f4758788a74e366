"""The feasibility model's verdict on every case the reference texts state (docs/feasibility.md, "Calibration").

Each case is a hardware profile, a checkpoint of the catalog and one of the profile's baselines (the
configuration the reference text ran), sometimes changed as the text describes (expert parallelism
off). The model (``tuner.search.feasibility.check``) answers with its memory per rank, its KV capacity
and its maximum concurrency at the blog's workload (ISL + OSL 1024 + 1024). What the reference text
says is written beside each case here, from ``../shared/reference/`` (the dossier, the model card, the
blog), with its source.

    .venv/bin/python docs/evidence/feasibility/measure.py      # writes calibration.json beside this file

``tests/unit/test_feasibility.py`` checks that the committed file is what the model says now, so the
table in docs/feasibility.md cannot drift from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from tuner.objective import Workload  # noqa: E402
from tuner.search import feasibility  # noqa: E402
from tuner.search.checkpoints import load_checkpoint  # noqa: E402
from tuner.search.feasibility import GB, GIB, check  # noqa: E402
from tuner.search.profile import bind_checkpoint, load_profile  # noqa: E402
from tuner.search.space import ServeConfig, build_config  # noqa: E402

OUT = HERE / "calibration.json"
BLOG = Workload(input_len=1024, output_len=1024)

# name, profile, checkpoint, baseline, arguments changed (None: removed), what the reference says, source
Change = tuple[tuple[str, Any], ...]
NO_EP: Change = (("enable-expert-parallel", None),)
CASES: tuple[tuple[str, str, str, str, Change, str, str], ...] = (
    ("4×96 GB, DP4 without EP, replicated per GPU", "gh200x4", "preview", "blog-dp4-ep", NO_EP,
     "does not fit", "issue, blog"),
    ("4×96 GB, DP4 + EP, utilization 0.95, 1024 sequences per rank", "gh200x4", "preview", "blog-dp4-ep", (),
     "fits; KV knee at c2752 (688 per rank) at ISL+OSL 1024+1024", "blog"),
    ("4×96 GB, TP4 + EP, utilization 0.92, max-num-seqs 2048", "gh200x4", "preview", "blog-tp4", (),
     "fits; \"KV cache pinned at 100%\" at c2048", "blog"),
    ("8×H200, W4A16-MTP, TP2 × 4 replicas, utilization 0.80", "h200x8", "w4a16-fp8-mtp", "model-card-tp2x4", (),
     "runs", "model card"),
    ("8×RTX PRO 6000 96 GB, W4A16-MTP, TP2 × 4 replicas", "rtxpro6000x8", "w4a16-fp8-mtp", "model-card-tp2x4", (),
     "2 replicas fit on 4 GPUs", "model card"),
    ("4×GB300, DP4 + EP, 0731 with DSpark 7", "gb300x4", "0731", "dossier-official", (),
     "the documented starting point", "dossier"),
    ("8×B200, TP2 × DP4 + EP", "b200x8", "0731", "perf-eval-tp2-dp4-ep", (), "the pinned topology", "dossier"),
    ("1×MI325X, TP1, kv-cache-memory-bytes 1e10", "mi325x1", "0731", "dossier-rocm-validation", (),
     "validated", "dossier"),
    ("8×H100 80 GB, TP8", "h100x8", "0731", "dossier-tp8", (), "documented", "dossier"),
    ("8×H100 80 GB, TP2 × DP4 without EP", "h100x8", "0731", "recipe-dep",
     (("tensor-parallel-size", 2), ("data-parallel-size", 4), *NO_EP), "(not a documented layout)", "—"),
)


def _gib(value: float) -> float:
    return round(value / GIB, 1)


def case(name: str, hw: str, ckpt_name: str, baseline: str, change: Change, says: str,
         source: str) -> dict[str, Any]:
    checkpoint = load_checkpoint(ckpt_name)
    profile = bind_checkpoint(load_profile(hw), checkpoint)
    values = next(b.values for b in profile.baselines if b.name == baseline)
    config = build_config(profile, values)
    if change:
        args = {**config.args, **dict(change)}
        config = ServeConfig(args={k: v for k, v in args.items() if v is not None}, env=config.env)
    verdict = check(profile, config, checkpoint, BLOG)
    memory = verdict.memory
    return {"case": name, "profile": hw, "checkpoint": ckpt_name, "baseline": baseline,
            "changed": {k: v for k, v in change},
            "reference_says": says, "source": source, "fits": verdict.ok,
            "reason": verdict.reason.split(";")[0] if not verdict.ok else "",
            "dp": verdict.topology.dp, "tp": verdict.topology.tp, "ep": verdict.topology.ep,
            "weights_gib": _gib(memory.weights_bytes), "draft_gib": _gib(memory.draft_bytes),
            "usable_gib": _gib(memory.usable_bytes), "kv_gib_per_rank": _gib(memory.kv_bytes),
            "kv_tokens_per_rank": verdict.kv_tokens_per_rank, "kv_tokens_total": verdict.kv_tokens_total,
            "max_num_seqs": config.args.get("max-num-seqs"), "max_concurrency": verdict.max_concurrency}


def measure() -> dict[str, Any]:
    checkpoints = {name: {"size_gb": c.size_gb, "routed_experts_gb": c.routed_experts_gb, "draft_gb": c.draft_gb,
                          "non_expert_gb": round(c.non_expert_gb, 2)}
                   for name in ("0731", "preview", "w4a16-fp8-mtp", "nvfp4-fp8")
                   for c in [load_checkpoint(name)]}
    rows = [case(*c) for c in CASES]
    constants = {"kv_bytes_per_token_fp8": feasibility.KV_BYTES_PER_TOKEN_FP8,
                 "non_torch_gib": feasibility.NON_TORCH_BYTES / GIB,
                 "activation_kib_per_batched_token": feasibility.ACTIVATION_BYTES_PER_TOKEN / 1024,
                 "cudagraph_base_gib": feasibility.CUDAGRAPH_BASE_BYTES / GIB,
                 "cudagraph_mib_per_captured_token": feasibility.CUDAGRAPH_BYTES_PER_SIZE / (1 << 20),
                 "layers": feasibility.N_LAYERS, "logit_vocab": feasibility.VOCAB_SIZE}
    return {"workload": {"input_len": BLOG.input_len, "output_len": BLOG.output_len}, "gb": GB,
            "constants": constants, "checkpoints": checkpoints, "cases": rows}


def main() -> int:
    OUT.write_text(json.dumps(measure(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(HERE.parents[2])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
