"""Committed evidence that the code computes (not measures) is what the code says now.

``docs/evidence/feasibility/calibration.json`` is the feasibility model's answer on the reference texts'
cases; docs/feasibility.md embeds it. A change to the model or the catalog that moves a figure must
regenerate the file (``python docs/evidence/feasibility/measure.py``), so the page cannot drift.
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
