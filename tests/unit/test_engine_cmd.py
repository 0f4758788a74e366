"""``--engine-cmd`` names the server program of any engine; ``--vllm-cmd`` stays an alias of it, and a
``study.json`` written before the rename (``vllm_cmd``) still opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import synthetic_record
from tuner.cli.main import build_parser
from tuner.study import Study, StudyRecord

EVIDENCE = Path(__file__).resolve().parents[2] / "docs" / "evidence"


@pytest.mark.parametrize("flag", ["--engine-cmd", "--vllm-cmd"])
@pytest.mark.parametrize("command", [["run", "--hw", "cpu"], ["worker", "--storage", "sqlite:///x.db", "--study", "s"]])
def test_engine_cmd_and_its_alias_set_one_field(flag: str, command: list[str]) -> None:
    args = build_parser().parse_args([*command, flag, "/opt/llama/llama-server"])
    assert args.server_cmd == "/opt/llama/llama-server"
    assert not hasattr(args, "vllm_cmd")


def test_the_help_names_the_alias(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--engine-cmd SERVER_CMD, --vllm-cmd SERVER_CMD" in text and "alias of --engine-cmd" in text


def test_a_study_json_written_with_vllm_cmd_still_opens(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    study = Study.create(synthetic_record(tmp_path, name="old", trials=1), runs)
    path = study.path / "study.json"
    data = json.loads(path.read_text())
    data["vllm_cmd"] = data.pop("server_cmd")
    path.write_text(json.dumps(data))
    reopened = Study.open("old", runs)
    assert reopened.record.server_cmd == data["vllm_cmd"]
    assert "vllm_cmd" not in reopened.record.model_dump() and "server_cmd" in reopened.record.model_dump()


def test_the_evidence_studies_of_older_versions_load() -> None:
    old = [p for p in sorted(EVIDENCE.glob("*/study.json")) if "vllm_cmd" in json.loads(p.read_text())]
    assert old, "docs/evidence keeps study.json files written before the rename"
    for p in old:
        data = json.loads(p.read_text())
        assert StudyRecord.model_validate(data).server_cmd == data["vllm_cmd"], p
