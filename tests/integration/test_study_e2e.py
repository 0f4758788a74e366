"""The spine, end to end on a real vLLM (CPU build): one study as a user runs it, through ``python -m tuner.cli``.

One study (module fixture), inspected by every test here; its launches are shared, so each is paid once:

- ``run``: two launched trials under ``--prevalidate auto``. The first baseline carries a value vLLM rejects,
  which vLLM's own parser refuses before any launch (a refusal is not a launch: ``--trials`` counts
  launches); the other two baselines launch, pass the objective's gate
  (``equivalence``) and are measured. The study is ranked by ``tokens_per_joule`` at a GPU-hour price;
  the power comes from a stand-in ``nvidia-smi`` (``tests/standins/gpu_tools``, named so: there is no GPU
  here) through the tuner's real ``nvidia-smi`` reader. The top trial is confirmed in one more launch with
  two repeats, and exported.
- ``verify``: ``best/serve.sh`` served again as it is, measured with the confirmation's workload.
- ``resume``: one more launched trial (the one legal configuration left), the finished ones untouched.

Five vLLM launches in all: two trials, the confirmation, the re-serve and the resumed trial. The fault night
(``tests/faults/test_vllm_night.py``) covers a flag vLLM rejects at a real launch.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tuner.load.affinity import format_cpu_list

pytestmark = [pytest.mark.server, pytest.mark.slow]

SENTINEL = "hf_sentinel_do_not_leak_0123456789"
STUDY = "e2e"
WATTS = 250.0
PRICE = 3.5
STANDIN_GPU_TOOLS = REPO / "tests" / "standins" / "gpu_tools"

PROFILE = {
    "name": "cpu-e2e",
    "description": "cpu profile for the end-to-end test: the first baseline carries a value vLLM rejects",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1,
                 "memory_per_device_gb": 1},
    # Prefix caching on with 32-token blocks: a re-sent 128-token prompt hits 3 of its 4 blocks, so a
    # confirmation repeat that re-sent an earlier window's prompts would show in vllm:prefix_cache_hits.
    "server": {"ready_timeout_s": 240, "client_cpus": 1,
               "fixed": {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16",
                         "enable-prefix-caching": True, "block-size": 32},
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                       "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}},
    "levers": {"max-num-seqs": {"choices": [4, 8, 16]},
               "kv-cache-dtype": {"choices": ["auto", "fp9_not_a_dtype"]}},
    # The first baseline's KV dtype is the one vLLM rejects: the equivalence reference is recorded under auto.
    "guards": {"reference": {"kv-cache-dtype": ["auto"]}},
    "baselines": [
        {"name": "rejected-by-vllm", "values": {"kv-cache-dtype": "fp9_not_a_dtype", "max-num-seqs": 4}},
        {"name": "sane", "values": {"kv-cache-dtype": "auto", "max-num-seqs": 16}},
        {"name": "sane-small", "values": {"kv-cache-dtype": "auto", "max-num-seqs": 4}},
    ],
}
OBJECTIVE = {
    "name": "joules-e2e", "metric": "tokens_per_joule",  # direction left out: an energy metric has one
    "slos": {"p95_ttft_ms": 60000, "p95_itl_ms": 5000}, "guards": ["equivalence"],
    "workload": {"input_len": 128, "output_len": 32, "num_prompts": 16, "concurrency": 4, "warmup_prompts": 1},
}


def _cli(*args: str, runs: Path, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_TOKEN": SENTINEL, "PYTHONUNBUFFERED": "1",
           "PATH": f"{STANDIN_GPU_TOOLS}{os.pathsep}{os.environ.get('PATH', '')}",
           "DSV4_STANDIN_WATTS": f"{WATTS:.2f}", "DSV4_STANDIN_GPUS": "1"}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args, "--runs-dir", str(runs)],
                          capture_output=True, text=True, timeout=timeout_s, env=env, check=False)


@pytest.fixture(scope="module")
def study_run(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e")
    profile = root / "cpu-e2e.yaml"
    objective = root / "joules-e2e.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    objective.write_text(yaml.safe_dump(OBJECTIVE))
    runs = root / "runs"
    study = runs / STUDY
    # --accept-unconfirmed: a busy 2-core machine can make two repeats disagree (a rejected confirmation);
    # the top trial is then exported labelled with its rejected repeats, and verify is held to their spread.
    run = _cli("--hw", str(profile), "--objective", str(objective), "--trials", "2", "--study", STUDY,
               "--model", str(demo_model), "--prevalidate", "auto", "--confirm-top-k", "1",
               "--confirm-repeats", "2", "--accept-unconfirmed", "--gpu-hour-usd", str(PRICE), runs=runs)
    verify = _cli("verify", STUDY, runs=runs) if (study / "best" / "serve.sh").is_file() else None
    record_path = study / "verify" / "verify.json"
    return {"proc": run, "verify": verify, "runs": runs, "study": study,
            "record": json.loads(record_path.read_text()) if record_path.is_file() else None}


def _outcomes(study: Path) -> dict[str, dict[str, Any]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(study.glob("trials/*/outcome.json"))}


def _rows(study: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((study / "trials.csv").open()))


def _launched(study: Path) -> dict[str, dict[str, Any]]:
    """Trial folder → outcome, for the trials that started a server (a refusal before launch has no folder)."""
    return {name: out for name, out in _outcomes(study).items() if out.get("ready_s")}


def _seqs(study: Path) -> list[int]:
    """max-num-seqs of each launched trial, from the configuration it wrote (trials/<n>/config.json)."""
    return sorted(json.loads((study / "trials" / name / "config.json").read_text())["args"]["max-num-seqs"]
                  for name in _launched(study))


def _first_rows(study: Path) -> list[dict[str, str]]:
    """The trials table without the rows that repeat an earlier configuration (``duplicate_of``)."""
    return [r for r in _rows(study) if not r.get("duplicate_of")]


def test_study_finishes_with_two_launches_and_a_refusal(study_run: dict[str, Any]) -> None:
    proc = study_run["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study: Path = study_run["study"]
    launched = _launched(study)
    assert len(launched) == 2 and all(o["ok"] for o in launched.values()), _outcomes(study)
    assert _seqs(study) == [4, 16]  # the two sane baselines
    assert [r["launched"] for r in _first_rows(study) if r["baseline"] == "rejected-by-vllm"] == ["False"]


def test_a_value_vllm_rejects_is_refused_by_vllms_parser_before_launch(study_run: dict[str, Any]) -> None:
    study: Path = study_run["study"]
    first = _first_rows(study)[0]
    assert first["baseline"] == "rejected-by-vllm" and first["failure_class"] == "bad_flag", first
    assert first["refused_by"] == "engine_args" and first["launched"] == "False", first
    assert "vLLM's own argument checks before launch" in first["reason"], first["reason"]
    assert "--kv-cache-dtype" in first["reason"] and "fp9_not_a_dtype" in first["reason"], first["reason"]
    assert not (study / "trials" / "0000").exists(), "a refused configuration started a server"
    # every configuration with that value was refused the same way, and none launched
    fp9 = [r for r in _first_rows(study) if r["param.kv-cache-dtype"] == "fp9_not_a_dtype"]
    assert fp9 and all(r["failure_class"] == "bad_flag" and r["launched"] == "False" for r in fp9), fp9
    assert "argument checks run before every launch" in (study / "report.md").read_text()


def test_successful_trial_has_load_metrics(study_run: dict[str, Any]) -> None:
    study: Path = study_run["study"]
    name = sorted(_launched(study))[0]
    load = json.loads((study / f"trials/{name}/load.json").read_text())
    summary = load["summary"]
    assert summary["completed"] == OBJECTIVE["workload"]["num_prompts"]  # type: ignore[index]
    assert summary["failed"] == 0
    assert summary["output_throughput"] > 0
    for key in ("p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "p95_itl_ms", "p95_tpot_ms", "p95_e2el_ms"):
        assert summary[key] > 0, key
    server_metrics = json.loads((study / f"trials/{name}/server_metrics.json").read_text())
    assert server_metrics["counters"]["vllm:generation_tokens"] >= summary["total_output_tokens"]
    # the KV capacity vLLM logged at start-up, which calibrates the feasibility model on a GPU node
    kv_tokens = server_metrics["kv_cache_tokens_per_rank"]
    assert kv_tokens > 0
    assert json.loads((study / f"trials/{name}/outcome.json").read_text())["kv_cache_tokens"] == kv_tokens


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: nothing to split")
def test_server_runs_on_its_cores_and_vllm_binds_its_threads_there(study_run: dict[str, Any]) -> None:
    trial = study_run["study"] / "trials" / sorted(_launched(study_run["study"]))[0]
    command = json.loads((trial / "command.json").read_text())
    cores = sorted(os.sched_getaffinity(0))
    assert command["cpus"] == {"server": cores[:-1], "client": cores[-1:], "bind_omp": True}
    bind = command["env"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert bind == format_cpu_list(cores[:-1])
    assert f"VLLM_CPU_OMP_THREADS_BIND={bind!r}" in (trial / "server.log").read_text()  # vLLM read it


def test_the_study_is_ranked_by_tokens_per_joule_from_the_power_it_read(study_run: dict[str, Any]) -> None:
    study: Path = study_run["study"]
    launched = [r for r in _first_rows(study) if r.get("tokens_per_joule")]
    assert len(launched) == 2, _first_rows(study)
    for row in launched:
        # constant power: tokens per joule is throughput over watts, and $/Mtok its price per token
        assert float(row["tokens_per_joule"]) == pytest.approx(float(row["output_throughput"]) / WATTS, rel=0.05)
        assert float(row["usd_per_mtok"]) == pytest.approx(PRICE / 3600 / (float(row["output_throughput"]) / 1e6),
                                                           rel=1e-6)
    report = (study / "report.md").read_text()
    assert "## Energy and cost" in report and "tokens per joule" in report


def test_a_confirmation_measures_every_repeat_cold(study_run: dict[str, Any]) -> None:
    """Two repeats on one server: the second starts where the first stopped, and no window hits the cache."""
    study: Path = study_run["study"]
    loads = sorted(study.glob("confirm/*/load.json"))
    assert loads, sorted(p.relative_to(study) for p in study.rglob("*") if "confirm" in str(p))
    load = json.loads(loads[0].read_text())
    assert len(load["repeats"]) == 2
    starts = [step["first_job"] for r in load["repeats"] for step in r["steps"]]
    assert starts == sorted(starts) and len(set(starts)) == len(starts) and starts[0] == 0, starts
    for repeat in load["repeats"]:
        assert repeat["refused_windows"] == []
        for step in repeat["steps"]:
            facts = step["server"]["facts"]
            assert facts["prefix_cache_queries"] > 0 and facts["prefix_cache_hits"] == 0, facts
            assert step["window_check"]["refused"] == []


def test_winner_is_exported_and_no_secret_leaks(study_run: dict[str, Any]) -> None:
    study: Path = study_run["study"]
    best = study / "best"
    profile = yaml.safe_load((best / "profile.yaml").read_text())
    identity = json.loads((best / "identity.json").read_text())
    assert profile["kv-cache-dtype"] == "auto"
    assert profile["host"] == "127.0.0.1"
    assert int(identity["trial"]) in {int(name) for name in _launched(study)}
    assert identity["objective"]["value"] > 0
    # confirmed, or exported under --accept-unconfirmed with its verdict and repeats kept
    assert identity["confirmation"] is not None and len(identity["confirmation"]["values"]) == 2
    assert identity["confirmation_status"] == ("confirmed" if identity["confirmed"] else "rejected")
    assert os.access(best / "serve.sh", os.X_OK)
    for path in study.rglob("*"):
        if path.is_file() and path.suffix != ".db":
            assert SENTINEL not in path.read_text(errors="replace"), path
    for proc in (study_run["proc"], study_run["verify"]):
        assert proc is not None and SENTINEL not in proc.stdout + proc.stderr


def test_verify_served_the_export_as_it_is_and_recorded_both_numbers(study_run: dict[str, Any]) -> None:
    record = study_run["record"]
    assert record is not None, study_run["verify"].stdout + study_run["verify"].stderr if study_run["verify"] else ""
    assert record["ok"] and record["ready_s"] > 0
    assert record["argv"][0] == "best/serve.sh" and record["argv"][1] == "--port"
    assert record["metric"] == "tokens_per_joule" and record["direction"] == "maximize"
    reported = record["reported"]
    assert reported["value"] > 0 and len(record["values"]) == 2
    assert record["median"] > 0 and record["delta"] == pytest.approx(record["median"] - reported["value"])
    conf = reported["confirmation_values"]
    assert len(conf) == 2  # confirmed or rejected, the confirmation's repeats are what verify is held to
    assert record["allowed"] == pytest.approx(max(conf) - min(conf))
    assert record["within"] == (abs(record["delta"]) <= record["allowed"])
    assert study_run["verify"].returncode == (0 if record["within"] else 1)
    for repeat in record["repeats"]:
        assert repeat["tokens_per_joule"] == pytest.approx(repeat["total_output_tokens"] / repeat["gpu_energy_j"])
        assert repeat["gpu_power_mean_w"] == pytest.approx(WATTS, rel=0.01)
    assert json.loads((study_run["study"] / "best" / "verify.json").read_text())["verdict"] == record["verdict"]


def test_the_re_served_server_was_stopped(study_run: dict[str, Any]) -> None:
    # a clean stop removes the server's pid record (nothing left for stop_orphans) and frees its port
    assert study_run["record"] is not None
    assert not (study_run["study"] / "verify" / "server.pid.json").exists()
    argv = study_run["record"]["argv"]
    port = int(argv[argv.index("--port") + 1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on the re-served port {port}"
    needle = b"--port\0" + str(port).encode() + b"\0"   # no process left with the re-served port in its argv
    live = [p.parent.name for p in Path("/proc").glob("[0-9]*/cmdline") if needle in _read(p)]
    assert not live, live


def test_resume_adds_trials_and_keeps_the_finished_ones(study_run: dict[str, Any]) -> None:
    study: Path = study_run["study"]
    before = {name: (study / f"trials/{name}/outcome.json").read_bytes() for name in _outcomes(study)}
    assert before
    proc = _cli("resume", STUDY, "--trials", "3", "--no-export", "--accept-unconfirmed", runs=study_run["runs"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(_launched(study)) == 3, _outcomes(study)
    assert _seqs(study) == [4, 8, 16]
    for name, blob in before.items():
        assert (study / f"trials/{name}/outcome.json").read_bytes() == blob


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
