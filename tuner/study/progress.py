"""What a running study shows: :class:`Progress`, updated at every phase change and handed to the CLI."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.trial import TrialOutcome

__all__ = ["Progress", "phase_reporter"]


@dataclass
class Progress:
    """What the CLI shows: updated at every phase change."""

    study: str
    launched: int = 0
    target: int | None = None
    phase: str = "starting"
    trial_number: int | None = None
    best_value: float | None = None
    best_trial: int | None = None
    deadline: float | None = None
    last: str = ""
    events: list[str] = field(default_factory=list)

    @property
    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    def launched_one(self, number: int, outcome: TrialOutcome, metric: str) -> None:
        """Count a launch and say how it went (``last``, and an event)."""
        self.launched += 1
        self.last = (f"trial {number}: {outcome.value:.1f} {metric}" if outcome.ok
                     else f"trial {number} failed: {outcome.failure_class}")
        self.events.append(self.last)


def phase_reporter(progress: Progress, on_progress: Callable[[Progress], None],
                   prefix: str = "") -> Callable[[str], None]:
    """``on_phase`` for a trial: each phase it enters (``launch``, ``guards``, ``load``) shown, prefixed."""
    def report(name: str) -> None:
        progress.phase = f"{prefix} {name}" if prefix else name
        on_progress(progress)

    return report
