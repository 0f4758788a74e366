"""One API key per study: every launch of a study in one process is served with the same key, never written.

vLLM 0.26 hashes ``VLLM_API_KEY`` into its torch.compile cache key (it is not among the variables
``vllm.envs.compile_factors`` ignores there), so a fresh key per launch recompiled every launch on the
H200 (docs/evidence/h200.md). The key must still never reach a file (tests/faults/test_vllm_night.py
checks the same on a real night).
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import synthetic_record
from tuner import store
from tuner.study import Study


def test_one_key_per_study_and_another_for_another_study(tmp_path: Path) -> None:
    first = store.study_api_key(tmp_path / "a")
    assert store.study_api_key(tmp_path / "a") == first and len(first) >= 32
    assert store.study_api_key(tmp_path / "b") != first


def test_every_context_of_a_study_carries_its_key_and_no_file_holds_it(tmp_path: Path) -> None:
    study = Study.create(synthetic_record(tmp_path, name="keyed", trials=2), tmp_path / "runs")
    key = study.context().api_key
    assert key and study.context().api_key == key
    assert Study.open("keyed", tmp_path / "runs").context().api_key == key   # the same process: the same key
    assert store.safe_env({"VLLM_API_KEY": key}) == {"VLLM_API_KEY": "***"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
