"""A worker of a shared study runs a speculative trial's control first, and learns the KV fit from every
worker's launches. Synthetic trials (``run_trial`` replaced) on a real SQLite Optuna storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState

import tuner.study.step as step_mod
from tests.conftest import synthetic_outcome, synthetic_record
from tuner.backends.node import NodeIdentity
from tuner.backends.worker import SharedStudy, Worker, WorkerOptions, open_shared
from tuner.search.space import ServeConfig, suggest
from tuner.study import Study
from tuner.study.storage import ask_fixed, make_storage
from tuner.trial import TrialContext, TrialOutcome

NODE = NodeIdentity(hostname="node-a", gpu_model=None, gpu_count=0, driver=None, vllm_version="0.32.0",
                    cpu_model="x86", cpu_count=2)
SPECULATIVE = {"max-num-seqs": 32, "max-num-batched-tokens": 2048, "block-size": 128, "kv-cache-dtype": "auto",
               "enable-prefix-caching": True, "enable-chunked-prefill": True, "speculative.draft_tokens": 2}
"""A speculative trial with every lever fixed (a legal one, not a baseline): with only the draft count fixed the
sampler drew the rest, and some draws are combinations the pre-flight refuses before launch (then neither the
trial nor its control launches, and the test read the sampler's luck)."""


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    """Every configuration launched, in order; each trial's value is its max-num-seqs."""
    seen: list[ServeConfig] = []

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, repeats: int = 1,
                       **_kw: Any) -> TrialOutcome:
        seen.append(config)
        return synthetic_outcome(ctx, config, tdir, repeats)

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    return seen


def _shared(tmp_path: Path, trials: int) -> tuple[SharedStudy, str]:
    record = synthetic_record(tmp_path, name="night", trials=trials, seed=0)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    return open_shared("night", tmp_path / "runs", make_storage(url), url=url, create=record), url


def test_a_workers_speculative_trial_launches_after_its_control(tmp_path: Path,
                                                                launches: list[ServeConfig]) -> None:
    shared, url = _shared(tmp_path, trials=2)
    shared.optuna_study().enqueue_trial(SPECULATIVE)  # ahead of the profile's baselines
    ostudy = Worker(shared, WorkerOptions(worker_id="a"), url=url, identity=NODE).run()

    # --trials 2 counts trials: the speculative one and one more; its control launches first, counted apart
    assert len(launches) == 3
    control, speculative, other = launches
    assert other.key() not in (control.key(), speculative.key())
    assert speculative.is_speculative and not control.is_speculative
    assert control.key() == speculative.control().key()
    by_key = {t.user_attrs["config_key"]: t for t in ostudy.get_trials(states=(TrialState.COMPLETE,))}
    assert by_key[control.key()].user_attrs["control_for"] == speculative.key()
    assert by_key[control.key()].user_attrs["worker_id"] == "a"  # stamped like any trial of this worker
    assert "control_for" not in by_key[speculative.key()].user_attrs
    assert not ostudy.get_trials(states=(TrialState.RUNNING,))
    waiting = ostudy.get_trials(states=(TrialState.WAITING,))
    assert all("baseline" in t.user_attrs for t in waiting)  # no control queued behind its twin


def test_a_control_already_launched_is_not_launched_again(tmp_path: Path, launches: list[ServeConfig]) -> None:
    shared, url = _shared(tmp_path, trials=2)
    ostudy = shared.optuna_study()
    first = ask_fixed(ostudy, {**SPECULATIVE}, {})
    control_params = suggest(shared.profile, first).control().params
    ostudy.tell(first, state=TrialState.FAIL)  # only there to learn the control's parameters
    ostudy.enqueue_trial(dict(control_params))
    ostudy.enqueue_trial(SPECULATIVE)
    Worker(shared, WorkerOptions(worker_id="a"), url=url, identity=NODE).run()

    assert [c.is_speculative for c in launches] == [False, True]
    assert launches[0].key() == launches[1].control().key()


def test_learn_kv_takes_each_trial_once_whoever_launched_it(tmp_path: Path) -> None:
    """Trials told by another worker (here: straight into the storage) refit this worker's KV model."""
    study = Study.create(synthetic_record(tmp_path, name="gh", trials=None, hw="gh200x4"), tmp_path / "runs")
    ostudy = study.optuna_study()
    baseline = next(b.values for b in study.profile.baselines if b.name == "blog-dp4-ep")

    def told_elsewhere(kv_tokens: int) -> None:
        trial = ask_fixed(ostudy, baseline, {})
        suggest(study.profile, trial)
        trial.set_user_attr("kv_cache_tokens", kv_tokens)
        ostudy.tell(trial, 1.0)

    told_elsewhere(500_000)
    checks = study.prelaunch(ostudy)
    assert checks.calibration is not None and checks.calibration.trials == 1
    told_elsewhere(520_000)
    study.learn_kv(ostudy, checks)
    study.learn_kv(ostudy, checks)  # nothing new: nothing counted twice
    assert checks.calibration is not None and checks.calibration.trials == 2
    assert checks.observed_trials == {0, 1}
