"""Objectives scale with the node (issue #14, finding 2): a GPU profile runs its node's workload.

On the old code ``--objective throughput`` ran the CPU demo's ISL/OSL 128 with a 4/16/32 ladder and a
20 s TTFT limit on every profile, and ``plan --objective throughput`` showed 128/128 while ``plan``
without one showed the blog's 1024/1024. Here the objective, at the profile's workload scale, is what
``plan``, ``run`` (the study) and the report all show, and each launch's ladder goes through its own
predicted KV knee.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner import catalog
from tuner.errors import CatalogError
from tuner.objective import load_objective
from tuner.report import build_markdown
from tuner.search import bind_checkpoint, build_plan, format_plan, load_checkpoint, load_profile
from tuner.search.envelope import envelope, objective_for
from tuner.search.space import build_config
from tuner.study import Study, new_record
from tuner.study.reader import read_study

GPU_PROFILES = [name for name in catalog.known_names("search_spaces")
                if load_profile(name).hardware.accelerator != "cpu" and load_profile(name).server.checkpoint]


def test_throughput_on_gh200x4_is_the_blogs_benchmark() -> None:
    objective = objective_for(load_profile("gh200x4"), "throughput")
    w = objective.workload
    assert (w.kind, w.input_len, w.output_len, w.range_ratio, w.ignore_eos) == ("random", 1024, 1024, 0.0, True)
    assert objective.scale is None and not objective.scales
    # p95 TTFT and ITL limits a throughput night at the KV knee can meet (the objective says why).
    assert objective.slos == {"p95_ttft_ms": 120000.0, "p95_itl_ms": 1000.0}
    assert objective.ladder is not None and objective.ladder.knee_fractions == (0.5, 1.0, 1.5)
    assert objective.ladder.prompts_per_concurrency == 2  # the blog's num-prompts = 2 x concurrency


def test_the_cpu_profile_keeps_the_demo_scale() -> None:
    objective = objective_for(load_profile("cpu"), "throughput")
    assert objective.scale == "demo"
    assert (objective.workload.input_len, objective.workload.output_len) == (128, 128)
    assert objective.ladder is not None and objective.ladder.steps == (4, 16, 32)
    assert objective.slos == {"p95_ttft_ms": 20000.0, "p95_itl_ms": 2000.0}


@pytest.mark.parametrize("name", [n for n in catalog.known_names("objectives") if n != "agent-demo"])
def test_every_shipped_objective_has_the_demo_scale_and_a_node_scale(name: str) -> None:
    """(agent-demo is agent.yaml's demo scale, kept as a file of its own for the CPU demo.)"""
    node = objective_for(load_profile("gh200x4"), name)
    demo = objective_for(load_profile("cpu"), name)
    assert demo.scale == "demo", f"objectives/{name}.yaml has no scales.demo for the CPU profile"
    node_tokens = node.workload.input_len + node.workload.output_len + node.workload.prefix_len
    demo_tokens = demo.workload.input_len + demo.workload.output_len + demo.workload.prefix_len
    assert node_tokens >= 8 * demo_tokens, f"{name}: the node's workload is not the node's"


def test_agent_on_h200x8_is_the_dossiers_40_agents() -> None:
    objective = objective_for(load_profile("h200x8"), "agent")
    w = objective.workload
    assert (w.kind, w.concurrency, w.output_len) == ("agent", 40, 8192)
    spec = w.agent_spec
    assert spec.system_len + spec.tools * spec.tool_schema_len + spec.context_len >= 30000  # ~32K prompts
    assert spec.reasoning_effort == "high" and spec.tool_choice == "auto"
    assert objective.slos == {"p95_ttft_ms": 4000.0}


@pytest.mark.parametrize("hw", GPU_PROFILES)
def test_every_launchs_ladder_goes_through_its_own_knee(hw: str) -> None:
    profile = load_profile(hw)
    checkpoint = load_checkpoint(profile.server.checkpoint)
    bound = bind_checkpoint(profile, checkpoint)
    rows = envelope(bound, checkpoint, objective_for(profile, "throughput")).rows
    assert rows
    for row in rows:
        if row.fits:
            assert row.knee > 0 and max(row.steps) >= 1.5 * row.knee - 1 and min(row.steps) <= row.knee, row


def test_plan_run_and_report_show_one_workload(tmp_path: Path) -> None:
    plan = build_plan("gh200x4", "throughput", 8 * 3600, None, samples=20)
    text = format_plan(plan)
    assert (plan.workload.input_len, plan.workload.output_len) == (1024, 1024)
    assert "ISL 1024 + OSL 1024" in text and "p95_ttft_ms <= 120000" in text
    # plan without --objective shows what run measures without one: the same objective.
    assert build_plan("gh200x4", None, None, None, samples=20).workload == plan.workload
    blog_dp4 = next(r for r in plan.ladder if r.name == "baseline blog-dp4-ep")
    assert blog_dp4.knee == 2740 and blog_dp4.steps == (1370, 2740, 4110)

    record = new_record(name="s", hw="gh200x4", objective="throughput", model=None, server_cmd="vllm", port=None,
                        trials=1, budget_s=None, seed=0, slo_overrides={}, ready_timeout_s=None)
    assert record.model == "deepseek-ai/DeepSeek-V4-Flash-0731"  # the profile checkpoint's repository
    study = Study.create(record, tmp_path)
    assert study.objective.workload == plan.workload and study.objective.slos == plan.slos
    # The study steps each launch's ladder through that launch's own predicted knee.
    knee = study.knee_predictor()
    assert knee is not None
    config = build_config(study.profile, study.profile.baselines[1].values)
    assert knee(config) == 2740
    assert study.objective.for_knee(knee(config)).ladder.steps == (1370, 2740, 4110)  # type: ignore[union-attr]
    report = build_markdown(study, read_study(study), {})
    assert '"input_len":1024,"output_len":1024' in report


def test_slo_and_an_objective_file_still_override(tmp_path: Path) -> None:
    gh200 = load_profile("gh200x4")
    assert objective_for(gh200, "throughput", {"p95_ttft_ms": 30000.0}).slos["p95_ttft_ms"] == 30000.0
    # A user's own file (no scales section) is used as it is, on any profile.
    own = yaml.safe_load(catalog.resolve("objectives", "throughput").read_text())
    own.pop("scales")
    own["workload"]["input_len"] = 333
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(own))
    assert objective_for(gh200, str(path)).workload.input_len == 333
    assert objective_for(load_profile("cpu"), str(path)).workload.input_len == 333


def test_a_scale_section_is_checked_when_the_objective_loads(tmp_path: Path) -> None:
    data = yaml.safe_load(catalog.resolve("objectives", "throughput").read_text())
    data["scales"]["demo"]["slos"] = {"p95_ttft": 10}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CatalogError, match=r"scales\.demo"):
        load_objective(str(path))
