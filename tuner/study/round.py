"""One round of the study, written once: what every driver does with each proposal.

    rnd = Round(step, guided)
    proposal = rnd.propose()             the guide queues its next point (``--prior model``); ask; draw
    opening = rnd.open(proposal, room)   screen (a duplicate is told the earlier result; a configuration
                                         running elsewhere is skipped); a speculative proposal whose control
                                         is not launched yet needs room for two launches; the KV refit;
                                         the control, to launch first
    rnd.admit(p)                         refuse before launch (told, with its reason); None: launch it
    rnd.launch(p, ...)                   here: run the trial, record it, learn
    rnd.learned(p, outcome)              elsewhere (the Ray driver): the result came back; record, learn
    rnd.done()                           ``--stop-when-done``: the model's stop estimate says the night is won

Learning, after every launch, covers all four things a launch teaches: the KV refit and memory lessons
and the start failures (the pre-launch checks, :meth:`TrialStep.learn_from`), the prior's correction and
the stop estimate (:meth:`GuidedSearch.after_trial`). Every driver takes them here, so a study run with
PostgreSQL workers or on Ray is guided by the model after each launch, as a local one is.

:meth:`Round.play` composes the round for a driver that launches in this process (the local loop, a
PostgreSQL worker); its :class:`Seat` is what differs between them: what wraps a launch (a worker's
heartbeat and node stamp), what is shown. The Ray driver ships launches to other nodes, so its Tune
searcher calls ``propose``/``open``/``admit`` and ``learned`` itself. What remains in a driver is
*where* a trial runs and *how many run at once*.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna

from tuner.errors import SearchStalledError
from tuner.search.prelaunch import Refusal
from tuner.study.guided import GuidedSearch
from tuner.study.progress import Progress, phase_reporter
from tuner.study.ranking import best_feasible_trial, launched_keys, running_keys, write_trials_table
from tuner.study.step import Proposal, TrialStep
from tuner.trial import TrialOutcome

__all__ = ["Opening", "ProgressSeat", "Round", "Seat"]

log = logging.getLogger(__name__)

OpeningStatus = Literal["go", "duplicate", "running", "held", "no_room"]


@dataclass(frozen=True)
class Opening:
    """What :meth:`Round.open` made of a proposal.

    ``go``: launch ``control`` (when not None) first, then the proposal; ``duplicate``: told the earlier
    result; ``running``: another worker runs it, skipped; ``held``: the driver launches it later (its
    control runs already); ``no_room``: it needs its control and the budget holds one launch but not two;
    it is abandoned (FAIL, interrupted), so that ``resume`` (or, in a shared study, another worker) asks it
    again.
    """

    proposal: Proposal
    status: OpeningStatus
    control: Proposal | None = None


class Seat:
    """Where a round's launches run, for a driver that runs them in this process: what wraps and shows them.

    The base seat shows nothing and wraps nothing; :class:`ProgressSeat` shows a study's progress.
    """

    def should_stop(self) -> bool:
        return False

    @contextlib.contextmanager
    def around(self, proposal: Proposal) -> Iterator[None]:
        """What wraps one launch (a PostgreSQL worker: the control's heartbeat and node stamp)."""
        yield

    def refused(self, proposal: Proposal, verdict: Refusal) -> None:
        """A proposal refused before launch."""

    def launching(self, proposal: Proposal) -> Callable[[str], None] | None:
        """A launch begins; returns what to call at each of its phases (None: nothing)."""
        return None

    def launched(self, proposal: Proposal, outcome: TrialOutcome, view: Mapping[str, Any] | None) -> None:
        """A launch ended, recorded and learnt from; ``view`` is the model's (``--prior model``), else None."""


@dataclass
class ProgressSeat(Seat):
    """The seat of a driver that shows a study's :class:`Progress` (the local loop, a PostgreSQL worker)."""

    progress: Progress
    on_progress: Callable[[Progress], None]
    metric: str = ""
    """The objective's metric, as the progress line names it."""
    stop: Callable[[], bool] = field(default=lambda: False)

    def should_stop(self) -> bool:
        return self.stop()

    def refused(self, proposal: Proposal, verdict: Refusal) -> None:
        self.progress.events.append(f"trial {proposal.number} pruned before launch: {verdict.reason[:100]}")
        self.on_progress(self.progress)

    def launching(self, proposal: Proposal) -> Callable[[str], None]:
        progress = self.progress
        progress.trial_number = proposal.number
        progress.current = (f"control {proposal.number} (speculation off)" if _is_control(proposal)
                            else f"trial {proposal.number}")
        return phase_reporter(progress, self.on_progress)

    def launched(self, proposal: Proposal, outcome: TrialOutcome, view: Mapping[str, Any] | None) -> None:
        progress = self.progress
        if view is not None:
            estimate = (f"chance an untried configuration wins: {view['chance_to_beat']:.0%}"
                        if view["chance_to_beat"] is not None
                        else f"model distrusted since launch {view['distrust_at']}: the measurements lead")
            progress.events.append(f"model: predicted {view['predicted_corrected']}, measured {view['measured']}; "
                                   + estimate)
        best = best_feasible_trial(proposal.trial.study)
        if best is not None and best.value is not None:
            progress.best_value = best.value
            progress.best_trial = best.number
        progress.launched_one(proposal.number, outcome, self.metric, control=_is_control(proposal))
        self.on_progress(progress)


def _is_control(proposal: Proposal) -> bool:
    """A speculative trial's no-speculation twin (not a ``--trials`` trial)."""
    return "control_for" in proposal.trial.user_attrs


@dataclass
class Round:
    """One round of a study: propose, screen, control first, refuse, launch, learn (see the module docstring)."""

    step: TrialStep
    guided: GuidedSearch | None = None
    """``--prior model``: queues the corrected model's proposals and learns from every launch."""
    shared: bool = False
    """Other workers tell into this study now (PostgreSQL): a configuration one of them runs is skipped,
    and an abandoned proposal is queued again at once rather than on ``resume``."""
    stop_when_done: bool = False
    """``--stop-when-done``: :meth:`done` may end screening on the model's stop estimate."""

    @property
    def ostudy(self) -> optuna.Study:
        return self.step.ostudy

    # -- before a launch -------------------------------------------------------------------------------
    def ask(self) -> optuna.Trial:
        """Ask Optuna, after the guide queued its next point when nothing else is queued."""
        if self.guided is not None:
            self.guided.before_ask(self.ostudy)
        return self.ostudy.ask()

    def propose(self, trial: optuna.Trial | None = None) -> Proposal:
        """The next proposal (``trial``, when the driver asked it already: a worker's heartbeat covers it)."""
        return self.step.propose(trial if trial is not None else self.ask())

    def open(self, proposal: Proposal, room: Callable[[int], bool] | None = None,
             busy: Mapping[str, int] | None = None, hold: Callable[[Proposal], bool] | None = None) -> Opening:
        """Screen ``proposal`` and find its control (see :class:`Opening`).

        ``room(n)``: whether the budget holds ``n`` more launches (None: no budget). ``busy``: configuration
        keys the driver runs now, beside the study's RUNNING trials of a shared study. ``hold(proposal)``:
        the driver keeps a speculative proposal whose control it runs already, to launch once that ends.
        """
        step = self.step
        launched = launched_keys(self.ostudy)
        running = dict(running_keys(self.ostudy, exclude_number=proposal.number)) if self.shared else {}
        running.update(busy or {})
        screened = step.screen(proposal, launched, running)
        if screened is not None:
            return Opening(proposal, "duplicate" if screened == "duplicate" else "running")
        if hold is not None and proposal.config.is_speculative and hold(proposal):
            return Opening(proposal, "held")
        if room is not None and step.needs_control(proposal, launched, running) and not room(2):
            log.info("trial %d speculates and its control is not launched yet: the pair does not fit the budget "
                     "left", proposal.number)
            self.abandon(proposal)
            return Opening(proposal, "no_room")
        step.learn_kv()  # every launch so far: this driver's, other workers', a resumed study's
        return Opening(proposal, "go", step.control_for(proposal, launched, running))

    def admit(self, proposal: Proposal) -> Refusal | None:
        """The pre-launch checks; a refusal is told, with its reason (and counts in the stop rule)."""
        return self.step.refuse(proposal)

    def abandon(self, proposal: Proposal) -> None:
        """A proposal not launched after all: FAIL, interrupted; in a shared study queued again now."""
        self.step.interrupted(proposal)
        if self.shared:
            self.requeue(proposal)

    def requeue(self, proposal: Proposal) -> None:
        self.ostudy.enqueue_trial(dict(proposal.trial.params), user_attrs={"retry_of": proposal.number})

    # -- a launch and what it teaches ------------------------------------------------------------------
    def launch(self, proposal: Proposal, *, should_stop: Callable[[], bool],
               on_phase: Callable[[str], None] | None = None) -> tuple[TrialOutcome, dict[str, Any] | None]:
        """Run the trial here, record it, and learn from it: its outcome and the model's view (:meth:`learn`).
        An interrupt marks it interrupted (FAIL), queues it again in a shared study, and propagates."""
        try:
            outcome = self.step.launch(proposal, should_stop=should_stop, on_phase=on_phase)
        except KeyboardInterrupt:
            if self.shared:
                log.warning("interrupted: trial %d goes back to the queue", proposal.number)
                self.requeue(proposal)
            raise
        return outcome, self.learn(proposal)

    def learned(self, proposal: Proposal, outcome: TrialOutcome) -> None:
        """A launch that ran elsewhere came back: record it, then learn from it as from one run here."""
        self.step.record(proposal.trial, outcome)
        self.step.learn_from(proposal, outcome)
        self.learn(proposal)

    def learn(self, proposal: Proposal) -> dict[str, Any] | None:
        """The guide's part of learning: the prior's correction refitted, the stop estimate, the residual."""
        return None if self.guided is None else self.guided.after_trial(self.ostudy, proposal.number)

    def done(self) -> bool:
        """``--stop-when-done`` and the model gives untried configurations too small a chance to win."""
        return self.stop_when_done and self.guided is not None and self.guided.done()

    # -- the round, for a driver that launches here ----------------------------------------------------
    def play(self, seat: Seat, trial: optuna.Trial | None = None,
             room: Callable[[int], bool] | None = None) -> OpeningStatus:
        """One whole round here: propose (or take ``trial``), open, the control first, then the proposal.

        Returns the opening's status (``no_room``: nothing launched, the driver stops).
        """
        opening = self.open(self.propose(trial), room)
        if opening.status != "go":
            return opening.status
        if opening.control is not None:
            # The control launches first, beside its speculative twin, so that the twin's gates can compare
            # with it and the report can show the speculative gain.
            try:
                self._attempt(opening.control, seat)
            except SearchStalledError:
                self.step.skip(opening.proposal, "the search stopped on its control's refusal, before it launched")
                raise
            except BaseException:
                self.abandon(opening.proposal)
                raise
        self._attempt(opening.proposal, seat)
        return "go"

    def _attempt(self, proposal: Proposal, seat: Seat) -> None:
        verdict = self.admit(proposal)
        if verdict is not None:
            seat.refused(proposal, verdict)
            return
        with seat.around(proposal):
            on_phase = seat.launching(proposal)
            outcome, view = self.launch(proposal, should_stop=seat.should_stop, on_phase=on_phase)
        seat.launched(proposal, outcome, view)
        write_trials_table(self.ostudy, self.step.path)
