"""Multi-fidelity: the screening trials rank candidates; the top-k are confirmed with a longer
workload repeated inside one launch, and scored by a noise-robust statistic.

    robust score = median − k·MAD        (maximize; median + k·MAD when minimizing)

A candidate whose repeats disagree (spread larger than ``max_spread`` of the median) or whose any
repeat misses an SLO is rejected. The winner is the best *confirmed* candidate, not a lucky single
screening run. Pure functions; the study runs the launches.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ConfirmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = Field(default=2, ge=0)
    repeats: int = Field(default=3, ge=1)
    workload_scale: float = Field(default=2.0, gt=0)
    """Confirmation runs send this many times the screening workload's prompts."""
    mad_k: float = Field(default=1.0, ge=0)
    max_spread: float = Field(default=0.25, gt=0)
    """Reject when (max − min) / median of the repeats exceeds this."""


@dataclass(frozen=True)
class Confirmation:
    trial: int
    """The screening trial this confirms (Optuna number)."""
    config_key: str
    values: tuple[float, ...]
    median: float
    mad: float
    robust: float
    accepted: bool
    reason: str
    trial_dir: str
    speculative: bool
    control_of: int | None = None
    """Set when this run is the no-speculation control of a speculative candidate."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation (unscaled)."""
    if not values:
        return float("nan")
    centre = statistics.median(values)
    return float(statistics.median(abs(v - centre) for v in values))


def robust_score(values: Sequence[float], *, k: float, maximize: bool) -> float:
    centre = statistics.median(values)
    spread = mad(values)
    return centre - k * spread if maximize else centre + k * spread


def judge(trial: int, config_key: str, values: Sequence[float], *, all_feasible: bool, spec: ConfirmSpec,
          maximize: bool, trial_dir: str, speculative: bool, failure: str | None = None,
          control_of: int | None = None) -> Confirmation:
    """Score one candidate's repeats and decide whether it is confirmed."""
    vals = tuple(float(v) for v in values)
    if failure is not None or not vals:
        return Confirmation(trial, config_key, vals, float("nan"), float("nan"), float("nan"), False,
                            failure or "no measurement", trial_dir, speculative, control_of)
    centre = statistics.median(vals)
    spread = mad(vals)
    robust = robust_score(vals, k=spec.mad_k, maximize=maximize)
    rel = (max(vals) - min(vals)) / abs(centre) if centre else float("inf")
    if not all_feasible:
        accepted, reason = False, "a repeat missed an SLO"
    elif len(vals) > 1 and rel > spec.max_spread:
        accepted, reason = False, f"repeats disagree: spread {rel:.0%} of the median > {spec.max_spread:.0%}"
    else:
        accepted, reason = True, f"confirmed: median {centre:.2f}, MAD {spread:.2f}, spread {rel:.0%}"
    return Confirmation(trial, config_key, vals, centre, spread, robust, accepted, reason, trial_dir,
                        speculative, control_of)


def pick_winner(confirmations: Sequence[Confirmation], *, maximize: bool) -> Confirmation | None:
    accepted = [c for c in confirmations if c.accepted]
    if not accepted:
        return None
    return max(accepted, key=lambda c: c.robust if maximize else -c.robust)
