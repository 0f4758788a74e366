"""A real vLLM (CPU build) whose engine hangs during start-up ends as ``hang`` (issue 14, finding 6).

The engine core is stopped (SIGSTOP) as soon as it logs its first line: the API server keeps waiting for
its handshake (for VLLM_ENGINE_READY_TIMEOUT_S, 600 s by default) and its log says nothing more at INFO,
as a start wedged in a collective or in graph capture does on a GPU. The start-up watchdog must end the
launch after ``startup_stall_s`` without progress, name the last progress line, and stop the whole
process group (the stopped engine core included), well before the ready timeout. One real launch:
`flock /tmp/dsv4-vllm.lock pytest tests/faults/test_vllm_startup_hang.py`.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest

from tests.conftest import vllm_cli
from tuner.objective import Objective
from tuner.search.space import ServeConfig
from tuner.trial import TrialContext, run_trial

pytestmark = [pytest.mark.server, pytest.mark.slow]

ENGINE_LINE = re.compile(r"\(EngineCore(?:_DP0)? pid=(\d+)\)")
STALL_S = 30.0
"""Longer than any silent step of a normal CPU start here (docs/evidence/startup-stall: 11 s at most)."""
READY_TIMEOUT_S = 200.0


class StopTheEngine(threading.Thread):
    """Waits for the engine core's first log line, then SIGSTOPs that process (once)."""

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.pid: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            match = ENGINE_LINE.search(text)
            if match:
                self.pid = int(match[1])
                os.kill(self.pid, signal.SIGSTOP)
                return


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_an_engine_that_stops_during_start_up_is_a_hang(tmp_path: Path, demo_model: Path) -> None:
    cli = vllm_cli()
    assert cli is not None
    ctx = TrialContext(server_cmd=[cli], model=str(demo_model), objective=Objective(name="t"),
                       ready_timeout_s=READY_TIMEOUT_S, startup_stall_s=STALL_S, served_model_name="demo")
    config = ServeConfig(args={"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
                         env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}, params={})
    tdir = tmp_path / "trials/0000"
    stopper = StopTheEngine(tdir / "server.log")
    stopper.start()
    try:
        outcome = run_trial(ctx, config, tdir)
    finally:
        stopper.done.set()
    assert stopper.pid is not None, "the engine core never logged a line"
    assert outcome.failure_class == "hang", outcome.reason
    assert outcome.ready_s is None
    assert f"no progress in its log for {STALL_S:.0f} s" in outcome.reason
    assert "last progress" in outcome.reason  # the line the engine got to before it stopped
    assert not _alive(stopper.pid), "the stopped engine core outlived the launch"
    assert not (tdir / "server.pid.json").exists()
