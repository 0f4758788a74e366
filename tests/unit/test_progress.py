"""The progress line counts what it says: trials against --trials, controls apart, confirmation on its own.

A study runs with ``run_trial`` replaced (synthetic launches that report their phases as the real trial
does: ``launch``, ``load``, and ``load i/N`` for a confirmation's repeats); every line the CLI would
print is kept. The README's demo used to end on "trials 5/4": its speculative trial's control counted
toward ``--trials``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import tuner.study.step as step_mod
from tests.conftest import synthetic_outcome, synthetic_record
from tuner.search.space import ServeConfig
from tuner.study import Progress, Study
from tuner.trial import TrialContext, TrialOutcome

SPECULATIVE = {"max-num-seqs": 8, "max-num-batched-tokens": 2048, "block-size": 32, "kv-cache-dtype": "auto",
               "enable-prefix-caching": True, "enable-chunked-prefill": True, "speculative.draft_tokens": 2}


@pytest.fixture()
def phased_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *, should_stop: Any = None,
                  on_phase: Any = None, repeats: int = 1) -> TrialOutcome:
        phase = on_phase or (lambda _p: None)
        phase("launch")
        phase("load")
        for index in range(repeats if repeats > 1 else 0):
            phase(f"load {index + 1}/{repeats}")
        return synthetic_outcome(ctx, config, tdir, repeats)

    monkeypatch.setattr(step_mod, "run_trial", run_trial)


def test_the_line_counts_trials_against_trials_and_names_controls_and_confirmation(
        tmp_path: Path, phased_launches: None) -> None:
    record = synthetic_record(tmp_path, name="p", trials=4, top_k=2)
    study = Study.create(record, tmp_path / "runs")
    study.optuna_study().enqueue_trial(SPECULATIVE)  # a speculative trial first: its control launches too
    lines: list[str] = []
    study.run(on_progress=lambda p: lines.append(p.describe()))

    counted = [(int(a), int(b)) for a, b in re.findall(r"trials (\d+)/(\d+)", " ".join(lines))]
    assert counted and all(done <= planned == 4 for done, planned in counted), counted
    assert any(re.search(r"· control \d+ \(speculation off\) launch", line) for line in lines), lines
    assert any("(+1 control)" in line for line in lines)
    screening = [line for line in lines if line.startswith("screening:")]
    assert screening and any("per launch, measured" in line for line in screening)  # ETA once one ran
    confirming = [line for line in lines if line.startswith("confirmation ")]
    assert confirming, lines
    assert any(re.match(r"confirmation 1/\d+: trial \d+ · repeat 2/2", line) for line in confirming), confirming
    assert lines[-1].startswith("done: trials 4/4 (+1 control)"), lines[-1]


def test_eta_is_the_median_measured_launch_times_the_trials_left() -> None:
    progress = Progress(study="s", target=10, launched=4)
    assert progress.eta_s is None  # nothing measured yet: no guess
    progress.launch_s.extend([60.0, 180.0, 120.0, 600.0])
    assert progress.eta_s == pytest.approx(6 * 150.0)
    assert "ETA 15 min (2.5 min per launch, measured)" in progress.describe()
    progress.controls = 2
    assert progress.counts() == "trials 4/10 (+2 controls)"


def test_a_confirmation_with_no_time_left_says_so_instead_of_a_stale_trial() -> None:
    progress = Progress(study="s", launched=1, stage="confirmation", confirm_planned=0, current="trial 0",
                        phase="load")
    assert progress.describe().startswith("confirmation: 0 launch(es) planned")
    assert "trial 0" not in progress.describe()


# -- the printed lines: fitted to a terminal, whole when piped ----------------------------------------------
def _printed(tmp_path: Path, *, terminal: bool, width: int, name: str = "a-study-with-a-long-name") -> list[str]:
    """What the CLI's printer writes for a study with a speculative trial and a confirmation."""
    import io

    from rich.console import Console

    from tuner.cli.progress_view import progress_printer

    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=width, color_system=None, highlight=False)
    record = synthetic_record(tmp_path, name=name, trials=4, top_k=2)
    study = Study.create(record, tmp_path / "runs")
    study.optuna_study().enqueue_trial(SPECULATIVE)
    study.run(on_progress=progress_printer(console, 0.0, study.clock))
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text  # nothing redrawn in place, no cursor movement
    return text.splitlines()


def test_on_an_80_column_terminal_every_line_fits_and_none_wraps(tmp_path: Path, phased_launches: None) -> None:
    lines = _printed(tmp_path, terminal=True, width=80, name="demo")
    assert lines and all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    # every line is a whole event: a progress line (the study's name first) or an outcome (indented)
    assert all(line.startswith(("demo ", "  ")) for line in lines), lines
    progress = [line for line in lines if line.startswith("demo ")]
    assert any("screening: trials" in line for line in progress) and "done: trials 4/4" in progress[-1]
    # where the line is too long, the elapsed time goes before the best so far does
    assert any("best" in line and "elapsed" not in line for line in progress), progress
    (tmp_path / "narrow").mkdir()
    narrow = _printed(tmp_path / "narrow", terminal=True, width=40, name="demo")
    assert all(len(line) <= 40 for line in narrow) and any(line.endswith("…") for line in narrow), narrow


def test_piped_every_event_is_one_whole_line(tmp_path: Path, phased_launches: None) -> None:
    lines = _printed(tmp_path, terminal=False, width=80)
    assert all(line.startswith(("a-study-with-a-long-name ", "  ")) for line in lines), lines
    progress = [line for line in lines if line.startswith("a-study")]
    assert all(line.endswith("elapsed") for line in progress), progress  # nothing cut, nothing wrapped
    assert any(len(line) > 80 for line in progress)  # longer than the 80 columns a pipe is given, and whole
    assert any("per launch, measured" in line for line in progress)


def test_fit_line_drops_the_least_important_parts_first_then_cuts() -> None:
    from tuner.study.progress import fit_line

    parts = [("screening: trials 1/4", 0), ("best 10.0 (trial 0)", 1), ("ETA 3 min", 3), ("2.0 min elapsed", 4)]
    assert fit_line(parts) == "screening: trials 1/4 · best 10.0 (trial 0) · ETA 3 min · 2.0 min elapsed"
    assert fit_line(parts, 60) == "screening: trials 1/4 · best 10.0 (trial 0) · ETA 3 min"
    assert fit_line(parts, 45) == "screening: trials 1/4 · best 10.0 (trial 0)"
    assert fit_line(parts, 30) == "screening: trials 1/4"
    assert fit_line(parts, 10) == "screening…" and len(fit_line(parts, 10)) == 10


def test_the_command_line_piped_writes_one_line_per_event(tmp_path: Path, phased_launches: None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``dsv4-tune run … > file``: the progress lines and the closing ones (report, winner) are whole lines."""

    from tests.conftest import stand_in_checkpoint
    from tuner.cli.main import main

    model = stand_in_checkpoint(tmp_path / "model")
    runs = tmp_path / "a-runs-folder-with-a-name-long-enough-to-pass-eighty-columns"
    assert main(["run", "--hw", "cpu", "--objective", "throughput", "--trials", "2", "--study", "piped",
                 "--model", str(model), "--prevalidate", "off", "--guards", "none", "--confirm-top-k", "1",
                 "--no-export", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    starts = ("piped ", "  ", "study ", "report: ", "winner: ")
    assert all(line.startswith(starts) for line in lines), lines
    winner = next(line for line in lines if line.startswith("winner: "))
    assert "robust score" in winner and len(winner) > 80  # the whole sentence on its one line
    assert any(line.startswith("report: ") and line.endswith("report.md") for line in lines), lines
