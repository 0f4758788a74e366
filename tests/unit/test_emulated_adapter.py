"""``--engine emulated``: the engine registry, the emulated node's adapter and its units, end to end.

The live test starts the emulated node through the adapter (its argv and environment, the process
helper, readiness) and measures a knee-sized ladder with the tuner's own load generator: the client's
figures, once converted to node units, must agree with the server's own ``/metrics`` counters (node
units by construction), and the top step must show the knee it was sized for.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.cli.rehearse import describe_engine
from tuner.engines import LaunchSpec, ServerProcess, VllmEngine, free_port, make_engine
from tuner.engines.emulated.engine import EmulatedEngine, choose_units, default_options
from tuner.engines.emulated.settings import EmulatorSettings
from tuner.engines.registry import engine_class, engine_options
from tuner.errors import UsageError
from tuner.load.ladder import measure
from tuner.load.metrics import counter_deltas, parse_prometheus
from tuner.load.units import Units
from tuner.objective import LadderSpec, Objective, Workload
from tuner.report import build_markdown
from tuner.search import bind_checkpoint, load_checkpoint, load_profile
from tuner.search.envelope import objective_for
from tuner.study import Study, new_record
from tuner.study.reader import read_study

MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"


def test_the_registry_picks_an_engine_by_name() -> None:
    assert isinstance(make_engine("vllm", {}, hardware="gh200x4"), VllmEngine)
    engine = make_engine("emulated", {"time_scale": 20, "multiplicity": 8}, hardware="/x/gh200x4.yaml",
                         checkpoint="0731")
    assert isinstance(engine, EmulatedEngine) and engine.units == Units(20.0, 8, 20.0, engine.units.process_start_s)
    with pytest.raises(UsageError, match="no engine options"):
        make_engine("vllm", {"time_scale": 2}, hardware="gh200x4")
    with pytest.raises(UsageError, match="Fix: use one of emulated, llamacpp, vllm"):
        engine_class("sglang")
    with pytest.raises(UsageError, match="unknown option"):
        make_engine("emulated", {"speed": 2}, hardware="gh200x4")
    assert engine_options("vllm", None, None, None, time_scale=None) == {}


def test_the_adapter_launches_the_emulator_with_vllms_command_line() -> None:
    engine = EmulatedEngine(units=Units(25.0, 128, 400.0, 60.0), hardware="/p/gh200x4.yaml", checkpoint="0731",
                            truth_seed=7)
    command = engine.resolve_command(engine.default_command)
    assert command == [sys.executable, "-m", "tuner.engines.emulated"]
    options = engine.serve_options(MODEL, {"data-parallel-size": 4, "enable-expert-parallel": True},
                                   host="127.0.0.1", port=8123)
    argv = engine.build_argv(command, options, api_key="k")
    assert argv[3:5] == ["serve", MODEL] and "--data-parallel-size" in argv and "--enable-expert-parallel" in argv
    assert engine.redact_argv(argv)[-1] == "***"
    env = engine.server_env(None, options)
    # The server reads back exactly the units the tuner converts with.
    settings = EmulatorSettings.from_env(env)
    assert (settings.hardware, settings.checkpoint, settings.truth_seed) == ("/p/gh200x4.yaml", "0731", 7)
    assert settings.units == Units(25.0, 128, 400.0)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert engine.name in " ".join(argv)  # the word that marks its processes as orphans
    assert (engine.version_of(command) or "").endswith("(emulated node)")


@pytest.mark.parametrize(("kw", "multiplicity", "scale"), [
    # gh200x4 throughput: the top step 1.5 x the DP4 knee; ~8 streams per engine.
    ({"top_concurrency": 4110, "max_dp": 4, "node_tok_s": 17000.0}, 128, 25.0),
    # A faster node: more copies per stream keep the speed-up of 20 within the chunk budget.
    ({"top_concurrency": 4110, "max_dp": 4, "node_tok_s": 40000.0}, 160, 20.0),
    # The dossier's 40 agents on DP8: more copies per stream (one stream per engine) so the chunks fit.
    ({"top_concurrency": 40, "max_dp": 8, "node_tok_s": 1500.0}, 5, 16.0),
    # A paced workload keeps one request per stream: copies would turn Poisson arrivals into bursts.
    ({"top_concurrency": 512, "max_dp": 4, "node_tok_s": 2000.0, "paced": True}, 1, 2.0),
])
def test_units_keep_the_client_within_its_chunk_budget(kw: dict[str, Any], multiplicity: int, scale: float) -> None:
    units = choose_units(**kw)
    assert (units.multiplicity, units.time_scale, units.startup_time_scale) == (multiplicity, scale, scale)
    assert kw["node_tok_s"] * units.time_scale / units.multiplicity <= 5000 * 1.01 or units.time_scale == 1


def test_a_night_is_sized_from_its_envelope() -> None:
    profile = load_profile("gh200x4")
    checkpoint = load_checkpoint("0731")
    bound = bind_checkpoint(profile, checkpoint)
    options = default_options(bound, checkpoint, objective_for(profile, "throughput"))
    assert options["multiplicity"] == 4110 // 32 and 1 <= options["time_scale"] <= 25
    assert default_options(bound, checkpoint, objective_for(profile, "throughput"), time_scale=5.0,
                           multiplicity=7, truth_seed=3) | {"process_start_s": 0} == {
        "time_scale": 5.0, "startup_time_scale": 5.0, "multiplicity": 7, "truth_seed": 3, "process_start_s": 0}


def test_a_study_on_the_emulated_node_runs_node_time(tmp_path: Path) -> None:
    record = new_record(name="r", hw="gh200x4", objective="throughput", model=None, server_cmd="x", port=None,
                        trials=1, budget_s=8 * 3600.0, seed=0, slo_overrides={}, ready_timeout_s=None,
                        engine="emulated", engine_options={"time_scale": 25.0, "multiplicity": 128},
                        rehearsal=True)
    study = Study.create(record, tmp_path)
    assert isinstance(study.engine, EmulatedEngine)
    assert Path(study.engine.hardware) == (study.path / "hardware_profile.yaml").resolve()
    assert study.clock.time_scale == 25.0
    ready_s, stall_s = study.startup_limits_s()
    assert ready_s == pytest.approx(study.profile.server.ready_timeout_s / 25.0 + study.engine.units.process_start_s)
    if study.profile.server.startup_stall_s is not None:
        assert stall_s is not None and stall_s < study.profile.server.startup_stall_s
    # Opened again (resume), the study runs the same engine with the same units.
    again = Study.open("r", tmp_path)
    assert again.engine == study.engine and again.record.rehearsal
    # Never mistakable for a node's evidence: the report and the CLI say what it is.
    report = build_markdown(study, read_study(study), {})
    assert "**REHEARSAL: every figure below is the prediction of the emulated node" in report
    assert "time scale 25 node s per real s, multiplicity 128" in report
    assert (describe_engine(study) or "").startswith("REHEARSAL on the emulated node (gh200x4)")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, EmulatedEngine]]:
    """DP2 + EP on gh200x4 (max-num-seqs 64 per engine: a knee of 128 requests), 4 requests per stream.

    Time runs 5 x: slow enough that the node's own time, not the client's real overheads, orders the
    requests (a second of HTTP set-up would be 5 node seconds)."""
    engine = EmulatedEngine(units=Units(time_scale=5.0, multiplicity=4, startup_time_scale=5000.0,
                                        process_start_s=120.0), hardware="gh200x4", checkpoint="0731")
    args = {"trust-remote-code": True, "kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 16384,
            "tensor-parallel-size": 2, "data-parallel-size": 2, "enable-expert-parallel": True,
            "max-num-seqs": 64, "max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.92}
    port = free_port("127.0.0.1")
    options = engine.serve_options(MODEL, args, host="127.0.0.1", port=port)
    command = engine.resolve_command(engine.default_command)
    workdir = tmp_path_factory.mktemp("emulated")
    spec = LaunchSpec(argv=engine.build_argv(command, options, api_key=None), env=engine.server_env(None, args),
                      host="127.0.0.1", port=port, workdir=workdir,
                      ready_timeout_s=engine.units.client_startup_seconds(3600.0), model_name=MODEL, engine=engine)
    with ServerProcess(spec) as server:
        server.wait_ready()
        yield server, engine


def _scrape(server: ServerProcess) -> dict[Any, float]:
    return dict(parse_prometheus(httpx.get(server.base_url + "/metrics", timeout=10).text))


def test_client_figures_in_node_units_agree_with_the_servers_counters(
        node: tuple[ServerProcess, EmulatedEngine]) -> None:
    server, engine = node
    objective = Objective(name="t", slos={"p95_ttft_ms": 600000.0},
                          workload=Workload(input_len=256, output_len=512, num_prompts=8, warmup_prompts=0),
                          ladder=LadderSpec(steps=(64, 192), prompts_per_concurrency=1, min_gain=0.0, patience=2))
    before = _scrape(server)
    run = measure(server.base_url, MODEL, objective, vocab_size=129280, api_key=None, should_stop=lambda: False,
                  scrape=lambda: _scrape(server), server_metrics=engine.metrics, units=engine.units, knee=128)
    after = _scrape(server)
    grown = counter_deltas(before, after, ["vllm:generation_tokens", "vllm:request_success"])
    steps = run.steps
    assert [s.concurrency for s in steps] == [64, 192]  # whole streams of 4: 16 and 48 streams
    assert [s.summary["client_streams"] for s in steps] == [16, 48]
    output = sum(s.summary["total_output_tokens"] for s in steps)
    completed = sum(s.summary["completed"] for s in steps)
    assert output == grown["vllm:generation_tokens"]  # node tokens, counted by the node itself
    assert completed == grown["vllm:request_success"] == 64 + 192
    for step in steps:
        # A node rate: node tokens over the window's node duration.
        assert step.summary["output_throughput"] == pytest.approx(
            step.summary["total_output_tokens"] / step.summary["duration"], rel=1e-6)
        assert step.summary["duration"] == pytest.approx(step.result.duration_s * engine.units.time_scale)
    # 192 requests on a node that runs at most 2 x 64: the top step shows the full batch and a queue.
    assert run.knee is not None and run.knee.shown, (run.knee, steps[-1].server.get("facts"))
    assert run.to_json()["units"]["multiplicity"] == 4
