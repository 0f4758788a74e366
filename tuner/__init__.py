"""dsv4-tune: find the fastest correct vLLM launch for a model on a node, unattended.

The public API; the CLI (``dsv4-tune``) is built on it. The code lives in rooms by concept
(``docs/architecture.md``): ``cli/``, ``study/``, ``backends/``, ``search/``, ``engines/``,
``load/``, ``guards/``, and a few shared modules here (``errors``, ``catalog``, ``store``,
``objective``, ``failures``, ``trial``, ``export``, ``report``, ``demo_model``). Optuna loads with
the names of :mod:`tuner.study` only (``ConfirmSpec``, ``Confirmation``, ``Study``); vLLM never loads
here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.engines import Engine, default_engine
from tuner.errors import (
    CatalogError,
    LaunchError,
    NoFeasibleTrialError,
    PortInUseError,
    StudyError,
    StudyLockedError,
    TunerError,
    UnconfirmedWinnerError,
    UnknownNameError,
    UsageError,
)
from tuner.failures import FailureClass
from tuner.guards import GuardReport, GuardResult, GuardSuite, GuardTarget
from tuner.objective import Objective, Score, Workload, load_objective, score
from tuner.search import HardwareProfile, ServeConfig, build_config, load_profile, suggest
from tuner.trial import TrialContext, TrialOutcome, run_trial

if TYPE_CHECKING:
    from tuner.study import Confirmation, ConfirmSpec, Study

__all__ = [
    "CatalogError",
    "ConfirmSpec",
    "Confirmation",
    "Engine",
    "FailureClass",
    "GuardReport",
    "GuardResult",
    "GuardSuite",
    "GuardTarget",
    "HardwareProfile",
    "LaunchError",
    "NoFeasibleTrialError",
    "Objective",
    "PortInUseError",
    "Score",
    "ServeConfig",
    "Study",
    "StudyError",
    "StudyLockedError",
    "TrialContext",
    "TrialOutcome",
    "TunerError",
    "UnconfirmedWinnerError",
    "UnknownNameError",
    "UsageError",
    "Workload",
    "build_config",
    "default_engine",
    "load_objective",
    "load_profile",
    "run_trial",
    "score",
    "suggest",
]

_STUDY_NAMES = frozenset({"ConfirmSpec", "Confirmation", "Study"})


def __getattr__(name: str) -> Any:
    """The study's names load Optuna: they are imported on first use (PEP 562)."""
    if name in _STUDY_NAMES:
        from tuner import study

        return getattr(study, name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
