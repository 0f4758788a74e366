"""A prefill/decode layout on the vLLM CPU build (issue 27): two real servers, ExampleConnector, vllm-router.

vLLM 0.32's CPU build runs ExampleConnector between two servers (the prefill server writes each prompt's KV to
a folder, the decode server loads it: ``vllm:external_prefix_cache_hits``), and vllm-router's P/D mode fronts
them (docs/decisions.md, issue 27). One trial launches the shipped demo model as a prefill member and a decode
member with the router in front, runs the DSV4 tool-call and reasoning gates through the router and the
long-context objective's demo load, and stops all three. A second launch gives the decode member a flag the
CPU build refuses (block size 16): the trial fails naming the member, its pool and its log's last line, and
nothing is left running. Two launches of two servers each; run one at a time (``flock``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.pd_cpu import run_layout
from tuner.engines.process import PID_FILE, port_is_free
from tuner.trial import TrialOutcome

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pd")
    return {layout: run_layout(root, layout, trial=i) for i, layout in enumerate(("1p1d", "1p1d-bad"))}


def _nothing_left(tdir: Path) -> None:
    command = json.loads((tdir / "command.json").read_text())
    for name, member in command["group"].items():
        assert not (tdir / name / PID_FILE).exists(), f"{name} left its pid file"
        assert port_is_free("127.0.0.1", int(member["port"])), f"{name} still holds its port"


def test_a_prefill_and_a_decode_server_serve_the_gates_and_the_load_through_the_router(
        launches: dict[str, Any]) -> None:
    outcome, tdir = launches["1p1d"]
    assert isinstance(outcome, TrialOutcome)
    guards = json.loads((tdir / "guards.json").read_text())
    assert guards["passed"], guards
    assert outcome.ok, outcome.reason
    assert outcome.summary["completed"] > 0 and outcome.summary["request_goodput"] > 0
    metrics = json.loads((tdir / "server_metrics.json").read_text())
    prefill, decode = metrics["pools"]["prefill"]["facts"], metrics["pools"]["decode"]["facts"]
    assert prefill["prompt_tokens"] > 0 and decode["generation_tokens"] > prefill["generation_tokens"]
    # the decode server received the prompts' KV from the prefill server, through the connector
    assert metrics["transfer"]["external_prefix_cache_hits"] > 0
    assert "p95_prefill_queue_ms" in outcome.summary
    assert [b["requests"] for b in outcome.summary["ttft_by_context"]] and \
        sum(b["requests"] for b in outcome.summary["ttft_by_context"]) == outcome.summary["completed"]
    command = json.loads((tdir / "command.json").read_text())
    router = command["group"]["router"]["argv"]
    assert "--vllm-pd-disaggregation" in router and "--prefill" in router and "--decode" in router
    assert any('"kv_role": "kv_producer"' in a for a in command["group"]["prefill-0"]["argv"])
    _nothing_left(tdir)


def test_a_member_that_dies_fails_the_trial_naming_its_pool_and_leaves_nothing(launches: dict[str, Any]) -> None:
    outcome, tdir = launches["1p1d-bad"]
    assert not outcome.ok and outcome.ready_s is None
    assert "decode-0 (decode pool)" in outcome.reason and "its log's last line" in outcome.reason
    _nothing_left(tdir)
