"""The dossier's 4P + 4D layout on the emulated h200x8 node (issue 27): two emulated servers and vllm-router, one trial.

The same group launch a real node gets: the prefill member and the decode member (each ``python -m
tuner.engines.emulated serve`` with its own topology and ``--kv-transfer-config``), the router in front, a short
load through it; the decode member pulls each prompt's KV (NIXL's ``kv_transfer_params`` round trip through the
router) and its ``/metrics`` says so. No vLLM server is started (the emulator imports vLLM's parser only).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.engines.emulated.engine import DEFAULT_COMMAND, EmulatedEngine
from tuner.engines.process import PID_FILE, port_is_free
from tuner.load.units import Units
from tuner.objective import Objective
from tuner.search import bind_checkpoint, build_config, load_checkpoint, load_profile
from tuner.trial import TrialContext, run_trial

pytestmark = [pytest.mark.slow]

UNITS = Units(time_scale=20.0, startup_time_scale=200.0, multiplicity=4, process_start_s=45.0)
OBJECTIVE = {
    "name": "pd-short", "description": "a short load of long prompts", "direction": "maximize",
    "metric": "output_throughput", "slos": {"p95_ttft_ms": 600000}, "max_failed_fraction": 0.0, "guards": [],
    "workload": {"kind": "random", "input_len": 16384, "output_len": 64, "range_ratio": 0.5, "num_prompts": 16,
                 "concurrency": 8, "warmup_prompts": 0, "seed": 0}}


def test_the_4p4d_layout_serves_through_the_router_and_its_pools_report_apart(tmp_path: Path) -> None:
    profile = bind_checkpoint(load_profile("h200x8"), load_checkpoint("0731"))
    values = next(b.values for b in profile.baselines if b.name == "pd-4p4d")
    config = build_config(profile, dict(values))
    assert config.disaggregation is not None
    shorter = {"max-model-len": 65536}  # a quicker emulated start than the profile's 131k context
    launch = replace(config.disaggregation, members=tuple(replace(m, args={**m.args, **shorter})
                                                          for m in config.disaggregation.members))
    config = replace(config, args={**config.args, **shorter}, disaggregation=launch)
    engine = EmulatedEngine(units=UNITS, hardware="h200x8", checkpoint="0731")
    ctx = TrialContext(server_cmd=engine.resolve_command(DEFAULT_COMMAND), model=profile.server.model or "",
                       engine=engine, objective=Objective.model_validate(OBJECTIVE), vocab_size=129280,
                       served_model_name="dsv4", ready_timeout_s=UNITS.client_startup_seconds(3600),
                       startup_stall_s=UNITS.client_stall_seconds(600))
    tdir = tmp_path / "trials" / "0000"
    outcome = run_trial(ctx, config, tdir)
    assert outcome.ok and outcome.feasible, outcome.reason
    metrics = json.loads((tdir / "server_metrics.json").read_text())
    transfer = metrics["transfer"]
    assert transfer["transfers"] > 0 and transfer["failed_transfers"] == 0 and transfer["p50_transfer_ms"] > 0
    prefill, decode = metrics["pools"]["prefill"]["facts"], metrics["pools"]["decode"]["facts"]
    # the prefill pool emits one token a request, the decode pool the rest; both saw every prompt
    assert decode["generation_tokens"] > 10 * prefill["generation_tokens"] > 0
    assert transfer["external_prefix_cache_hits"] > 0.9 * decode["prompt_tokens"]
    assert outcome.summary["ttft_by_context"] and "p95_prefill_queue_ms" in outcome.summary
    command = json.loads((tdir / "command.json").read_text())
    assert set(command["group"]) == {"prefill-0", "decode-0", "router"}
    for name, member in command["group"].items():
        assert not (tdir / name / PID_FILE).exists()
        assert port_is_free("127.0.0.1", int(member["port"]))
