"""What a running study shows: :class:`Progress`, updated at every phase change and handed to the CLI.

Screening counts trials (what ``--trials`` counts) apart from their controls, with an ETA from the
measured launch times; confirmation is its own stage, candidate by candidate, repeat by repeat.

:meth:`Progress.describe` gives the line; with a ``width`` (a terminal's), it fits it: the least important
parts go first (the elapsed time, then the ETA and the budget, then the best so far), and a line still too
long is cut with "…". Never wider than the terminal, so a line never wraps into two.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.study.clock import WALL, StudyClock
from tuner.trial import TrialOutcome

__all__ = ["Progress", "fit_line", "phase_reporter"]

_REPEAT = re.compile(r"^load (\d+)/(\d+)$")
SEPARATOR = " · "


def fit_line(parts: Sequence[tuple[str, int]], width: int | None = None) -> str:
    """``parts`` (text, rank) joined by :data:`SEPARATOR` in their order, empty ones left out.

    Within ``width`` characters: the parts of the highest rank go first (the last of them first); rank 0 is
    never dropped, and a line that is still too long is cut, ending in "…". ``None``: no limit.
    """
    kept = [(text, rank) for text, rank in parts if text]
    line = SEPARATOR.join(text for text, _ in kept)
    while width is not None and len(line) > width and any(rank > 0 for _, rank in kept):
        worst = max(rank for _, rank in kept)
        del kept[max(i for i, (_, rank) in enumerate(kept) if rank == worst)]
        line = SEPARATOR.join(text for text, _ in kept)
    if width is not None and len(line) > width:
        line = line[:max(0, width - 1)] + "…"
    return line


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
    controls: int = 0
    """Controls launched (no-speculation twins of speculative trials), apart from ``launched`` (trials)."""
    launch_s: list[float] = field(default_factory=list)
    """Measured wall time of each launch so far (start to stop): what the ETA is reckoned from."""
    stage: str = "screening"
    """``screening``, ``confirmation`` or ``done``."""
    current: str = ""
    """What runs now, in words: ``trial 7``, ``control 8 (speculation off)``, ``trial 3``."""
    confirm_planned: int = 0
    """Confirmation launches this run will make (candidates and their controls)."""
    confirm_done: int = 0
    confirm_running: int = 0
    """Which of the ``confirm_planned`` launches runs now (1-based)."""
    repeat: tuple[int, int] | None = None
    """Confirmation: (the repeat running, the repeats planned) of the current launch."""
    clock: StudyClock = WALL
    """The study clock ``deadline`` is on (node seconds)."""

    @property
    def seconds_left(self) -> float | None:
        """Node seconds left (the study clock's)."""
        return None if self.deadline is None else max(0.0, self.deadline - self.clock.now())

    @property
    def median_launch_s(self) -> float | None:
        return statistics.median(self.launch_s) if self.launch_s else None

    @property
    def eta_s(self) -> float | None:
        """Seconds until the planned trials are screened, at the median measured launch (None: unknown)."""
        median = self.median_launch_s
        if self.target is None or median is None:
            return None
        return max(0, self.target - self.launched) * median

    def launched_one(self, number: int, outcome: TrialOutcome, metric: str, *, control: bool = False) -> None:
        """Count a launch (a trial, or a control apart) and say how it went (``last``, and an event)."""
        if control:
            self.controls += 1
        else:
            self.launched += 1
        self.launch_s.append(outcome.duration_s)
        what = f"control {number}" if control else f"trial {number}"
        self.last = (f"{what}: {outcome.value:.1f} {metric}" if outcome.ok
                     else f"{what} failed: {outcome.failure_class}")
        self.events.append(self.last)

    def counts(self) -> str:
        """``trials 4/4 (+1 control)``: trials against ``--trials``, controls named apart."""
        text = f"trials {self.launched}/{self.target}" if self.target else f"trials {self.launched}"
        if self.controls:
            text += f" (+{self.controls} control{'s' if self.controls != 1 else ''})"
        return text

    def describe(self, unit: str = "min", *, width: int | None = None, elapsed: str = "") -> str:
        """One line: the stage, what runs, how far along, the best so far, the time left (``unit``: the study
        clock's minutes, ``node min`` on the emulated node) and ``elapsed``; at most ``width`` characters."""
        best = f"best {self.best_value:.1f} (trial {self.best_trial})" if self.best_value is not None else "best -"
        left = self.seconds_left
        budget = f"{left / 60:.0f} {unit} of budget left" if left is not None else ""
        timing = ""
        if self.stage == "confirmation" and not self.confirm_running:  # nothing launched yet (or no time for it)
            head = f"confirmation: {self.confirm_planned} launch(es) planned"
        elif self.stage == "confirmation":
            repeat = f" · repeat {self.repeat[0]}/{self.repeat[1]}" if self.repeat else ""
            head = f"confirmation {self.confirm_running}/{self.confirm_planned}: {self.current}{repeat} · {self.phase}"
        elif self.stage == "done":
            head, budget = f"done: {self.counts()}, {self.confirm_done} confirmation launch(es)", ""
        else:
            median, eta = self.median_launch_s, self.eta_s
            timing = (f"ETA {eta / 60:.0f} {unit} ({median / 60:.1f} {unit} per launch, measured)"
                      if eta is not None and median is not None else "")
            head = f"screening: {self.counts()} · {self.current or 'next'} {self.phase}".rstrip()
        return fit_line([(head, 0), (best, 1), (timing, 3), (budget, 2), (elapsed, 4)], width)


def phase_reporter(progress: Progress, on_progress: Callable[[Progress], None],
                   prefix: str = "") -> Callable[[str], None]:
    """``on_phase`` for a trial: each phase it enters (``launch``, ``guards``, ``load``) shown, prefixed."""
    def report(name: str) -> None:
        progress.phase = f"{prefix} {name}" if prefix else name
        repeat = _REPEAT.match(name)  # the trial says "load 2/3" for a confirmation's second repeat of three
        if repeat:
            progress.repeat = (int(repeat.group(1)), int(repeat.group(2)))
        on_progress(progress)

    return report
