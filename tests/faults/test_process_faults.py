"""Faults a real vLLM cannot show on demand, on real processes: stand-ins (tests/standins/) and plain
programs, one per fault. No vLLM is started here.

- hang before ready    stand-in hang_before_ready.py: the ready timeout kills parent *and* child
- /health 500 mid-run  stand-in unhealthy_midrun.py: the trial stops as ``unhealthy``, bounded
- port taken           a socket this test holds: pick another, or fail naming the holder
- two tuners           the study lock; the second tuner refuses and touches nothing
- GPU memory not freed injected probe (a GPU host runs the real one: tests marked gpu)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from tests.faults.conftest import STANDINS, Tuner, cli_env
from tuner.engines.process import (
    GPU_RELEASE_FILE,
    LaunchSpec,
    ServerProcess,
    choose_port,
    free_port,
    group_alive,
    nvidia_smi_probe,
    wait_gpu_memory_released,
)
from tuner.errors import PortInUseError
from tuner.objective import Objective
from tuner.search.space import ServeConfig
from tuner.trial import TrialContext, run_trial

CPU_PROFILE = {
    "name": "cpu-fault-unit",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 5},
    "levers": {"max-num-seqs": {"choices": [4, 8]}},
}


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _ctx(program: Sequence[str], objective: Objective | None = None, **kw: object) -> TrialContext:
    return TrialContext(server_cmd=list(program), model="standin-model", objective=objective or Objective(name="t"),
                        **kw)  # type: ignore[arg-type]


# -- hang during startup ---------------------------------------------------------------------------
def test_hang_before_ready_times_out_and_kills_the_whole_group(tmp_path: Path) -> None:
    ctx = _ctx([sys.executable, str(STANDINS / "hang_before_ready.py")], ready_timeout_s=3)
    outcome = run_trial(ctx, ServeConfig(args={}, env={}, params={}), tmp_path / "t0")
    pids = json.loads((tmp_path / "t0/standin_pids.json").read_text())
    assert outcome.failure_class == "timeout", outcome.reason
    assert "not ready after 3 s" in outcome.reason
    assert _dead(pids["parent"]) and _dead(pids["child"]), "the SIGTERM-ignoring child outlived the timeout"
    assert not group_alive(pids["parent"])
    assert not (tmp_path / "t0/server.pid.json").exists()
    assert outcome.duration_s >= 3  # the ready timeout was given in full (how long the stop takes:
    # benchmarks/bench_stop_times.py, docs/evidence/stop-times)
    assert json.loads((tmp_path / "t0/outcome.json").read_text())["failure_class"] == "timeout"


# -- /health turns 500 while the server keeps serving ----------------------------------------------
def test_health_500_mid_run_stops_the_trial_in_bounded_time(tmp_path: Path) -> None:
    objective = Objective.model_validate({"name": "t", "workload": {
        "input_len": 8, "output_len": 400, "num_prompts": 8, "concurrency": 2, "warmup_prompts": 0}})
    ctx = _ctx([sys.executable, str(STANDINS / "unhealthy_midrun.py")], objective, ready_timeout_s=30,
               health_poll_s=0.5)
    config = ServeConfig(args={}, env={"HEALTH_500_AFTER_S": "2"}, params={})
    outcome = run_trial(ctx, config, tmp_path / "t0")
    assert outcome.failure_class == "unhealthy", outcome.reason
    # Each request would stream 400 tokens, 0.25 s apart (100 s); the trial must not wait for them: no
    # request may have streamed to its end, and those in flight end as failed.
    load = json.loads((tmp_path / "t0/load.json").read_text())
    requests = [r for run in load["repeats"] for step in run["steps"] for r in step["requests"]]
    assert requests and all(r["output_tokens"] < 400 for r in requests), [r["output_tokens"] for r in requests]
    assert any(not r["ok"] for r in requests)
    assert outcome.ok is False and outcome.feasible is False
    assert "server unhealthy" in outcome.reason
    assert outcome.summary["failed"] >= 1, outcome.summary
    assert not (tmp_path / "t0/server.pid.json").exists()
    record = json.loads((tmp_path / "t0/command.json").read_text())
    assert record["env"]["VLLM_API_KEY"] == "***"


# -- the chosen port is taken ----------------------------------------------------------------------
@pytest.fixture
def held_port() -> Iterator[int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_taken_port_fails_naming_the_holder(tmp_path: Path, held_port: int) -> None:
    spec = LaunchSpec(argv=["sleep", "30"], env={}, host="127.0.0.1", port=held_port, workdir=tmp_path,
                      ready_timeout_s=5)
    server = ServerProcess(spec, gpu_probe=None)
    with pytest.raises(PortInUseError) as info:
        server.start()
    assert f"port {held_port}" in str(info.value)
    assert f"held by pid {os.getpid()}" in str(info.value)
    assert server.proc is None, "nothing may be started on a taken port"


def test_trial_on_a_taken_port_moves_to_a_free_one(tmp_path: Path, held_port: int,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tuner.engines.process")
    # a plain program that exits at once: only the port choice matters here
    ctx = _ctx([sys.executable, "-c", "import sys; sys.exit(3)"], port=held_port, ready_timeout_s=10)
    outcome = run_trial(ctx, ServeConfig(args={}, env={}, params={}), tmp_path / "t0")
    command = json.loads((tmp_path / "t0/command.json").read_text())
    assert command["port"] != held_port
    assert outcome.failure_class == "crash" and "exit code 3" in outcome.reason
    assert any(f"port {held_port}" in r.getMessage() and f"pid {os.getpid()}" in r.getMessage()
               for r in caplog.records), caplog.text
    assert choose_port("127.0.0.1", held_port) != held_port


# -- two tuners on one study -----------------------------------------------------------------------
def test_second_tuner_on_the_same_study_refuses_and_touches_nothing(tmp_path: Path) -> None:
    from tuner.study import Study, StudyLock, StudyRecord

    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(CPU_PROFILE))
    (tmp_path / "model").mkdir()
    runs = tmp_path / "runs"
    record = StudyRecord(name="busy", hw=str(tmp_path / "cpu.yaml"), objective="throughput",
                         model=str(tmp_path / "model"), trials=1)
    study = Study.create(record, runs)
    # the first tuner's live server, as its pid record says
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        pid_file = study.path / "trials/0000/server.pid.json"
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(json.dumps({"pid": server.pid, "pgid": server.pid, "program": "sleep"}))
        with StudyLock(study.path):  # the first tuner holds the lock
            second = Tuner("resume", "busy", runs=runs, env=cli_env())
            rc = second.wait(60)
        assert rc == 1, second.output
        assert "already being run by another tuner" in second.output
        assert f"pid {os.getpid()}" in second.output
        assert "Traceback" not in second.output
        assert server.poll() is None, "the second tuner stopped the first tuner's server"
        assert pid_file.exists()
    finally:
        server.kill()
        server.wait()


# -- GPU memory not freed after a stop -------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_gpu_wait_returns_as_soon_as_memory_is_back() -> None:
    readings = iter([[70000, 500], [30000, 500], [900, 500]])
    clock = FakeClock()
    report = wait_gpu_memory_released(lambda: next(readings), [500, 500], timeout_s=60, poll_s=2,
                                      clock=clock, sleep=clock.sleep)
    assert report.status == "freed" and report.freed
    assert report.waited_s == 4.0
    assert report.last_mib == (900, 500)


def test_gpu_wait_is_bounded_and_reports_what_is_held() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def probe() -> list[int]:
        calls.append(clock.now)
        return [70000, 400]

    report = wait_gpu_memory_released(probe, [500, 400], timeout_s=10, poll_s=1, clock=clock, sleep=clock.sleep)
    assert report.status == "not_freed" and not report.freed
    assert report.waited_s == 10.0
    assert len(calls) == 11
    assert "GPU 0: 70000 MiB used, 500 MiB before start" in report.message()
    assert "GPU 1" not in report.message()


def test_gpu_wait_gives_up_quietly_when_the_probe_fails() -> None:
    report = wait_gpu_memory_released(lambda: None, [500], timeout_s=10)
    assert report.status == "unknown" and report.freed


def test_stop_waits_for_gpu_memory_and_writes_the_report(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tuner.engines.process")
    state = {"stopped": False}

    reads = {"after_stop": 0}

    def probe() -> list[int]:  # memory stays held after the server is gone
        if state["stopped"]:
            reads["after_stop"] += 1
        return [50000] if state["stopped"] else [1000]

    spec = LaunchSpec(argv=["sleep", "300"], env={}, host="127.0.0.1", port=free_port(), workdir=tmp_path,
                      ready_timeout_s=5, gpu_release_timeout_s=1.5)
    server = ServerProcess(spec, gpu_probe=probe)
    server.start()
    state["stopped"] = True
    server.stop()
    assert server.gpu_release is not None and server.gpu_release.status == "not_freed"
    # The wait ended at its 1.5 s cap: one read per 1 s poll, at most 3 (a slow machine reads fewer).
    assert 1 <= reads["after_stop"] <= 3, reads
    assert server.gpu_release.waited_s >= 1.5
    report = json.loads((tmp_path / GPU_RELEASE_FILE).read_text())
    assert report["baseline_mib"] == [1000] and report["last_mib"] == [50000]
    assert "not freed" in report["message"] and "Fix:" in report["message"]
    assert "GPU memory not freed" in caplog.text


def test_stop_without_gpu_does_not_wait(tmp_path: Path) -> None:
    spec = LaunchSpec(argv=["sleep", "300"], env={}, host="127.0.0.1", port=free_port(), workdir=tmp_path,
                      ready_timeout_s=5)
    server = ServerProcess(spec, gpu_probe=None)
    server.start()
    server.stop()
    assert server.gpu_release is None
    assert not (tmp_path / GPU_RELEASE_FILE).exists()


@pytest.mark.gpu
@pytest.mark.skipif(nvidia_smi_probe() is None, reason="no NVIDIA GPU / nvidia-smi on this host")
def test_real_gpu_probe_reads_every_gpu(tmp_path: Path) -> None:
    reading = nvidia_smi_probe()
    assert reading is not None and all(isinstance(x, int) and x >= 0 for x in reading)
    spec = LaunchSpec(argv=["sleep", "300"], env={}, host="127.0.0.1", port=free_port(), workdir=tmp_path,
                      ready_timeout_s=5, gpu_release_timeout_s=30)
    server = ServerProcess(spec)  # the default probe: nvidia-smi
    server.start()
    server.stop()
    assert server.gpu_release is not None and server.gpu_release.status == "freed"
