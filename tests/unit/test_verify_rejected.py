"""Issue 31: ``verify`` must be able to fail. A rejected confirmation lends no tolerance."""

from tuner.verify import judge_reserve


def test_rejected_confirmation_fails_verify_even_when_close() -> None:
    reported = {"value": 6384.0, "confirmed": False, "confirmation_values": [4854.0, 8881.0],
                "confirmation_accepted": False}
    verdict = judge_reserve([8445.0, 8400.0], reported, max_spread=0.1)
    assert verdict["within"] is False
    assert "rejected" in verdict["verdict"]


def test_accepted_confirmation_spread_is_the_tolerance() -> None:
    reported = {"value": 8000.0, "confirmed": True, "confirmation_values": [7900.0, 8100.0],
                "confirmation_accepted": True}
    assert judge_reserve([8150.0], reported, max_spread=0.1)["within"] is True
    assert judge_reserve([8300.0], reported, max_spread=0.1)["within"] is False
