"""scripts/gpu/collect.py and docs/evidence/h200x1/tables.py: from what the device calls return to the
write-up's tables. The study folder here is written by hand in the shapes the tool writes (trial records,
a confirmation, the re-serve), with vLLM 0.26's own start-up lines; the CPU rehearsal
(scripts/gpu/rehearse.sh) runs the same path on a real study."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "gpu"
STARTUP = """\
(EngineCore pid=2211) INFO 12-02 01:10:07 [backends.py:1156] Dynamo bytecode transform time: 2.95 s
(EngineCore pid=2211) INFO 12-02 01:10:08 [backends.py:394] Compiling a graph for compile range (1, 8192) takes 9.10 s
(EngineCore pid=2211) INFO 12-02 01:10:09 [monitor.py:53] torch.compile took 13.02 s in total
(EngineCore pid=2211) INFO 12-02 01:10:24 [gpu_model_runner.py:6845] Graph capturing finished in 14 secs, took 0.88 GiB
"""


def _step(concurrency: int, tok_s: float, kv: float, chosen_power: bool) -> dict[str, Any]:
    summary = {"output_throughput": tok_s, "p95_ttft_ms": 900.0, "p95_itl_ms": 41.0, "completed": concurrency,
               "failed": 0, "duration": 10.0, "total_output_tokens": tok_s * 10}
    server: dict[str, Any] = {"gauges": {"vllm:kv_cache_usage_perc": {"samples": 20, "mean": kv / 2, "max": kv},
                                         "vllm:num_requests_waiting": {"samples": 20, "mean": 1, "max": 5}},
                              "counters": {"vllm:num_preemptions": 3.0}}
    if chosen_power:
        summary.update({"gpu_power_mean_w": 600.0, "gpu_energy_j": 6000.0, "tokens_per_joule": tok_s * 10 / 6000,
                        "usd_per_mtok": 0.1})
        server["power"] = {"mean_w": 600.0, "max_w": 650.0, "energy_j": 6000.0, "energy_from": "counter"}
    return {"concurrency": concurrency, "feasible": True, "summary": summary, "server": server,
            "client": {"client_processes": 4, "client_cpu_share": 0.3, "client_saturated": False},
            "requests": [{"ok": True}] * 3}


def _study(root: Path) -> Path:
    study = root / "h200x1-tiny"
    args = {"max-num-seqs": 1024, "max-num-batched-tokens": 8192, "gpu-memory-utilization": 0.9,
            "kv-cache-dtype": "auto", "enforce-eager": False,
            "compilation-config": {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 512}}
    for kind, name in (("trials", "0000"), ("confirm", "0000")):
        d = study / kind / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"args": args}))
        (d / "outcome.json").write_text(json.dumps({"ok": True, "feasible": True, "value": 9000.0, "ready_s": 61.5,
                                                    "reason": "met every SLO", "duration_s": 95.0}))
        steps = [_step(64, 3000.0, 0.1, False), _step(1024, 9000.0, 0.97, True)]
        (d / "load.json").write_text(json.dumps({"repeats": [{"chosen_step": 1, "steps": steps}]}))
        (d / "server.log").write_text("(APIServer pid=1) INFO starting\n/root/stage/tiny-moe\n" + STARTUP)
    verify = {"ok": True, "ready_s": 40.1, "metric": "output_throughput", "median": 8950.0, "values": [8900.0, 9000.0],
              "within": True, "allowed": 200.0, "delta": -50.0, "delta_rel": -50 / 9000, "verdict": "within",
              "reported": {"value": 9000.0, "confirmed": True, "confirmation_values": [8900.0, 9100.0]},
              "steps": [{"chosen_step": 0, "steps": [_step(1024, 8950.0, 0.96, True)]}]}
    (study / "verify").mkdir()
    (study / "verify" / "verify.json").write_text(json.dumps(verify))
    (study / "best" / "evidence").mkdir(parents=True)
    (study / "best" / "serve.sh").write_text("#!/usr/bin/env bash\nexec vllm serve --config /root/stage/x\n")
    (study / "best" / "evidence" / "load.json").write_text((study / "trials" / "0000" / "load.json").read_text())
    (study / "report.md").write_text("# report\nmodel /root/stage/tiny-moe\n")
    with (study / "trials.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["number", "baseline", "value"])
        w.writerow(["0", "vllm-defaults", "9000.0"])
    return study


def test_collect_writes_the_claim_folder_and_tables_read_it(tmp_path: Path) -> None:
    study = _study(tmp_path)
    finish = tmp_path / "out4"
    finish.mkdir()
    subprocess.run([sys.executable, str(SCRIPTS / "pack.py"), str(study), str(finish / "study.tar.gz")], check=True,
                   capture_output=True)
    (finish / "timeline.txt").write_text("1000 finish start\n1100 verify\n")
    prepare = tmp_path / "out2"
    prepare.mkdir()
    (prepare / "capacity.json").write_text(json.dumps({"rows": [
        {"processes": 1, "concurrency": 1024, "chunks_per_s": 14000.0, "client_cpu_share": 0.97,
         "client_saturated": True},
        {"processes": 4, "concurrency": 1024, "chunks_per_s": 52000.0, "client_cpu_share": 0.6,
         "client_saturated": False}]}))
    (prepare / "prevalidate.txt").write_text("INFO noise\n[vllm-defaults] accepted (2.1 s)\nverdict: ok\n")
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps([{"call": 4, "what": "finish", "wall_s": 530, "held_s": 1600, "budget_left_s": 200}]))
    out = tmp_path / "evidence"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "collect.py"), "--prepare", str(prepare), "--finish",
                           str(finish), "--calls", str(calls), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    launches = list(csv.DictReader((out / "launches.csv").open()))
    assert [r["kind"] for r in launches] == ["screen", "confirm", "reserve"]
    assert launches[0]["compile_cache"] == "miss" and launches[0]["graph_capture_s"] == "14.0"
    assert launches[0]["baseline"] == "vllm-defaults" and launches[0]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    ladder = list(csv.DictReader((out / "ladder.csv").open()))
    assert len(ladder) == 5 and ladder[1]["kv_usage_max"] == "0.97" and ladder[1]["chosen"] == "True"
    for name in ("report.md", "best/serve.sh"):
        assert "/root/stage" not in (out / name).read_text()  # machine paths shortened
    assert "requests" not in json.loads((out / "best" / "evidence" / "load.json").read_text())["repeats"][0]["steps"][0]
    assert (out / "prevalidate.txt").read_text() == "[vllm-defaults] accepted (2.1 s)\nverdict: ok\n"
    assert json.loads((out / "gpu_time.json").read_text())["timeline"][1] == {"t_s": 100, "what": "verify"}

    spec = importlib.util.spec_from_file_location("h200x1_tables", REPO / "docs" / "evidence" / "h200x1" / "tables.py")
    assert spec is not None and spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    knee = tables.TABLES["knee"](out)
    assert "| 0000 | 1024 | 9,000 |" in knee and "97.0 %" in knee
    assert "vllm-defaults" in tables.TABLES["launches"](out) and "miss" in tables.TABLES["launches"](out)
    assert "15.00" in tables.TABLES["power"](out)  # 9,000 tok/s × 10 s / 6,000 J
    assert "| yes |" in tables.TABLES["verify"](out) and "-0.6 %" in tables.TABLES["verify"](out)
    assert "52,000" in tables.TABLES["capacity"](out) and "1600 s" in tables.TABLES["gpu_time"](out)
    assert tables.TABLES["knee"](tmp_path).startswith("(no data yet")
