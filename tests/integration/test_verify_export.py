"""The exported launch file, served again: ``dsv4-tune verify`` on a real vLLM (CPU build).

One small study as a user runs it (``--prevalidate auto``, the objective's gate, confirmation of the
top trial with repeats, the export), ranked by ``tokens_per_joule`` at a GPU-hour price. There is no
GPU here, so the power is read by the stand-in reader (``tests/standins/power_reader.py``, named so)
in place of NVML. Then ``verify`` starts ``best/serve.sh`` as it is, measures it with the
confirmation's workload, and records both numbers.
"""

from __future__ import annotations

import csv
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.standins.power_reader import StandInPowerReader
from tuner.cli.main import main as dsv4_tune

pytestmark = [pytest.mark.server, pytest.mark.slow]

STUDY = "verify-e2e"
WATTS = 250.0
PRICE = 3.5
PROFILE = {
    "name": "cpu-verify",
    "description": "cpu profile for the re-serve test",
    "hardware": {"accelerator": "cpu", "device_name": "x86-64 CPU", "device_count": 1, "memory_per_device_gb": 1},
    "server": {"ready_timeout_s": 240, "client_cpus": 1,
               "fixed": {"max-model-len": 1024, "enforce-eager": True, "dtype": "bfloat16"},
               "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}},
    "levers": {"max-num-seqs": {"choices": [8, 16]}},
    "baselines": [{"name": "sixteen", "values": {"max-num-seqs": 16}}],
}
OBJECTIVE = {
    "name": "joules-e2e", "metric": "tokens_per_joule",  # direction left out: an energy metric has one
    "slos": {"p95_ttft_ms": 60000, "p95_itl_ms": 5000}, "guards": ["equivalence"],
    "workload": {"input_len": 64, "output_len": 32, "num_prompts": 16, "concurrency": 4, "warmup_prompts": 1},
}


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("verify")
    (root / "cpu-verify.yaml").write_text(yaml.safe_dump(PROFILE))
    (root / "joules.yaml").write_text(yaml.safe_dump(OBJECTIVE))
    runs = root / "runs"
    reader = StandInPowerReader(watts=WATTS, gpus=1)
    with pytest.MonkeyPatch.context() as mp:
        for where in ("tuner.study.record", "tuner.study.study", "tuner.verify"):
            mp.setattr(f"{where}.detect_power_reader", lambda: reader)
        run_rc = dsv4_tune(["run", "--hw", str(root / "cpu-verify.yaml"), "--objective", str(root / "joules.yaml"),
                            "--trials", "1", "--study", STUDY, "--model", str(demo_model),
                            "--confirm-top-k", "1", "--confirm-repeats", "2", "--gpu-hour-usd", str(PRICE),
                            "--runs-dir", str(runs)])
        study = runs / STUDY
        export_rc = None
        if not (study / "best" / "serve.sh").is_file():
            # A busy 2-core machine can make two repeats disagree (a rejected confirmation, exit 3): the
            # best screening trial is then exported on request, labelled with its rejected repeats.
            export_rc = dsv4_tune(["export", STUDY, "--runs-dir", str(runs), "--accept-unconfirmed"])
        verify_rc = dsv4_tune(["verify", STUDY, "--runs-dir", str(runs)])
    return {"run_rc": run_rc, "export_rc": export_rc, "verify_rc": verify_rc, "study": study, "reader": reader,
            "record": json.loads((study / "verify" / "verify.json").read_text())}


def test_the_study_ranked_by_tokens_per_joule_and_exported(verified: dict[str, Any]) -> None:
    study: Path = verified["study"]
    assert verified["run_rc"] in (0, 3), (study / "trials.csv").read_text() if (study / "trials.csv").exists() else ""
    assert verified["export_rc"] in (None, 0)
    rows = list(csv.DictReader((study / "trials.csv").open()))
    launched = [r for r in rows if r.get("tokens_per_joule")]
    assert launched, rows
    for row in launched:
        # constant stand-in power: tokens per joule is throughput over watts, and $/Mtok its price per token
        assert float(row["tokens_per_joule"]) == pytest.approx(float(row["output_throughput"]) / WATTS, rel=0.05)
        assert float(row["usd_per_mtok"]) == pytest.approx(PRICE / 3600 / (float(row["output_throughput"]) / 1e6),
                                                           rel=1e-6)
    assert (study / "best" / "serve.sh").is_file()
    report = (study / "report.md").read_text()
    assert "## Energy and cost" in report and "tokens per joule" in report


def test_verify_served_the_export_as_it_is_and_recorded_both_numbers(verified: dict[str, Any]) -> None:
    record = verified["record"]
    assert record["ok"] and record["ready_s"] > 0
    assert record["argv"][0] == "best/serve.sh" and record["argv"][1:3][0] == "--port"
    assert record["metric"] == "tokens_per_joule" and record["direction"] == "maximize"
    reported = record["reported"]
    assert reported["value"] > 0 and len(record["values"]) == 2
    assert record["median"] > 0 and record["delta"] == pytest.approx(record["median"] - reported["value"])
    conf = reported["confirmation_values"]
    assert len(conf) == 2  # confirmed or rejected, the confirmation's repeats are what verify is held to
    assert record["allowed"] == pytest.approx(max(conf) - min(conf))
    assert record["within"] == (abs(record["delta"]) <= record["allowed"])
    assert verified["verify_rc"] == (0 if record["within"] else 1)
    for repeat in record["repeats"]:
        assert repeat["tokens_per_joule"] == pytest.approx(repeat["total_output_tokens"] / repeat["gpu_energy_j"])
        assert repeat["gpu_power_mean_w"] == pytest.approx(WATTS, rel=0.01)
    assert json.loads((verified["study"] / "best" / "verify.json").read_text())["verdict"] == record["verdict"]


def test_the_re_served_server_was_stopped(verified: dict[str, Any]) -> None:
    # a clean stop removes the server's pid record (nothing left for stop_orphans) and frees its port
    assert not (verified["study"] / "verify" / "server.pid.json").exists()
    argv = verified["record"]["argv"]
    port = int(argv[argv.index("--port") + 1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on the re-served port {port}"
    needle = b"--port\0" + str(port).encode() + b"\0"   # no process left with the re-served port in its argv
    live = [p.parent.name for p in Path("/proc").glob("[0-9]*/cmdline") if needle in _read(p)]
    assert not live, live


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
