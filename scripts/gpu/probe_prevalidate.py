#!/usr/bin/env python3
"""Does the tool's pre-launch validator (``tuner.engines.vllm.validate``) work against this vLLM?

Checks a legal launch of the tiny MoE and three illegal ones, first with the tool as it is, then
with vLLM 0.26's module path for the serve parser (``vllm.entrypoints.openai.cli_args``) aliased
under the 0.32 name the tool imports. Writes ``auto`` or ``off`` to ``$STAGE/prevalidate.mode``:
``auto`` only when the stock validator accepts the legal launch.

    python3 scripts/gpu/probe_prevalidate.py MODEL_DIR
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuner.engines.vllm import validate as vllm_validate  # noqa: E402

GOOD = {"tensor-parallel-size": 2, "max-num-seqs": 256, "max-num-batched-tokens": 8192, "max-model-len": 2048,
        "gpu-memory-utilization": 0.6, "kv-cache-dtype": "fp8", "moe-backend": "triton", "enforce-eager": False,
        "compilation-config": {"max_cudagraph_capture_size": 256},
        "speculative-config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3,
                               "prompt_lookup_min": 2}}
BAD = {
    "unknown compilation key": {**GOOD, "compilation-config": {"no_such_key": 1}},
    "unknown moe backend": {**GOOD, "moe-backend": "no_such_backend"},
    "unknown speculative key": {**GOOD, "speculative-config": {"method": "ngram", "num_speculative_tokens": 2,
                                                               "no_such_key": 1}},
}


def check(label: str, model: str) -> bool:
    started = time.monotonic()
    good = vllm_validate.validate_options({"model": model, **GOOD})
    print(f"[{label}] legal launch: {'accepted' if not good else 'REFUSED: ' + '; '.join(good)} "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    for name, opts in BAD.items():
        problems = vllm_validate.validate_options({"model": model, **opts})
        print(f"[{label}] {name}: {'refused: ' + '; '.join(problems)[:300] if problems else 'ACCEPTED (missed)'}",
              flush=True)
    return not good


def main() -> int:
    model = sys.argv[1]
    started = time.monotonic()
    print(f"vllm importable: {vllm_validate.vllm_available()} ({time.monotonic() - started:.1f} s)", flush=True)
    stock_ok = check("stock", model)
    try:
        importlib.import_module("vllm.entrypoints.launchers.cli_args")
        print("vllm.entrypoints.launchers.cli_args exists here; no alias needed")
    except ModuleNotFoundError:
        pkg = types.ModuleType("vllm.entrypoints.launchers")
        pkg.__path__ = []
        sys.modules["vllm.entrypoints.launchers"] = pkg
        sys.modules["vllm.entrypoints.launchers.cli_args"] = importlib.import_module("vllm.entrypoints.openai.cli_args")
        vllm_validate._parser.cache_clear()
        check("0.26 path aliased", model)
    import torch

    print(f"CUDA initialised in the tuner process by validation: {torch.cuda.is_initialized()}")
    mode = "auto" if stock_ok else "off"
    stage = Path(os.environ.get("STAGE", "/root/stage"))
    (stage / "prevalidate.mode").write_text(mode + "\n", encoding="utf-8")
    print(f"study will use --prevalidate {mode}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
