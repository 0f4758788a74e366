"""The tuner is interrupted while the correctness gates run, on a real vLLM (CPU build).

A gate (guard suite) sends SIGINT to this process while it talks to the ready server; the signal
lands inside the gate as KeyboardInterrupt (as it does in the CLI, whose SIGTERM/SIGHUP handlers
raise the same). The trial must let it through and stop the server's whole process group.
One real launch. Run one at a time: `flock /tmp/vllm-server.lock pytest tests/faults -m server`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import vllm_cli
from tuner.engines.process import group_alive
from tuner.guards.api import GuardReport, GuardTarget
from tuner.objective import Objective
from tuner.search.space import ServeConfig
from tuner.trial import TrialContext, run_trial

pytestmark = [pytest.mark.server, pytest.mark.slow]


class SignalDuringGates:
    """A gate that checks the server with the trial's key, then gets SIGINT mid-gate."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.with_key: int | None = None
        self.without_key: int | None = None

    def run(self, target: GuardTarget) -> GuardReport:
        self.pgid = int(json.loads((target.trial_dir / "server.pid.json").read_text())["pgid"])
        self.with_key = httpx.get(target.base_url + "/v1/models", headers=dict(target.headers), timeout=30).status_code
        self.without_key = httpx.get(target.base_url + "/v1/models", timeout=30).status_code
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)  # the signal lands here
        raise AssertionError("SIGINT did not interrupt the gate")


@pytest.fixture
def default_sigint() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigint_during_gates_stops_the_server(tmp_path: Path, demo_model: Path, default_sigint: None) -> None:
    cli = vllm_cli()
    assert cli is not None
    gate = SignalDuringGates()
    ctx = TrialContext(server_cmd=[cli], model=str(demo_model), objective=Objective(name="t"), ready_timeout_s=240,
                       served_model_name="demo", guards=gate)
    config = ServeConfig(args={"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
                         env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}, params={})
    tdir = tmp_path / "trials/0000"
    with pytest.raises(KeyboardInterrupt):
        run_trial(ctx, config, tdir)
    assert gate.pgid is not None, "the gate never ran"
    assert gate.with_key == 200 and gate.without_key == 401
    assert not group_alive(gate.pgid)
    assert not (tdir / "server.pid.json").exists()
    assert not (tdir / "outcome.json").exists()  # the study marks it interrupted; resume re-runs it
