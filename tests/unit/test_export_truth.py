"""The export never relabels a rejected winner, and never drops its repeats.

The study runs through the real command line (``dsv4-tune run``, in process) with the launch replaced
by a synthetic one: screening runs meet every SLO; every confirmation's repeats disagree as the
committed CPU study's did (2293.9 / 632.7 / 3361.8 tok/s, a spread of 119 %). Before this was fixed
the study exported the winner as "UNCONFIRMED (single screening run)" with ``"confirmation": null``
and exited 0; these tests fail on that behaviour.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import tuner.study.step as step_mod
from tests.conftest import stand_in_checkpoint
from tuner import store
from tuner.cli.main import EXIT_UNCONFIRMED, main
from tuner.objective import constraint_names
from tuner.search.space import ServeConfig
from tuner.trial import TrialContext, TrialOutcome

REPO = Path(__file__).resolve().parents[2]
NOISY = (2293.9, 632.7, 3361.8)
STEADY = (2400.0, 2410.0, 2395.0)


def _fake_launches(monkeypatch: pytest.MonkeyPatch, repeats_seen: tuple[float, ...]) -> None:
    def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                  on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        value = 1000.0 + 10.0 * float(config.args.get("max-num-seqs", 1))
        values = repeats_seen if repeats > 1 else (value,)
        store.write_json(tdir / "config.json", config.to_json())
        store.write_json(tdir / "command.json", {"argv": ["vllm", "serve"], "env": {"HF_HUB_OFFLINE": "1"}})
        constraints = tuple(-0.5 for _ in constraint_names(ctx.objective))
        outcome = TrialOutcome(ok=True, value=values[0] if repeats == 1 else sorted(values)[len(values) // 2],
                               constraints=constraints, failure_class=None, reason="synthetic",
                               summary={"output_throughput": value}, server_metrics={}, ready_s=1.0,
                               duration_s=5.0, trial_dir=str(tdir), config_key=config.key(), repeat_values=values)
        store.write_json(tdir / "outcome.json", outcome.to_json())
        return outcome

    monkeypatch.setattr(step_mod, "run_trial", run_trial)


def _run(tmp_path: Path, *extra: str) -> int:
    model = stand_in_checkpoint(tmp_path / "model")
    return main(["run", "--hw", "cpu", "--objective", "throughput", "--trials", "2", "--study", "s",
                 "--model", str(model), "--prevalidate", "off", "--guards", "none", "--confirm-top-k", "1",
                 "--confirm-repeats", "3", "--runs-dir", str(tmp_path / "runs"), *extra])


def test_a_study_whose_confirmation_was_rejected_exports_nothing_and_exits_3(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_launches(monkeypatch, NOISY)
    assert _run(tmp_path) == EXIT_UNCONFIRMED
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert "no candidate was confirmed" in text
    assert "2293.9 / 632.7 / 3361.8" in text and "--accept-unconfirmed" in text
    study = tmp_path / "runs" / "s"
    assert not (study / "best").exists()
    report = (study / "report.md").read_text()
    assert "No candidate was confirmed" in report and "2293.9, 632.7, 3361.8" in report
    assert "- pre-launch argument checks: off (--prevalidate off)" in report  # whether they ran
    # `export` refuses it too, with the same reason, and the same exit code
    assert main(["export", "s", "--runs-dir", str(tmp_path / "runs")]) == EXIT_UNCONFIRMED
    assert "2293.9 / 632.7 / 3361.8" in " ".join(capsys.readouterr().err.split())
    assert not (study / "best").exists()


def test_accept_unconfirmed_writes_the_rejected_repeats_into_every_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_launches(monkeypatch, NOISY)
    assert _run(tmp_path, "--accept-unconfirmed") == 0
    best = tmp_path / "runs" / "s" / "best"
    identity = json.loads((best / "identity.json").read_text())
    assert identity["confirmed"] is False and identity["confirmation_status"] == "rejected"
    assert identity["accepted_unconfirmed"] is True
    assert identity["confirmation"] is not None, "the rejected verdict was dropped"
    assert tuple(identity["confirmation"]["values"]) == NOISY
    assert identity["confirmation"]["trial"] == identity["trial"]
    assert "repeats disagree" in identity["confirmation"]["reason"]
    assert [tuple(c["values"]) for c in identity["rejected_confirmations"]] == [NOISY]
    for name in ("serve.sh", "profile.yaml"):
        text = (best / name).read_text()
        assert "REJECTED in confirmation: repeats 2293.9 / 632.7 / 3361.8" in text, name
        assert "exported with --accept-unconfirmed" in text, name
        assert "UNCONFIRMED (single screening run)" not in text, name
    confirmations = json.loads((best / "evidence" / "confirmations.json").read_text())
    assert [tuple(c["values"]) for c in confirmations] == [NOISY]


def test_a_confirmed_winner_exports_without_consent_and_says_so(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_launches(monkeypatch, STEADY)
    assert _run(tmp_path) == 0
    best = tmp_path / "runs" / "s" / "best"
    identity = json.loads((best / "identity.json").read_text())
    assert identity["confirmed"] is True and identity["confirmation_status"] == "confirmed"
    assert identity["accepted_unconfirmed"] is False and identity["rejected_confirmations"] == []
    assert identity["objective"]["value"] == pytest.approx(2400.0)  # the median repeat, not the screening run
    assert "confirmed: median of 3 repeats (2400.0 / 2410.0 / 2395.0" in (best / "serve.sh").read_text()


def test_a_forced_run_carries_its_mismatches_and_constraints_into_report_identity_and_status(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--force goes on past a pre-flight mismatch (a disk too small for a night, on a CPU without AVX-512): the
    mismatch and the probe's constraint reach report.md, best/identity.json and `status` (issue 25)."""
    import tuner.search.preflight as preflight

    monkeypatch.setattr(preflight, "ACTIVE_PROBE", preflight.HostProbe(
        free_disk_gb=lambda path: 0.5, cpu_flags=lambda: frozenset({"sse4_2", "avx2"})))
    _fake_launches(monkeypatch, STEADY)
    assert _run(tmp_path) == 2  # refused without --force
    assert "disk: 0.5 GB free" in capsys.readouterr().err
    assert _run(tmp_path, "--force") == 0
    folder = tmp_path / "runs" / "s"
    host = json.loads((folder / "best" / "identity.json").read_text())["host"]
    assert [line.split(":")[0] for line in host["preflight_mismatches"]] == ["disk"]
    assert [(c["lever"], c["value"], c["trial"]) for c in host["learned_constraints"]] == [
        ("kv-cache-dtype", "fp8", None)]
    section = (folder / "report.md").read_text().split("## The host: pre-flight and learned constraints")[1]
    section = section.split("\n## ")[0]
    assert "pre-flight mismatch (run with --force): disk: 0.5 GB free" in section
    assert "learned constraint: kv-cache-dtype=fp8 never launched (bad_flag, host probe)" in section
    assert "AVX-512" in section
    capsys.readouterr()
    assert main(["status", "s", "--runs-dir", str(tmp_path / "runs")]) == 0
    status = capsys.readouterr().out
    assert "pre-flight mismatch (run with --force): disk" in status and "kv-cache-dtype=fp8 never launched" in status


def _rejected_rows(report: str) -> dict[int, tuple[float, ...]]:
    """Rows of a report's confirmation table that were not accepted (trial, not a control) → repeats.

    The columns are found by their header (``trial``, ``control of``, ``repeats``, ``accepted``), so a column
    added to the table does not make every row unreadable (a table this test once read by position).
    """
    rows: dict[int, tuple[float, ...]] = {}
    header: list[str] | None = None
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if {"trial", "control of", "repeats", "accepted"} <= set(cells):
            header = cells
            continue
        if header is None or len(cells) != len(header):
            continue
        row = dict(zip(header, cells, strict=True))
        if row["trial"].isdigit() and row["control of"] == "" and row["accepted"] == "False":
            rows[int(row["trial"])] = tuple(float(v) for v in re.findall(r"[\d.]+", row["repeats"]))
    return rows


def _check_export_carries_its_rejected_confirmation(folder: Path) -> str:
    """A study folder (``report.md``, ``best/``) whose exported trial was rejected in confirmation carries that
    verdict and its repeats in every file. Returns ``"rejected"`` when it checked that, ``"none"`` when the
    exported trial has no rejected confirmation (nothing to carry); an assertion fails otherwise."""
    identity = json.loads((folder / "best" / "identity.json").read_text())
    report = (folder / "report.md").read_text() if (folder / "report.md").is_file() else ""
    rejected = _rejected_rows(report).get(int(identity["trial"]))
    if identity.get("confirmed") or rejected is None:
        assert identity.get("confirmation_status", "unconfirmed") != "rejected" or identity["confirmation"]
        return "none"
    assert identity["confirmation"] is not None, f"{folder.name}: the rejected confirmation {rejected} was dropped"
    assert tuple(round(v, 1) for v in identity["confirmation"]["values"]) == rejected
    serve = (folder / "best" / "serve.sh").read_text()
    assert "REJECTED in confirmation" in serve and "UNCONFIRMED (single screening run)" not in serve
    return "rejected"


@pytest.mark.parametrize("study", sorted(p.parent.parent.name
                                         for p in (REPO / "docs" / "evidence").glob("*/best/identity.json")))
def test_committed_exports_carry_their_rejected_confirmations(study: str) -> None:
    """The committed evidence itself: a rejected confirmation of the exported trial is in its files."""
    assert _check_export_carries_its_rejected_confirmation(REPO / "docs" / "evidence" / study) in {"rejected", "none"}


def test_the_committed_exports_check_reads_a_rejected_confirmation_and_fails_on_a_dropped_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above on a study whose winner was rejected (no committed study is one): it takes the rejected
    branch and passes; with the verdict dropped from identity.json, or the serve.sh relabelled as the old bug
    wrote it, it fails."""
    _fake_launches(monkeypatch, NOISY)
    assert _run(tmp_path, "--accept-unconfirmed") == 0
    study = tmp_path / "runs" / "s"
    assert _rejected_rows((study / "report.md").read_text()), "the report's confirmation table was not read"
    assert _check_export_carries_its_rejected_confirmation(study) == "rejected"
    identity_path = study / "best" / "identity.json"
    identity = json.loads(identity_path.read_text())
    identity_path.write_text(json.dumps({**identity, "confirmation": None}))
    with pytest.raises(AssertionError, match="was dropped"):
        _check_export_carries_its_rejected_confirmation(study)
    identity_path.write_text(json.dumps(identity))
    serve = study / "best" / "serve.sh"
    serve.write_text(serve.read_text().replace("REJECTED in confirmation", "UNCONFIRMED (single screening run)"))
    with pytest.raises(AssertionError):
        _check_export_carries_its_rejected_confirmation(study)
