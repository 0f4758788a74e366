"""The study reader: one reading of a study's Optuna storage for the report, the export and the night summary.

A real SQLite study with every kind of trial that is not a plain success: refused before launch, crashed,
missed an SLO, a duplicate of a failure and of a refusal, interrupted (with and without a class), a proposal
skipped for another worker, one still queued and one still running. The report's failure table and the
export's refusal count the same trials, through :func:`tuner.study.reader.failure_counts`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import synthetic_record
from tuner.errors import NoFeasibleTrialError
from tuner.study import Study
from tuner.study.reader import TrialRecord, failure_class_of, failure_counts, read_study

EXPECTED = {"interrupted": 2, "crash": 1, "infeasible": 1, "slo_violated": 1}


def _tell(ostudy: optuna.Study, attrs: dict[str, Any], value: float | None = 0.0, *,
          state: TrialState = TrialState.COMPLETE, seqs: int = 8) -> int:
    trial = ostudy.ask()
    trial.suggest_int("max-num-seqs", seqs, seqs)
    for key, item in attrs.items():
        trial.set_user_attr(key, item)
    if state == TrialState.COMPLETE:
        ostudy.tell(trial, value)
    elif state == TrialState.FAIL:
        ostudy.tell(trial, state=TrialState.FAIL)
    return trial.number


def _study_with_failures(tmp_path: Path) -> Study:
    study = Study.create(synthetic_record(tmp_path, name="failures", trials=None), tmp_path / "runs")
    ostudy = study.optuna_study()
    refused = _tell(ostudy, {"launched": False, "feasible": False, "failure_class": "infeasible",
                             "constraints": [1.0]}, seqs=1)
    crashed = _tell(ostudy, {"feasible": False, "ok": False, "failure_class": "crash", "reason": "exit code 1"},
                    seqs=2)
    _tell(ostudy, {"feasible": False, "ok": True, "failure_class": "slo_violated", "constraints": [0.5]}, 40.0,
          seqs=3)
    _tell(ostudy, {"feasible": False, "ok": False, "failure_class": "crash", "duplicate_of": crashed}, seqs=2)
    _tell(ostudy, {"launched": False, "feasible": False, "failure_class": "infeasible", "duplicate_of": refused},
          seqs=1)
    _tell(ostudy, {"interrupted": True, "failure_class": "interrupted"}, state=TrialState.FAIL, seqs=4)
    _tell(ostudy, {"interrupted": True}, state=TrialState.FAIL, seqs=5)  # a twin abandoned before its launch
    _tell(ostudy, {"skipped": "running on another worker as trial 9"}, state=TrialState.FAIL, seqs=6)
    _tell(ostudy, {"config_key": "k"}, state=TrialState.RUNNING, seqs=7)  # still running
    ostudy.enqueue_trial({"max-num-seqs": 9})  # queued
    return study


def test_report_and_export_count_the_same_failures(tmp_path: Path) -> None:
    from tuner.report import build_markdown

    study = _study_with_failures(tmp_path)
    reading = read_study(study)
    assert reading.failure_counts() == EXPECTED
    assert [t.state for t in reading.trials][-2:] == ["RUNNING", "WAITING"]

    section = build_markdown(study, reading, images={}).split("## Failures", 1)[1].split("###", 1)[0]
    reported = {m[0]: int(m[1]) for m in re.findall(r"^\| (\w+) \| (\d+) \|$", section, re.MULTILINE)}
    with pytest.raises(NoFeasibleTrialError) as refusal:
        from tuner.export import export_best

        export_best(study)
    listed = re.search(r"SLOs \((.*)\)\. Fix", str(refusal.value))
    assert listed is not None
    exported = {k: int(v) for k, v in (item.split(": ") for item in listed.group(1).split(", "))}
    assert reported == exported == EXPECTED


def test_the_night_counts_a_refusal_once_and_the_reading_holds_plain_data(tmp_path: Path) -> None:
    from tuner.night import summarize_night

    study = _study_with_failures(tmp_path)
    night = summarize_night(study)
    assert (night.launched, night.refused_before_launch) == (2, 1)  # the crash and the SLO miss; duplicates not
    reading = read_study(study)
    first = reading.trial(0)
    assert isinstance(first, TrialRecord) and first.params == {"max-num-seqs": 1}
    assert (first.state, first.value, first.constraints, first.launched) == ("COMPLETE", 0.0, (1.0,), False)
    assert reading.best_feasible() is None and reading.winner is None and reading.direction == "maximize"
    with pytest.raises(KeyError):
        reading.trial(99)


def test_a_feasible_trial_is_no_failure_and_is_ranked() -> None:
    def record(number: int, value: float, **attrs: Any) -> TrialRecord:
        return TrialRecord(number=number, state="COMPLETE", params={}, value=value, user_attrs=attrs,
                           constraints=())

    good, dup = record(0, 5.0, feasible=True), record(1, 5.0, feasible=True, duplicate_of=0)
    assert failure_class_of(good) is None and failure_class_of(dup) is None
    assert failure_counts([good, dup, record(2, 0.0, failure_class="oom")]) == {"oom": 1}
