"""Confirmation statistics, goodput, the Pareto front and the report's HTML."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tuner.load.generator import LoadResult, RequestRecord
from tuner.load.goodput import request_goodput
from tuner.report import markdown_to_html, pareto_front
from tuner.study.confirm import ConfirmSpec, Winner, judge, mad, pick_winner, robust_score


def test_mad_and_robust_score() -> None:
    assert mad([10.0, 12.0, 11.0, 30.0]) == pytest.approx(1.0)
    assert robust_score([10.0, 12.0, 11.0], k=1.0, maximize=True) == pytest.approx(10.0)
    assert robust_score([10.0, 12.0, 11.0], k=2.0, maximize=False) == pytest.approx(13.0)
    assert math.isnan(mad([]))


def test_judge_accepts_agreeing_repeats_and_rejects_spread() -> None:
    spec = ConfirmSpec(max_spread=0.2, mad_k=1.0)
    ok = judge(3, "k", [100.0, 104.0, 98.0], all_feasible=True, spec=spec, maximize=True, trial_dir="t",
               speculative=False)
    assert ok.accepted and ok.median == 100.0 and ok.robust == pytest.approx(98.0)
    noisy = judge(4, "k", [60.0, 100.0, 130.0], all_feasible=True, spec=spec, maximize=True, trial_dir="t",
                  speculative=False)
    assert not noisy.accepted and "disagree" in noisy.reason
    missed = judge(5, "k", [100.0, 101.0], all_feasible=False, spec=spec, maximize=True, trial_dir="t",
                   speculative=False)
    assert not missed.accepted and "SLO" in missed.reason
    crashed = judge(6, "k", [], all_feasible=False, spec=spec, maximize=True, trial_dir="t", speculative=False,
                    failure="oom: killed")
    assert not crashed.accepted and crashed.reason == "oom: killed"


def test_winner_is_best_robust_not_best_median() -> None:
    spec = ConfirmSpec(max_spread=1.0, mad_k=2.0)
    steady = judge(1, "a", [100.0, 101.0, 99.0], all_feasible=True, spec=spec, maximize=True, trial_dir="a",
                   speculative=False)
    lucky = judge(2, "b", [80.0, 104.0, 130.0], all_feasible=True, spec=spec, maximize=True, trial_dir="b",
                  speculative=True)
    assert lucky.median > steady.median
    winner = pick_winner([steady, lucky], maximize=True)
    assert winner is not None and winner.trial == 1
    assert pick_winner([], maximize=True) is None


def test_a_speculative_winner_says_when_its_controls_confirmation_did_not_run() -> None:
    # the one-H100 study: the winner (ngram, 3 drafts) was confirmed, its control's launch was cut
    spec = ConfirmSpec(max_spread=0.25, mad_k=1.0)
    won = judge(2, "spec", [11662.7, 11451.2], all_feasible=True, spec=spec, maximize=True, trial_dir="t",
                speculative=True)
    cut = Winner(trial=2, trial_dir=Path("t"), value=won.median, confirmed=True, confirmation=won,
                 all_confirmations=(won,))
    assert cut.control_status == "not run" and "control's confirmation did not run" in cut.describe("tok/s")
    control = judge(2, "plain", [9700.0, 9600.0], all_feasible=True, spec=spec, maximize=True, trial_dir="c",
                    speculative=False, control_of=2)
    both = Winner(trial=2, trial_dir=Path("t"), value=won.median, confirmed=True, confirmation=won,
                  all_confirmations=(won, control))
    assert both.control_status == "confirmed" and "control" not in both.describe("tok/s")
    plain = judge(0, "plain", [9700.0, 9600.0], all_feasible=True, spec=spec, maximize=True, trial_dir="c",
                  speculative=False)
    assert Winner(trial=0, trial_dir=Path("c"), value=plain.median, confirmed=True, confirmation=plain,
                  all_confirmations=(plain,)).control_status is None


def _rec(ttft_s: float, e2e_s: float, tokens: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(ok=ok, error="" if ok else "boom", prompt_tokens=8, output_tokens=tokens, start_s=0.0,
                         ttft_s=ttft_s if ok else None, itl_s=(), e2e_s=e2e_s)


def test_goodput_counts_requests_meeting_every_limit() -> None:
    records = (_rec(0.1, 1.1, 11),   # tpot 100 ms: good
               _rec(0.1, 2.1, 11),   # tpot 200 ms: too slow
               _rec(0.9, 1.0, 2),    # ttft 900 ms: too slow
               _rec(0.1, 0.2, 2, ok=False))
    result = LoadResult(records=records, duration_s=2.0, concurrency=4, request_rate=None)
    assert request_goodput(result, {"ttft_ms": 500, "tpot_ms": 150}) == pytest.approx(0.5)
    assert request_goodput(result, {}) == pytest.approx(1.5)


def test_pareto_front_max_throughput_min_latency() -> None:
    points = [(100.0, 50.0), (120.0, 60.0), (90.0, 70.0), (120.0, 55.0), (80.0, 20.0)]
    assert sorted(pareto_front(points)) == [0, 3, 4]


def test_markdown_to_html_escapes_and_tabulates() -> None:
    page = markdown_to_html("# T <x>\n\n| a | b |\n|---|---|\n| 1 | `<b>` |\n\n![plot](p.png)\n", "t")
    assert "<h1>T &lt;x&gt;</h1>" in page
    assert "<th>a</th>" in page and "<td>&lt;b&gt;</td>" in page
    assert "src='p.png'" in page


def test_a_challenger_displaces_the_confirmed_recipe_only_beyond_its_spread() -> None:
    spec = ConfirmSpec()
    recipe = judge(0, "r", [100.0, 96.0, 103.0], all_feasible=True, spec=spec, maximize=True, trial_dir="r",
                   speculative=False)  # median 100, MAD 3: its spread reaches 103
    close = judge(7, "c", [104.0, 103.0, 105.0], all_feasible=True, spec=spec, maximize=True, trial_dir="c",
                  speculative=False)  # robust 103: inside the recipe's spread
    clear = judge(8, "d", [110.0, 109.0, 111.0], all_feasible=True, spec=spec, maximize=True, trial_dir="d",
                  speculative=False)  # robust 109: beyond it
    assert pick_winner([recipe, close], maximize=True).trial == 7  # type: ignore[union-attr]  # no incumbent named
    assert pick_winner([recipe, close], maximize=True, incumbent=0).trial == 0  # type: ignore[union-attr]
    assert pick_winner([recipe, close, clear], maximize=True, incumbent=0).trial == 8  # type: ignore[union-attr]
    rejected = judge(0, "r", [100.0, 60.0, 103.0], all_feasible=True, spec=spec, maximize=True, trial_dir="r",
                     speculative=False)  # its repeats disagree: no longer a bar to clear
    assert pick_winner([rejected, close], maximize=True, incumbent=0).trial == 7  # type: ignore[union-attr]
    # minimizing (a latency objective): the recipe's spread reaches down to its median − MAD, 97
    low = judge(0, "r", [100.0, 96.0, 103.0], all_feasible=True, spec=spec, maximize=False, trial_dir="r",
                speculative=False)
    lower = judge(7, "c", [95.0, 94.0, 96.0], all_feasible=True, spec=spec, maximize=False, trial_dir="c",
                  speculative=False)  # robust (median + MAD) 96: below 97
    near = judge(9, "n", [97.0, 96.0, 98.0], all_feasible=True, spec=spec, maximize=False, trial_dir="n",
                 speculative=False)  # robust 98: inside the recipe's spread
    assert pick_winner([low, lower], maximize=False, incumbent=0).trial == 7  # type: ignore[union-attr]
    assert pick_winner([low, near], maximize=False, incumbent=0).trial == 0  # type: ignore[union-attr]


def test_the_better_of_two_confirmed_recipes_holds() -> None:
    """Two recipes that screened close are both confirmed; the one with the better median is the bar."""
    spec = ConfirmSpec()
    screened_first = judge(0, "a", [100.0, 98.0, 102.0], all_feasible=True, spec=spec, maximize=True,
                           trial_dir="a", speculative=False)
    screened_second = judge(1, "b", [110.0, 107.0, 113.0], all_feasible=True, spec=spec, maximize=True,
                            trial_dir="b", speculative=False)  # median 110, MAD 3: robust 107
    challenger = judge(7, "c", [109.0, 108.0, 110.0], all_feasible=True, spec=spec, maximize=True, trial_dir="c",
                       speculative=False)  # robust 108: the best robust score, beyond the first recipe's spread
    both = [screened_first, screened_second, challenger]
    assert pick_winner(both, maximize=True, incumbent=0).trial == 7  # type: ignore[union-attr]
    # with both recipes confirmed, the better median (110) is the bar, and 108 is inside its spread (to 113)
    assert pick_winner(both, maximize=True, incumbent=[0, 1]).trial == 1  # type: ignore[union-attr]
    assert pick_winner([screened_first, challenger], maximize=True,
                       incumbent=[0, 1]).trial == 7  # type: ignore[union-attr]  # the second was not confirmed


def test_a_recipe_that_screened_close_to_the_best_recipe_is_confirmed_beside_it(tmp_path: Path) -> None:
    import optuna
    from optuna.distributions import FloatDistribution

    from tuner.objective import Objective
    from tuner.search import load_profile
    from tuner.study.confirm import INCUMBENT_BAND, ConfirmationPhase

    study = optuna.create_study(direction="maximize")
    spec = ConfirmSpec()
    lead = 100.0
    close = lead * (1.0 - 0.9 * INCUMBENT_BAND * spec.noise)  # within the band: confirmed too
    far = lead * (1.0 - 1.1 * INCUMBENT_BAND * spec.noise)
    for name, value in (("far", far), ("lead", lead), ("close", close), ("challenger", 120.0)):
        attrs: dict[str, object] = {"feasible": True}
        if name != "challenger":
            attrs["baseline"] = name
        study.add_trial(optuna.trial.create_trial(value=value, params={"x": 0.0},
                                                  distributions={"x": FloatDistribution(0.0, 1.0)},
                                                  user_attrs=attrs))
    objective = Objective.model_validate({"name": "t", "metric": "output_throughput", "slos": {},
                                          "workload": {"input_len": 8, "output_len": 8, "num_prompts": 4}})
    phase = ConfirmationPhase(tmp_path, spec, objective, load_profile("cpu"))
    assert phase.incumbents(study) == [1, 2]
    off = ConfirmationPhase(tmp_path, ConfirmSpec(incumbent=False), objective, load_profile("cpu"))
    assert off.incumbents(study) == []
