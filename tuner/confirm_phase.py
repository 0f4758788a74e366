"""The confirmation phase: after screening, relaunch the top-k and pick the winner.

Each candidate is relaunched once, at the concurrency its screening ladder chose, and runs a longer
workload ``repeats`` times inside that launch; :func:`tuner.confirm.judge` scores the repeats. A
speculative candidate is followed by its no-speculation control, so the winner's speculative gain is
measured under the same conditions. Verdicts are stored in the Optuna study (``confirmations``), so a
killed or resumed study keeps the ones already done and confirms only the rest.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.confirm import Confirmation, ConfirmSpec, judge, pick_winner
from tuner.failures import FailureClass
from tuner.objective import Objective
from tuner.profile import HardwareProfile
from tuner.space import ServeConfig, build_config

if TYPE_CHECKING:
    from tuner.study import Progress
    from tuner.trial import TrialContext, TrialOutcome

RunTrial = Callable[..., "TrialOutcome"]
"""``tuner.trial.run_trial``'s signature; passed in so the study (and its tests) choose the runner."""


@dataclass(frozen=True)
class Winner:
    trial: int
    trial_dir: Path
    value: float
    confirmed: bool
    confirmation: Confirmation | None
    all_confirmations: tuple[Confirmation, ...]


def best_feasible_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best COMPLETE trial that ran, passed its gates and met every SLO."""
    candidates = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                  if t.user_attrs.get("feasible") and "duplicate_of" not in t.user_attrs
                  and t.value is not None]
    if not candidates:
        return None
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    return max(candidates, key=lambda t: sign * float(t.value or 0.0))


@dataclass
class ConfirmationPhase:
    """Confirms one study's top-k screening trials; ``path`` is the study folder."""

    path: Path
    spec: ConfirmSpec
    objective: Objective
    profile: HardwareProfile

    @property
    def maximize(self) -> bool:
        return self.objective.direction == "maximize"

    def confirmations(self, study: optuna.Study) -> list[Confirmation]:
        return [Confirmation(**{**c, "values": tuple(c["values"])}) for c in study.user_attrs.get("confirmations", [])]

    def candidates(self, study: optuna.Study) -> list[tuple[int, ServeConfig, int | None]]:
        """Top-k distinct feasible screening trials, each speculative one followed by its control."""
        top = sorted((t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                      if t.user_attrs.get("feasible") and "duplicate_of" not in t.user_attrs and t.value is not None),
                     key=lambda t: float(t.value or 0.0), reverse=self.maximize)[: self.spec.top_k]
        out: list[tuple[int, ServeConfig, int | None]] = []
        seen: set[str] = set()
        for t in top:
            config = build_config(self.profile, t.params)
            if config.key() not in seen:
                out.append((t.number, config, None))
                seen.add(config.key())
            if config.is_speculative and config.control().key() not in seen:
                out.append((t.number, config.control(), t.number))
                seen.add(config.control().key())
        return out

    def reserve_s(self, study: optuna.Study) -> float:
        """Wall time to keep for this phase when deciding whether to screen once more."""
        if self.spec.top_k == 0:
            return 0.0
        finished = [t for t in study.get_trials(deepcopy=False) if "duration_s" in t.user_attrs]
        if not finished:
            return 0.0
        launch = statistics.median(float(t.user_attrs.get("ready_s") or 0.0) for t in finished)
        load = statistics.median(max(0.0, float(t.user_attrs["duration_s"]) - float(t.user_attrs.get("ready_s") or 0.0))
                                 for t in finished)
        per_candidate = launch + load * self.spec.repeats * self.spec.workload_scale
        return per_candidate * self.spec.top_k * 1.5  # controls of speculative candidates, roughly

    def run(self, study: optuna.Study, ctx: TrialContext, run_trial: RunTrial, progress: Progress,
            on_progress: Callable[[Progress], None], should_stop: Callable[[], bool],
            deadline: float | None = None) -> None:
        if self.spec.top_k == 0:
            return
        per_candidate_s = self.reserve_s(study) / (self.spec.top_k * 1.5)
        done = {(c.trial, c.config_key) for c in self.confirmations(study)}
        for number, config, control_of in self.candidates(study):
            if (number, config.key()) in done or should_stop():
                continue
            if deadline is not None and time.time() + per_candidate_s > deadline:
                progress.events.append(f"no time left to confirm trial {number}; its result stays unconfirmed")
                on_progress(progress)
                continue
            suffix = "-control" if control_of is not None else ""
            tdir = self.path / "confirm" / f"{number:04d}{suffix}"
            progress.trial_number = number
            progress.phase = f"confirm{suffix}"
            on_progress(progress)
            outcome = run_trial(self._context(ctx, study.trials[number]), config, tdir, should_stop=should_stop,
                                repeats=self.spec.repeats,
                                on_phase=_phase_reporter(progress, on_progress, f"confirm{suffix}"))
            if outcome.failure_class == FailureClass.INTERRUPTED.value:
                raise KeyboardInterrupt
            verdict = judge(number, config.key(), outcome.repeat_values, all_feasible=outcome.feasible, spec=self.spec,
                            maximize=self.maximize, trial_dir=str(tdir.relative_to(self.path)),
                            speculative=config.is_speculative,
                            failure=None if outcome.ok else f"{outcome.failure_class}: {outcome.reason[:200]}",
                            control_of=control_of)
            stored = list(study.user_attrs.get("confirmations", []))
            stored.append(verdict.to_json())
            study.set_user_attr("confirmations", stored)
            progress.events.append(f"confirm trial {number}{suffix}: {verdict.reason}")
            on_progress(progress)

    def _context(self, ctx: TrialContext, screened: FrozenTrial) -> TrialContext:
        """The longer workload, at the concurrency the screening ladder chose (not the whole ladder again)."""
        workload = self.objective.workload
        prompts = max(1, round(workload.num_prompts * self.spec.workload_scale))
        longer = workload.model_copy(update={"num_prompts": prompts})
        update: dict[str, Any] = {"workload": longer}
        chosen_c = screened.user_attrs.get("max_concurrency")
        if chosen_c and self.objective.ladder is not None:
            update["ladder"] = self.objective.ladder.model_copy(update={"steps": (int(chosen_c),)})
            update["workload"] = longer.model_copy(update={"concurrency": int(chosen_c)})
        return dataclasses.replace(ctx, objective=self.objective.model_copy(update=update))

    def winner(self, study: optuna.Study) -> Winner | None:
        """What to export: the best confirmed candidate, else the best feasible screening trial."""
        confirmations = self.confirmations(study)
        chosen = pick_winner(confirmations, maximize=self.maximize)
        if chosen is not None:
            return Winner(trial=chosen.trial, trial_dir=self.path / chosen.trial_dir, value=chosen.median,
                          confirmed=True, confirmation=chosen, all_confirmations=tuple(confirmations))
        best = best_feasible_trial(study)
        if best is None or best.value is None:
            return None
        return Winner(trial=best.number, trial_dir=self.path / str(best.user_attrs["trial_dir"]), value=best.value,
                      confirmed=False, confirmation=None, all_confirmations=tuple(confirmations))


def _phase_reporter(progress: Progress, on_progress: Callable[[Progress], None],
                    prefix: str) -> Callable[[str], None]:
    def report(name: str) -> None:
        progress.phase = f"{prefix} {name}"
        on_progress(progress)

    return report
