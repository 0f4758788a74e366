"""A window long enough to rank on, and a winner that beats its runner-up by more than the noise (issue 31)."""

from __future__ import annotations

import pytest

from tuner.load.generator import LoadResult
from tuner.load.ladder import Step, _choose, window_long_enough
from tuner.objective import LadderSpec, Objective, load_objective
from tuner.study.confirm import Confirmation, ConfirmSpec, measured_noise, within_noise


def _step(concurrency: int, throughput: float, duration: float) -> Step:
    return Step(concurrency=concurrency, summary={"output_throughput": throughput, "duration": duration},
                server={}, result=LoadResult((), duration, concurrency, None))


def _objective(min_window_s: float) -> Objective:
    return Objective(name="t", metric="output_throughput",
                     ladder=LadderSpec(steps=(64, 1024), min_window_s=min_window_s))


def test_a_short_window_does_not_win_over_a_long_one() -> None:
    """The H200's case: 6,384 tok/s from 0.64 s beat 6,317 from 10.4 s."""
    steps = [_step(64, 6384.0, 0.64), _step(1024, 6317.0, 10.4)]
    assert _choose(_objective(5.0), steps) == 1
    assert _choose(_objective(0.0), steps) == 0   # no minimum: the best value wins, as before


def test_only_short_windows_are_still_ranked() -> None:
    steps = [_step(4, 10.0, 1.0), _step(16, 30.0, 2.0)]
    assert _choose(_objective(30.0), steps) == 1


def test_window_long_enough_reads_the_duration() -> None:
    spec = LadderSpec(steps=(8,), min_window_s=30.0)
    assert window_long_enough(spec, {"duration": 30.0})
    assert not window_long_enough(spec, {"duration": 29.9})
    assert not window_long_enough(spec, {})
    assert window_long_enough(None, {})


def test_the_node_objective_sets_a_window_and_the_demo_keeps_its_own() -> None:
    node = load_objective("throughput")
    assert node.ladder is not None and node.ladder.min_requests >= 256 and node.ladder.min_window_s >= 30
    demo = node.at_scale("demo")
    assert demo.ladder is not None and demo.ladder.min_requests == 0 and demo.ladder.min_window_s == 0


@pytest.mark.parametrize(("values", "top_k", "noise", "expected"), [
    ([6384.0, 6317.0, 5000.0], 1, 0.05, 2),   # 1 % apart: both go to confirmation
    ([7000.0, 6317.0, 5000.0], 1, 0.05, 1),   # 10 % apart: the winner stands
    ([100.0, 99.0, 98.5, 98.0], 2, 0.05, 3),  # one more past top_k at most
    ([100.0], 1, 0.05, 1),
    ([100.0, 99.0], 0, 0.05, 0),              # no confirmation asked for
])
def test_within_noise(values: list[float], top_k: int, noise: float, expected: int) -> None:
    assert within_noise(values, top_k, noise) == expected


def _confirmation(values: tuple[float, ...], accepted: bool) -> Confirmation:
    centre = sorted(values)[len(values) // 2]
    return Confirmation(0, "k", values, centre, 0.0, centre, accepted, "", "", False)


def test_measured_noise_is_the_widest_accepted_spread() -> None:
    confirmations = [_confirmation((90.0, 100.0, 110.0), True), _confirmation((4854.0, 8881.0), False),
                     _confirmation((98.0, 100.0, 102.0), True)]
    assert measured_noise(confirmations, default=ConfirmSpec().noise) == pytest.approx(0.2)
    assert measured_noise([_confirmation((4854.0, 8881.0), False)], default=0.05) == 0.05
