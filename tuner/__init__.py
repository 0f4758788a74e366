"""dsv4-tune: find the fastest correct vLLM launch for a model on a node, unattended.

The public API; the CLI (``dsv4-tune``) is built on it. Heavy modules (Optuna, vLLM) load lazily.
"""

from __future__ import annotations

from tuner.confirm import Confirmation, ConfirmSpec
from tuner.errors import (
    CatalogError,
    LaunchError,
    NoFeasibleTrialError,
    PortInUseError,
    StudyError,
    StudyLockedError,
    TunerError,
    UnknownNameError,
    UsageError,
)
from tuner.failures import FailureClass
from tuner.guard_api import GuardReport, GuardResult, GuardSuite, GuardTarget
from tuner.objective import Objective, Score, load_objective, score
from tuner.profile import HardwareProfile, load_profile
from tuner.space import ServeConfig, build_config, suggest
from tuner.trial import TrialContext, TrialOutcome, run_trial
from tuner.workload import Workload

__all__ = [
    "CatalogError",
    "ConfirmSpec",
    "Confirmation",
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
    "StudyError",
    "StudyLockedError",
    "TrialContext",
    "TrialOutcome",
    "TunerError",
    "UnknownNameError",
    "UsageError",
    "Workload",
    "build_config",
    "load_objective",
    "load_profile",
    "run_trial",
    "score",
    "suggest",
]
