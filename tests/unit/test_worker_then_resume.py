"""After scale-out workers finish, ``resume`` on one node confirms the top-k and exports.

Workers screen only (each node runs its own trials; none can own the confirmation phase). The shared
study then resumes like a local one: its trial target is already met, so the loop goes straight to
confirmation. Synthetic trials (``run_trial`` replaced) on a real SQLite Optuna storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tuner.study.step as step_mod
from tests.conftest import synthetic_outcome, synthetic_record
from tuner.backends.node import NodeIdentity
from tuner.backends.worker import Worker, WorkerOptions, open_shared
from tuner.search.space import ServeConfig
from tuner.study import Study
from tuner.study.storage import make_storage
from tuner.trial import TrialContext, TrialOutcome

NODE = NodeIdentity(hostname="node-a", gpu_model=None, gpu_count=0, driver=None, vllm_version="0.32.0",
                    cpu_model="x86", cpu_count=2)


def test_a_shared_study_is_confirmed_by_resume_after_its_workers(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[tuple[int, str]] = []

    def fake_run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, repeats: int = 1,
                       **_kw: Any) -> TrialOutcome:
        runs.append((repeats, config.key()))
        return synthetic_outcome(ctx, config, tdir, repeats)

    monkeypatch.setattr(step_mod, "run_trial", fake_run_trial)
    record = synthetic_record(tmp_path, name="night", trials=3, top_k=1, seed=0)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    storage = make_storage(url)
    shared = open_shared("night", tmp_path / "runs", storage, url=url, create=record)
    ostudy = Worker(shared, WorkerOptions(worker_id="a"), url=url, identity=NODE).run()
    assert all(repeats == 1 for repeats, _ in runs)  # workers screen only
    assert "confirmations" not in ostudy.user_attrs

    resumed = Study.open("night", tmp_path / "runs")
    after = resumed.run()
    confirmations = after.user_attrs["confirmations"]
    confirmed = [c for c in confirmations if c["control_of"] is None]
    # the top-k (1, and a trial that screened within the noise of it: the sampler may draw one alike) and the
    # recipe when it is not among them: each confirmed once, over the record's 2 repeats
    planned = [n for n, _, control_of in resumed.confirmation_phase.candidates(after) if control_of is None]
    assert 1 <= len(planned) <= 3 and [c["trial"] for c in confirmed] == planned
    assert all(c["values"] == [c["values"][0]] * 2 for c in confirmed)
    assert [r for r, _ in runs].count(2) == len(confirmations)  # confirmation launches, nothing re-screened
    assert resumed.winner(after) is not None and resumed.winner(after).confirmed  # type: ignore[union-attr]
