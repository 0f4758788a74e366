"""Every marked table of figures in README.md and docs/ equals what its committed data builds, and no measured
figure in their prose goes without a marker (scripts/evidence.py --check)."""

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


# -- the strict check: a measured figure in prose needs a marker ---------------------------------------------
def _prose_repo(tmp_path: Path, text: str, where: str = "README.md") -> Path:
    repo = _toy_repo(tmp_path, "5,856")
    doc = repo / where
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text((doc.read_text() if doc.is_file() else "") + "\n" + text + "\n", encoding="utf-8")
    return repo


@pytest.mark.parametrize("figure", ["7 min 16 s", "30–36 s", "120 ms", "2,428 tok/s", "1.5 req/s", "3.1×",
                                    "2x", "+7.0 %", "19 %"])
def test_an_unbacked_measured_figure_in_prose_fails_the_check(tmp_path: Path, figure: str) -> None:
    repo = _prose_repo(tmp_path, f"On this machine the demo reads {figure} for it.")
    problems = evidence.check(repo)
    assert len(problems) == 1, problems
    assert problems[0].startswith("README.md:") and repr(figure) in problems[0] and "no evidence marker" in problems[0]


def test_an_unbacked_figure_in_a_doc_or_a_claim_folders_readme_fails_too(tmp_path: Path) -> None:
    repo = _prose_repo(tmp_path, "A launch took 33 s.", where="docs/evidence/toy/README.md")
    (repo / "docs" / "notes.md").write_text("The gate ran in 2.5 s.\n", encoding="utf-8")
    problems = evidence.check(repo)
    assert sorted(p.split(":")[0] for p in problems) == ["docs/evidence/toy/README.md", "docs/notes.md"], problems


@pytest.mark.parametrize("text", [
    "The watchdog stops a launch after <!-- not measured -->600 s of silence.",   # configured, and says so
    "The baseline ran at <!-- evidence: toy/peak -->5,856<!-- /evidence --> tok/s.",  # backed by its data
    "Run `dsv4-tune --budget 90m` or `sleep 5 s` (commands are not prose).",
    "    took 7 min 16 s   (an indented code block after a blank line)",
    "A 4×GH200 node, 4×96 GB, 2 × 264 B (counts and products, not ratios); p95 TTFT, v0.26.",
    "[a link](docs/x.md#took-5-s) in prose with no figure.",
])
def test_backed_configured_code_and_non_figures_pass(tmp_path: Path, text: str) -> None:
    repo = _prose_repo(tmp_path, "\n" + text)
    assert evidence.check(repo) == []


def test_a_tool_written_report_in_a_claim_folder_is_data_not_prose(tmp_path: Path) -> None:
    repo = _prose_repo(tmp_path, "trial 0: 2428.2 tok/s in 33 s", where="docs/evidence/toy/report.md")
    assert evidence.check(repo) == []


def test_a_not_measured_marker_with_no_figure_after_it_fails(tmp_path: Path) -> None:
    repo = _prose_repo(tmp_path, "The limit is <!-- not measured --> generous.")
    problems = evidence.check(repo)
    assert len(problems) == 1 and "is not followed by a figure" in problems[0], problems


def test_a_table_that_fails_on_its_data_is_reported_not_raised(tmp_path: Path) -> None:
    repo = _toy_repo(tmp_path, "5,856")
    (repo / "docs" / "evidence" / "toy" / "data.csv").write_text("name,tok_s\n", encoding="utf-8")
    problems = evidence.check(repo)
    assert problems and all("failed on its data" in p for p in problems), problems
