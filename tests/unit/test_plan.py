"""dsv4-tune plan: works for every profile, counts the space, and budgets trials."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.search.plan import build_plan, format_plan, space_size
from tuner.search.profile import load_profile

# every shipped profile, the GPU evidence ones included: a baseline the tool's own rules prune never runs
# (h200x1-tiny's ngram baseline once drew 2 draft tokens, which no capture ceiling of it divides by 1+k)
PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "search_spaces").glob("*.yaml")
                  if not p.name.startswith("_"))


@pytest.mark.parametrize("name", PROFILES)
def test_plan_for_every_profile(name: str) -> None:
    plan = build_plan(name, None, 8 * 3600, None, samples=100)
    text = format_plan(plan)
    assert f"# Plan: {name}" in text
    # a GPU node's KV capacity is per topology; a unified-memory host's (Strix Halo, llama.cpp) per envelope
    memory = "## KV capacity by topology" if plan.envelopes is None else "## Envelopes"
    assert (memory in text or plan.envelopes == ()) and "## Baseline trials" in text
    assert plan.space_size is not None and plan.space_size > 1
    assert 0.0 < plan.feasible_share <= 1.0
    assert plan.trials_in_budget == int(8 * 3600 // plan.per_trial_s)
    assert all(b.ok for b in plan.baselines), [b.reason for b in plan.baselines if not b.ok]


def test_plan_with_objective_and_checkpoint() -> None:
    plan = build_plan("gh200x4", "throughput", None, "preview", samples=50)
    assert plan.checkpoint == "preview" and plan.objective == "throughput"
    assert plan.trials_in_budget is None
    assert "mtp" in plan.draft
    assert "pass --budget" in format_plan(plan)


def test_plan_topology_table_shows_dp_ep_beats_tp_on_gh200() -> None:
    rows = {r.topology: r for r in build_plan("gh200x4", None, None, "preview", samples=10).topologies}
    assert rows["dp4-ep"].max_concurrency > 2 * rows["tp4"].max_concurrency
    assert rows["tp4"].kv_tokens_total == rows["tp4"].kv_tokens_per_rank


def test_space_size_honours_conditions() -> None:
    profile = load_profile("cpu")
    assert space_size(profile) == 5 * 4 * 2 * 2 * 2 * 2 * 3
    h200 = load_profile("h200x8")
    size = space_size(h200)
    assert size is not None
    no_ep, ep = 3, 4  # tp8, tp4-dp2, tp2-dp4 vs the EP shapes
    rest = 4 * 3 * 4 * 3 * 3 * 2 * 4
    layouts = 3 * 4 * 3 * 3 * 2 * 4  # 4p4d, 2p6d, 6p2d: no topology, seats or budget of their own to draw
    assert size == no_ep * rest + ep * rest * 3 * 2 + layouts


def test_plan_is_deterministic() -> None:
    a = build_plan("b200x8", None, 3600, None, samples=60, seed=3)
    b = build_plan("b200x8", None, 3600, None, samples=60, seed=3)
    assert a == b


def test_plan_says_whether_the_engines_own_checks_will_run(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm", reason="vLLM is not importable here")
    from tuner.cli.main import main
    from tuner.engines.vllm import validate as vllm_validate

    assert main(["plan", "--hw", "cpu"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "Pre-launch argument checks (--prevalidate auto): vLLM's own checks will run before every launch" in said
    monkeypatch.setattr(vllm_validate, "vllm_available", lambda: False)  # the parser cannot be built here
    assert main(["plan", "--hw", "cpu"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "vLLM's own checks cannot run in this environment" in said and "launch unchecked" in said
