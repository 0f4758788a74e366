"""One API key per study: every launch of a study is served with the same key, kept owner-only in the study.

vLLM 0.26 hashes ``VLLM_API_KEY`` into its torch.compile cache key (it is not among the variables
``vllm.envs.compile_factors`` ignores there), so a fresh key per launch recompiled every launch on the
H200 (docs/evidence/h200.md). The key must still never reach a file the study writes for people.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from tests.conftest import synthetic_record
from tuner import store
from tuner.study import Study


def test_the_key_is_made_once_owner_only_and_differs_between_studies(tmp_path: Path) -> None:
    first = store.study_api_key(tmp_path / "a")
    assert store.study_api_key(tmp_path / "a") == first and len(first) >= 32
    assert stat.S_IMODE((tmp_path / "a" / store.API_KEY_FILE).stat().st_mode) == 0o600
    assert store.study_api_key(tmp_path / "b") != first


def test_every_context_of_a_study_carries_its_key_and_a_reopened_study_the_same(tmp_path: Path) -> None:
    study = Study.create(synthetic_record(tmp_path, name="keyed", trials=2), tmp_path / "runs")
    key = study.context().api_key
    assert key and study.context().api_key == key
    assert Study.open("keyed", tmp_path / "runs").context().api_key == key   # a resume compiles nothing again
    assert key not in json.dumps(store.safe_env({"VLLM_API_KEY": key}))
    for path in study.path.rglob("*"):
        if path.is_file() and path.name != store.API_KEY_FILE:
            assert key not in path.read_text(errors="replace"), path
