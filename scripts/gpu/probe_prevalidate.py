#!/usr/bin/env python3
"""Does the tool's pre-launch validator (``tuner.engines.vllm.validate``) work against this vLLM?

Checks the h200x1-tiny profile's baselines (legal) and three illegal launches of the model in
MODEL_DIR, with the validator as it is (no aliasing: it reads vLLM 0.26's ``openai.cli_args`` itself
since the 2026-11-30 fix), and says what each check cost, where it ran (a forked child) and whether
it initialised CUDA there, and that the probe's own process never did.

    python3 scripts/gpu/probe_prevalidate.py MODEL_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuner.engines.vllm import VllmEngine  # noqa: E402
from tuner.engines.vllm import validate as vllm_validate  # noqa: E402
from tuner.search.profile import load_profile  # noqa: E402
from tuner.search.space import build_config  # noqa: E402

BAD = {
    "unknown compilation key": {"compilation-config": {"no_such_key": 1}},
    "unknown moe backend": {"moe-backend": "no_such_backend"},
    "unknown speculative key": {"speculative-config": {"method": "ngram", "num_speculative_tokens": 2,
                                                       "no_such_key": 1}},
    "context above the model's": {"max-model-len": 10**7},
}


def _check(label: str, options: dict[str, object]) -> list[str]:
    started = time.monotonic()
    problems = vllm_validate.validate_options(options)
    check = vllm_validate.LAST_CHECK[0] if vllm_validate.LAST_CHECK else None
    where = ("child" if check.isolated else "tuner") if check else "-"
    cuda = check.cuda_initialised if check else None
    verdict = "accepted" if not problems else "refused: " + "; ".join(problems)[:300]
    print(f"[{label}] {verdict} ({time.monotonic() - started:.1f} s; ran in the {where}; CUDA initialised "
          f"there: {cuda}{'; unavailable: ' + check.unavailable if check and check.unavailable else ''})",
          flush=True)
    return problems


def main() -> int:
    model = sys.argv[1]
    started = time.monotonic()
    print(f"vllm importable and its parser builds: {vllm_validate.vllm_available()} "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    profile = load_profile("h200x1-tiny")
    engine = VllmEngine()
    legal_ok = True
    for base in profile.baselines:
        options = engine.serve_options(model, build_config(profile, base.values).args, host="127.0.0.1", port=8000)
        legal_ok &= not _check(base.name, options)
    missed = 0
    for name, extra in BAD.items():
        args = {**build_config(profile, profile.baselines[0].values).args, **extra}
        missed += not _check(name, engine.serve_options(model, args, host="127.0.0.1", port=8000))
    import torch

    print(f"CUDA initialised in this (the tuner's) process: {torch.cuda.is_initialized()}")
    print(f"verdict: legal launches {'all accepted' if legal_ok else 'REFUSED (a bug)'}; "
          f"illegal ones {'all refused' if not missed else f'{missed} MISSED'}")
    return 0 if legal_ok and not missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
