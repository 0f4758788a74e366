"""Bad input: each gives a clear error that names the file (or flag), the key and the fix; never a
traceback. The table in docs/bad-input.md lists the same cases with their messages.

The CLI runs in-process (``tuner.cli.main``) with its console captured; exit codes are the CLI's:
2 for a usage or catalog error, 1 for a study error.
"""

from __future__ import annotations

import importlib
import io
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from tuner import catalog
from tuner.errors import UnknownNameError

cli = importlib.import_module("tuner.cli.main")  # the module: ``tuner.cli.main`` names the function

GOOD_PROFILE = {
    "name": "cpu-bad-input",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 30},
    "levers": {"max-num-seqs": {"choices": [4, 8]}},
}


def _profile(**patch: object) -> str:
    data = json.loads(json.dumps(GOOD_PROFILE))
    for dotted, value in patch.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return yaml.safe_dump(data)


@dataclass
class Case:
    id: str
    argv: Callable[[Path], list[str]]
    expect: list[str]
    rc: int = 2
    files: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None


def _run_args(tmp: Path, *extra: str, hw: str | None = None) -> list[str]:
    return ["run", "--hw", hw or str(tmp / "hw.yaml"), "--model", str(tmp / "model"), "--trials", "1",
            "--runs-dir", str(tmp / "runs"), *extra]


def _newer_json_schema(tmp: Path) -> None:
    study = tmp / "runs/old"
    study.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"schema_version": 99, "name": "old"}))


def _newer_db_schema(tmp: Path) -> None:
    from tuner.study import Study, StudyRecord

    study = Study.create(StudyRecord(name="newdb", hw=str(tmp / "hw.yaml"), objective="throughput",
                                     model=str(tmp / "model"), trials=1), tmp / "runs")
    study.optuna_study()
    con = sqlite3.connect(study.path / "study.db")
    con.execute("UPDATE alembic_version SET version_num = 'v9.9.9.from-the-future'")
    con.execute("UPDATE version_info SET library_version = '99.0.0'")
    con.commit()
    con.close()


CASES = [
    Case("malformed YAML", lambda t: _run_args(t), ["hw.yaml", "line 3", "malformed YAML", "Fix:"],
         files={"hw.yaml": "name: x\nlevers:\n  max-num-seqs: {choices: [4, 8}\n"}),
    Case("deeply nested YAML", lambda t: _run_args(t), ["hw.yaml", "nested too deeply", "Fix:"],
         files={"hw.yaml": "[" * 2000}),
    Case("unknown key", lambda t: _run_args(t), ["hw.yaml", "levers.max-num-seqs.choises", "unknown key",
                                                 "did you mean 'choices'"],
         files={"hw.yaml": _profile(levers={"max-num-seqs": {"choises": [4]}})}),
    Case("wrong type", lambda t: _run_args(t), ["hw.yaml", "hardware.device_count", "'four'", "Fix:"],
         files={"hw.yaml": _profile(hardware__device_count="four")}),
    Case("empty range", lambda t: _run_args(t), ["hw.yaml", "levers.max-num-seqs", "empty range [64, 8]", "Fix:"],
         files={"hw.yaml": _profile(levers={"max-num-seqs": {"int": [64, 8]}})}),
    Case("empty choices", lambda t: _run_args(t), ["hw.yaml", "levers.max-num-seqs", "'choices' is empty", "Fix:"],
         files={"hw.yaml": _profile(levers={"max-num-seqs": {"choices": []}})}),
    Case("TP×DP ≠ GPU count", lambda t: _run_args(t), ["hw.yaml", "topology.choices[0]", "4 GPUs, the node has 8",
                                                        "Fix:", "device_count"],
         files={"hw.yaml": _profile(hardware__accelerator="nvidia", hardware__device_count=8,
                                    topology={"choices": ["tp2-dp2"]})}),
    Case("unknown hardware", lambda t: _run_args(t, hw="gh300x9"), ["unknown hardware profile 'gh300x9'", "known:",
                                                                    "gh200x4", "path to a YAML file"]),
    Case("unknown objective", lambda t: _run_args(t, "--objective", "fastest"),
         ["unknown objective 'fastest'", "known:", "throughput"]),
    Case("SLO without a unit (catalog)", lambda t: _run_args(t, "--objective", str(t / "obj.yaml")),
         ["obj.yaml", "slos", "'ttft' has no recognised unit", "p95_ttft_ms"],
         files={"obj.yaml": "name: o\nslos: {ttft: 2000}\n"}),
    Case("SLO without a unit (--slo)", lambda t: _run_args(t, "--slo", "ttft=2000"),
         ["--slo", "'ttft'", "p95_ttft_ms"]),
    Case("--engine-cmd that does not exist", lambda t: _run_args(t, "--engine-cmd", "/opt/nowhere/vllm"),
         ["--engine-cmd", "/opt/nowhere/vllm", "not found", "Fix:"]),
    Case("model path that does not exist", lambda t: [*_run_args(t)[:4], "/data/no/such/model", "--trials", "1",
                                                      "--runs-dir", str(t / "runs")],
         ["--model", "/data/no/such/model", "no such file or directory", "Fix:"]),
    Case("budget of 0", lambda t: _run_args(t, "--budget", "0"), ["--budget '0'", "longer than 0"]),
    Case("--trials -1", lambda t: ["run", "--hw", "cpu", "--trials", "-1"],
         ["argument --trials", "must be at least 1, got -1"]),
    Case("resume of a study that does not exist", lambda t: ["resume", "nosuch", "--runs-dir", str(t / "runs")],
         ["no study 'nosuch'", "known:", "Fix:"], rc=1),
    Case("study.json from a newer schema", lambda t: ["resume", "old", "--runs-dir", str(t / "runs")],
         ["study.json", "schema_version 99", "upgrade dsv4-tune"], rc=1, setup=_newer_json_schema),
]

DB_CASE = Case("study.db from a newer Optuna schema", lambda t: ["resume", "newdb", "--runs-dir", str(t / "runs")],
               ["study.db", "newer", "Fix:"], rc=1, setup=_newer_db_schema)


def run_case(case: Case, tmp: Path, capsys: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    (tmp / "model").mkdir(exist_ok=True)
    (tmp / "hw.yaml").write_text(yaml.safe_dump(GOOD_PROFILE))
    for name, text in case.files.items():
        (tmp / name).write_text(text)
    if case.setup is not None:
        case.setup(tmp)
    out = io.StringIO()
    wide = Console(file=out, width=4000, highlight=False, color_system=None)
    monkeypatch.setattr(cli, "console", wide)
    monkeypatch.setattr(cli, "err_console", wide)
    try:
        rc = cli.main(case.argv(tmp))
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, " ".join((out.getvalue() + captured.out + captured.err).split())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_a_clear_error(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rc, text = run_case(case, tmp_path, capsys, monkeypatch)
    assert "Traceback" not in text, text
    assert rc == case.rc, text
    for needle in case.expect:
        assert needle in text, f"{needle!r} missing from: {text}"


def test_newer_db_schema_gives_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rc, text = run_case(DB_CASE, tmp_path, capsys, monkeypatch)
    assert rc == DB_CASE.rc, text
    for needle in DB_CASE.expect:
        assert needle in text, f"{needle!r} missing from: {text}"


def test_unknown_guard_name_is_a_clear_error() -> None:
    with pytest.raises(UnknownNameError) as info:
        catalog.resolve("guards", "no-such-guard")
    assert "unknown guard 'no-such-guard'" in str(info.value)
    assert "Or pass a path to a YAML file" in str(info.value)
