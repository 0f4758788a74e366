"""The study: a named folder of trials, its Optuna study, and the one trial step every driver takes.

    study.py      Study: the folder, its snapshots, its Optuna study, the trial context; runs the local driver
    record.py     StudyRecord (``study.json``), StudyLock, new_record
    step.py       TrialStep: propose, screen duplicates, learn KV, control first, pre-launch, launch, record
    local.py      LocalLoop: the local driver (one node, one trial at a time), then confirmation
    guided.py     GuidedSearch: ``--prior model`` (the performance model proposes, each launch corrects it)
    confirm.py    the confirmation phase and the winner
    ranking.py    reading the trials: launched, running, feasible, best; the trials table
    reader.py     the study read once as plain data (report, export, night): trials, winner, failures counted
    progress.py   Progress: what the CLI shows

Only ``study/`` and ``backends/`` import Optuna (report, export and night read a study through
:mod:`tuner.study.reader`); a single trial (:mod:`tuner.trial`) runs without it.
"""

from __future__ import annotations

from tuner.study.confirm import Confirmation, ConfirmationPhase, ConfirmSpec, Winner, judge, pick_winner
from tuner.study.local import LocalLoop
from tuner.study.progress import Progress
from tuner.study.ranking import (
    best_feasible_trial,
    feasible_trials,
    launched_keys,
    launched_numbers,
    running_keys,
    time_for_another,
    trials_frame,
    write_trials_table,
)
from tuner.study.record import StudyLock, StudyRecord, new_record, resolve_model, vocab_size_of
from tuner.study.step import MAX_DUPLICATES_IN_A_ROW, MAX_REFUSED_IN_A_ROW, PRUNED_LOG, Proposal, TrialStep, learn_kv
from tuner.study.study import Study, storage_for_record

__all__ = [
    "MAX_DUPLICATES_IN_A_ROW",
    "MAX_REFUSED_IN_A_ROW",
    "PRUNED_LOG",
    "ConfirmSpec",
    "Confirmation",
    "ConfirmationPhase",
    "LocalLoop",
    "Progress",
    "Proposal",
    "Study",
    "StudyLock",
    "StudyRecord",
    "TrialStep",
    "Winner",
    "best_feasible_trial",
    "feasible_trials",
    "judge",
    "launched_keys",
    "launched_numbers",
    "learn_kv",
    "new_record",
    "pick_winner",
    "resolve_model",
    "running_keys",
    "storage_for_record",
    "time_for_another",
    "trials_frame",
    "vocab_size_of",
    "write_trials_table",
]
