"""A study never spins (issue 14, finding 5), and what a failed launch teaches every driver (finding 6, 7).

Synthetic launches (``tuner.study.step.run_trial`` replaced) on the real study machinery: gh200x4 with its
DeepSeek-V4-Flash checkpoint, the feasibility model, the default constrained TPE, real SQLite storage.
A launch reports the KV capacity a chosen "node" logs; the node decides what the refit learns.

Before the fix a refit from one launch that logged a twentieth of the expected KV made every point
infeasible and the local loop told pruned trials forever (the worker too; only Ray stopped). Each test
that could spin counts proposals and fails once a study has made ``SPIN_LIMIT`` without stopping.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

import tuner.study.step as step_mod
from tests.conftest import synthetic_record
from tuner.backends.node import NodeIdentity
from tuner.backends.worker import Worker, WorkerOptions, open_shared
from tuner.errors import SearchStalledError
from tuner.objective import constraint_names
from tuner.search import feasibility
from tuner.search.space import ServeConfig, build_config
from tuner.study import MAX_REFUSED_IN_A_ROW, PRUNED_LOG, Study
from tuner.study.storage import make_storage
from tuner.trial import TrialContext, TrialOutcome

SPIN_LIMIT = MAX_REFUSED_IN_A_ROW
"""No test here needs more proposals: a study still proposing past this spins (the tests set K to 40)."""
NODE = NodeIdentity(hostname="node-a", gpu_model="GH200", gpu_count=4, driver=None, vllm_version="0.32.0",
                    cpu_model="grace", cpu_count=72)
Node = Callable[[ServeConfig, int], tuple[int | None, str | None, float | None]]
"""(config, launch index) → (KV tokens logged, failure class, ready_s)."""


class Spinning(AssertionError):
    pass


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Callable[[Node], list[ServeConfig]]:
    """Install a node; return the configurations it launched. Proposals past SPIN_LIMIT fail the test."""
    seen: list[ServeConfig] = []
    proposals = [0]
    real_suggest = step_mod.suggest

    def counting_suggest(profile: Any, source: Any) -> ServeConfig:
        proposals[0] += 1
        if proposals[0] > SPIN_LIMIT:
            raise Spinning(f"the study kept proposing: {proposals[0]} proposals, {len(seen)} launches")
        return real_suggest(profile, source)

    monkeypatch.setattr(step_mod, "suggest", counting_suggest)

    def install(node: Node) -> list[ServeConfig]:
        def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, **_: Any) -> TrialOutcome:
            tokens, failure, ready_s = node(config, len(seen))
            seen.append(config)
            tdir.mkdir(parents=True, exist_ok=True)
            names = constraint_names(ctx.objective)
            ok = failure is None
            margins = tuple(-1.0 if ok else 1.0 for _ in names)
            value = float(config.args.get("max-num-seqs", 1)) if ok else 0.0
            reason = {"oom": "server crashed under load (oom): torch.OutOfMemoryError: CUDA out of memory",
                      "hang": "server hung during startup: no progress in its log for 600 s"}.get(failure or "", "ok")
            return TrialOutcome(ok=ok, value=value, constraints=margins, failure_class=failure, reason=reason,
                                summary={"output_throughput": value}, server_metrics={}, ready_s=ready_s,
                                duration_s=5.0, trial_dir=str(tdir), config_key=config.key(), kv_cache_tokens=tokens)

        monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
        return seen

    return install


def _predicted(study: Study, config: ServeConfig) -> int:
    assert study.checkpoint is not None
    return feasibility.check(study.profile, config, study.checkpoint, study.objective.workload).kv_tokens_per_rank


def _study(tmp_path: Path, trials: int | None, name: str = "night") -> Study:
    record = synthetic_record(tmp_path, name=name, trials=trials, hw="gh200x4", seed=0)
    record = record.model_copy(update={"guards": []})
    return Study.create(record, tmp_path / "runs")


def _tiny_kv_node(study: Study) -> Node:
    """A node whose KV holds a twentieth of what the prior predicts: no launch of max-model-len 128k fits."""
    return lambda config, _n: (_predicted(study, config) // 20, None, 1.0)


# -- the refit rule ----------------------------------------------------------------------------------------
def test_one_launch_that_logged_far_less_kv_does_not_prune_the_night(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    """Finding 5's trigger: the first launch logs 1/20 of the expected KV (say, a misread log); the others log
    what the prior predicts. The 20x refit needs a second launch that agrees before it may prune."""
    study = _study(tmp_path, trials=6)
    seen = launches(lambda config, n: (_predicted(study, config) // 20 if n == 0 else _predicted(study, config),
                                       None, 1.0))
    ostudy = study.run()
    assert len(seen) >= 6
    checks = study.prelaunch(ostudy)
    assert checks.calibration is not None and checks.calibration.trusted and 0.9 < checks.calibration.ratio < 1.1


# -- K pruned in a row: every driver stops with the reason and the fitted figure -------------------------------
def _assert_stall(exc: SearchStalledError, study: Study, ostudy: optuna.Study) -> None:
    message = str(exc)
    assert exc.kind == "refused"
    assert "kv_capacity" in message and "less than max-model-len" in message
    assert "KV bytes/token" in message and "the prior 26,400" in message and "agreeing" in message
    assert str(study.path / PRUNED_LOG) in message
    told = ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    refused = [t for t in told if t.user_attrs.get("launched") is False and "duplicate_of" not in t.user_attrs]
    launched = [t for t in told if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs]
    # pruned suggestions get one line each, not a folder each
    folders = sorted(p.name for p in (study.path / "trials").iterdir())
    assert folders == [f"{t.number:04d}" for t in sorted(launched, key=lambda t: t.number)]
    lines = [json.loads(line) for line in (study.path / PRUNED_LOG).read_text().splitlines()]
    assert sorted(line["number"] for line in lines) == sorted(t.number for t in refused)
    assert all(line["config"]["key"] and line["reason"] and line["rule"] for line in lines)
    assert all(t.user_attrs["pruned_log"] == PRUNED_LOG for t in refused)


def test_the_local_loop_stops_after_k_refusals_in_a_row(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_mod, "MAX_REFUSED_IN_A_ROW", 40)  # the rule, reached sooner (200 takes minutes here)
    study = _study(tmp_path, trials=None)
    seen = launches(_tiny_kv_node(study))
    with pytest.raises(SearchStalledError) as caught:
        study.run()
    ostudy = study.optuna_study()
    _assert_stall(caught.value, study, ostudy)
    assert 2 <= len(seen) <= 3  # the baselines until two agree on the fit; then nothing fits
    assert "the last 40 proposals" in str(caught.value)
    assert (study.path / "trials.csv").is_file()  # the morning's files are written before the error


def test_a_worker_stops_after_k_refusals_in_a_row(tmp_path: Path, launches: Callable[[Node], list[ServeConfig]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_mod, "MAX_REFUSED_IN_A_ROW", 40)  # the same rule, reached sooner
    record = synthetic_record(tmp_path, name="night", trials=None, hw="gh200x4", seed=0)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    shared = open_shared("night", tmp_path / "runs", make_storage(url), url=url,
                         create=record.model_copy(update={"guards": []}))
    launches(_tiny_kv_node(shared))
    with pytest.raises(SearchStalledError) as caught:
        Worker(shared, WorkerOptions(worker_id="a"), url=url, identity=NODE).run()
    _assert_stall(caught.value, shared, shared.optuna_study())
    assert "the last 40 proposals" in str(caught.value)


def _ray_result(study: Study, shipped: dict[str, Any], outcome: TrialOutcome) -> dict[str, Any]:
    return {"node": json.dumps(NODE.to_json()), "gpu_ids": "[]", "ray_node_id": "n1", "attempt": 1,
            "value": outcome.value, "outcome": json.dumps(outcome.to_json(), default=str)}


def test_the_ray_searcher_stops_after_k_refusals_in_a_row(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.tune")
    from ray.tune.search import Searcher

    from tuner.backends.ray import make_searcher

    monkeypatch.setattr(step_mod, "MAX_REFUSED_IN_A_ROW", 40)
    study = _study(tmp_path, trials=None)
    ostudy = study.optuna_study()
    study.prepare_queue(ostudy)
    ctx = study.context()
    seen = launches(_tiny_kv_node(study))
    searcher, finish = make_searcher(study, study.round(ostudy, ctx), None)
    answers = []
    for i in range(SPIN_LIMIT):
        shipped = searcher.suggest(f"t{i}")
        answers.append(shipped)
        if shipped == Searcher.FINISHED:
            break
        if shipped is None:
            continue
        config = build_config(study.profile, shipped["params"])
        tdir = study.path / "trials" / f"{shipped['trial_number']:04d}"
        outcome = step_mod.run_trial(ctx, config, tdir)  # what the node would run
        searcher.on_trial_complete(f"t{i}", _ray_result(study, shipped, outcome))
    assert answers[-1] == Searcher.FINISHED
    stalled = finish()
    assert stalled is not None
    _assert_stall(stalled, study, ostudy)
    assert 2 <= len(seen) <= 3


# -- exhausted: a covered space ends the search without an error --------------------------------------------
def test_an_exhausted_space_ends_the_search(tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    profile = tmp_path / "two.yaml"
    profile.write_text(json.dumps({
        "name": "two", "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1,
                                    "memory_per_device_gb": 1},
        "server": {"ready_timeout_s": 60}, "levers": {"max-num-seqs": {"choices": [4, 8]}}}))
    record = synthetic_record(tmp_path, name="two", trials=None).model_copy(update={"hw": str(profile)})
    study = Study.create(record, tmp_path / "runs")
    seen = launches(lambda config, _n: (None, None, 1.0))
    ostudy = study.run()  # no error: the two configurations were tried
    assert sorted(int(c.args["max-num-seqs"]) for c in seen) == [4, 8]
    assert len(ostudy.trials) >= 2 + step_mod.MAX_DUPLICATES_IN_A_ROW


# -- what a failed launch teaches, on every driver ------------------------------------------------------------
OOM_UNDER_LOAD = {"topology": "dp4-ep", "max-num-seqs": 1024, "max-num-batched-tokens": 8192,
                  "gpu-memory-utilization": 0.95, "compilation-config.cudagraph_mode": "FULL_AND_PIECEWISE",
                  "moe-backend": "auto", "all2all-backend": "allgather_reducescatter", "enable-prefix-caching": True,
                  "speculative.draft_tokens": 0}
HUNGRIER = {**OOM_UNDER_LOAD, "max-num-seqs": 2048, "max-num-batched-tokens": 16384, "moe-backend": "humming"}
HANGS = {**OOM_UNDER_LOAD, "gpu-memory-utilization": 0.88, "compilation-config.cudagraph_mode": "FULL_DECODE_ONLY"}
ITS_TWIN = {**HANGS, "speculative.draft_tokens": 3}


def _failing_node(config: ServeConfig, _n: int) -> tuple[int | None, str | None, float | None]:
    params = dict(config.params)
    if params.get("compilation-config.cudagraph_mode") == "FULL_DECODE_ONLY" \
            and params.get("gpu-memory-utilization") == 0.88:
        return None, "hang", None
    if params.get("gpu-memory-utilization") == 0.95 and int(params.get("max-num-batched-tokens", 0)) >= 8192:
        return 1_400_000, "oom", 1.0
    return 1_400_000, None, 1.0


def _queue(ostudy: optuna.Study) -> None:
    for params in (OOM_UNDER_LOAD, HUNGRIER, HANGS, ITS_TWIN):
        ostudy.enqueue_trial(params)


def _assert_taught(ostudy: optuna.Study, seen: list[ServeConfig]) -> None:
    told = {t.number: t for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))}
    by_params = {json.dumps(t.params, sort_keys=True): t for t in told.values() if "duplicate_of" not in t.user_attrs}
    oom = by_params[json.dumps(OOM_UNDER_LOAD, sort_keys=True)]
    hungrier = by_params[json.dumps(HUNGRIER, sort_keys=True)]
    hang = by_params[json.dumps(HANGS, sort_keys=True)]
    twin = by_params[json.dumps(ITS_TWIN, sort_keys=True)]
    assert oom.user_attrs["failure_class"] == "oom" and oom.user_attrs["ready_s"] is not None
    assert hungrier.user_attrs["launched"] is False and hungrier.user_attrs["refused_by"] == "learned_oom"
    assert f"trial {oom.number} ran out of memory under load" in hungrier.user_attrs["reason"]
    assert hang.user_attrs["failure_class"] == "hang"
    assert twin.user_attrs["launched"] is False and twin.user_attrs["refused_by"] == "base_failed_to_start"
    assert twin.user_attrs["failure_class"] == "hang" and f"trial {hang.number}" in twin.user_attrs["reason"]
    launched_keys = {c.key() for c in seen}
    assert twin.user_attrs["config_key"] not in launched_keys and hungrier.user_attrs["config_key"] not in launched_keys


def test_the_local_loop_learns_from_an_oom_under_load_and_a_failed_start(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    study = _study(tmp_path, trials=3)
    ostudy = study.optuna_study()
    _queue(ostudy)  # ahead of the profile's baselines
    seen = launches(_failing_node)
    _assert_taught(study.run(), seen)


def test_a_worker_learns_from_an_oom_under_load_and_a_failed_start(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    record = synthetic_record(tmp_path, name="night", trials=3, hw="gh200x4", seed=0)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    shared = open_shared("night", tmp_path / "runs", make_storage(url), url=url,
                         create=record.model_copy(update={"guards": []}))
    _queue(shared.optuna_study())
    seen = launches(_failing_node)
    _assert_taught(Worker(shared, WorkerOptions(worker_id="a"), url=url, identity=NODE).run(), seen)


def test_the_ray_searcher_learns_from_an_oom_under_load_and_a_failed_start(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    pytest.importorskip("ray.tune")
    from ray.tune.search import Searcher

    from tuner.backends.ray import make_searcher

    study = _study(tmp_path, trials=None)
    ostudy = study.optuna_study()
    _queue(ostudy)
    study.prepare_queue(ostudy)
    ctx = study.context()
    seen = launches(_failing_node)
    searcher, finish = make_searcher(study, study.round(ostudy, ctx), 3)
    for i in range(20):  # one node: each shipped trial completes before the next suggest
        shipped = searcher.suggest(f"t{i}")
        if shipped == Searcher.FINISHED:
            break
        if shipped is None:
            continue
        config = build_config(study.profile, shipped["params"])
        outcome = step_mod.run_trial(ctx, config, study.path / "trials" / f"{shipped['trial_number']:04d}")
        searcher.on_trial_complete(f"t{i}", _ray_result(study, shipped, outcome))
    assert finish() is None
    _assert_taught(ostudy, seen)


def test_a_resumed_study_remembers_a_base_that_failed_to_start(
        tmp_path: Path, launches: Callable[[Node], list[ServeConfig]]) -> None:
    from tuner.study.storage import ask_fixed

    study = _study(tmp_path, trials=1)
    study.optuna_study().enqueue_trial(HANGS)
    seen = launches(_failing_node)
    study.run()
    assert len(seen) == 1  # the base hung
    again = Study.open("night", tmp_path / "runs")  # a resume (or another worker) builds its step afresh
    ostudy = again.optuna_study()
    step = again.step(ostudy, again.context())
    twin = step.propose(ask_fixed(ostudy, ITS_TWIN, {}))
    verdict = step.refuse(twin)
    assert verdict is not None and verdict.rule == "base_failed_to_start" and verdict.failure_class == "hang"
    assert twin.trial.number not in {t.number for t in ostudy.trials if t.user_attrs.get("launched", True)
                                     and t.state.name == "COMPLETE"}
