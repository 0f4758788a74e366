"""Every marked table of figures in README.md and docs/ equals what its committed data builds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _evidence_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("evidence_script", REPO / "scripts" / "evidence.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


evidence = _evidence_module()


def test_every_marked_table_in_the_docs_equals_its_data() -> None:
    problems = evidence.check(REPO)
    assert problems == [], "\n\n".join(problems)


def _toy_repo(tmp_path: Path, figure: str) -> Path:
    claim = tmp_path / "docs" / "evidence" / "toy"
    claim.mkdir(parents=True)
    (claim / "data.csv").write_text("name,tok_s\nbaseline,5856\n", encoding="utf-8")
    (claim / "tables.py").write_text(
        "from pathlib import Path\n"
        "def peak(folder: Path) -> str:\n"
        "    rows = (folder / 'data.csv').read_text().splitlines()[1:]\n"
        "    return f\"{int(rows[0].split(',')[1]):,}\"\n"
        "def table(folder: Path) -> str:\n"
        "    return '| name | tok/s |\\n|---|---|\\n| baseline | ' + peak(folder) + ' |'\n"
        "TABLES = {'peak': peak, 'table': table}\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        f"The baseline ran at <!-- evidence: toy/peak -->{figure}<!-- /evidence --> tok/s.\n\n"
        "<!-- evidence: toy/table -->\n| name | tok/s |\n|---|---|\n| baseline | 5,856 |\n<!-- /evidence -->\n",
        encoding="utf-8")
    return tmp_path


def test_a_figure_that_disagrees_with_its_data_is_reported(tmp_path: Path) -> None:
    repo = _toy_repo(tmp_path, "6,000")
    problems = evidence.check(repo)
    assert len(problems) == 1 and "toy/peak differs from its data" in problems[0]


def test_write_brings_the_document_back_to_its_data(tmp_path: Path) -> None:
    repo = _toy_repo(tmp_path, "6,000")
    assert evidence.write(repo) == [repo / "README.md"]
    assert "<!-- evidence: toy/peak -->5,856<!-- /evidence -->" in (repo / "README.md").read_text()
    assert evidence.check(repo) == []


@pytest.mark.parametrize(("ref", "message"), [("nothing/peak", "no folder docs/evidence/nothing/"),
                                              ("toy/missing", "has no table 'missing'")])
def test_a_marker_naming_missing_evidence_is_an_error(tmp_path: Path, ref: str, message: str) -> None:
    repo = _toy_repo(tmp_path, "5,856")
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + f"\n<!-- evidence: {ref} -->1<!-- /evidence -->\n", encoding="utf-8")
    problems = evidence.check(repo)
    assert len(problems) == 1 and message in problems[0]
