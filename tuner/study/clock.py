"""The study's clock: node seconds, whatever engine serves the trials.

A real node's clock is the wall clock. An engine that compresses time (the emulated node: ``Units``,
``docs/emulator.md``) runs ``time_scale`` node seconds per real second, start-up included, so every
figure the study plans with is node time: ``--budget 8h`` is 8 node hours (minutes of real time), the
deadline, the estimate of one more trial (the longest ``duration_s`` so far), the time kept for
confirmation, the minutes left the CLI shows, and each trial's ``ready_s`` and ``duration_s``. Start-up
limits (ready timeout, watchdog) are node time too; they become real seconds in
:meth:`tuner.study.Study.startup_limits_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["WALL", "StudyClock"]


@dataclass(frozen=True)
class StudyClock:
    """Node seconds since the epoch: the wall clock, run ``time_scale`` times faster from ``origin`` on."""

    time_scale: float = 1.0
    origin: float = field(default_factory=time.time)
    wall: Callable[[], float] = time.time

    def now(self) -> float:
        """Node time now (seconds since the epoch, as ``time.time()``)."""
        real = self.wall()
        return self.origin + (real - self.origin) * self.time_scale

    def node_seconds(self, real_seconds: float) -> float:
        """A real duration, in node seconds."""
        return real_seconds * self.time_scale


WALL = StudyClock()
"""A real node's clock (time scale 1)."""
