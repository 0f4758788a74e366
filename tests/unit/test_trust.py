"""The guide notices when the model is wrong (issue 24): residuals against the stated uncertainty, the launch
where it stops trusting the model, and the measurement-led search that takes over."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.objective import Objective, Workload
from tuner.predict import Guide, Predictor, predictor_for
from tuner.predict.explore import failure_rate
from tuner.predict.trust import Residual, Trust
from tuner.search import bind_checkpoint, load_checkpoint, load_profile

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
    assert choice is not None and choice.led_by == "measurements"
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
