"""The night's figures as data: ``<study>/night.json``, written when a study ends.

What a morning (or a rehearsal: ``dsv4-tune rehearse``) reads first, in one small file: which engine
served the trials and in what units, how much node time and wall time the night took, every launch
(its value, whether it passed, why not, whether its ladder showed the knee it was sized for), the
baselines, the winner with its confirmed value, and whether the winner beats every baseline.
``scripts/ci_night.py`` checks a rehearsed night against it; ``docs/evidence/`` keeps copies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner import store
from tuner.study import Study
from tuner.study.reader import TrialRecord, read_study

__all__ = ["NIGHT_FILE", "NightSummary", "read_night", "summarize_night", "write_night"]

NIGHT_FILE = "night.json"


@dataclass(frozen=True)
class NightSummary:
    study: str
    hw: str
    objective: str
    metric: str
    direction: str
    workload: dict[str, Any]
    slos: dict[str, float]
    engine: str
    units: dict[str, Any]
    rehearsal: bool
    budget_node_s: float | None
    wall_s: float | None
    node_s: float | None
    guards: list[str]
    launched: int
    refused_before_launch: int
    trials: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    winner: dict[str, Any] | None = None
    best_baseline: dict[str, Any] | None = None
    winner_beats_baselines: bool | None = None
    """The winner's screening value is at least every feasible baseline's (like for like: one window each;
    None: no winner, or no baseline passed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _trial_row(study_obj: Study, t: TrialRecord) -> dict[str, Any]:
    attrs = t.user_attrs
    row: dict[str, Any] = {
        "trial": t.number, "baseline": attrs.get("baseline"), "params": dict(t.params),
        "launched": bool(attrs.get("launched", True)), "feasible": bool(attrs.get("feasible")),
        "value": t.value if attrs.get("feasible") else None, "failure_class": attrs.get("failure_class"),
        "reason": str(attrs.get("reason", ""))[:300], "max_concurrency": attrs.get("max_concurrency"),
        "duration_s": attrs.get("duration_s"), "duplicate_of": attrs.get("duplicate_of"),
    }
    outcome_path = study_obj.path / str(attrs.get("trial_dir", "")) / "outcome.json"
    if attrs.get("trial_dir") and outcome_path.is_file():
        summary = store.read_json(outcome_path).get("summary") or {}
        row["knee_predicted"] = summary.get("knee_predicted")
        row["knee_top_concurrency"] = summary.get("knee_top_concurrency")
        row["knee_shown"] = summary.get("knee_shown")
    return row


def summarize_night(study_obj: Study, *, wall_s: float | None = None) -> NightSummary:
    """The figures of ``study_obj`` as its Optuna study and trial folders hold them now."""
    reading = read_study(study_obj)
    rows = [_trial_row(study_obj, t) for t in reading.complete()]
    maximize = study_obj.objective.direction == "maximize"
    baselines = [r for r in rows if r["baseline"] and r["duplicate_of"] is None]
    feasible_baselines = [r for r in baselines if r["feasible"] and r["value"] is not None]
    best_baseline = (max(feasible_baselines, key=lambda r: r["value"] if maximize else -r["value"])
                     if feasible_baselines else None)
    winner = reading.winner
    winner_row: dict[str, Any] | None = None
    beats: bool | None = None
    if winner is not None:
        trial = reading.trial(winner.trial)
        winner_row = {"trial": winner.trial, "value": winner.value, "confirmed": winner.confirmed,
                      "baseline": trial.user_attrs.get("baseline"), "params": dict(trial.params),
                      "screening_value": trial.value,
                      "confirmation": winner.confirmation.to_json() if winner.confirmation else None}
        screened = trial.value
        if best_baseline is not None and screened is not None and not math.isnan(screened):
            beats = screened >= best_baseline["value"] if maximize else screened <= best_baseline["value"]
    units = study_obj.engine.units
    return NightSummary(
        study=study_obj.record.name, hw=study_obj.profile.name, objective=study_obj.objective.name,
        metric=study_obj.objective.metric, direction=study_obj.objective.direction,
        workload=study_obj.objective.workload.model_dump(mode="json"), slos=dict(study_obj.objective.slos),
        engine=study_obj.engine.name, units=units.to_json(), rehearsal=study_obj.record.rehearsal,
        budget_node_s=study_obj.record.budget_s, wall_s=wall_s,
        node_s=None if wall_s is None else units.node_seconds(wall_s), guards=study_obj.guard_names(),
        launched=reading.launched_count(), refused_before_launch=reading.refused_count(), trials=rows,
        baselines=baselines, winner=winner_row, best_baseline=best_baseline, winner_beats_baselines=beats)


def write_night(study_obj: Study, *, wall_s: float | None = None) -> NightSummary:
    """Summarize the night and write it to ``<study>/night.json``."""
    summary = summarize_night(study_obj, wall_s=wall_s)
    store.write_json(study_obj.path / NIGHT_FILE, summary.to_json())
    return summary


def read_night(study_obj: Study) -> NightSummary:
    """``<study>/night.json`` as written by :func:`write_night`."""
    data = store.read_json(study_obj.path / NIGHT_FILE)
    return NightSummary(**data)
