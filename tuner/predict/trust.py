"""Does the model still deserve trust? Each launch's residual against the uncertainty the model stated for it.

Before a launch the guide states what it expects: a predicted objective value and a log-space sd (the
spread of its corrected model's posterior draws, the residual GP's sd, and the measurement noise it was
told). After the launch, ``z = log(measured / predicted) / sd``. A model whose errors are within its
stated uncertainty has ``z`` of about ±1; :class:`Trust` stops trusting it when the root mean square of
the last :data:`WINDOW` ``z`` exceeds :data:`Z_LIMIT` (with at least :data:`MIN_RESIDUALS` of them), or
when :data:`SURPRISE_LIMIT` launches it predicted to run failed (or missed every SLO). Once it stops, it
stays stopped for the study: the guide then searches by its measurements (:mod:`tuner.predict.explore`)
and the report names the launch.

Pure: no Optuna, no I/O.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

__all__ = ["MIN_RESIDUALS", "SURPRISE_LIMIT", "WINDOW", "Z_LIMIT", "Residual", "Trust"]

log = logging.getLogger(__name__)

Z_LIMIT = 2.0
"""RMS z beyond which the model's errors are larger than it says: a model within its uncertainty has about 1."""
WINDOW = 4
MIN_RESIDUALS = 2
SURPRISE_LIMIT = 2
"""Launches predicted to run (or to meet the SLOs) that did not, before the model is distrusted."""


@dataclass(frozen=True)
class Residual:
    """One launch: what the model said before it, and what it measured."""

    launch: int
    """1-based, in the order the guide observed the launches."""
    point: int
    predicted: float
    """Predicted objective value (0: predicted to miss an SLO)."""
    sd: float
    """The stated log-space sd of that prediction."""
    measured: float | None
    """Measured objective value (None: it failed, or missed an SLO)."""
    surprise: bool = False
    """Predicted to run and meet the SLOs (with a small chance to fail), and it did not."""

    @property
    def log_ratio(self) -> float | None:
        if self.measured is None or self.measured <= 0 or self.predicted <= 0:
            return None
        return math.log(self.measured / self.predicted)

    @property
    def z(self) -> float | None:
        ratio = self.log_ratio
        return None if ratio is None else ratio / max(self.sd, 1e-6)

    def to_json(self) -> dict[str, float | int | bool | None]:
        z, ratio = self.z, self.log_ratio
        return {"launch": self.launch, "point": self.point, "predicted": round(self.predicted, 2),
                "stated_sd": round(self.sd, 4), "measured": None if self.measured is None else round(self.measured, 2),
                "log_ratio": None if ratio is None else round(ratio, 4), "z": None if z is None else round(z, 3),
                "surprise": self.surprise}


@dataclass
class Trust:
    """The residuals so far, and the launch after which the model stopped being trusted (None: trusted)."""

    z_limit: float = Z_LIMIT
    window: int = WINDOW
    min_residuals: int = MIN_RESIDUALS
    surprise_limit: int = SURPRISE_LIMIT
    residuals: list[Residual] = field(default_factory=list)
    distrust_at: int | None = None
    why: str = ""

    @property
    def trusted(self) -> bool:
        return self.distrust_at is None

    def rms_z(self) -> float | None:
        zs = [r.z for r in self.residuals if r.z is not None][-self.window:]
        if len(zs) < self.min_residuals:
            return None
        return math.sqrt(sum(z * z for z in zs) / len(zs))

    def add(self, residual: Residual) -> None:
        self.residuals.append(residual)
        if self.distrust_at is not None:
            return
        rms = self.rms_z()
        surprises = sum(1 for r in self.residuals if r.surprise)
        if rms is not None and rms > self.z_limit:
            self.why = (f"the last {min(self.window, sum(1 for r in self.residuals if r.z is not None))} launches "
                        f"missed their predictions by {rms:.1f} stated sd (RMS), more than {self.z_limit:g}")
        elif surprises >= self.surprise_limit:
            self.why = f"{surprises} launches the model expected to run and meet the SLOs did not"
        else:
            return
        self.distrust_at = residual.launch
        log.warning("guide: the model is no longer trusted after launch %d: %s; searching by the measurements",
                    residual.launch, self.why)
