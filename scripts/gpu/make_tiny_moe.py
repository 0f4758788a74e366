#!/usr/bin/env python3
"""Generate the tiny Qwen3-MoE that the H200 evidence study serves (random bf16 weights, no hub).

The tokenizer is the demo model's (``tuner.demo_model``: byte-level BPE trained on Python's
stdlib, ~4.1 k tokens), so the same prompts work on the CPU build and here. The model is a
Qwen3-MoE sized so that TP2, DP2 and expert parallelism over 2 GPUs all divide evenly:
12 query heads / 4 KV heads, 48 experts (24 per rank under EP), top-4 routing.

    python3 scripts/gpu/make_tiny_moe.py OUT_DIR [--layers 6] [--experts 48] [--keep-demo DIR]

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--experts", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--moe-intermediate", type=int, default=384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-demo", type=Path, help="also copy the demo Llama (tokenizer source) here")
    args = parser.parse_args()

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
        num_hidden_layers=args.layers, num_attention_heads=12, num_key_value_heads=4, head_dim=64,
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
    info = {"architecture": "Qwen3MoeForCausalLM", "parameters": params, "layers": args.layers,
            "hidden_size": args.hidden, "experts": args.experts, "experts_per_token": args.top_k,
            "moe_intermediate_size": args.moe_intermediate, "vocab_size": len(tokenizer),
            "weights": f"random (seed {args.seed}), bf16", "built_on": device,
            "build_s": round(time.monotonic() - started, 1),
            "transformers": transformers.__version__, "torch": torch.__version__}
    (args.out / "tiny-moe.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
