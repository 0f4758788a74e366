"""Confirmation goes on down the ranking when every challenger is rejected.

On the independent h200x8 node a run's two best screening values sat on the TTFT SLO's edge, both were
rejected in confirmation, and the study exported the recipe at 0.29 of the optimum while a launch close to
the optimum was third in line. The launches are replaced by a deterministic function of the configuration
(a stand-in for what the node would measure); the study, its trials and the confirmation phase are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution

from tuner.objective import Objective, constraint_names
from tuner.search import load_profile
from tuner.search.space import ServeConfig
from tuner.study.confirm import NEXT_IN_LINE, ConfirmationPhase, ConfirmSpec
from tuner.study.progress import Progress
from tuner.trial import TrialContext, TrialOutcome

RECIPE = 64
"""max-num-seqs of the recipe baseline (the cpu profile's vllm-defaults)."""


def _study(screened: dict[int, float], *, more: float | None = None) -> optuna.Study:
    """A finished screening: one trial per max-num-seqs, the recipe's flagged as a baseline (``more``: one
    challenger more, the recipe's with a smaller token budget, screened at that value)."""
    profile = load_profile("cpu")
    base = dict(profile.baselines[0].values)
    study = optuna.create_study(direction="maximize")
    for seqs, value in screened.items():
        params = {**base, "max-num-seqs": seqs}
        attrs: dict[str, Any] = {"feasible": True, **({"baseline": "vllm-defaults"} if seqs == RECIPE else {})}
        study.add_trial(optuna.trial.create_trial(
            value=value, params=params, user_attrs=attrs,
            distributions={k: CategoricalDistribution([v]) for k, v in params.items()}))
    if more is not None:
        params = {**base, "max-num-batched-tokens": 512}
        study.add_trial(optuna.trial.create_trial(
            value=more, params=params, user_attrs={"feasible": True},
            distributions={k: CategoricalDistribution([v]) for k, v in params.items()}))
    return study


def _confirm(tmp_path: Path, study: optuna.Study, holds: dict[int, float]) -> tuple[ConfirmationPhase, list[int]]:
    """Run the confirmation phase; a configuration in ``holds`` repeats at that value within its SLOs, any other
    misses an SLO in every repeat. Returns the phase and the max-num-seqs confirmed, in order."""
    objective = Objective.model_validate({"name": "t", "metric": "output_throughput", "slos": {"p95_ttft_ms": 1000},
                                          "workload": {"input_len": 8, "output_len": 8, "num_prompts": 4}})
    phase = ConfirmationPhase(tmp_path, ConfirmSpec(), objective, load_profile("cpu"))
    launched: list[int] = []

    def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                  on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        seqs = int(config.args["max-num-seqs"])
        launched.append(seqs)
        value = holds.get(seqs, 150.0)
        margin = -0.1 if seqs in holds else 0.02
        return TrialOutcome(ok=True, value=value, constraints=(margin,) * len(constraint_names(ctx.objective)),
                            failure_class=None, reason="stand-in", summary={"output_throughput": value},
                            server_metrics={}, ready_s=1.0, duration_s=5.0, trial_dir=str(tdir),
                            config_key=config.key(), repeat_values=(value,) * repeats)

    ctx = TrialContext(server_cmd=["vllm"], model="m", objective=objective)
    phase.run(study, ctx, run_trial, Progress(study="t"), lambda _: None, lambda: False)
    return phase, launched


def test_the_next_in_line_is_confirmed_when_both_challengers_are_rejected(tmp_path: Path) -> None:
    # screening: two challengers high on an SLO's edge, a third above the recipe, a fourth below it
    study = _study({RECIPE: 100.0, 32: 140.0, 16: 135.0, 8: 120.0, 4: 90.0})
    phase, launched = _confirm(tmp_path, study, holds={RECIPE: 100.0, 8: 118.0, 4: 95.0})
    assert launched == [32, 16, RECIPE, 8]  # the top two, the recipe, then the next in line; not the one below
    winner = phase.winner(study)
    assert winner is not None and winner.confirmed and study.trials[winner.trial].params["max-num-seqs"] == 8


def test_the_next_in_line_stops_where_the_recipe_holds(tmp_path: Path) -> None:
    # every challenger is rejected, and what is left screened below the recipe's confirmed median
    study = _study({RECIPE: 100.0, 32: 140.0, 16: 135.0, 8: 99.0, 4: 98.0})
    phase, launched = _confirm(tmp_path, study, holds={RECIPE: 100.0, 8: 118.0, 4: 95.0})
    assert launched == [32, 16, RECIPE]
    winner = phase.winner(study)
    assert winner is not None and study.trials[winner.trial].user_attrs.get("baseline") == "vllm-defaults"


def test_the_next_in_line_goes_no_further_than_its_cap(tmp_path: Path) -> None:
    # five challengers, all rejected: the top two, then NEXT_IN_LINE more, not the fifth
    study = _study({RECIPE: 60.0, 32: 140.0, 16: 125.0, 8: 110.0, 4: 100.0}, more=90.0)
    _, launched = _confirm(tmp_path, study, holds={RECIPE: 60.0})
    assert NEXT_IN_LINE == 2
    assert launched == [32, 16, RECIPE, 8, 4]
