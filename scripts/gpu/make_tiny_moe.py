#!/usr/bin/env python3
"""Generate the small Qwen3-MoE that the H200 evidence studies serve (random bf16 weights, no hub).

The tokenizer is the demo model's (``tuner.demo_model``: byte-level BPE trained on Python's
stdlib, ~4.1 k tokens), so the same prompts work on the CPU build and here. Two presets:

- ``h200x2`` (2026-11-30, ``docs/evidence/h200.md``): 0.27 B parameters, 6 layers, hidden 768,
  12 query / 4 KV heads of 64, 48 experts top-4: TP2, DP2 and EP over 2 GPUs divide evenly. Its KV
  cache is 6 KiB a token, so an H200 holds 20 M tokens of it and no load fills it (0.18 % was seen).
- ``h200x1`` (issue 16): 0.72 B parameters, 12 layers, hidden 1024, 16 query and 16 KV heads of 128
  (no grouping), 32 experts top-4 (MoE width 512). Its KV cache is 96 KiB a token (12 layers × K,V ×
  16 heads × 128 × 2 bytes), so one H200 at ``gpu-memory-utilization`` 0.9 holds about 1.3 M tokens:
  1,024 requests of 1,536 + 64 tokens fill it, and 0.25 fills at about 200. 1.4 GB of weights,
  generated, written and loaded in seconds; 12 layers keep compilation and CUDA-graph capture short.

    python3 scripts/gpu/make_tiny_moe.py OUT_DIR [--preset h200x1] [--layers N ...] [--keep-demo DIR]

Weights are drawn on the GPU when there is one (seconds), else on the CPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
PRESETS = {
    "h200x2": {"layers": 6, "hidden": 768, "heads": 12, "kv_heads": 4, "head_dim": 64, "experts": 48, "top_k": 4,
               "moe_intermediate": 384},
    "h200x1": {"layers": 12, "hidden": 1024, "heads": 16, "kv_heads": 16, "head_dim": 128, "experts": 32,
               "top_k": 4, "moe_intermediate": 512},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200x2")
    for name in ("layers", "hidden", "heads", "kv-heads", "head-dim", "experts", "top-k", "moe-intermediate"):
        parser.add_argument(f"--{name}", type=int, help="overrides the preset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-demo", type=Path, help="also copy the demo Llama (tokenizer source) here")
    args = parser.parse_args()
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    import torch
    import transformers

    from tuner.demo_model import build_demo_model

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        demo = build_demo_model(Path(tmp) / "demo", seed=args.seed)
        tokenizer = transformers.AutoTokenizer.from_pretrained(demo)
        args.out.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            if (demo / name).is_file():
                shutil.copy2(demo / name, args.out / name)
        if args.keep_demo is not None:
            shutil.copytree(demo, args.keep_demo, dirs_exist_ok=True)

    config = transformers.Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=4096, num_experts=args.experts, num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.moe_intermediate, decoder_sparse_step=1, norm_topk_prob=True,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id, dtype="bfloat16",
    )
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out)
    params = int(sum(p.numel() for p in model.parameters()))
    kv_bytes = args.layers * 2 * args.kv_heads * args.head_dim * 2
    info = {"architecture": "Qwen3MoeForCausalLM", "preset": args.preset, "parameters": params, "layers": args.layers,
            "hidden_size": args.hidden, "attention_heads": args.heads, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "kv_cache_bytes_per_token_bf16": kv_bytes,
            "experts": args.experts, "experts_per_token": args.top_k,
            "moe_intermediate_size": args.moe_intermediate, "vocab_size": len(tokenizer),
            "weights": f"random (seed {args.seed}), bf16", "built_on": device,
            "build_s": round(time.monotonic() - started, 1),
            "transformers": transformers.__version__, "torch": torch.__version__}
    (args.out / "tiny-moe.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
