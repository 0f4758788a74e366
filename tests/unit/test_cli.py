"""tuner/cli.py main([...]) in-process: durations, argument errors, exit codes, messages."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from tuner import catalog
from tuner.cli import main
from tuner.cli.args import parse_duration, parse_slos
from tuner.errors import UsageError


def _printed(capsys: pytest.CaptureFixture[str]) -> str:
    """Everything the CLI printed: results on stdout, errors on stderr."""
    captured = capsys.readouterr()
    return captured.out + captured.err



@pytest.mark.parametrize(("text", "seconds"), [("8h", 28800.0), ("90m", 5400.0), ("1h30m", 5400.0),
                                               ("45s", 45.0), ("600", 600.0), ("1.5h", 5400.0),
                                               ("2m30s", 150.0), (" 10m ", 600.0)])

def test_parse_duration_ok(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "", "abc", "-5m", "0h0m", "   ", "5 m", "m", "h30", "1d"])
def test_parse_duration_rejected(text: str) -> None:
    with pytest.raises(UsageError, match="--budget"):
        parse_duration(text)


def test_parse_slos() -> None:
    assert parse_slos(["p95_ttft_ms=2000", " p99_itl_ms = 50.5"]) == {"p95_ttft_ms": 2000.0, "p99_itl_ms": 50.5}
    with pytest.raises(UsageError, match="KEY=MILLISECONDS"):
        parse_slos(["p95_ttft_ms"])
    with pytest.raises(UsageError):
        parse_slos(["p95_ttft_ms=fast"])


@pytest.mark.parametrize("trials", ["0", "-1", "two"])
def test_non_positive_trials_is_argparse_error(trials: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--hw", "cpu", "--trials", trials])
    assert info.value.code == 2
    assert "--trials" in capsys.readouterr().err


def test_trials_zero_through_default_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--hw", "cpu", "--trials", "0"])
    assert info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_unknown_hw_returns_2_and_lists_known(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["run", "--hw", "nope", "--trials", "1", "--runs-dir", str(tmp_path)])
    out = _printed(capsys)
    assert code == 2
    assert "'nope'" in out
    for name in catalog.known_names("search_spaces"):
        assert name in out
    assert not any(tmp_path.iterdir())  # nothing created


def test_default_command_is_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    explicit = main(["run", "--hw", "nope", "--runs-dir", str(tmp_path)])
    explicit_out = _printed(capsys)
    implicit = main(["--hw", "nope", "--runs-dir", str(tmp_path)])
    implicit_out = _printed(capsys)
    verbose = main(["-v", "--hw", "nope", "--runs-dir", str(tmp_path)])
    verbose_out = _printed(capsys)
    assert explicit == implicit == verbose == 2
    assert "unknown hardware profile 'nope'" in explicit_out
    assert explicit_out == implicit_out == verbose_out


def test_no_arguments_prints_help_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: dsv4-tune" in _printed(capsys)


def test_list_prints_profiles_and_objectives(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["list", "--runs-dir", str(tmp_path)]) == 0
    out = _printed(capsys)
    assert re.search(r"\bcpu\b", out)
    assert re.search(r"\bthroughput\b", out)
    assert "invalid" not in out  # every shipped catalog entry loads
    assert "(none)" in out


def test_resume_missing_study(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["resume", "nosuch", "--runs-dir", str(tmp_path)]) == 1
    out = _printed(capsys)
    assert "no study 'nosuch'" in out


def test_resume_missing_study_hint_is_a_working_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    main(["resume", "nosuch", "--runs-dir", str(tmp_path)])
    out = " ".join(_printed(capsys).split())  # undo rich's line wrapping
    hint = re.search(r"`dsv4-tune ([^`]+)`", out)
    assert hint is not None
    assert main(shlex.split(hint.group(1))) == 0


def test_missing_vllm_program_returns_2_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["--hw", "cpu", "--trials", "1", "--vllm-cmd", "/no/such/vllm", "--runs-dir", str(tmp_path)])
    out = _printed(capsys)
    assert code == 2
    assert "/no/such/vllm" in out
    assert not (tmp_path / "_models").exists()  # failed before building the demo model


def test_missing_model_path_returns_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["--hw", "cpu", "--trials", "1", "--model", "./missing", "--engine-cmd", sys.executable,
                 "--runs-dir", str(tmp_path / "runs")])
    out = _printed(capsys)
    assert code == 2
    assert "'./missing'" in out and "no such file or directory" in out
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host as the pre-flight check sees it: no GPU tools, no checkpoint in the local cache (injected,
    so a developer's GPU machine or hub cache gives the same verdict)."""
    import tuner.search.preflight as preflight

    monkeypatch.setattr(preflight, "ACTIVE_PROBE", preflight.HostProbe(
        nvidia_devices=lambda: None, amd_devices=lambda: None, hf_snapshot=lambda repo, rev: None))


def test_the_designs_command_on_a_cpu_host_stops_before_any_launch(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, cpu_host: None) -> None:
    """``dsv4-tune --hw gh200x4 --objective throughput`` as written: one line per mismatch, each with its fix."""
    code = main(["--hw", "gh200x4", "--objective", "throughput", "--runs-dir", str(tmp_path / "runs")])
    out = _printed(capsys)
    assert code == 2
    assert "nothing was launched" in out
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith(("accelerator:", "checkpoint:"))]
    assert len(lines) == 2, out
    assert lines[0].startswith("accelerator: no NVIDIA GPU found") and "4x" in lines[0] and "Fix:" in lines[0]
    assert lines[1].startswith("checkpoint:") and "not available offline" in lines[1] and "Fix:" in lines[1]
    assert "dsv4-tune doctor --hw gh200x4" in out
    assert not (tmp_path / "runs").exists()


def test_doctor_names_the_same_mismatches_and_passes_the_cpu_profile(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, cpu_host: None) -> None:
    from tests.conftest import stand_in_checkpoint

    assert main(["doctor", "--hw", "gh200x4", "--runs-dir", str(tmp_path)]) == 1
    out = _printed(capsys)
    assert "no NVIDIA GPU found" in out and "not available offline" in out
    model = stand_in_checkpoint(tmp_path / "model")
    assert main(["doctor", "--hw", "cpu", "--model", str(model), "--runs-dir", str(tmp_path)]) == 0, _printed(capsys)
    assert "can serve cpu" in _printed(capsys)


def test_no_stop_condition_runs_the_profiles_night_and_says_so_first(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither --trials nor --budget: the budget is the profile's night, said before anything else runs."""
    from tests.conftest import stand_in_checkpoint
    main_mod = sys.modules["tuner.cli.main"]  # the package's `main` name is the function

    seen: dict[str, object] = {}

    def no_night(study: object, args: object) -> int:  # the night itself is the e2e tests'; stop at its start
        seen["budget_s"] = study.record.budget_s  # type: ignore[attr-defined]
        return 0

    monkeypatch.setattr(main_mod, "_run_study", no_night)
    model = stand_in_checkpoint(tmp_path / "model")
    assert main(["--hw", "cpu", "--model", str(model), "--runs-dir", str(tmp_path / "runs")]) == 0
    first = _printed(capsys).splitlines()[0]
    assert first.startswith("budget: the profile's night, 8 h") and "Ctrl-C" in first and "dsv4-tune resume" in first
    assert seen["budget_s"] == 8 * 3600.0


def test_bad_budget_returns_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["--hw", "cpu", "--budget", "soon", "--runs-dir", str(tmp_path)])
    assert code == 2
    assert "--budget 'soon'" in _printed(capsys)


def test_slo_override_without_unit_returns_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    code = main(["--hw", "cpu", "--trials", "1", "--slo", "ttft=5", "--model", str(tmp_path),
                 "--engine-cmd", "false", "--study", "s", "--runs-dir", str(runs), "--no-export"])
    assert code == 2
    assert "ttft" in _printed(capsys)
    assert not (runs / "s" / "study.json").exists()


def test_plan_names_what_a_probe_of_this_host_rules_out(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.search.preflight as preflight

    monkeypatch.setattr(preflight, "ACTIVE_PROBE", preflight.HostProbe(cpu_flags=lambda: frozenset({"avx2"})))
    assert main(["plan", "--hw", "cpu"]) == 0
    assert "Ruled out on this host before any launch: kv-cache-dtype=fp8 never launched" in _printed(capsys)
    monkeypatch.setattr(preflight, "ACTIVE_PROBE", preflight.HostProbe(cpu_flags=lambda: frozenset({"avx512f"})))
    assert main(["plan", "--hw", "cpu"]) == 0
    assert "Ruled out on this host" not in _printed(capsys)
