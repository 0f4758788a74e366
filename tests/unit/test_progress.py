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
