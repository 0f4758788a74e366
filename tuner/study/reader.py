"""A study read once, as plain data: what the report, the export and the night summary read.

:func:`read_study` opens a study's Optuna storage, reads every trial into a frozen :class:`TrialRecord`
(number, state, params, value, user attributes, constraint margins), and the winner and confirmations
the confirmation phase picks; it returns a :class:`StudyReading`, which holds no Optuna object. Only
``study/`` and ``backends/`` import Optuna: :mod:`tuner.report`, :mod:`tuner.export` and
:mod:`tuner.night` read a study through this module, so a failure, a launch and a feasible trial are
counted one way in all three (:func:`failure_counts`).
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.confirm import Confirmation, Winner

if TYPE_CHECKING:
    from tuner.study.study import Study

__all__ = ["StudyReading", "TrialRecord", "failure_class_of", "failure_counts", "read_study"]

log = logging.getLogger(__name__)

FINISHED_STATES = ("COMPLETE", "FAIL", "PRUNED")
"""States of a trial that has ended (WAITING is queued, RUNNING is still running)."""


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the study stores it, without Optuna."""

    number: int
    state: str
    """Optuna's state by name: ``COMPLETE``, ``FAIL``, ``PRUNED``, ``RUNNING`` or ``WAITING``."""
    params: dict[str, Any]
    value: float | None
    user_attrs: dict[str, Any]
    constraints: tuple[float, ...]
    """The SLO margins the trial step recorded (``<= 0``: met), in the objective's constraint order."""

    @property
    def complete(self) -> bool:
        return self.state == "COMPLETE"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def feasible(self) -> bool:
        """Ran (or was screened), passed its gates and met every SLO."""
        return self.complete and bool(self.user_attrs.get("feasible"))

    @property
    def duplicate_of(self) -> int | None:
        """The trial whose result this one reused (the sampler proposed a configuration told before)."""
        original = self.user_attrs.get("duplicate_of")
        return None if original is None else int(original)

    @property
    def launched(self) -> bool:
        """Started a server (False: refused before launch by the pre-launch checks)."""
        return bool(self.user_attrs.get("launched", True))

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialRecord:
        attrs = dict(t.user_attrs)
        return cls(number=t.number, state=t.state.name, params=dict(t.params),
                   value=None if t.value is None else float(t.value), user_attrs=attrs,
                   constraints=tuple(float(c) for c in attrs.get("constraints") or ()))


def failure_class_of(t: TrialRecord) -> str | None:
    """The class a trial is counted under as a failure; None when it is not one.

    Not failures: a feasible trial; a trial not finished (WAITING: queued; RUNNING: under way); a duplicate
    (it reused the result of the trial that took its configuration first, which is counted); a proposal
    skipped because another worker runs its configuration. Every other trial is one failure, of its
    ``failure_class`` (``infeasible`` for one refused before launch, ``slo_violated``, ``crash``, ...),
    ``interrupted`` for one abandoned without a class, else its state (``fail``).
    """
    if not t.finished or t.feasible or t.duplicate_of is not None or "skipped" in t.user_attrs:
        return None
    cls = t.user_attrs.get("failure_class")
    if cls:
        return str(cls)
    return "interrupted" if t.user_attrs.get("interrupted") else t.state.lower()


def failure_counts(trials: Iterable[TrialRecord]) -> dict[str, int]:
    """Failure class → how many trials failed so (:func:`failure_class_of`), the most common first."""
    counts = Counter(c for c in map(failure_class_of, trials) if c is not None)
    return dict(counts.most_common())


@dataclass(frozen=True)
class StudyReading:
    """A study's trials, winner and confirmations as read at one moment (no Optuna object)."""

    name: str
    direction: str
    """``maximize`` or ``minimize``."""
    sampler: str
    """The sampler's class name (``TPESampler``, ...)."""
    user_attrs: dict[str, Any]
    trials: tuple[TrialRecord, ...]
    winner: Winner | None
    confirmations: tuple[Confirmation, ...]
    importances: dict[str, float] = field(default_factory=dict)
    """Parameter importance over the launched trials (empty unless read with ``importances=True``)."""

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"

    def trial(self, number: int) -> TrialRecord:
        found = next((t for t in self.trials if t.number == number), None)
        if found is None:
            raise KeyError(f"study {self.name!r} has no trial {number}")
        return found

    def complete(self) -> list[TrialRecord]:
        """Every COMPLETE trial (launched, refused before launch, or a duplicate of one of those)."""
        return [t for t in self.trials if t.complete]

    def told(self) -> list[TrialRecord]:
        """COMPLETE trials that are not duplicates: each configuration once (launched or refused before launch)."""
        return [t for t in self.trials if t.complete and t.duplicate_of is None]

    def ranked(self) -> list[TrialRecord]:
        """Feasible trials with a value (duplicates left out), the best first."""
        sign = 1.0 if self.maximize else -1.0
        return sorted((t for t in self.told() if t.feasible and t.value is not None),
                      key=lambda t: sign * float(t.value or 0.0), reverse=True)

    def best_feasible(self) -> TrialRecord | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def failure_counts(self) -> dict[str, int]:
        return failure_counts(self.trials)

    def launched_count(self) -> int:
        """Trials that started a server (duplicates left out)."""
        return sum(1 for t in self.told() if t.launched)

    def refused_count(self) -> int:
        """Configurations refused before launch (duplicates left out)."""
        return sum(1 for t in self.told() if not t.launched)


def param_importances(ostudy: optuna.Study) -> dict[str, float]:
    """Optuna's parameter importance over the feasible launched trials; empty below three of them."""
    launched = [t for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if "duplicate_of" not in t.user_attrs]
    feasible = [t for t in launched if t.user_attrs.get("feasible")]
    if len(feasible) < 3:
        return {}
    # Optuna's default evaluator ranks parameters for reaching LOW targets: flip the sign when
    # maximizing, and give infeasible trials the worst feasible target seen.
    sign = -1.0 if ostudy.direction == optuna.study.StudyDirection.MAXIMIZE else 1.0
    worst = max(sign * float(t.value or 0.0) for t in feasible)

    def target(t: FrozenTrial) -> float:
        return sign * float(t.value or 0.0) if t.user_attrs.get("feasible") else worst

    try:
        with warnings.catch_warnings():  # it warns for every maximize study; the sign is handled above
            warnings.simplefilter("ignore", UserWarning)
            return dict(optuna.importance.get_param_importances(ostudy, target=target))
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        log.info("parameter importance not available: %s", exc)
        return {}


def read_study(study_obj: Study, ostudy: optuna.Study | None = None, *, importances: bool = False) -> StudyReading:
    """Read ``study_obj``'s Optuna study (``ostudy`` when the caller holds it open) into a :class:`StudyReading`."""
    ostudy = ostudy if ostudy is not None else study_obj.optuna_study()
    direction = "maximize" if ostudy.direction == optuna.study.StudyDirection.MAXIMIZE else "minimize"
    return StudyReading(
        name=ostudy.study_name, direction=direction, sampler=type(ostudy.sampler).__name__,
        user_attrs=dict(ostudy.user_attrs),
        trials=tuple(TrialRecord.of(t) for t in ostudy.get_trials(deepcopy=False)),
        winner=study_obj.winner(ostudy), confirmations=tuple(study_obj.confirmations(ostudy)),
        importances=param_importances(ostudy) if importances else {})
