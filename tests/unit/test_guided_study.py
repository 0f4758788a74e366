"""``--prior model`` in a study: the record's default per profile, the prior's queue after the baselines, the
guide's proposals through Optuna's queue, the report's predicted-against-measured section, and ``plan``'s
prior section."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tuner.objective import Objective, Workload
from tuner.predict import Guide, Predictor, predictor_for
from tuner.predict.plan import format_prior, prior_plan
from tuner.search import bind_checkpoint, load_checkpoint, load_profile
from tuner.search.space import suggest
from tuner.study.guided import PREDICTION_FILE, GuidedSearch, prediction_section
from tuner.study.record import default_prior

OBJECTIVE = Objective.model_validate({
    "name": "t", "metric": "output_throughput", "slos": {"p95_ttft_ms": 120000, "p95_itl_ms": 1000},
    "workload": Workload(input_len=1024, output_len=1024, num_prompts=64, concurrency=2048).model_dump(),
    "ladder": {"steps": [1024, 2048, 3072], "prompts_per_concurrency": 2}})


@pytest.fixture(scope="module")
def profile() -> object:
    return bind_checkpoint(load_profile("gh200x4"), load_checkpoint("0731"))


@pytest.fixture(scope="module")
def predictor(profile: object) -> Predictor:
    return predictor_for(profile, load_checkpoint("0731"), OBJECTIVE)  # type: ignore[arg-type]


def test_the_prior_is_the_default_on_gpu_profiles_only() -> None:
    assert default_prior("nvidia") == "model"
    assert default_prior("amd") == "model"
    assert default_prior("cpu") == "none"


def test_the_prior_queues_its_picks_after_the_baselines_and_the_guide_then_proposes(
        profile: object, predictor: Predictor, tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for base in profile.baselines:  # type: ignore[attr-defined]
        study.enqueue_trial(dict(base.values), user_attrs={"baseline": base.name})
    guided = GuidedSearch(Guide(predictor, seed=0), profile, tmp_path)  # type: ignore[arg-type]
    picks = guided.enqueue_prior(study)
    assert len(picks) == 3 and guided.enqueue_prior(study) == []  # once per study
    asked = []
    for _ in range(len(profile.baselines) + 3 + 1):  # type: ignore[attr-defined]
        guided.before_ask(study)  # queues a proposal only once the queue is empty
        trial = study.ask()
        config = suggest(profile, trial)  # type: ignore[arg-type]
        asked.append(guided.point_of(trial.params))
        trial.set_user_attr("feasible", True)
        trial.set_user_attr("output_throughput", 10000.0)
        trial.set_user_attr("p95_ttft_ms", 50000.0)
        trial.set_user_attr("p95_itl_ms", 100.0)
        trial.set_user_attr("max_concurrency", 2048)
        for name in ("p95_ttft_ms", "p95_itl_ms", "failed_fraction", "trial_ran"):
            trial.set_constraint(name, -0.5)
        study.tell(trial, 10000.0)
        entry = guided.after_trial(study, trial.number)
        assert entry["chance_to_beat"] is None or 0.0 <= entry["chance_to_beat"] <= 1.0
        assert (entry["chance_to_beat"] is None) == (entry["distrust_at"] is not None)
        assert config.key() == predictor.table.keys[asked[-1]]  # type: ignore[index]
    n = len(profile.baselines)  # type: ignore[attr-defined]
    assert asked[n:n + 3] == picks
    assert study.trials[-1].user_attrs.get("guided") is True  # the 7th came from the corrected model
    assert asked[-1] not in asked[:-1]
    history = json.loads((tmp_path / PREDICTION_FILE).read_text())["history"]
    assert [h["trial"] for h in history] == list(range(len(asked)))


def test_the_report_shows_predicted_against_measured_and_the_factors(tmp_path: Path) -> None:
    correction = [{"factor": "backend:humming", "multiplier": 0.62, "low": 0.5, "high": 0.75,
                   "constants": "moe_mfu_humming"}]
    history = [
        {"trial": 0, "chance_to_beat": 1.0, "best_value": 5300.0, "predicted_optimum": 19000.0, "measured": 5300.0,
         "feasible": True, "measured_output_tok_s": 5300.0, "failure_class": None, "predicted_corrected": 6378.0,
         "predicted_prior": 6378.0, "launches": 1, "correction": correction, "rms_log_error_before": 0.18,
         "rms_log_error_after": 0.01},
        {"trial": 1, "chance_to_beat": 0.0, "best_value": 5300.0, "predicted_optimum": 12000.0, "measured": None,
         "feasible": False, "measured_output_tok_s": None, "failure_class": "guard_failed",
         "predicted_corrected": 17000.0, "predicted_prior": 19526.0, "launches": 2, "correction": correction,
         "rms_log_error_before": 0.18, "rms_log_error_after": 0.01}]
    (tmp_path / PREDICTION_FILE).write_text(json.dumps({"history": history, "objective": "x"}))
    text = "\n".join(prediction_section(tmp_path))
    assert "| 0 | 6,378 | 6,378 | 5,300  | 0.83 | — | — | model | 100% |" in text
    assert "guard_failed" in text and "| 1 |" in text
    assert "| backend:humming | 0.62 | 0.5–0.75 | moe_mfu_humming |" in text
    assert "trusted the model throughout" in text
    assert prediction_section(tmp_path / "none") == []
    # a history whose second launch missed its prediction by far more than the model said
    history[0]["residual"] = {"launch": 1, "z": -1.4, "stated_sd": 0.13, "surprise": False}
    history[1].update(residual={"launch": 2, "z": None, "stated_sd": 0.11, "surprise": True}, trusted=False,
                      distrust_at=2, distrust_why="2 launches the model expected to run and meet the SLOs did not")
    (tmp_path / PREDICTION_FILE).write_text(json.dumps({"history": history, "objective": "x"}))
    text = "\n".join(prediction_section(tmp_path))
    assert "| ±13% | -1.4 | model |" in text
    assert "— (expected to run) | **measurements** |" in text
    assert "stopped trusting the model after launch 2** (trial 1): 2 launches the model expected" in text
    assert "second spread" not in text
    history.append({**history[1], "trial": 2, "launches": 3, "led_by": "spread"})
    (tmp_path / PREDICTION_FILE).write_text(json.dumps({"history": history, "objective": "x"}))
    text = "\n".join(prediction_section(tmp_path))
    assert "the **second spread** measured what the model had no launch for" in text and "trial 2." in text


def test_plan_shows_the_predicted_optimum_the_top_and_the_picks(profile: object) -> None:
    plan = prior_plan(profile, load_checkpoint("0731"), OBJECTIVE)  # type: ignore[arg-type]
    assert plan.available and len(plan.top) == 5 and len(plan.picks) == 3
    text = format_prior(plan)
    assert "predicted optimum" in text and "blog-dp4-ep" in text
    assert plan.top[0].value >= max(r.value for r in plan.picks)
    off = prior_plan(load_profile("cpu"), None, OBJECTIVE)
    assert not off.available and "Off:" in format_prior(off)
