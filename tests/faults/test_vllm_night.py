"""A night that goes wrong, on a real vLLM (CPU build): every fault a real server can show on demand.

One study is driven through `python -m tuner.cli` (real processes, real signals) and the test
injects one fault per trial; the module fixture runs the whole night once and records what it saw,
and each test below checks one promise. Launches (3 reach ready, 5 end during startup):

    trial 0  a flag vLLM rejects                     → bad_flag, log kept, next trial starts
    trial 1  a KV budget larger than the machine      → oom (simulated OOM: real vLLM, real error)
    trial 2  server SIGKILLed 3 s into startup        → crash ("killed by SIGKILL")
    trial 3  ready: security probed, then the API server SIGKILLed mid-load → died_during_load
    trial 4  the *tuner* SIGKILLed in launch         → orphan left; `resume` stops it, re-runs trial 4
    trial 5  (retry of 4) tuner SIGTERMed mid-load   → exit 130, server stopped, trial marked
    trial 6  (retry of 5) tuner SIGINTed in launch   → exit 130, server stopped, trial marked
    trial 7  (retry of 6) runs to the end            → study finishes, winner exported

Run one at a time: `flock /tmp/vllm-server.lock pytest tests/faults -m server`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
import yaml

from tests.faults.conftest import (
    SENTINEL,
    Tuner,
    files_containing,
    listening_addresses,
    process_env,
    wait_file,
)
from tuner.engines.process import group_alive, stop_orphans
from tuner.load.metrics import parse_prometheus

pytestmark = [pytest.mark.server, pytest.mark.slow]

STUDY = "night"
START_S = 300.0  # generous: 2 cores, shared with other work

PROFILE = {
    "name": "cpu-faults",
    "description": "cpu profile for the fault suite: each baseline is one scripted fault",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1,
                 "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 240,
               "fixed": {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
               "env": {"HF_HUB_OFFLINE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120",
                       # a catalog value full of shell metacharacters: must arrive verbatim, run nothing
                       "DSV4_FAULT_PROBE": "x; touch INJECTED_ENV $(touch INJECTED_SUB) `touch INJECTED_BT`"}},
    "levers": {
        "max-num-seqs": {"choices": [4, 8, 16, 32, 64]},
        "kv-cache-dtype": {"choices": ["auto", "fp9_not_a_dtype"]},
        "kv-space": {"choices": ["1", "99999"], "env": "VLLM_CPU_KVCACHE_SPACE"},
    },
    "baselines": [
        {"name": "bad-flag", "values": {"max-num-seqs": 4, "kv-cache-dtype": "fp9_not_a_dtype", "kv-space": "1"}},
        {"name": "oom", "values": {"max-num-seqs": 4, "kv-cache-dtype": "auto", "kv-space": "99999"}},
        {"name": "crash", "values": {"max-num-seqs": 8, "kv-cache-dtype": "auto", "kv-space": "1"}},
        {"name": "dies-mid-load", "values": {"max-num-seqs": 16, "kv-cache-dtype": "auto", "kv-space": "1"}},
        {"name": "tuner-killed", "values": {"max-num-seqs": 32, "kv-cache-dtype": "auto", "kv-space": "1"}},
    ],
}
OBJECTIVE = {
    "name": "throughput-faults", "direction": "maximize", "metric": "output_throughput",
    "slos": {"p95_ttft_ms": 600000, "p95_itl_ms": 60000},
    "workload": {"input_len": 32, "output_len": 32, "num_prompts": 120, "concurrency": 4, "warmup_prompts": 1},
}


def _record(study: Path, n: int) -> dict[str, Any] | None:
    return wait_file(study / f"trials/{n:04d}/server.pid.json", 10)


def _poll(what: str, check: Callable[[], bool], timeout_s: float, tuner: Tuner | None = None) -> None:
    """Wait until ``check()`` holds: fail naming ``what`` after ``timeout_s``, or when ``tuner`` exits first."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if tuner is not None and tuner.proc.poll() is not None:
            raise AssertionError(f"the tuner exited (rc {tuner.proc.returncode}) while waiting for {what}:\n"
                                 f"{tuner.output[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)


def _starting(study: Path, n: int) -> Callable[[], bool]:
    """Trial ``n``'s server has begun its start-up: vLLM has written its first log records."""
    log = study / f"trials/{n:04d}/server.log"
    return lambda: log.is_file() and " INFO " in log.read_text(errors="replace")


def _requests_running(port: int) -> Callable[[], bool]:
    """The load is on: vLLM's own gauge ``vllm:num_requests_running`` is above 0."""
    def check() -> bool:
        try:
            page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return False
        return any(value > 0 for (name, _labels), value in parse_prometheus(page).items()
                   if name == "vllm:num_requests_running")
    return check


def _load_under_way(port: int) -> Callable[[], bool]:
    """Requests are running, or some have completed (a counter: a poll that misses the gauge between two
    short requests, on a busy machine, still sees the load under way while the other 100-odd run)."""
    running, completed = _requests_running(port), _requests_completed(port, 1)
    return lambda: running() or completed()


def _requests_completed(port: int, at_least: int) -> Callable[[], bool]:
    """The measured load has finished requests: vLLM's own counter ``vllm:request_success_total`` (all finish
    reasons) has reached ``at_least``. Requests merely running is not enough: on a busy machine the kill
    then lands before any measured request completes, and the trial has nothing to count as completed."""
    def check() -> bool:
        try:
            page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return False
        return sum(value for (name, _labels), value in parse_prometheus(page).items()
                   if name == "vllm:request_success_total") >= at_least
    return check


def _gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.2)
    return not group_alive(pgid)


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("night")
    (root / "profile.yaml").write_text(yaml.safe_dump(PROFILE))
    (root / "objective.yaml").write_text(yaml.safe_dump(OBJECTIVE))
    runs = root / "runs"
    study = runs / STUDY
    obs: dict[str, Any] = {"runs": runs, "study": study, "root": root}

    try:
        yield from _night(runs, study, root, demo_model, obs)
    finally:  # whatever failed, leave no server behind (the orphan of a failed run would eat the cores)
        for tuner in ("run1", "r1", "r2", "r3"):
            if tuner in obs and obs[tuner].proc.poll() is None:
                obs[tuner].proc.kill()
                obs[tuner].wait(30)
        stop_orphans(study / "trials")


def _night(runs: Path, study: Path, root: Path, demo_model: Path, obs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    run1 = Tuner("--hw", str(root / "profile.yaml"), "--objective", str(root / "objective.yaml"),
                 "--trials", "5", "--study", STUDY, "--model", str(demo_model),
                 # the bad flag must reach a real launch here; pre-launch validation has its own tests
                 "--prevalidate", "off", "--confirm-top-k", "0", runs=runs)
    obs["run1"] = run1
    try:
        # trial 2: the server dies during startup (SIGKILL to its main process)
        rec2 = wait_file(study / "trials/0002/server.pid.json", START_S, run1.proc)
        assert rec2 is not None, run1.output
        _poll("trial 2's server to begin its start-up", _starting(study, 2), START_S, run1)
        os.kill(int(rec2["pid"]), signal.SIGKILL)
        obs["t2_pgid"] = int(rec2["pgid"])

        # trial 3: probe the live server's security, then kill its API server mid-load
        assert run1.wait_for(r"trial 3 load", START_S), run1.output
        rec3 = _record(study, 3)
        assert rec3 is not None
        port = int(rec3["port"])
        base = f"http://127.0.0.1:{port}"
        obs["t3_no_key"] = httpx.get(base + "/v1/models", timeout=10).status_code
        obs["t3_wrong_key"] = httpx.post(base + "/v1/completions", timeout=10,
                                         headers={"Authorization": "Bearer wrong"},
                                         json={"model": "x", "prompt": "a", "max_tokens": 1}).status_code
        obs["t3_listen"] = listening_addresses(port)
        server_env = process_env(int(rec3["pid"]))
        obs["t3_api_key"] = server_env.get("VLLM_API_KEY", "")
        obs["t3_hf_token_reaches_server"] = server_env.get("HF_TOKEN") == SENTINEL
        obs["t3_probe_env"] = server_env.get("DSV4_FAULT_PROBE")
        # the warm-up request (the objective's warmup_prompts: 1), then at least two measured ones
        _poll("measured requests completed on trial 3's server", _requests_completed(port, 3), START_S, run1)
        os.kill(int(rec3["pid"]), signal.SIGKILL)
        obs["t3_pgid"] = int(rec3["pgid"])

        # trial 4: SIGKILL the tuner itself while its server starts; the server is orphaned
        rec4 = wait_file(study / "trials/0004/server.pid.json", START_S, run1.proc)
        assert rec4 is not None, run1.output
        _poll("trial 4's server to begin its start-up", _starting(study, 4), START_S, run1)
        run1.proc.kill()
        obs["run1_rc"] = run1.wait(30)
        obs["t4_pgid"] = int(rec4["pgid"])
        obs["t4_orphan_alive"] = group_alive(int(rec4["pgid"]))  # the tuner is reaped; its server lives on
        obs["finished_before"] = {p.parent.name: p.read_bytes() for p in study.glob("trials/*/outcome.json")}
    finally:
        if run1.proc.poll() is None:
            run1.proc.kill()
            run1.wait(30)

    # resume 1: stops the orphan, re-runs trial 4 as trial 5; SIGTERM to the tuner mid-load
    r1 = Tuner("resume", STUDY, runs=runs)
    obs["r1"] = r1
    obs["t4_orphan_stopped"] = _gone(obs["t4_pgid"], 120)
    reached = r1.wait_for(r"trial 5 load", START_S)
    rec5 = _record(study, 5) if reached else None
    _signal_mid_trial(obs, r1, "r1", "t5_pgid", rec5, reached, signal.SIGTERM,
                      ("trial 5's load under way", _load_under_way(int(rec5["port"])) if rec5 else None))

    # resume 2: SIGINT to the tuner while trial 6 (the retry) is launching
    r2 = Tuner("resume", STUDY, runs=runs)
    obs["r2"] = r2
    rec6 = wait_file(study / "trials/0006/server.pid.json", START_S, r2.proc)
    _signal_mid_trial(obs, r2, "r2", "t6_pgid", rec6, rec6 is not None, signal.SIGINT,
                      ("trial 6's server to begin its start-up", _starting(study, 6)))

    # resume 3: runs trial 7 to the end and exports the winner
    r3 = Tuner("resume", STUDY, runs=runs)
    obs["r3"] = r3
    obs["r3_rc"] = r3.wait(600)
    yield obs


def _signal_mid_trial(obs: dict[str, Any], tuner: Tuner, name: str, pgid_key: str, record: dict[str, Any] | None,
                      reached: bool, sig: signal.Signals, once: tuple[str, Callable[[], bool] | None]) -> None:
    """Signal ``tuner`` once the trial it reached (``record``: its server) is where ``once`` says; it must
    stop within a generous 90 s (else it is killed, and its exit code says so)."""
    if not reached:
        obs[f"{name}_rc"] = tuner.wait(5)
        return
    obs[pgid_key] = int(record["pgid"]) if record else None
    what, check = once
    if check is not None:
        _poll(what, check, START_S, tuner)
    tuner.proc.send_signal(sig)
    obs[f"{name}_rc"] = tuner.wait(90)


def _outcome(night: dict[str, Any], n: int) -> dict[str, Any]:
    return dict(json.loads((night["study"] / f"trials/{n:04d}/outcome.json").read_text()))


def _trials(night: dict[str, Any]) -> dict[int, optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{night['study'] / 'study.db'}"
    return {t.number: t for t in optuna.load_study(study_name=STUDY, storage=storage).get_trials()}


# -- server exits during startup -------------------------------------------------------------------
def test_bad_flag_is_recorded_with_class_and_log(night: dict[str, Any]) -> None:
    out = _outcome(night, 0)
    assert out["ok"] is False and out["failure_class"] == "bad_flag", out
    assert "kv-cache-dtype" in out["reason"] and "fp9_not_a_dtype" in out["reason"], out["reason"]
    assert "server.log" in out["reason"]
    assert "invalid choice" in (night["study"] / "trials/0000/server.log").read_text()


def test_simulated_oom_is_oom_not_bad_flag(night: dict[str, Any]) -> None:
    out = _outcome(night, 1)
    assert out["failure_class"] == "oom", out["reason"]
    assert "99999" in out["reason"] and "memory" in out["reason"]


def test_crash_during_startup_is_crash_and_group_is_gone(night: dict[str, Any]) -> None:
    out = _outcome(night, 2)
    assert out["failure_class"] == "crash", out["reason"]
    assert "SIGKILL" in out["reason"]
    assert not group_alive(night["t2_pgid"])
    assert not (night["study"] / "trials/0002/server.pid.json").exists()


def test_startup_failure_outcome_carries_the_log_tail(night: dict[str, Any]) -> None:
    for n in (0, 1, 2):
        out = _outcome(night, n)
        log = night["study"] / f"trials/{n:04d}/server.log"
        # a server killed before it printed anything leaves an empty log, and so an empty tail
        if log.is_file() and log.read_text(errors="replace").strip():
            assert out.get("log_tail"), f"trial {n} has no log_tail"
            assert out["log_tail"].strip()[-200:] in log.read_text(errors="replace")
    assert "invalid choice" in _outcome(night, 0)["log_tail"]


def test_next_trial_starts_cleanly_after_startup_failures(night: dict[str, Any]) -> None:
    out = _outcome(night, 3)
    assert out["ready_s"] is not None and out["ready_s"] > 0, out


# -- server dies mid-load --------------------------------------------------------------------------
def test_server_death_mid_load_keeps_evidence_and_counts_failures(night: dict[str, Any]) -> None:
    out = _outcome(night, 3)
    assert out["failure_class"] == "died_during_load", out["reason"]
    summary = out["summary"]
    assert summary["completed"] >= 1, summary
    assert summary["failed"] >= 1, summary
    assert f"{summary['completed']} requests completed, {summary['failed']} failed" in out["reason"]
    assert (night["study"] / "trials/0003/load.json").is_file()
    assert not group_alive(night["t3_pgid"]), "the engine core outlived its API server"
    trials = _trials(night)
    assert trials[3].state.name == "COMPLETE" and trials[3].user_attrs["failure_class"] == "died_during_load"


def test_study_goes_on_after_a_server_death(night: dict[str, Any]) -> None:
    assert (night["study"] / "trials/0004/server.log").is_file()
    assert night["r3_rc"] == 0, night["r3"].output


# -- the tuner is killed ---------------------------------------------------------------------------
def test_sigkill_leaves_an_orphan_that_resume_stops_and_reruns(night: dict[str, Any]) -> None:
    assert night["run1_rc"] == -signal.SIGKILL
    assert night["t4_orphan_alive"], "the fault did not happen: no orphan after SIGKILL"
    assert night["t4_orphan_stopped"], night["r1"].output
    assert "orphaned server" in night["r1"].output
    trials = _trials(night)
    assert trials[4].state.name == "FAIL"
    assert trials[5].user_attrs.get("retry_of") == 4
    assert trials[5].params == trials[4].params


def test_finished_trials_are_intact_after_kills_and_resumes(night: dict[str, Any]) -> None:
    before: dict[str, bytes] = night["finished_before"]
    assert set(before) == {"0000", "0001", "0002", "0003"}
    for name, blob in before.items():
        assert (night["study"] / f"trials/{name}/outcome.json").read_bytes() == blob
    con = sqlite3.connect(night["study"] / "study.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()


def test_sigterm_during_load_stops_server_and_marks_trial(night: dict[str, Any]) -> None:
    assert night["r1_rc"] == 130, night["r1"].output
    assert night["t5_pgid"] is not None and not group_alive(night["t5_pgid"])
    assert not (night["study"] / "trials/0005/server.pid.json").exists()
    t5 = _trials(night)[5]
    assert t5.state.name == "FAIL" and t5.user_attrs.get("interrupted") is True
    assert "dsv4-tune resume night" in night["r1"].output


def test_sigint_during_launch_stops_server_and_marks_trial(night: dict[str, Any]) -> None:
    assert night["r2_rc"] == 130, night["r2"].output
    assert not group_alive(night["t6_pgid"])
    assert not (night["study"] / "trials/0006/server.pid.json").exists()
    t6 = _trials(night)[6]
    assert t6.state.name == "FAIL" and t6.user_attrs.get("interrupted") is True
    assert t6.user_attrs.get("retry_of") == 5


def test_last_resume_reruns_the_trial_and_exports(night: dict[str, Any]) -> None:
    assert night["r3_rc"] == 0, night["r3"].output
    trials = _trials(night)
    assert trials[7].user_attrs.get("retry_of") == 6
    assert _outcome(night, 7)["ok"] is True
    profile = yaml.safe_load((night["study"] / "best/profile.yaml").read_text())
    assert profile["max-num-seqs"] == 32


# -- security --------------------------------------------------------------------------------------
def test_server_rejects_requests_without_the_api_key(night: dict[str, Any]) -> None:
    assert night["t3_no_key"] == 401
    assert night["t3_wrong_key"] == 401
    assert len(night["t3_api_key"]) >= 24
    # ...and the load generator used it: requests completed on that server before it was killed
    assert _outcome(night, 3)["summary"]["completed"] >= 1


def test_server_listens_on_loopback_only(night: dict[str, Any]) -> None:
    assert night["t3_listen"] == ["0100007F"], night["t3_listen"]
    profile = yaml.safe_load((night["study"] / "best/profile.yaml").read_text())
    assert profile["host"] == "127.0.0.1"


def test_secrets_are_never_written(night: dict[str, Any]) -> None:
    assert night["t3_hf_token_reaches_server"], "HF_TOKEN must reach the server through the environment"
    root: Path = night["root"]
    assert files_containing(root, SENTINEL) == []
    assert files_containing(root, night["t3_api_key"]) == []
    for tuner in ("run1", "r1", "r2", "r3"):
        assert SENTINEL not in night[tuner].output


def test_shell_metacharacters_in_catalog_values_run_nothing(night: dict[str, Any]) -> None:
    assert night["t3_probe_env"] == PROFILE["server"]["env"]["DSV4_FAULT_PROBE"]  # type: ignore[index]
    injected = [p for p in night["root"].rglob("INJECTED_*")] + list(Path.cwd().glob("INJECTED_*"))
    assert injected == []
    serve_sh = (night["study"] / "best/serve.sh").read_text()
    assert "export DSV4_FAULT_PROBE='x; touch INJECTED_ENV $(touch INJECTED_SUB) `touch INJECTED_BT`'" in serve_sh
