"""The study layer's logic, driven by a cheap synthetic response surface in place of launches.

``tuner.study.step.run_trial`` is replaced by a deterministic function of the configuration (a known
surface with a failing region and an SLO-violating region). The real launch path is covered by
tests/integration; here we check what the study does with outcomes: constraints, de-duplication,
controls, confirmation, budget and resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

import tuner.study.step as step_mod
from tests.conftest import synthetic_record
from tuner.objective import constraint_names
from tuner.search.space import ServeConfig
from tuner.study import Study, best_feasible_trial
from tuner.trial import TrialContext, TrialOutcome


def surface(config: ServeConfig) -> tuple[bool, float, tuple[float, ...], str | None]:
    """(ran, value, constraints, failure class) for one configuration."""
    args = config.args
    if args.get("block-size") == 16:
        return False, 0.0, (1.0, 1.0, 1.0, 1.0), "bad_flag"
    value = 100.0 + 10.0 * [4, 8, 16, 32, 64].index(int(args["max-num-seqs"]))
    value += 15.0 if args.get("kv-cache-dtype") == "fp8" else 0.0
    value += 8.0 * config.draft_tokens
    itl_margin = 0.5 if int(args["max-num-seqs"]) == 64 else -0.5  # the SLO binds at the top
    return True, value, (-0.5, itl_margin, 0.0, 0.0), None


@pytest.fixture()
def fake_launches(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    launched: list[ServeConfig] = []

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                       on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        launched.append(config)
        ran, value, constraints, failure = surface(config)
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "config.json").write_text(json.dumps({"args": config.args}))
        feasible_failure = None if all(c <= 0 for c in constraints) else "slo_violated"
        return TrialOutcome(ok=ran, value=value, constraints=constraints,
                            failure_class=failure or (feasible_failure if ran else None),
                            reason="synthetic", summary={"output_throughput": value}, server_metrics={},
                            ready_s=1.0, duration_s=100.0, trial_dir=str(tdir), config_key=config.key(),
                            repeat_values=tuple([value] * repeats) if ran else ())

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    return launched


def _study(tmp_path: Path, *, trials: int | None, budget_s: float | None = None, top_k: int = 0,
           name: str = "s") -> Study:
    record = synthetic_record(tmp_path, name=name, trials=trials, budget_s=budget_s, top_k=top_k)
    return Study.create(record, tmp_path / "runs")


def test_failures_are_complete_with_violated_constraints(tmp_path: Path, fake_launches: list[ServeConfig]) -> None:
    study_obj = _study(tmp_path, trials=12)
    optuna_study = study_obj.run()
    told = [t for t in optuna_study.trials if "duplicate_of" not in t.user_attrs]
    complete = [t for t in told if t.state == TrialState.COMPLETE]
    trials = [t for t in complete if "control_for" not in t.user_attrs and t.user_attrs.get("launched", True)]
    controls = [t for t in complete if "control_for" in t.user_attrs and t.user_attrs.get("launched", True)]
    # --trials counts trials; a speculative trial's control launches beside it and is counted apart
    assert len(trials) == 12
    assert controls and {c.user_attrs["control_for"] for c in controls} <= {t.user_attrs["config_key"] for t in trials}
    failed = [t for t in told if t.user_attrs.get("failure_class") == "bad_flag"]
    for t in failed:
        assert t.state == TrialState.COMPLETE
        assert all(v > 0 for v in t.constraints.values())
    assert optuna_study.trials[0].user_attrs.get("baseline") == "vllm-defaults"


def test_never_launches_the_same_configuration_twice(tmp_path: Path, fake_launches: list[ServeConfig]) -> None:
    _study(tmp_path, trials=16).run()
    keys = [c.key() for c in fake_launches]
    assert len(keys) == len(set(keys))


def test_speculative_trials_launch_after_their_control(tmp_path: Path,
                                                       fake_launches: list[ServeConfig]) -> None:
    _study(tmp_path, trials=10).run()
    assert any(c.is_speculative for c in fake_launches)
    for index, config in enumerate(fake_launches):
        if config.is_speculative:
            earlier = {c.key() for c in fake_launches[:index]}
            assert config.control().key() in earlier, f"launch {index} ran before its control"


def test_sampler_finds_the_feasible_optimum_region(tmp_path: Path, fake_launches: list[ServeConfig]) -> None:
    optuna_study = _study(tmp_path, trials=25).run()
    best = best_feasible_trial(optuna_study)
    assert best is not None
    # feasible optimum: max-num-seqs 32, fp8, 4 draft tokens = 100 + 30 + 15 + 32 = 177
    assert best.value is not None and best.value >= 0.9 * 177.0
    assert best.params["max-num-seqs"] != 64  # the SLO-violating region never wins


def test_confirmation_runs_top_k_and_controls(tmp_path: Path, fake_launches: list[ServeConfig]) -> None:
    study_obj = _study(tmp_path, trials=8, top_k=2)
    optuna_study = study_obj.run()
    confirmations = study_obj.confirmations(optuna_study)
    assert 2 <= len(confirmations) <= 4
    assert all(c.accepted for c in confirmations)
    winner = study_obj.winner(optuna_study)
    assert winner is not None and winner.confirmed
    assert winner.value == max(c.median for c in confirmations)
    for c in confirmations:
        if c.speculative:
            assert any(o.control_of == c.trial for o in confirmations)


def test_budget_stops_before_a_trial_that_cannot_finish(tmp_path: Path,
                                                        fake_launches: list[ServeConfig]) -> None:
    # each synthetic trial "takes" 100 s; the first trial uses the profile's estimate (45 + 15 s)
    study_obj = _study(tmp_path, trials=None, budget_s=70.0)
    study_obj.run()
    assert len(fake_launches) == 1


def test_interrupt_marks_the_trial_and_resume_requeues_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          fake_launches: list[ServeConfig]) -> None:
    study_obj = _study(tmp_path, trials=4)
    real = step_mod.run_trial
    calls = {"n": 0}

    def interrupt_third(*args: Any, **kwargs: Any) -> TrialOutcome:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(step_mod, "run_trial", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        study_obj.run()
    interrupted = [t for t in study_obj.optuna_study().trials if t.user_attrs.get("interrupted")]
    assert 1 <= len(interrupted) <= 2  # the control and its already-asked twin, when a control is hit
    assert all(t.state == TrialState.FAIL for t in interrupted)
    resumed = Study.open("s", tmp_path / "runs")
    optuna_study = resumed.run()
    retried = [t for t in optuna_study.trials if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert len(retried) == 1 and retried[0].params == interrupted[0].params
    done = [t for t in optuna_study.trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs
            and "control_for" not in t.user_attrs and t.user_attrs.get("launched", True)]
    assert len(done) == 4  # --trials counts trials; their controls are counted apart


def test_second_tuner_on_the_same_study_is_refused(tmp_path: Path, fake_launches: list[ServeConfig]) -> None:
    from tuner.errors import StudyLockedError
    from tuner.study import StudyLock

    study_obj = _study(tmp_path, trials=1)
    with StudyLock(study_obj.path), pytest.raises(StudyLockedError, match="already being run"):
        study_obj.run()


def test_the_kv_fit_is_learnt_from_launches_and_survives_a_resume(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """gh200x4 with its catalogued checkpoint: each launch's logged KV capacity refits the model."""
    launched: list[ServeConfig] = []

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, **_kw: Any) -> TrialOutcome:
        launched.append(config)
        tdir.mkdir(parents=True, exist_ok=True)
        margins = tuple(-1.0 for _ in constraint_names(ctx.objective))
        return TrialOutcome(ok=True, value=100.0, constraints=margins, failure_class=None, reason="synthetic",
                            summary={"output_throughput": 100.0}, server_metrics={}, ready_s=1.0, duration_s=10.0,
                            trial_dir=str(tdir), config_key=config.key(), kv_cache_tokens=400_000)

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    study = Study.create(synthetic_record(tmp_path, name="kv", hw="gh200x4", trials=2), tmp_path / "runs")
    ostudy = study.run()
    assert launched
    assert any(t.user_attrs.get("kv_cache_tokens") == 400_000 for t in ostudy.trials)
    reopened = Study.open("kv", tmp_path / "runs")
    checks = reopened.prelaunch(reopened.optuna_study())
    assert checks.calibration is not None and checks.calibration.trials == len(launched)


def test_report_names_the_winner_the_failures_and_the_trials_a_client_limited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.report import build_markdown
    from tuner.study.reader import read_study

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, **_kw: Any) -> TrialOutcome:
        ran, value, constraints, failure = surface(config)
        tdir.mkdir(parents=True, exist_ok=True)
        starved = int(config.args["max-num-seqs"]) >= 32
        return TrialOutcome(ok=ran, value=value, constraints=constraints,
                            failure_class=failure or (None if all(c <= 0 for c in constraints) else "slo_violated"),
                            reason="synthetic", summary={"output_throughput": value, "p95_ttft_ms": 10.0,
                                                         "p95_itl_ms": 2.0},
                            server_metrics={"client": {"client_starved": starved, "client_saturated": False}},
                            ready_s=1.0, duration_s=10.0, trial_dir=str(tdir), config_key=config.key())

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    study = _study(tmp_path, trials=6)
    ostudy = study.run()
    flagged = [t.number for t in ostudy.trials if t.user_attrs.get("client_starved")]
    assert flagged, "the surface's max-num-seqs >= 32 trials starve the client"
    assert not any(t.user_attrs.get("client_saturated") for t in ostudy.trials)
    text = build_markdown(study, read_study(study, ostudy), images={})
    winner = study.winner(ostudy)
    assert winner is not None and f"**Winner: trial {winner.trial}, output_throughput = {winner.value:.2f}" in text
    section = text.split("## Load generator warnings", 1)[1].split("## Failures", 1)[0]
    for number in flagged:
        assert f"| {number} | " in section and "starved" in section
    for t in ostudy.trials:
        if t.number not in flagged:
            assert f"| {t.number} | " not in section
    assert "## Failures" in text


def _lucky_screening(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """A noisy node: every launch but the baseline screens 30 % above what its repeats then measure.

    The baseline (max-num-seqs 64) is worth 150 and measures it every time; any other configuration is
    worth 120 + its max-num-seqs / 4 (at most 128), and screens once at 1.3 times that: the screening
    ranks it above the recipe, and only confirmation shows it is worth less.
    """
    calls: list[tuple[str, int]] = []

    def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                  on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        calls.append((config.key(), repeats))
        tdir.mkdir(parents=True, exist_ok=True)
        seqs = int(config.args["max-num-seqs"])
        worth = 150.0 if seqs == 64 and not config.is_speculative else 120.0 + seqs / 4
        value = worth if repeats > 1 or seqs == 64 else 1.3 * worth
        met = tuple(-0.5 for _ in constraint_names(ctx.objective))
        return TrialOutcome(ok=True, value=value, constraints=met, failure_class=None, reason="synthetic",
                            summary={"output_throughput": value}, server_metrics={}, ready_s=1.0, duration_s=100.0,
                            trial_dir=str(tdir), config_key=config.key(), repeat_values=(value,) * repeats)

    monkeypatch.setattr(step_mod, "run_trial", run_trial)
    return calls


@pytest.mark.parametrize("incumbent", [True, False])
def test_the_best_baseline_is_confirmed_beside_the_candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              incumbent: bool) -> None:
    from tuner.study.confirm import ConfirmSpec

    calls = _lucky_screening(monkeypatch)
    record = synthetic_record(tmp_path, name="s", trials=6, top_k=2)
    record = record.model_copy(update={"confirm": ConfirmSpec(top_k=2, repeats=2, incumbent=incumbent)})
    study_obj = Study.create(record, tmp_path / "runs")
    optuna_study = study_obj.run()
    baseline = next(t for t in optuna_study.trials if t.user_attrs.get("baseline"))
    assert baseline.value == 150.0 and not baseline.user_attrs.get("interrupted")
    screened_higher = [t for t in optuna_study.trials if (t.value or 0) > 150.0]
    assert len(screened_higher) >= 2, "the lucky screening must put two trials above the recipe"
    confirmed = {c.trial for c in study_obj.confirmations(optuna_study)}
    winner = study_obj.winner(optuna_study)
    assert winner is not None and winner.confirmed
    if incumbent:
        # the recipe is confirmed too, and it wins: the candidates' repeats measure them below it
        assert baseline.number in confirmed
        assert winner.trial == baseline.number and winner.value == 150.0
    else:
        assert baseline.number not in confirmed
        assert winner.trial != baseline.number and winner.value < 150.0
    # one confirmation launch (with its repeats) per verdict stored
    assert sum(1 for _, repeats in calls if repeats > 1) == len(study_obj.confirmations(optuna_study))
