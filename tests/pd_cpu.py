"""A prefill/decode layout of two vLLM CPU servers (issue 27): the profile and one trial, shared by the server-lane
test (``tests/integration/test_pd_cpu.py``) and the connector measurement (``benchmarks/bench_pd_cpu.py``).

The profile is the CPU host as a two-"GPU" node: one server per pool, the shipped demo model with the DSV4
tokenizer and parsers (so the tool-call and reasoning gates can pass through the router), ``1p1d`` and
``1p1d-bad`` (a decode member with a block size the CPU build refuses).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.ci_parts import vllm_cli
from tests.cpu_server import vocab_size
from tuner.demo_model import write_demo_model
from tuner.guards import load_suite
from tuner.objective import load_objective
from tuner.search import build_config, load_profile
from tuner.search.profile import DISAGG_PARAM
from tuner.trial import TrialContext, TrialOutcome, run_trial

DSV4 = {"tokenizer-mode": "deepseek_v4", "reasoning-parser": "deepseek_v4", "tool-call-parser": "deepseek_v4",
        "enable-auto-tool-choice": True}
GATES = ("tool_call", "reasoning")


def write_profile(folder: Path, connector: str, env: Mapping[str, str] | None = None) -> Path:
    data: dict[str, Any] = {
        "name": "cpu-pd", "description": "two vLLM CPU servers as a prefill and a decode pool",
        "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 2,
                     "memory_per_device_gb": 1},
        "server": {"ready_timeout_s": 300, "fixed": {"max-model-len": 2048, "enforce-eager": True,
                                                      "dtype": "bfloat16", "block-size": 32, **DSV4},
                   "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}},
        "levers": {"enable-prefix-caching": {"choices": [False, True]}},
        "disaggregation": {"connector": connector, "router": "vllm-router", "aggregated": False, "layouts": {
            # the prefill budget holds every concurrent prompt whole: ExampleConnector saves a prompt's KV per
            # step, so a prompt prefilled in two chunks leaves a partial file the decode server dies on
            "1p1d": {"prefill": {"topology": "tp1", "max-num-seqs": 4, "max-num-batched-tokens": 8192},
                     "decode": {"topology": "tp1", "max-num-seqs": 8}},
            "1p1d-bad": {"prefill": {"topology": "tp1"}, "decode": {"topology": "tp1", "options": {"block-size": 16}}},
        }},
    }
    path = folder / f"cpu-pd-{connector}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_layout(root: Path, layout: str, *, connector: str = "ExampleConnector", env: Mapping[str, str] | None = None,
               trial: int = 0, prefix_caching: bool = False) -> tuple[TrialOutcome, Path]:
    """One trial of ``layout``: the demo model's two servers and the router, the DSV4 gates, the long-context
    objective's demo load. Returns the outcome and the trial's folder.

    Prefix caching is off unless asked (``benchmarks/bench_pd_cpu.py`` runs ExampleConnector both ways)."""
    cli = vllm_cli()
    assert cli is not None, "vLLM's CLI is not installed"
    model = write_demo_model(root / "demo")
    profile = load_profile(str(write_profile(root, connector, env)))
    objective = load_objective("long-context").at_scale("demo")
    ctx = TrialContext(server_cmd=[cli], model=str(model), objective=objective, ready_timeout_s=300,
                       served_model_name="demo", guards=load_suite(list(GATES)), vocab_size=vocab_size(model))
    config = build_config(profile, {DISAGG_PARAM: layout, "enable-prefix-caching": prefix_caching})
    tdir = root / connector / "trials" / f"{trial:04d}"
    return run_trial(ctx, config, tdir), tdir
