"""Failures that cost minutes, not hours, and teach the model (issue 14, findings 6 and 7), on the emulated node.

The emulated DeepSeek-V4-Flash node on 4x GH200 (``--engine emulated``: tuner/engines/emulated,
docs/emulator.md) runs as a real server process, started by the real trial (``run_trial``: the process
helper, the watchdog, the health watch, the load generator) with vLLM's argv. Its truth tables plant
vLLM's failures:

- a hang in CUDA-graph capture with ``cudagraph_mode`` FULL and DP > 1 (finding 6): the watchdog ends the
  launch as ``hang`` with the capture bar as its last progress; a speculative twin of it is not launched;
- an out-of-memory under load at gpu-memory-utilization >= 0.97 (finding 7): the trial is a crash,
  ``oom``, whatever its SLOs say, and the feasibility model refuses the neighbourhood afterwards.

Node time runs faster here (the engine's ``Units``): the hardware profile's ready timeout and stall time
are node seconds, and become real seconds in one place (``Units.client_startup_seconds`` and
``Units.client_stall_seconds``, through
``Study.startup_limits_s``): divided by the start-up time scale, plus the real seconds the emulator's
process needs before its node clock starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner import catalog
from tuner.engines.emulated.engine import DEFAULT_COMMAND, EmulatedEngine
from tuner.load.units import Units
from tuner.objective import Objective
from tuner.search.checkpoints import load_checkpoint
from tuner.search.prelaunch import PreLaunch
from tuner.search.profile import load_profile
from tuner.search.space import ServeConfig, build_config
from tuner.study import PRUNED_LOG, Study, new_record
from tuner.study.confirm import ConfirmSpec
from tuner.trial import TrialContext, run_trial

MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"
NODE = {"time_scale": 20.0, "startup_time_scale": 60.0, "multiplicity": 64, "process_start_s": 45.0}
"""Start-up at 60x: the profile's 600 s stall is 10 node-scaled real s, the weight load's quarter steps ~1 s,
vLLM's broadcast heartbeat every 1 s; plus 45 real s the emulator's process may take before its first log record
(importing vLLM: 8 s on an idle 2-core machine, over 20 s on a loaded one)."""
UNITS = Units(**NODE)  # type: ignore[arg-type]
OBJECTIVE = {
    "name": "emulated-faults", "description": "a short load: enough batched tokens for the OOM rule to fire",
    "direction": "maximize", "metric": "output_throughput", "slos": {"p95_ttft_ms": 120000, "p95_itl_ms": 1000},
    "max_failed_fraction": 0.0, "guards": [],
    "workload": {"kind": "random", "input_len": 128, "output_len": 64, "num_prompts": 16, "concurrency": 8,
                 "warmup_prompts": 0, "seed": 0}}
"""At multiplicity 64, 8 streams are 512 node requests: their prompts fill 8,192-token steps, past the 4,096
batched tokens at which the truth's OOM rule fires."""


def _gh200(**changes: Any) -> ServeConfig:
    """The blog's DP4 + EP baseline on gh200x4, with ``changes`` to its arguments (32k context: a quicker start)."""
    profile = load_profile("gh200x4")
    base = build_config(profile, dict(profile.baselines[1].values))
    args = {**base.args, "max-model-len": 32768, **changes}
    return ServeConfig(args=args, env=dict(base.env), params=dict(base.params))


def _ctx(**kw: Any) -> TrialContext:
    profile = load_profile("gh200x4")
    engine = EmulatedEngine(units=UNITS, hardware="gh200x4")
    return TrialContext(server_cmd=engine.resolve_command(DEFAULT_COMMAND), model=MODEL, engine=engine,
                        objective=Objective.model_validate(OBJECTIVE), vocab_size=129280, served_model_name="dsv4",
                        ready_timeout_s=UNITS.client_startup_seconds(profile.server.ready_timeout_s),
                        startup_stall_s=UNITS.client_stall_seconds(profile.server.startup_stall_s or 0), **kw)


# -- finding 6: a start that hangs --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_hang_in_graph_capture_is_a_hang_with_its_last_progress(tmp_path: Path) -> None:
    config = _gh200(**{"compilation-config": {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 1024}})
    outcome = run_trial(_ctx(), config, tmp_path / "t0")
    assert outcome.failure_class == "hang", outcome.reason
    assert outcome.ready_s is None
    # 600 node s at 60x: 10 real s once the node clock runs (the process's own start is allowed only until
    # the server's first log record: LaunchSpec.process_start_grace_s)
    assert "no progress in its log for 10 s" in outcome.reason
    assert "Capturing CUDA graphs (mixed prefill-decode, FULL)" in outcome.reason  # the last progress, not the
    assert "broadcast block" not in outcome.reason                                # heartbeat that followed it
    log = (tmp_path / "t0/server.log").read_text(encoding="utf-8")
    assert log.count("No available shared memory broadcast block") >= 2  # vLLM kept saying it, to no avail
    assert not (tmp_path / "t0/server.pid.json").exists()  # stopped, whole group


def _widened_profile(tmp_path: Path) -> Path:
    """gh200x4 widened the way a user might (FULL CUDA graphs), then narrowed to one point, with and without
    DSpark's 3 draft tokens: DP4 + EP, FULL graphs. Every configuration in it has the same base flags."""
    data = yaml.safe_load(catalog.resolve("search_spaces", "gh200x4").read_text(encoding="utf-8"))
    data["name"] = "gh200x4-full-graphs"
    data["server"]["fixed"]["max-model-len"] = 32768
    data["topology"] = {"choices": ["dp4-ep"]}
    levers = data["levers"]
    levers["compilation-config.cudagraph_mode"] = {"choices": ["FULL"]}
    for name, value in (("max-num-seqs", 256), ("max-num-batched-tokens", 8192), ("gpu-memory-utilization", 0.95),
                        ("enable-prefix-caching", True), ("all2all-backend", "allgather_reducescatter")):
        levers[name] = {**levers[name], "choices": [value]}
    levers["moe-backend"] = {"choices": ["auto"]}
    data["speculative"]["draft_tokens"] = {"choices": [0, 3]}
    data["baselines"] = []
    path = tmp_path / "gh200x4-full-graphs.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_twin_of_a_control_that_hung_is_not_launched(tmp_path: Path) -> None:
    """The first launch of the base flags hangs (a speculative proposal's control, or the base itself, as the
    sampler draws): every other configuration with those base flags is told that, not launched."""
    objective = tmp_path / "objective.yaml"
    objective.write_text(yaml.safe_dump(OBJECTIVE), encoding="utf-8")
    record = new_record(name="hang", hw=str(_widened_profile(tmp_path)), objective=str(objective), model=MODEL,
                        server_cmd=DEFAULT_COMMAND, port=None, trials=None, budget_s=None, seed=0,
                        slo_overrides={}, ready_timeout_s=None, guards=[], prevalidate="off",
                        confirm=ConfirmSpec(top_k=0, repeats=2), engine="emulated", engine_options=NODE)
    study = Study.create(record, tmp_path / "runs")
    assert study.startup_limits_s() == (UNITS.client_startup_seconds(3600), UNITS.client_stall_seconds(600))
    ostudy = study.run()  # the base hangs once; the rest are refused, then only duplicates come: exhausted

    told = [t for t in ostudy.trials if "duplicate_of" not in t.user_attrs and t.state.name == "COMPLETE"]
    launched = [t for t in told if t.user_attrs.get("launched", True)]
    refused = [t for t in told if not t.user_attrs.get("launched", True)]
    assert len(launched) == 1, [t.user_attrs.get("reason") for t in launched]  # one start, not two
    hung = launched[0]
    assert hung.user_attrs["failure_class"] == "hang", hung.user_attrs["reason"]
    assert "Capturing CUDA graphs" in hung.user_attrs["reason"]
    assert refused and any(t.params["speculative.draft_tokens"] == 3 for t in refused)  # the twin among them
    for twin in refused:
        assert twin.user_attrs["failure_class"] == "hang" and twin.user_attrs["refused_by"] == "base_failed_to_start"
        assert f"trial {hung.number}" in twin.user_attrs["reason"]
    assert sorted(p.name for p in (study.path / "trials").iterdir()) == [f"{hung.number:04d}"]
    pruned = [json.loads(line) for line in (study.path / PRUNED_LOG).read_text().splitlines()]
    assert sorted(p["number"] for p in pruned) == sorted(t.number for t in refused)


# -- finding 7: a server that dies under load --------------------------------------------------------------
def test_an_oom_under_load_is_a_crash_and_teaches_the_memory_model(tmp_path: Path) -> None:
    config = _gh200(**{"gpu-memory-utilization": 0.97})
    outcome = run_trial(_ctx(), config, tmp_path / "t0")
    assert outcome.failure_class == "oom", outcome.reason  # not slo_violated, whatever the SLOs say
    assert outcome.ready_s is not None and outcome.ok is False
    assert "crashed under load" in outcome.reason and "OutOfMemoryError" in outcome.reason
    assert json.loads((tmp_path / "t0/outcome.json").read_text())["failure_class"] == "oom"

    profile = load_profile("gh200x4")
    checks = PreLaunch(profile, load_checkpoint("0731"), Objective.model_validate(OBJECTIVE), "off")
    ctx: Any = None
    hungrier = _gh200(**{"gpu-memory-utilization": 0.97, "max-num-seqs": 2048, "max-num-batched-tokens": 16384})
    assert checks.check(hungrier, ctx) is None  # the prior has no reason to refuse it
    checks.observe_failure(config.args, outcome.failure_class, started=outcome.ready_s is not None, trial=0,
                           evidence=outcome.reason)
    refusal = checks.check(hungrier, ctx)
    assert refusal is not None and refusal.rule == "learned_oom" and "under load" in refusal.reason
    assert checks.check(_gh200(**{"gpu-memory-utilization": 0.95}), ctx) is None  # more headroom: still tried
    assert checks.check(_gh200(**{"gpu-memory-utilization": 0.97, "max-num-batched-tokens": 4096}), ctx) is None


# -- issue 25: a fault of the node, not of the flags ---------------------------------------------------------
@pytest.mark.slow
def test_an_unreadable_checkpoint_ends_the_night_after_two_launches_and_resume_goes_on(tmp_path: Path) -> None:
    """The checkpoint folder's config.json is corrupt: every launch dies at vLLM's config step with one message
    that names no lever value. The night stops after two launches, naming the cause and ``doctor``; once the
    file is restored, ``resume`` launches again and those two failures mark no configuration as failed."""
    from tests.conftest import stand_in_checkpoint
    from tuner.errors import NodeFaultError

    checkpoint = stand_in_checkpoint(tmp_path / "DeepSeek-V4-Flash", {"model_type": "deepseek_v4"})
    good = (checkpoint / "config.json").read_bytes()
    (checkpoint / "config.json").write_bytes(b"\x00\x1f garbled by a failed copy")
    objective = tmp_path / "objective.yaml"
    objective.write_text(yaml.safe_dump(OBJECTIVE), encoding="utf-8")
    record = new_record(name="broken", hw="gh200x4", objective=str(objective), model=str(checkpoint),
                        server_cmd=DEFAULT_COMMAND, port=None, trials=3, budget_s=None, seed=0, slo_overrides={},
                        ready_timeout_s=None, guards=[], prevalidate="off", confirm=ConfirmSpec(top_k=0, repeats=2),
                        engine="emulated", engine_options=NODE)
    study = Study.create(record, tmp_path / "runs")
    with pytest.raises(NodeFaultError) as stop:
        study.run()
    message = str(stop.value)
    assert "is not a valid JSON file" in message and "dsv4-tune doctor --hw gh200x4" in message
    first = study.optuna_study().trials
    launched = [t for t in first if t.state.name == "COMPLETE" and t.user_attrs.get("launched", True)]
    assert len(launched) == 2, [t.user_attrs.get("reason") for t in launched]
    assert launched[0].user_attrs["config_key"] != launched[1].user_attrs["config_key"]
    assert all(t.user_attrs["ready_s"] is None for t in launched)

    (checkpoint / "config.json").write_bytes(good)  # the fix
    resumed = Study.open("broken", tmp_path / "runs")
    ostudy = resumed.run()
    after = [t for t in ostudy.trials if t.number > launched[-1].number and t.state.name == "COMPLETE"
             and t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs]
    assert after and any(t.user_attrs.get("ready_s") is not None for t in after), \
        [t.user_attrs.get("reason") for t in after]
    assert not any(t.user_attrs.get("refused_by") == "base_failed_to_start" for t in ostudy.trials)
