"""The Ray driver launches a speculative proposal's control first, as the other drivers do: its Tune searcher
ships the control, holds the twin while the control runs (filling other nodes meanwhile), and ships the twin
once the control's result is in. Driven here the way Tune drives a searcher, on a real SQLite study."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.conftest import synthetic_outcome, synthetic_record
from tuner.backends.node import NodeIdentity
from tuner.search.space import build_config
from tuner.study import Study

pytest.importorskip("ray.tune")

NODE = NodeIdentity(hostname="node-a", gpu_model=None, gpu_count=0, driver=None, vllm_version="0.32.0",
                    cpu_model="x86", cpu_count=2)
SPECULATIVE = {"speculative.draft_tokens": 2}


def _result(study: Study, ctx: Any, shipped: dict[str, Any]) -> dict[str, Any]:
    """What ``ray_trial`` returns from a node for the shipped trial (its outcome synthetic)."""
    config = build_config(study.profile, shipped["params"])
    tdir = study.path / "trials" / f"{shipped['trial_number']:04d}"
    outcome = synthetic_outcome(ctx, config, tdir)
    return {"node": json.dumps(NODE.to_json()), "gpu_ids": "[]", "ray_node_id": "n1", "attempt": 1,
            "value": outcome.value, "outcome": json.dumps(outcome.to_json(), default=str)}


def test_the_ray_searcher_ships_the_control_first_and_holds_the_twin(tmp_path: Path) -> None:
    from ray.tune.search import Searcher

    from tuner.backends.ray import make_searcher

    study = Study.create(synthetic_record(tmp_path, name="ray", trials=2), tmp_path / "runs")
    ostudy = study.optuna_study()
    ostudy.enqueue_trial(SPECULATIVE)  # ahead of the hardware profile's baselines
    study.prepare_queue(ostudy)
    ctx = study.context()
    searcher, abandon_held = make_searcher(study, study.round(ostudy, ctx), 2)

    control = searcher.suggest("t1")
    assert control is not None and control["params"]["speculative.draft_tokens"] == 0
    other = searcher.suggest("t2")  # another node takes another configuration meanwhile
    assert other is not None and other["trial_number"] != control["trial_number"]
    assert searcher.suggest("t3") is None  # --trials 2 reached, but a twin waits for its control

    searcher.on_trial_complete("t1", _result(study, ctx, control))
    twin = searcher.suggest("t3")
    assert twin is not None and twin["params"]["speculative.draft_tokens"] == 2  # the pair passes --trials by one
    searcher.on_trial_complete("t2", _result(study, ctx, other))
    searcher.on_trial_complete("t3", _result(study, ctx, twin))
    assert searcher.suggest("t4") == Searcher.FINISHED
    abandon_held()

    trials = {t.number: t for t in optuna.load_study(study_name="ray", storage=study.storage()).get_trials()}
    twin_config = build_config(study.profile, twin["params"])
    control_trial, twin_trial = trials[control["trial_number"]], trials[twin["trial_number"]]
    assert control_trial.user_attrs["config_key"] == twin_config.control().key()
    assert control_trial.user_attrs["control_for"] == twin_config.key()
    assert twin_trial.user_attrs["speculative"] is True and twin_trial.user_attrs["backend"] == "ray"
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in (control_trial, twin_trial))


def test_a_twin_still_held_when_tune_stops_is_left_for_resume(tmp_path: Path) -> None:
    from tuner.backends.ray import make_searcher

    study = Study.create(synthetic_record(tmp_path, name="ray", trials=1), tmp_path / "runs")
    ostudy = study.optuna_study()
    ostudy.enqueue_trial(SPECULATIVE)
    study.prepare_queue(ostudy)
    searcher, abandon_held = make_searcher(study, study.round(ostudy, study.context()), 1)
    control = searcher.suggest("t1")
    assert control is not None and control["params"]["speculative.draft_tokens"] == 0
    abandon_held()  # Tune stopped (its time budget) before the control's result came in
    held = [t for t in ostudy.get_trials() if t.user_attrs.get("interrupted")]
    assert len(held) == 1 and held[0].params["speculative.draft_tokens"] == 2
    assert held[0].state == optuna.trial.TrialState.FAIL  # resume re-queues an interrupted trial
