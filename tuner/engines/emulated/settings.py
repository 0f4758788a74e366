"""The emulator's own settings, read from ``DSV4_EMULATOR_*`` environment variables.

vLLM's command line says what to launch; these say what node it runs on and how time passes:

=================================  ===========================================================
``DSV4_EMULATOR_HW``               hardware profile name or path (default ``gh200x4``)
``DSV4_EMULATOR_CHECKPOINT``       checkpoint catalog name (default: the one whose repo is the
                                   served model, else the profile's)
``DSV4_EMULATOR_TRUTH_SEED``       a perturbed true node (``coefficients.perturbed(seed)``)
``DSV4_EMULATOR_TRUTH_FILE``       a truth as JSON (``truth.Truth.to_json``); wins over the seed
``DSV4_EMULATOR_TIME_SCALE``       virtual seconds per real second (default 1)
``DSV4_EMULATOR_STARTUP_TIME_SCALE``  the same for start-up only (default: the time scale)
``DSV4_EMULATOR_MULTIPLICITY``     virtual requests per HTTP request (default 1)
``DSV4_EMULATOR_FAULT``            comma list forced on this launch: ``hang``, ``oom_at_start``,
                                   ``crash_at_start``, ``oom_under_load``, ``trap``
``DSV4_EMULATOR_SEED``             seed of per-request randomness (draft acceptance; default 0)
``DSV4_EMULATOR_STATS_INTERVAL_S`` virtual seconds between "Engine 000: Avg prompt throughput"
                                   lines (default 10, as vLLM)
=================================  ===========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.engines.emulated.units import Units

__all__ = ["ENV_PREFIX", "MULTIPLICITY_HEADER", "EmulatorSettings", "SettingsError"]

ENV_PREFIX = "DSV4_EMULATOR_"
MULTIPLICITY_HEADER = "X-DSV4-Emulator-Multiplicity"
"""A request that carries this header stands for that many virtual requests (at most the multiplicity):
the tuner's correctness probes send 1."""


class SettingsError(ValueError):
    """A ``DSV4_EMULATOR_*`` variable has a value the emulator cannot use."""


@dataclass(frozen=True)
class EmulatorSettings:
    hardware: str = "gh200x4"
    checkpoint: str | None = None
    truth_seed: int | None = None
    truth_file: str | None = None
    time_scale: float = 1.0
    startup_time_scale: float | None = None
    multiplicity: int = 1
    faults: tuple[str, ...] = ()
    seed: int = 0
    stats_interval_s: float = 10.0

    @property
    def units(self) -> Units:
        return Units(time_scale=self.time_scale, multiplicity=self.multiplicity,
                     startup_time_scale=self.startup_time_scale or self.time_scale)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EmulatorSettings:
        read = _Reader(os.environ if env is None else env)
        scale = read.float("TIME_SCALE")
        time_scale = 1.0 if scale is None else scale
        startup = read.float("STARTUP_TIME_SCALE")
        copies = read.int("MULTIPLICITY")
        multiplicity = 1 if copies is None else copies
        if time_scale <= 0 or (startup is not None and startup <= 0):
            raise SettingsError(f"{ENV_PREFIX}TIME_SCALE and {ENV_PREFIX}STARTUP_TIME_SCALE must be > 0")
        if multiplicity < 1:
            raise SettingsError(f"{ENV_PREFIX}MULTIPLICITY must be >= 1, got {multiplicity}")
        faults = tuple(f.strip() for f in (read.text("FAULT") or "").split(",") if f.strip())
        stats = read.float("STATS_INTERVAL_S")
        return cls(hardware=read.text("HW") or cls.hardware, checkpoint=read.text("CHECKPOINT"),
                   truth_seed=read.int("TRUTH_SEED"), truth_file=read.text("TRUTH_FILE"), time_scale=time_scale,
                   startup_time_scale=startup, multiplicity=multiplicity, faults=faults,
                   seed=read.int("SEED") or 0, stats_interval_s=10.0 if stats is None else stats)


class _Reader:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def text(self, name: str) -> str | None:
        value = self.env.get(ENV_PREFIX + name)
        return value.strip() if value is not None and value.strip() else None

    def float(self, name: str) -> float | None:
        raw = self.text(name)
        try:
            return None if raw is None else float(raw)
        except ValueError as exc:
            raise SettingsError(f"{ENV_PREFIX}{name}={raw!r} is not a number") from exc

    def int(self, name: str) -> int | None:
        raw = self.text(name)
        try:
            return None if raw is None else int(raw)
        except ValueError as exc:
            raise SettingsError(f"{ENV_PREFIX}{name}={raw!r} is not an integer") from exc
