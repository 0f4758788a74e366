"""The study: a named folder of trials, its Optuna study, and the one round every driver takes.

    study.py      Study: the folder, its snapshots, its Optuna study, the trial context; runs the local driver
    record.py     StudyRecord (``study.json``), StudyLock, new_record
    storage.py    the Optuna side: storage URLs, RDB storage with heartbeats, samplers, trials created
                  RUNNING (``ask_fixed``); the one module that touches Optuna's internals
    step.py       TrialStep: the parts of a trial (propose, screen, control, refuse, launch, record, learn)
    round.py      Round: the study's one round (every driver's): propose, screen, control first, refuse,
                  launch, learn (the KV refit, start failures, the prior's correction, the stop estimate)
    local.py      LocalLoop: the local driver (one node, one round at a time), then confirmation
    guided.py     GuidedSearch: ``--prior model`` (the performance model proposes, each launch corrects it)
    confirm.py    the confirmation phase and the winner
    ranking.py    reading the trials: launched, running, feasible, best; the trials table
    reader.py     the study read once as plain data (report, export, night): trials, winner, failures counted
    progress.py   Progress: what the CLI shows

Only ``study/`` and ``backends/`` import Optuna (report, export and night read a study through
:mod:`tuner.study.reader`); a single trial (:mod:`tuner.trial`) runs without it. The drivers beyond this
node (``tuner.backends``) are one floor above: nothing here imports them.
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
from tuner.study.round import Opening, ProgressSeat, Round, Seat
from tuner.study.step import MAX_DUPLICATES_IN_A_ROW, MAX_REFUSED_IN_A_ROW, PRUNED_LOG, Proposal, TrialStep, learn_kv
from tuner.study.storage import (
    STORAGE_ENV,
    ask_fixed,
    heartbeat,
    make_sampler,
    make_storage,
    mask_url,
    resolve_storage_url,
    retried_trial_number,
    shared_sampler,
    sqlite_url,
    study_exists,
)
from tuner.study.study import Study, storage_for_record

__all__ = [
    "MAX_DUPLICATES_IN_A_ROW",
    "MAX_REFUSED_IN_A_ROW",
    "PRUNED_LOG",
    "STORAGE_ENV",
    "ConfirmSpec",
    "Confirmation",
    "ConfirmationPhase",
    "LocalLoop",
    "Opening",
    "Progress",
    "ProgressSeat",
    "Proposal",
    "Round",
    "Seat",
    "Study",
    "StudyLock",
    "StudyRecord",
    "TrialStep",
    "Winner",
    "ask_fixed",
    "best_feasible_trial",
    "feasible_trials",
    "heartbeat",
    "judge",
    "launched_keys",
    "launched_numbers",
    "learn_kv",
    "make_sampler",
    "make_storage",
    "mask_url",
    "new_record",
    "pick_winner",
    "resolve_model",
    "resolve_storage_url",
    "retried_trial_number",
    "running_keys",
    "shared_sampler",
    "sqlite_url",
    "storage_for_record",
    "study_exists",
    "time_for_another",
    "trials_frame",
    "vocab_size_of",
    "write_trials_table",
]
