"""One round, every driver (issue 26): the same seeded ``--prior model`` study on the same emulated truth,
run by the local loop, by two workers sharing it on a real PostgreSQL, and by the Ray driver's searcher.

Each launch is measured on the emulated node (``benchmarks/search_truth.py``: the emulated node's
performance model with seed 3's constants, 3 % throughput noise), the same figures for a configuration
whichever driver launches it. The node shares the prior's structure, so the correction the prior learns
names the node's constants whichever configurations a driver happened to launch; on the independent node
of issue 24 it would depend on the launches, and the drivers launch different ones (two workers race).
``tuner.study.step.run_trial`` is replaced by that measurement; everything else is the real study:
Optuna storage (SQLite, PostgreSQL), the feasibility model and pre-launch checks, controls first, the
guide. The Ray driver's searcher is driven here the way Tune drives it (two nodes' worth of trials in
flight), in this process, so that its launches are measured on the same truth.

Before the round was written once, only the local driver told the guide of each launch: the workers and
Ray ran ``--prior model`` blind after the prior's first picks, and this test failed on them (no model view
after their launches).
"""

from __future__ import annotations

import math
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import tuner.study.step as step_mod
from tests.conftest import load_benchmark, synthetic_record
from tuner.backends.node import NodeIdentity
from tuner.backends.worker import Worker, WorkerOptions, open_shared
from tuner.objective import constraint_names, failed_score
from tuner.search.space import ServeConfig
from tuner.study import Study, StudyRecord
from tuner.study.guided import GuidedSearch, study_history
from tuner.study.storage import make_storage
from tuner.trial import TrialContext, TrialOutcome

LAUNCHES = 8
"""Screening trials per driver (controls come on top): the prior's picks, then the corrected model's."""
TRUTH_SEED = 3
NODE = NodeIdentity(hostname="node-a", gpu_model="GH200", gpu_count=4, driver=None, vllm_version="0.32.0",
                    cpu_model="grace", cpu_count=72)
Truth = Callable[[ServeConfig], Any]


@pytest.fixture(scope="module")
def truth() -> Callable[[Study], Truth]:
    """The emulated node over a study's own table: configuration → its (seeded) measurement."""
    search_truth = load_benchmark("search_truth")
    made: dict[str, Any] = {}

    def for_study(study: Study) -> Truth:
        guided = study.guided_search(study.optuna_study())
        assert guided is not None, "the study runs --prior model"
        table = guided.predictor.table
        if "truth" not in made:
            made["truth"] = search_truth.make_truth(table, guided.predictor.objective, TRUTH_SEED)
        node = made["truth"]

        def measure(config: ServeConfig) -> Any:
            point = table.index_of[config.key()]
            return node.measure(point, np.random.default_rng(point))  # the same figures for every driver

        return measure

    return for_study


def _install(monkeypatch: pytest.MonkeyPatch, measure: Truth) -> None:
    """Launches in this process measured on the truth."""

    def run_on_truth(ctx: TrialContext, config: ServeConfig, tdir: Path, **_: Any) -> TrialOutcome:
        return _outcome(ctx, config, tdir, measure(config))

    monkeypatch.setattr(step_mod, "run_trial", run_on_truth)


def _outcome(ctx: TrialContext, config: ServeConfig, tdir: Path, m: Any) -> TrialOutcome:
    """What ``run_trial`` returns for a launch of ``config`` measured as ``m`` (``search_truth.Outcome``)."""
    tdir.mkdir(parents=True, exist_ok=True)
    names = constraint_names(ctx.objective)
    started = m.launched and m.failure_class != "oom"
    if m.figures is None:
        return TrialOutcome(ok=False, value=failed_score(ctx.objective).value, constraints=tuple(1.0 for _ in names),
                            failure_class=m.failure_class, reason=f"{m.failure_class} on the emulated node",
                            summary={}, server_metrics={}, ready_s=1.0 if started else None, duration_s=60.0,
                            trial_dir=str(tdir), config_key=config.key())
    summary = {"output_throughput": m.figures["output_tok_s"], "p95_ttft_ms": m.figures["ttft_p95_ms"],
               "p95_itl_ms": m.figures["itl_p95_ms"], "max_concurrency": m.concurrency}
    margins = (*m.margins, -1.0, -1.0)  # the SLOs, then failed_fraction and trial_ran
    return TrialOutcome(ok=True, value=m.value, constraints=margins[:len(names)],
                        failure_class=m.failure_class, reason="measured on the emulated node", summary=summary,
                        server_metrics={}, ready_s=1.0, duration_s=60.0, trial_dir=str(tdir),
                        config_key=config.key())


def _record(tmp_path: Path, name: str) -> StudyRecord:
    record = synthetic_record(tmp_path, name=name, trials=LAUNCHES, hw="gh200x4", seed=0)
    assert record.prior == "model"
    return record.model_copy(update={"guards": []})


def _learnt_from_every_launch(ostudy: optuna.Study) -> list[dict[str, Any]]:
    """The model's view after each launch, checked to cover every launch (controls included)."""
    launched = sorted(t.number for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                      if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs)
    history = study_history(ostudy)
    assert [h["trial"] for h in history] == launched, "the guide learnt from every launch, and only once"
    assert all(h["correction"] for h in history)
    return history


def _factors(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    return {c["factor"]: c for c in history[-1]["correction"]}


# -- the three drivers ---------------------------------------------------------------------------------------
def _local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truth: Callable[[Study], Truth]) -> optuna.Study:
    study = Study.create(_record(tmp_path / "local", "local"), tmp_path / "local" / "runs")
    _install(monkeypatch, truth(study))
    return study.run()


def _workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truth: Callable[[Study], Truth],
             pg_url: str) -> optuna.Study:
    name = f"round-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "workers" / "runs"
    record = _record(tmp_path / "workers", name)
    storage = make_storage(pg_url, heartbeat_interval_s=5, grace_period_s=60)
    first = open_shared(name, runs, storage, url=pg_url, create=record)
    _install(monkeypatch, truth(first))
    errors: list[BaseException] = []

    def work(worker_id: str) -> None:
        try:
            shared = open_shared(name, runs, make_storage(pg_url, heartbeat_interval_s=5, grace_period_s=60),
                                 url=pg_url)
            Worker(shared, WorkerOptions(worker_id=worker_id, heartbeat_interval_s=5), url=pg_url,
                   identity=NODE).run()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    ostudy = optuna.load_study(study_name=name, storage=storage)
    workers = {t.user_attrs.get("worker_id") for t in ostudy.get_trials(states=(TrialState.COMPLETE,))
               if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs}
    assert workers == {"w1", "w2"}, "both workers launched"
    return ostudy


def _ray_trial_on_truth(config: Any, job: Any) -> dict[str, Any]:
    """A Ray trial on its node (a Ray worker process): the real ``ray_trial``, its launch measured on the truth.

    Tune pickles this function by value (this test module is not importable on a worker: pytest imported it
    by its file name), and what it uses by reference: ``tuner``, ``tests.conftest`` (Ray puts the driver's
    working directory, the repository, on a worker's path). There ``tuner.backends.ray`` is imported afresh:
    its ``ray_trial`` is the real one, which this test replaced in the driver only."""
    import tuner.backends.ray as ray_backend

    study = Study(StudyRecord.model_validate(job.record), Path(job.runs_dir))
    guided = GuidedSearch.build(study.profile, study.checkpoint, study.objective)
    node = load_benchmark("search_truth").make_truth(guided.predictor.table, guided.predictor.objective, TRUTH_SEED)

    def run_on_truth(ctx: TrialContext, serve: ServeConfig, tdir: Path, **_: Any) -> TrialOutcome:
        point = guided.predictor.table.index_of[serve.key()]
        return _outcome(ctx, serve, tdir, node.measure(point, np.random.default_rng(point)))

    assert ray_backend.ray_trial is not _ray_trial_on_truth, "runs in a Ray worker, where ray_trial is the real one"
    ray_backend.run_trial = run_on_truth  # this worker process only
    return ray_backend.ray_trial(config, job)


def _ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ray_address: str) -> optuna.Study:
    """A real Tune run on the session's Ray head (two logical GPUs: two trials at once), its trials measured
    on the truth in Ray's worker processes.

    The shared head, not a cluster of this test's own: ``ray.init(address="local")`` writes an auth token to
    ``~/.ray`` that every later client on the machine then sends to the shared head, which refuses it (it
    broke the real-server lane's Ray test). Two trials of this test at once hold the head's two GPUs for a
    few seconds; the real-server lane's Ray trial, run beside it, waits for them or they for it."""
    import ray
    from ray import cloudpickle

    import tuner.backends.ray as ray_backend

    monkeypatch.setattr(ray_backend, "ray_trial", _ray_trial_on_truth)
    study = Study.create(_record(tmp_path / "ray", "ray"), tmp_path / "ray" / "runs")
    this_module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(this_module)
    try:
        ostudy = ray_backend.run_study(study, ray_backend.RayOptions(address=ray_address, gpus_per_trial=1,
                                                                     max_concurrent_trials=2, max_retries=0))
    finally:
        cloudpickle.unregister_pickle_by_value(this_module)
        ray.shutdown()
    lost = [t.number for t in ostudy.get_trials(states=(TrialState.FAIL,)) if t.user_attrs.get("failure_class")]
    assert not lost, f"trials lost on Ray: {lost}"
    assert all(t.user_attrs.get("backend") == "ray" for t in ostudy.get_trials(states=(TrialState.COMPLETE,))
               if t.user_attrs.get("launched", True) and "duplicate_of" not in t.user_attrs)
    return ostudy


def test_every_driver_learns_the_same_correction_from_every_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truth: Callable[[Study], Truth], pg_url: str,
        ray_address: str) -> None:
    histories = {
        "local": _learnt_from_every_launch(_local(tmp_path, monkeypatch, truth)),
        "2 PostgreSQL workers": _learnt_from_every_launch(_workers(tmp_path, monkeypatch, truth, pg_url)),
        "ray": _learnt_from_every_launch(_ray(tmp_path, monkeypatch, ray_address)),
    }
    for name, history in histories.items():
        assert len(history) >= LAUNCHES, f"{name}: {len(history)} launches learnt from"
    factors = {name: _factors(h) for name, h in histories.items()}
    names = set.intersection(*(set(f) for f in factors.values()))
    assert names, "the drivers fitted the same factors"
    for factor in sorted(names):
        # within the noise of one another: two drivers' multipliers differ by less than twice the spread of
        # their difference (each fit's 68 % interval, on the log scale, as its sd)
        fits = {d: (math.log(float(f[factor]["multiplier"])),
                    (math.log(float(f[factor]["high"])) - math.log(float(f[factor]["low"]))) / 2)
                for d, f in factors.items()}
        for a, (la, sa) in fits.items():
            for b, (lb, sb) in fits.items():
                assert abs(la - lb) <= 2 * math.hypot(sa, sb), (
                    f"{factor}: {a} fitted ×{math.exp(la):.3f} (sd {sa:.3f}), {b} ×{math.exp(lb):.3f} (sd {sb:.3f})")
    for history in histories.values():  # the model was corrected: factors moved off 1 by what the launches said
        assert any(not math.isclose(float(c["multiplier"]), 1.0, abs_tol=1e-3) for c in history[-1]["correction"])
