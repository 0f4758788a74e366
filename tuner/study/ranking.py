"""Reading a study's trials: which launched, which ran where, which is best, how long one takes, the table.

Every driver (the local loop, a worker, the Ray driver) and the confirmation phase read the Optuna
study through these functions (report, export and night through :mod:`tuner.study.reader`), so
"launched", "feasible" and "best" mean one thing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import store

__all__ = ["best_feasible_trial", "feasible_trials", "launched_controls", "launched_keys", "launched_numbers",
           "running_keys", "time_for_another", "trials_frame", "write_trials_table"]


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """COMPLETE trials that ran, passed their gates and met every SLO (duplicates left out)."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("feasible") and "duplicate_of" not in t.user_attrs and t.value is not None]


def best_feasible_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best COMPLETE trial that ran, passed its gates and met every SLO."""
    candidates = feasible_trials(study)
    if not candidates:
        return None
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    return max(candidates, key=lambda t: sign * float(t.value or 0.0))


def launched_keys(study: optuna.Study) -> dict[str, int]:
    """Configuration key → the trial that first took it (launched, or refused before launch)."""
    keys: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = t.user_attrs.get("config_key")
        if key and "duplicate_of" not in t.user_attrs and key not in keys:
            keys[key] = t.number
    return keys


def launched_numbers(study: optuna.Study) -> list[int]:
    """The screening trials that launched a server: what ``--trials`` counts. Controls (the no-speculation
    twins launched beside speculative trials) are not among them: :func:`launched_controls`."""
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if "duplicate_of" not in t.user_attrs and t.user_attrs.get("launched", True)
            and "control_for" not in t.user_attrs]


def launched_controls(study: optuna.Study) -> list[int]:
    """The controls that launched a server (shown as controls, never counted toward ``--trials``)."""
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if "duplicate_of" not in t.user_attrs and t.user_attrs.get("launched", True)
            and "control_for" in t.user_attrs]


def running_keys(study: optuna.Study, exclude_number: int | None = None) -> dict[str, int]:
    """Configuration key → RUNNING trial (another worker's, in a shared study)."""
    return {str(t.user_attrs["config_key"]): t.number
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number != exclude_number and "config_key" in t.user_attrs}


def time_for_another(study: optuna.Study, deadline: float, first_estimate_s: float, reserve_s: float = 0.0,
                     now: float | None = None, launches: int = 1) -> bool:
    """Start another trial only if it can finish (longest duration so far) before the deadline.

    ``launches`` is 2 for a speculative proposal whose control launches first: the pair, not one of them,
    must fit (the one-H100 study's screening overran its budget by starting a control and its twin with
    one trial's time left: docs/evidence/h100.md).

    ``first_estimate_s`` stands in before any trial finished (the hardware profile's ``expected_launch_s``).
    ``now``, ``deadline`` and the durations are the study clock's node seconds (:mod:`tuner.study.clock`);
    ``now`` defaults to the wall clock.
    """
    durations = [float(t.user_attrs["duration_s"]) for t in study.get_trials(deepcopy=False)
                 if "duration_s" in t.user_attrs and "duplicate_of" not in t.user_attrs]
    # The longest trial so far, not the median: a trial that overruns the night is worse than one fewer.
    # Except the study's first launch, once another has finished: on a GPU node it fills the machine's
    # caches (Python bytecode, Triton's kernels, torch.compile's cache) and is the slowest by far; kept,
    # it would hold a cold start's margin before every later trial (docs/evidence/h200.md).
    warm = durations[1:] if len(durations) > 1 else durations
    estimate = max(warm) if warm else first_estimate_s
    return (time.time() if now is None else now) + launches * estimate + reserve_s <= deadline


def trials_frame(study: optuna.Study) -> Any:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name, "value": t.value}
        row.update({f"param.{k}": v for k, v in t.params.items()})
        row.update({k: v for k, v in t.user_attrs.items() if k != "constraints"})
        row["constraints"] = json.dumps(t.user_attrs.get("constraints"))
        rows.append(row)
    return pd.DataFrame(rows)


def write_trials_table(study: optuna.Study, study_path: Path) -> Path:
    """``trials.csv``: every trial, one row (pandas reads it back)."""
    out = study_path / "trials.csv"
    store.write_text(out, trials_frame(study).to_csv(index=False))
    return out
