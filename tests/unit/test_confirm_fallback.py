"""Confirmation one step down: a chosen ladder step that meets its SLOs in screening but misses one in a
confirmation repeat (it sits on the SLO's edge) is confirmed again at the next step screening met its SLOs at.

The h200x8 emulated night found it: screening's top step met p95 TTFT by under 1 %, a confirmation repeat
missed it by under 1 %, and the study ended with no confirmed winner. The launches are replaced by a
deterministic function of the step the confirmation runs at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tuner.study.step as step_mod
from tests.conftest import synthetic_record
from tuner.objective import constraint_names
from tuner.search.space import ServeConfig
from tuner.study import Study
from tuner.trial import TrialContext, TrialOutcome

EDGE, BELOW = 32, 16
"""The step screening chose (on an SLO's edge), and the one below it that holds."""


def _fake(confirmed_at: list[int | None], *, below_holds: bool = True) -> Any:
    def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                  on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "config.json").write_text(json.dumps({"args": config.args}))
        n = len(constraint_names(ctx.objective))
        if repeats == 1:  # screening: the ladder met its SLOs at both steps and chose the higher one
            return TrialOutcome(ok=True, value=200.0, constraints=(-0.01,) * n, failure_class=None, reason="met",
                                summary={"output_throughput": 200.0, "max_concurrency": EDGE,
                                         "feasible_concurrencies": [BELOW, EDGE]},
                                server_metrics={}, ready_s=1.0, duration_s=10.0, trial_dir=str(tdir),
                                config_key=config.key(), repeat_values=(200.0,))
        ladder = ctx.objective.ladder
        assert ladder is not None and ladder.steps is not None and len(ladder.steps) == 1
        at = ladder.steps[0]
        confirmed_at.append(at)
        holds = at == BELOW and below_holds
        value = 190.0 if at == BELOW else 201.0
        return TrialOutcome(ok=True, value=value, constraints=(-0.01 if holds else 0.004,) * n,
                            failure_class=None if holds else "slo_violated",
                            reason="met every SLO" if holds else "p95_ttft_ms 120469.1 > 120000",
                            summary={"output_throughput": value, "max_concurrency": at}, server_metrics={},
                            ready_s=1.0, duration_s=10.0, trial_dir=str(tdir), config_key=config.key(),
                            repeat_values=(value,) * repeats)
    return run_trial


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, below_holds: bool = True) -> tuple[Study, Any, list]:
    confirmed_at: list[int | None] = []
    monkeypatch.setattr(step_mod, "run_trial", _fake(confirmed_at, below_holds=below_holds))
    record = synthetic_record(tmp_path, name="edge", trials=1, top_k=1)
    study_obj = Study.create(record, tmp_path / "runs")
    assert study_obj.objective.ladder is not None, "the test needs an objective with a ladder"
    return study_obj, study_obj.run(), confirmed_at


def test_a_step_on_an_slo_edge_is_confirmed_one_step_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study_obj, ostudy, confirmed_at = _run(tmp_path, monkeypatch)
    assert confirmed_at == [EDGE, BELOW]
    first, second = study_obj.confirmations(ostudy)
    assert not first.accepted and first.concurrency == EDGE
    assert "a repeat missed an SLO: p95_ttft_ms 120469.1 > 120000" in first.reason
    assert second.accepted and second.concurrency == BELOW and second.median == 190.0
    assert second.trial_dir.endswith(f"-c{BELOW}") and first.trial_dir != second.trial_dir
    winner = study_obj.winner(ostudy)
    assert winner is not None and winner.confirmed and winner.value == 190.0
    assert winner.confirmation == second
    assert f"at concurrency {BELOW}" in winner.describe("output_throughput")


def test_one_step_down_is_tried_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study_obj, ostudy, confirmed_at = _run(tmp_path, monkeypatch, below_holds=False)
    assert confirmed_at == [EDGE, BELOW]  # no third launch: the lowest screened step is not tried again
    assert [c.accepted for c in study_obj.confirmations(ostudy)] == [False, False]
    winner = study_obj.winner(ostudy)
    assert winner is not None and not winner.confirmed and winner.status == "rejected"
