"""optuna-dashboard reads a study's storage as it is: the real dashboard app (its WSGI API, no server
socket) over a study of synthetic trials on real SQLite storage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
from optuna.trial import TrialState
from optuna_dashboard import wsgi

import tuner.study.step as step_mod
from tests.conftest import synthetic_outcome, synthetic_record
from tuner.search.space import ServeConfig
from tuner.study import Study, best_feasible_trial
from tuner.trial import TrialContext, TrialOutcome


def _api(app: Any, path: str, query: str = "") -> Any:
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING=query)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, _headers, _exc=None: status.append(s)))
    assert status == ["200 OK"], (path, status, body[:500])
    return json.loads(body)


def test_the_dashboard_shows_the_studys_trials_best_and_importances(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, repeats: int = 1,
                       **_kw: Any) -> TrialOutcome:
        return synthetic_outcome(ctx, config, tdir, repeats)

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    study = Study.create(synthetic_record(tmp_path, name="night", trials=5, top_k=1, seed=0), tmp_path / "runs")
    ostudy = study.run()
    app = wsgi(study.storage())

    summaries = _api(app, "/api/studies")["study_summaries"]
    assert [(s["study_name"], s["directions"]) for s in summaries] == [("night", ["maximize"])]
    detail = _api(app, f"/api/studies/{summaries[0]['study_id']}", "after=0")

    ours = {t.number: t for t in ostudy.get_trials()}
    shown = {t["number"]: t for t in detail["trials"]}
    assert shown.keys() == ours.keys()
    for number, trial in shown.items():
        assert trial["state"] == ours[number].state.name.capitalize()
        if ours[number].state == TrialState.COMPLETE:
            assert trial["values"] == [ours[number].value]
        assert {p["name"]: p["param_internal_value"] for p in trial["params"]}.keys() == ours[number].params.keys()
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert attrs["config_key"] == ours[number].user_attrs["config_key"]  # what the report and trials.csv key on
        assert attrs["feasible"] == str(ours[number].user_attrs["feasible"])
    best = best_feasible_trial(ostudy)
    assert best is not None and best.number in {t["number"] for t in detail["best_trials"]}
    assert {a["key"] for a in detail["user_attrs"]} >= {"constraint_names", "confirmations"}

    importances = _api(app, f"/api/studies/{summaries[0]['study_id']}/param_importances")["param_importances"]
    assert {i["name"] for i in importances[0]} <= set(study.profile.param_names())
