"""Stand-in GPU power reader: what NVML would answer on a GPU node, for a CPU-only machine.

There is no GPU here, so the energy figures (``tokens_per_joule``, ``usd_per_mtok``) are tested with
this reader in place of :class:`tuner.load.power.NvmlPower`. It draws a fixed power per GPU, and its
energy counter grows with the wall clock at exactly that power, as a driver's counter does, so a
window's energy is known in advance: watts × GPUs × seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StandInPowerReader:
    """A stand-in for NVML: ``watts`` per GPU on ``gpus`` GPUs, with an energy counter (or without)."""

    name = "stand-in"

    def __init__(self, watts: float = 300.0, gpus: int = 1, *, counter: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.watts = watts
        self.gpus = gpus
        self.counter = counter
        self.clock = clock
        self.origin = clock()
        self.reads = 0

    def devices(self) -> int:
        return self.gpus

    def read_w(self) -> tuple[float, ...] | None:
        self.reads += 1
        return tuple(self.watts for _ in range(self.gpus))

    def energy_j(self) -> tuple[float, ...] | None:
        if not self.counter:
            return None
        elapsed = self.clock() - self.origin
        return tuple(self.watts * elapsed for _ in range(self.gpus))
