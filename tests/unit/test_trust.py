"""The guide notices when the model is wrong (issue 24): residuals against the stated uncertainty, the launch
where it stops trusting the model, and the measurement-led search that takes over."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.objective import Objective, Workload
from tuner.predict import Guide, Predictor, predictor_for
from tuner.predict.explore import (
    AMPLITUDE_FLOOR,
    BUDGET_PARAM,
    ResidualGP,
    cell_of,
    failure_rate,
    speculative_twins,
    twin_budget,
)
from tuner.predict.trust import Residual, Trust
from tuner.search import bind_checkpoint, load_checkpoint, load_profile
from tuner.search.profile import DRAFT_TOKENS_PARAM

OBJECTIVE = Objective.model_validate({
    "name": "t", "metric": "output_throughput", "slos": {"p95_ttft_ms": 120000, "p95_itl_ms": 1000},
    "workload": Workload(input_len=1024, output_len=1024, num_prompts=64, concurrency=2048).model_dump(),
    "ladder": {"steps": [1024, 2048, 3072], "prompts_per_concurrency": 2}})


def _residual(launch: int, ratio: float, sd: float = 0.1, surprise: bool = False) -> Residual:
    return Residual(launch=launch, point=launch, predicted=1000.0, sd=sd,
                    measured=None if surprise else 1000.0 * math.exp(ratio), surprise=surprise)


def test_a_model_within_its_stated_uncertainty_stays_trusted() -> None:
    trust = Trust()
    for i, ratio in enumerate([0.1, -0.12, 0.08, -0.15, 0.05, 0.11], start=1):
        trust.add(_residual(i, ratio))
    assert trust.trusted and trust.distrust_at is None
    rms = trust.rms_z()
    assert rms is not None and rms < 1.5


def test_residuals_beyond_twice_the_stated_sd_end_the_trust_at_that_launch() -> None:
    trust = Trust()
    trust.add(_residual(1, 0.05))
    trust.add(_residual(2, -0.35))  # 3.5 sd
    assert not trust.trusted and trust.distrust_at == 2
    assert "stated sd" in trust.why
    trust.add(_residual(3, 0.0))  # once distrusted, for the rest of the study
    assert trust.distrust_at == 2


def test_launches_expected_to_run_that_fail_end_the_trust_too() -> None:
    trust = Trust()
    trust.add(_residual(1, 0.0))
    trust.add(_residual(2, 0.0, surprise=True))
    assert trust.trusted
    trust.add(_residual(3, 0.0, surprise=True))
    assert trust.distrust_at == 3 and "expected to run" in trust.why


def test_one_residual_is_not_enough_to_judge() -> None:
    trust = Trust()
    trust.add(_residual(1, -1.0))
    assert trust.trusted


@pytest.fixture(scope="module")
def predictor() -> Predictor:
    profile = bind_checkpoint(load_profile("gh200x4"), load_checkpoint("0731"))
    return predictor_for(profile, load_checkpoint("0731"), OBJECTIVE)


def _observe(guide: Guide, point: int, value: float) -> None:
    guide.observe(point, concurrency=2048, figures={"output_tok_s": value, "ttft_p95_ms": 5e4, "itl_p95_ms": 100.0},
                  value=value, feasible=True)


def test_a_node_slower_than_the_model_says_hands_the_search_to_the_measurements(predictor: Predictor) -> None:
    guide = Guide(predictor, seed=0)
    top = [r.point for r in predictor.ranking(top=40)]
    # the model's favourites measure at a third of their prediction, one a quarter: far beyond its stated sd
    for point, share in zip(top[:3], (0.33, 0.25, 0.33), strict=True):
        predicted = predictor.prior_value(point)
        assert predicted is not None
        _observe(guide, point, predicted * share)
    assert not guide.trust.trusted and guide.trust.distrust_at is not None
    assert all(r.sd > 0 for r in guide.trust.residuals)
    choice = guide.next_point()
    assert choice is not None and choice.led_by in ("spread", "measurements")
    assert choice.point not in top[:3]


def test_a_trusted_model_keeps_leading(predictor: Predictor) -> None:
    guide = Guide(predictor, seed=0)
    for point in [r.point for r in predictor.ranking(top=3)]:
        stated, _sd, _ok = guide.predictive(point)
        _observe(guide, point, stated)  # exactly what it said
    assert guide.trust.trusted
    choice = guide.next_point()
    assert choice is not None and choice.led_by == "model"


def test_the_measured_failure_rate_follows_the_launches_that_failed(predictor: Predictor) -> None:
    codes = predictor.codes
    failed, ran = 0, int(np.flatnonzero((codes != codes[0]).sum(axis=1) >= 5)[0])
    near_failed = int(np.flatnonzero((codes != codes[failed]).sum(axis=1) == 1)[0])
    near_ran = int(np.flatnonzero((codes != codes[ran]).sum(axis=1) == 1)[0])
    rate = failure_rate(codes, [(failed, True), (ran, False)], np.array([near_failed, near_ran]))
    assert rate[0] > 0.5 > rate[1]
    assert failure_rate(codes, [], np.array([0])).tolist() == [0.0]


def _distrusted(predictor: Predictor, shares: tuple[float, ...] = (1 / 3, 1 / 3, 1 / 3),
                **kwargs: object) -> tuple[Guide, list[int]]:
    """A guide that measured the model's favourites at ``shares`` of their prediction (it distrusts the model)."""
    guide = Guide(predictor, seed=0, **kwargs)  # type: ignore[arg-type]
    top = [r.point for r in predictor.ranking(top=len(shares))]
    for point, share in zip(top, shares, strict=True):
        _observe(guide, point, (predictor.prior_value(point) or 0.0) * share)
    assert not guide.trust.trusted
    return guide, top


def test_the_second_spread_measures_each_cell_the_model_has_no_launch_for_then_hands_over(
        predictor: Predictor) -> None:
    guide, _top = _distrusted(predictor)
    params = predictor.table.params
    spread: list[int] = []
    for _ in range(12):
        choice = guide.next_point()
        assert choice is not None
        if choice.led_by != "spread":
            break
        before = guide.launched_points
        tried = {cell_of(params[p]) for p in before}
        topology, speculates = cell_of(params[choice.point])
        if speculates:  # the speculative twin of a launch that ran, at the token budget its drafts need there
            assert (topology, True) not in tried
            seats = guide.seats()
            assert any(choice.point in speculative_twins(predictor.table, p, seats.get(p)) for p in before)
        else:  # a topology never launched
            assert all(where != topology for where, _ in tried)
        spread.append(choice.point)
        _observe(guide, choice.point, (predictor.prior_value(choice.point) or 1000.0) / 3)
    else:
        pytest.fail("the second spread never handed over to the GP")
    assert choice.led_by == "measurements"
    assert spread  # the favourites' topology speculates at least
    assert len({cell_of(params[p]) for p in spread}) == len(spread)  # one launch per cell
    # a node uniformly slower than the model (every launch at a third) makes no unlaunched topology likelier
    assert all(cell_of(params[p])[1] for p in spread)


def test_without_the_second_spread_the_gp_leads_at_once(predictor: Predictor) -> None:
    guide, _top = _distrusted(predictor, second_spread=False)
    choice = guide.next_point()
    assert choice is not None and choice.led_by == "measurements"


def test_one_launch_moves_the_gp_for_its_whole_cell() -> None:
    """The GP's cell term: a residual measured at one configuration lifts the configurations of its cell that
    differ from it in many levers, and not those of another cell as far away."""
    codes = np.array([[0, 0, 0, 0, 0, 0],   # the launch, cell 0
                      [0, 1, 1, 1, 1, 0],   # same cell, four levers away
                      [1, 0, 1, 1, 1, 0]])  # another cell (its first lever), as far
    cells = np.array([0, 0, 1])
    gp = ResidualGP(codes, cells, np.ones(6), amp2=AMPLITUDE_FLOOR ** 2, noise2=0.05 ** 2)
    mean, sd = gp.posterior(np.array([0]), np.array([0.7]), np.array([1, 2]))
    assert mean[0] > 0.4 > 0.1 > mean[1]  # the cell moves with its launch; the other cell hardly
    assert sd[0] < sd[1]
    alone = ResidualGP(codes, np.array([0, 1, 2]), np.ones(6), amp2=AMPLITUDE_FLOOR ** 2, noise2=0.05 ** 2)
    assert alone.posterior(np.array([0]), np.array([0.7]), np.array([1]))[0][0] < 0.1  # without it, nothing


def test_a_launch_that_missed_its_slos_teaches_the_measured_failure_rate(predictor: Predictor) -> None:
    """A launch that missed an SLO at every step is worth nothing under the objective: its neighbours are less
    likely to be worth a launch. A point refused before launch or an interrupted launch teaches nothing."""
    guide, top = _distrusted(predictor)
    codes = predictor.codes
    missed = int(np.flatnonzero((codes != codes[top[0]]).sum(axis=1) >= 5)[0])
    refused, interrupted = (int(p) for p in np.flatnonzero((codes != codes[missed]).sum(axis=1) >= 6)[:2])
    guide.observe(missed, concurrency=2048, figures={"output_tok_s": 900.0, "ttft_p95_ms": 9e5, "itl_p95_ms": 100.0},
                  value=None, feasible=False, failure_class="slo_violated")
    guide.observe(refused, concurrency=None, figures=None, value=None, feasible=False, failure_class="infeasible")
    guide.observe(interrupted, concurrency=None, figures=None, value=None, feasible=False,
                  failure_class="interrupted")
    outcomes = guide.outcomes()
    assert (missed, True) in outcomes and all(p not in (refused, interrupted) for p, _ in outcomes)
    assert sum(failed for _, failed in outcomes) == 1  # the three measured launches gave values
    near_missed = int(np.flatnonzero((codes != codes[missed]).sum(axis=1) == 1)[0])
    near_ran = int(np.flatnonzero((codes != codes[top[0]]).sum(axis=1) == 1)[0])
    rate = failure_rate(codes, outcomes, np.array([near_missed, near_ran]))
    assert rate[0] > rate[1]


def _plain(predictor: Predictor, **values: object) -> int:
    """The first launchable point without drafts whose levers hold ``values``."""
    table = predictor.table
    for i, params in enumerate(table.params):
        if (not table.prunable[i] and not params.get(DRAFT_TOKENS_PARAM)
                and all(params.get(k.replace("_", "-")) == v for k, v in values.items())):
            return i
    raise AssertionError(f"no launchable point without drafts has {values}")


def test_a_speculative_twin_takes_the_token_budget_its_drafts_need(predictor: Predictor) -> None:
    """vLLM charges each running request its drafts from the token budget: at 1024 running requests a rank, a
    1024/1024 workload and 3 drafts a twin needs 1024 × (1 + 3 + 1) = 5,120 tokens a step, so a control at 4,096
    has a twin at 8,192; at 256 requests a rank (1,280 tokens) the control's own budget holds it."""
    table = predictor.table
    point = _plain(predictor, max_num_seqs=1024, max_num_batched_tokens=4096)
    assert twin_budget(table, point, 3, 1024.0) == 8192
    assert twin_budget(table, point, 3, 256.0) == 4096
    assert twin_budget(table, point, 3, 1e6) == 16384  # none holds it: the largest offered
    held = speculative_twins(table, point, 1024.0)
    own = speculative_twins(table, point)
    assert held and own and set(held).isdisjoint(own)
    assert all(table.params[q][BUDGET_PARAM] > 4096 for q in held)
    assert all(table.params[q][BUDGET_PARAM] == 4096 for q in own)
    for q in held:  # the twin is the launch with drafts and that budget, nothing else changed
        differ = {k for k, v in table.params[q].items() if table.params[point].get(k) != v}
        assert differ <= {DRAFT_TOKENS_PARAM, BUDGET_PARAM}


def test_the_guide_reads_the_running_requests_a_rank_from_each_launch(predictor: Predictor) -> None:
    guide = Guide(predictor, seed=0)
    point = _plain(predictor, max_num_seqs=1024)
    row = int(predictor.table.phys_of[point])
    dp = float(predictor.table.physics.dp[row])
    _observe(guide, point, 1000.0)  # at concurrency 2048
    assert guide.seats()[point] == pytest.approx(min(1024.0, 2048.0 / dp))
    failed = _plain(predictor, max_num_seqs=512)
    guide.observe(failed, concurrency=None, figures=None, value=None, feasible=False, failure_class="oom")
    assert failed not in guide.seats()  # a launch without figures measured no running requests
