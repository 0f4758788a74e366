"""The local driver: one tuner runs a study's trials one after another on this node, then confirms.

Each round takes the trial step (:mod:`tuner.study.step`): ask, launch a speculative proposal's
control first, then screen (duplicate), pre-launch checks, launch, record. The loop stops at
``--trials`` launches, before a trial that could not finish inside ``--budget`` (keeping time for
the confirmation phase), on a stop request, or when the step says the search is stalled
(:class:`~tuner.errors.SearchStalledError`): the space is exhausted, or every proposal is refused.
Either way the confirmation phase and the trials table still run; a study stopped by refusals then
raises that error, so the command fails with its reason after the morning's files are written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import optuna

from tuner.errors import SearchStalledError
from tuner.study.clock import WALL, StudyClock
from tuner.study.confirm import ConfirmationPhase
from tuner.study.guided import GuidedSearch
from tuner.study.progress import Progress, phase_reporter
from tuner.study.ranking import (
    best_feasible_trial,
    launched_controls,
    launched_keys,
    launched_numbers,
    time_for_another,
    write_trials_table,
)
from tuner.study.record import StudyRecord
from tuner.study.step import Proposal, TrialStep

__all__ = ["LocalLoop"]

log = logging.getLogger(__name__)


class LocalLoop:
    """Screening, then confirmation, of one study on this node (``Study.run`` builds and runs it)."""

    def __init__(self, step: TrialStep, record: StudyRecord, confirmation: ConfirmationPhase,
                 first_trial_estimate_s: float, clock: StudyClock = WALL, guided: GuidedSearch | None = None) -> None:
        self.step = step
        self.record = record
        self.confirmation = confirmation
        self.first_trial_estimate_s = first_trial_estimate_s
        self.clock = clock
        """Node seconds: ``--budget``, the deadline and the trials' durations are on it."""
        self.guided = guided
        """``--prior model``: queues the corrected model's proposals, learns from each launch."""

    def run(self, on_progress: Callable[[Progress], None], should_stop: Callable[[], bool]) -> optuna.Study:
        step, record, ostudy = self.step, self.record, self.step.ostudy
        started = self.clock.now()
        deadline = started + record.budget_s if record.budget_s else None
        progress = Progress(study=record.name, target=record.trials, deadline=deadline, clock=self.clock)
        launched = launched_keys(ostudy)
        progress.launched = len(launched_numbers(ostudy))
        progress.controls = len(launched_controls(ostudy))
        self._update_best(progress)
        stalled: SearchStalledError | None = None
        while True:
            if record.trials is not None and progress.launched >= record.trials:
                progress.last = f"reached --trials {record.trials}"
                break
            # Keep time for confirmation, but never more than a third of the budget for it.
            reserve_s = min(self.confirmation.reserve_s(ostudy), (record.budget_s or 0.0) / 3)
            if deadline is not None and not time_for_another(ostudy, deadline, self.first_trial_estimate_s,
                                                             reserve_s, now=self.clock.now()):
                progress.last = "budget left is shorter than one trial; stopping"
                break
            if should_stop():
                break
            if self.guided is not None and record.stop_when_done and self.guided.done():
                chance = self.guided.history[-1]["chance_to_beat"]
                progress.last = (f"--stop-when-done: the model gives untried configurations a {chance:.0%} chance "
                                 "to beat the winner; the rest of the budget goes to confirmation")
                progress.events.append(progress.last)
                self.confirmation = self.confirmation.with_budget_for_repeats(
                    ostudy, None if deadline is None else deadline - self.clock.now())
                break
            if self.guided is not None:
                self.guided.before_ask(ostudy)
            try:
                if not self._round(launched, progress, on_progress, should_stop, deadline, reserve_s):
                    progress.last = ("budget left is shorter than a speculative trial with its control (two "
                                     "launches); stopping, the trial goes back to the queue")
                    progress.events.append(progress.last)
                    break
            except SearchStalledError as exc:
                stalled = exc
                progress.last = str(exc)
                progress.events.append(f"search stopped ({exc.kind}): {exc}")
                on_progress(progress)
                break
        if not should_stop():
            self.confirmation.run(ostudy, step.ctx, step.run_trial, progress, on_progress, should_stop, deadline,
                                  clock=self.clock)
        progress.phase = "done"
        progress.stage = "done"
        on_progress(progress)
        write_trials_table(ostudy, step.path)
        if stalled is not None and stalled.kind == "refused":
            raise stalled
        return ostudy

    def _round(self, launched: dict[str, int], progress: Progress, on_progress: Callable[[Progress], None],
               should_stop: Callable[[], bool], deadline: float | None = None, reserve_s: float = 0.0) -> bool:
        """One proposal: its control first when it speculates, then the proposal itself.

        False, with nothing launched and the proposal back in the queue (FAIL, interrupted: re-queued on
        resume), when it needs a control and the budget holds one launch but not two.
        """
        step = self.step
        proposal = step.propose()
        if (deadline is not None and step.needs_control(proposal, launched)
                and not time_for_another(step.ostudy, deadline, self.first_trial_estimate_s, reserve_s,
                                         now=self.clock.now(), launches=2)):
            log.info("trial %d speculates and its control is not launched yet: the pair does not fit the budget "
                     "left", proposal.number)
            step.interrupted(proposal)
            return False
        control = step.control_for(proposal, launched)
        if control is not None:
            # The control launches first, beside its speculative twin, so that the twin's gates can
            # compare with it and the report can show the speculative gain.
            try:
                self._attempt(control, launched, progress, on_progress, should_stop)
            except SearchStalledError:
                step.skip(proposal, "the search stopped on its control's refusal, before it launched")
                raise
            except BaseException:
                step.interrupted(proposal)
                raise
        self._attempt(proposal, launched, progress, on_progress, should_stop)
        return True

    def _attempt(self, proposal: Proposal, launched: dict[str, int], progress: Progress,
                 on_progress: Callable[[Progress], None], should_stop: Callable[[], bool]) -> str:
        """Tell one proposal: reuse a duplicate, refuse before launch, or launch it."""
        step = self.step
        if step.screen(proposal, launched) is not None:
            return "duplicate"
        verdict = step.refuse(proposal)
        if verdict is not None:
            launched[proposal.key] = proposal.number
            progress.events.append(f"trial {proposal.number} pruned before launch: {verdict.reason[:100]}")
            on_progress(progress)
            return "pruned"
        progress.trial_number = proposal.number
        control = "control_for" in proposal.trial.user_attrs  # a speculative trial's twin: not a --trials trial
        progress.current = f"control {proposal.number} (speculation off)" if control else f"trial {proposal.number}"
        outcome = step.launch(proposal, should_stop=should_stop, on_phase=phase_reporter(progress, on_progress))
        launched[proposal.key] = proposal.number
        if self.guided is not None:
            seen = self.guided.after_trial(step.ostudy, proposal.number)
            estimate = (f"chance an untried configuration wins: {seen['chance_to_beat']:.0%}"
                        if seen["chance_to_beat"] is not None
                        else f"model distrusted since launch {seen['distrust_at']}: the measurements lead")
            progress.events.append(f"model: predicted {seen['predicted_corrected']}, measured {seen['measured']}; "
                                   + estimate)
        self._update_best(progress)
        progress.launched_one(proposal.number, outcome, step.objective.metric, control=control)
        on_progress(progress)
        write_trials_table(step.ostudy, step.path)
        return "launched"

    def _update_best(self, progress: Progress) -> None:
        best = best_feasible_trial(self.step.ostudy)
        if best is not None and best.value is not None:
            progress.best_value = best.value
            progress.best_trial = best.number
