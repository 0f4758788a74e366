"""Committed evidence that the code computes (not measures) is what the code says now.

``docs/evidence/feasibility/calibration.json`` is the feasibility model's answer on the reference texts'
cases; docs/feasibility.md embeds it. A change to the model or the catalog that moves a figure must
regenerate the file (``python docs/evidence/feasibility/measure.py``), so the page cannot drift.
``docs/evidence/emulator/calibration.json`` is the same for the emulated node's predictions
(docs/emulator.md), compared with a rounding step's tolerance.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_feasibility_calibration_on_file_is_what_the_model_says_now() -> None:
    measure = _module(REPO / "docs" / "evidence" / "feasibility" / "measure.py", "feasibility_measure")
    committed = json.loads((REPO / "docs" / "evidence" / "feasibility" / "calibration.json").read_text("utf-8"))
    now = json.loads(json.dumps(measure.measure(), ensure_ascii=False))
    assert now == committed, ("run .venv/bin/python docs/evidence/feasibility/measure.py, then "
                              "scripts/evidence.py --write docs/feasibility.md")


def test_the_reference_cases_keep_their_verdicts() -> None:
    """The texts' fit / no-fit cases, as the page states them: the file may be regenerated, not turned around."""
    committed = json.loads((REPO / "docs" / "evidence" / "feasibility" / "calibration.json").read_text("utf-8"))
    verdicts = {c["case"]: c["fits"] for c in committed["cases"]}
    assert verdicts.pop("4×96 GB, DP4 without EP, replicated per GPU") is False
    assert verdicts.pop("8×H100 80 GB, TP2 × DP4 without EP") is False
    assert all(verdicts.values()), verdicts
    knee = next(c for c in committed["cases"] if c["baseline"] == "blog-dp4-ep" and c["fits"])
    assert knee["max_concurrency"] == 2752  # the fit point of the KV constant


def _agree(now: object, committed: object, where: str = "") -> list[str]:
    """Where two JSON trees differ; numbers may differ by a rounding step (1e-3 relative, or 1 in the last unit)."""
    if isinstance(now, dict) and isinstance(committed, dict):
        if now.keys() != committed.keys():
            return [f"{where}: keys {sorted(now)} vs {sorted(committed)}"]
        return [d for k in now for d in _agree(now[k], committed[k], f"{where}.{k}")]
    if isinstance(now, list) and isinstance(committed, list):
        if len(now) != len(committed):
            return [f"{where}: {len(now)} items vs {len(committed)}"]
        return [d for i, (a, b) in enumerate(zip(now, committed, strict=True)) for d in _agree(a, b, f"{where}[{i}]")]
    numbers = (int, float)
    if isinstance(now, numbers) and isinstance(committed, numbers) and not isinstance(now, bool) \
            and not isinstance(committed, bool):
        unit = 1.0 if isinstance(now, int) and isinstance(committed, int) else 0.11
        ok = abs(now - committed) <= max(1e-3 * abs(committed), unit)
        return [] if ok else [f"{where}: model {now} vs file {committed}"]
    return [] if now == committed else [f"{where}: model {now!r} vs file {committed!r}"]


def test_the_emulator_calibration_on_file_is_what_the_model_says_now() -> None:
    """docs/emulator.md's calibration table, TP4 figures and other profiles are the emulator's answers now."""
    folder = REPO / "docs" / "evidence" / "emulator"
    measure = _module(folder / "measure.py", "emulator_measure")
    committed = json.loads((folder / "calibration.json").read_text("utf-8"))
    now = json.loads(json.dumps(measure.measure(), ensure_ascii=False))
    differences = _agree(now, committed)
    assert not differences, ("run .venv/bin/python docs/evidence/emulator/measure.py, then "
                             f"scripts/evidence.py --write docs/emulator.md: {differences}")


def test_the_agreement_check_sees_a_moved_figure() -> None:
    assert _agree({"a": [1.0, 12782]}, {"a": [1.0, 12782]}) == []
    assert _agree({"a": [1.0, 12782]}, {"a": [1.0, 12802]}) == [".a[1]: model 12782 vs file 12802"]
    assert _agree({"a": 10.3}, {"a": 10.8}) and _agree({"a": "x"}, {"a": "y"}) and _agree({"a": 1}, {"b": 1})
