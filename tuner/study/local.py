"""The local driver: one tuner runs a study's rounds one after another on this node, then confirms.

Each round is the study's one round (:mod:`tuner.study.round`): propose, screen, a speculative
proposal's control first, pre-launch checks, launch, learn. This driver decides only that its trials
run here, one at a time, and when to stop: at
``--trials`` launches, before a trial that could not finish inside ``--budget`` (keeping time for
the confirmation phase), on a stop request, or when the step says the search is stalled
(:class:`~tuner.errors.SearchStalledError`): the space is exhausted, or every proposal is refused.
Either way the confirmation phase and the trials table still run; a study stopped by refusals then
raises that error, so the command fails with its reason after the morning's files are written.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna

from tuner.errors import SearchStalledError
from tuner.study.clock import WALL, StudyClock
from tuner.study.confirm import ConfirmationPhase
from tuner.study.progress import Progress
from tuner.study.ranking import (
    best_feasible_trial,
    launched_controls,
    launched_numbers,
    time_for_another,
    write_trials_table,
)
from tuner.study.record import StudyRecord
from tuner.study.round import ProgressSeat, Round

__all__ = ["LocalLoop"]


class LocalLoop:
    """Screening, then confirmation, of one study on this node (``Study.run`` builds and runs it)."""

    def __init__(self, round_: Round, record: StudyRecord, confirmation: ConfirmationPhase,
                 first_trial_estimate_s: float, clock: StudyClock = WALL) -> None:
        self.round = round_
        self.record = record
        self.confirmation = confirmation
        self.first_trial_estimate_s = first_trial_estimate_s
        self.clock = clock
        """Node seconds: ``--budget``, the deadline and the trials' durations are on it."""

    def run(self, on_progress: Callable[[Progress], None], should_stop: Callable[[], bool]) -> optuna.Study:
        rnd, record = self.round, self.record
        step, ostudy = rnd.step, rnd.ostudy
        deadline = self.clock.now() + record.budget_s if record.budget_s else None
        progress = Progress(study=record.name, target=record.trials, deadline=deadline, clock=self.clock)
        progress.launched = len(launched_numbers(ostudy))
        progress.controls = len(launched_controls(ostudy))
        best = best_feasible_trial(ostudy)
        if best is not None and best.value is not None:
            progress.best_value, progress.best_trial = best.value, best.number
        seat = ProgressSeat(progress, on_progress, metric=step.objective.metric, stop=should_stop)
        stalled: SearchStalledError | None = None
        while True:
            if record.trials is not None and progress.launched >= record.trials:
                progress.last = f"reached --trials {record.trials}"
                break
            # Keep time for confirmation, but never more than a third of the budget for it.
            reserve_s = min(self.confirmation.reserve_s(ostudy), (record.budget_s or 0.0) / 3)

            def room(launches: int, reserve_s: float = reserve_s) -> bool:
                return deadline is None or time_for_another(ostudy, deadline, self.first_trial_estimate_s, reserve_s,
                                                            now=self.clock.now(), launches=launches)

            if not room(1):
                progress.last = "budget left is shorter than one trial; stopping"
                break
            if should_stop():
                break
            if rnd.guided is not None and rnd.done():
                chance = rnd.guided.history[-1]["chance_to_beat"]
                progress.last = (f"--stop-when-done: the model gives untried configurations a {chance:.0%} chance "
                                 "to beat the winner; the rest of the budget goes to confirmation")
                progress.events.append(progress.last)
                self.confirmation = self.confirmation.with_budget_for_repeats(
                    ostudy, None if deadline is None else deadline - self.clock.now())
                break
            try:
                if rnd.play(seat, room=room) == "no_room":
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
