"""The spine, end to end on a real vLLM (CPU build): one study of real launches, a failing trial,
an exported winner that starts, and a resume that loses nothing.

Launches run one at a time; the study is run once (module fixture) and inspected by several tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import vllm_cli
from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.load.affinity import format_cpu_list

pytestmark = [pytest.mark.server, pytest.mark.slow]

SENTINEL = "hf_sentinel_do_not_leak_0123456789"
STUDY = "e2e"

PROFILE = {
    "name": "cpu-e2e",
    "description": "cpu profile for the end-to-end test: the first baseline carries a value vLLM rejects",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1,
                 "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 240, "client_cpus": 1, "fixed": {"max-model-len": 1024, "enforce-eager": True,
                                                 "dtype": "bfloat16"},
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                       "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}},
    "levers": {"max-num-seqs": {"choices": [4, 16]},
               "kv-cache-dtype": {"choices": ["auto", "fp9_not_a_dtype"]},
               "enable-prefix-caching": {"choices": [True, False]}},
    "baselines": [
        {"name": "rejected-by-vllm", "values": {"kv-cache-dtype": "fp9_not_a_dtype", "max-num-seqs": 4,
                                                "enable-prefix-caching": True}},
        {"name": "sane", "values": {"kv-cache-dtype": "auto", "max-num-seqs": 16,
                                    "enable-prefix-caching": True}},
        {"name": "sane-small", "values": {"kv-cache-dtype": "auto", "max-num-seqs": 4,
                                          "enable-prefix-caching": False}},
    ],
}
OBJECTIVE = {
    "name": "throughput-e2e", "direction": "maximize", "metric": "output_throughput",
    "slos": {"p95_ttft_ms": 60000, "p95_itl_ms": 5000},
    "workload": {"input_len": 64, "output_len": 32, "num_prompts": 16, "concurrency": 4, "warmup_prompts": 1},
}


def _cli(*args: str, runs: Path, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_TOKEN": SENTINEL, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args, "--runs-dir", str(runs)],
                          capture_output=True, text=True, timeout=timeout_s, env=env, check=False)


@pytest.fixture(scope="module")
def study_run(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> dict[str, object]:
    root = tmp_path_factory.mktemp("e2e")
    profile = root / "cpu-e2e.yaml"
    objective = root / "throughput-e2e.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    objective.write_text(yaml.safe_dump(OBJECTIVE))
    runs = root / "runs"
    # --prevalidate off: the rejected flag must reach a real launch here (the parser check has its own test).
    proc = _cli("--hw", str(profile), "--objective", str(objective), "--trials", "3", "--study", STUDY,
                "--model", str(demo_model), "--prevalidate", "off", "--confirm-top-k", "1",
                "--confirm-repeats", "2", "--accept-unconfirmed", runs=runs)
    return {"proc": proc, "runs": runs, "study": runs / STUDY}


def _outcomes(study: Path) -> dict[str, dict[str, object]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(study.glob("trials/*/outcome.json"))}


def test_study_finishes_with_three_launches(study_run: dict[str, object]) -> None:
    proc = study_run["proc"]
    assert isinstance(proc, subprocess.CompletedProcess)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outcomes = _outcomes(Path(str(study_run["study"])))
    assert len(outcomes) == 3
    assert sum(1 for o in outcomes.values() if o["ok"]) >= 2


def test_rejected_flag_is_recorded_with_its_reason(study_run: dict[str, object]) -> None:
    study = Path(str(study_run["study"]))
    first = json.loads((study / "trials/0000/outcome.json").read_text())
    assert first["ok"] is False
    assert first["failure_class"] == "bad_flag"
    assert "fp9_not_a_dtype" in str(first["reason"]) or "kv-cache-dtype" in str(first["reason"])
    assert (study / "trials/0000/server.log").stat().st_size > 0
    command = json.loads((study / "trials/0000/command.json").read_text())
    assert "fp9_not_a_dtype" in command["argv"]
    table = (study / "trials.csv").read_text()
    assert "bad_flag" in table


def test_successful_trial_has_load_metrics(study_run: dict[str, object]) -> None:
    study = Path(str(study_run["study"]))
    load = json.loads((study / "trials/0001/load.json").read_text())
    summary = load["summary"]
    assert summary["completed"] == OBJECTIVE["workload"]["num_prompts"]  # type: ignore[index]
    assert summary["failed"] == 0
    assert summary["output_throughput"] > 0
    for key in ("p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p95_itl_ms", "p95_tpot_ms", "p95_e2el_ms"):
        assert summary[key] > 0, key
    server_metrics = json.loads((study / "trials/0001/server_metrics.json").read_text())
    assert server_metrics["counters"]["vllm:generation_tokens"] >= summary["total_output_tokens"]
    # the KV capacity vLLM logged at start-up, which calibrates the feasibility model on a GPU node
    kv_tokens = server_metrics["kv_cache_tokens_per_rank"]
    assert kv_tokens > 0
    assert json.loads((study / "trials/0001/outcome.json").read_text())["kv_cache_tokens"] == kv_tokens


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to split")
def test_server_runs_on_its_cores_and_vllm_binds_its_threads_there(study_run: dict[str, object]) -> None:
    trial = Path(str(study_run["study"])) / "trials/0001"
    command = json.loads((trial / "command.json").read_text())
    cores = sorted(os.sched_getaffinity(0))
    assert command["cpus"] == {"server": cores[:-1], "client": cores[-1:], "bind_omp": True}
    bind = command["env"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert bind == format_cpu_list(cores[:-1])
    assert f"VLLM_CPU_OMP_THREADS_BIND={bind!r}" in (trial / "server.log").read_text()  # vLLM read it


def test_winner_is_exported_and_no_secret_leaks(study_run: dict[str, object]) -> None:
    study = Path(str(study_run["study"]))
    best = study / "best"
    profile = yaml.safe_load((best / "profile.yaml").read_text())
    identity = json.loads((best / "identity.json").read_text())
    assert profile["kv-cache-dtype"] == "auto"
    assert profile["host"] == "127.0.0.1"
    assert identity["trial"] in (1, 2)
    assert identity["objective"]["value"] > 0
    # confirmed, or exported under --accept-unconfirmed with its verdict and repeats kept
    assert identity["confirmation"] is not None and len(identity["confirmation"]["values"]) == 2
    assert identity["confirmation_status"] == ("confirmed" if identity["confirmed"] else "rejected")
    assert os.access(best / "serve.sh", os.X_OK)
    for path in study.rglob("*"):
        if path.is_file() and path.suffix != ".db":
            assert SENTINEL not in path.read_text(errors="replace"), path


def test_exported_profile_starts_a_server_that_answers(study_run: dict[str, object], tmp_path: Path) -> None:
    best = Path(str(study_run["study"])) / "best"
    port = free_port()
    cli = vllm_cli()
    assert cli is not None
    spec = LaunchSpec(argv=["bash", str(best / "serve.sh"), "--port", str(port)],
                      env={"VLLM_CMD": cli}, host="127.0.0.1", port=port, workdir=tmp_path,
                      ready_timeout_s=240)
    with ServerProcess(spec) as server:
        server.wait_ready()
        model = yaml.safe_load((best / "profile.yaml").read_text())["served-model-name"]
        resp = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                          json={"model": model, "prompt": "def main(", "max_tokens": 8})
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] > 0


def test_resume_adds_trials_and_keeps_the_finished_ones(study_run: dict[str, object]) -> None:
    study = Path(str(study_run["study"]))
    before = {name: (study / f"trials/{name}/outcome.json").read_bytes() for name in _outcomes(study)}
    proc = _cli("resume", STUDY, "--trials", "4", "--no-export", "--accept-unconfirmed",
                runs=Path(str(study_run["runs"])))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = _outcomes(study)
    assert len(after) == 4
    for name, blob in before.items():
        assert (study / f"trials/{name}/outcome.json").read_bytes() == blob
