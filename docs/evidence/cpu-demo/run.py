"""Run the README's demo as a new user would, and keep what it took: ``demo.json`` beside this file.

    flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/cpu-demo/run.py

runs ``dsv4-tune --hw cpu --objective throughput --trials 4`` (the README's first command after setup)
in a fresh runs folder (so the demo model is copied out as on a new machine) and records the wall time,
the exit code, the machine's load, and per launch (trials, controls, confirmations): its class, when it
was ready, how long it took, and its throughput. ``tables.py`` turns it into the README's timing rows.
Paths are not kept.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
COMMAND = ["--hw", "cpu", "--objective", "throughput", "--trials", "4"]


def _launch(outcome_path: Path) -> dict[str, Any]:
    outcome = json.loads(outcome_path.read_text(encoding="utf-8"))
    summary = outcome.get("summary") or {}
    return {"launch": outcome_path.parent.parent.name + "/" + outcome_path.parent.name,
            "ok": outcome.get("ok"), "failure_class": outcome.get("failure_class"),
            "ready_s": None if outcome.get("ready_s") is None else round(float(outcome["ready_s"]), 1),
            "duration_s": round(float(outcome["duration_s"]), 1),
            "output_throughput": None if summary.get("output_throughput") is None
            else round(float(summary["output_throughput"]), 1)}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cpu-demo-") as tmp:
        runs = Path(tmp) / "runs"
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "tuner.cli", *COMMAND, "--study", "demo", "--runs-dir", str(runs)],
                              cwd=REPO, capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall_s = time.monotonic() - started
        study = runs / "demo"
        launches = [_launch(p) for p in sorted(study.glob("trials/*/outcome.json"))]
        launches += [_launch(p) for p in sorted(study.glob("confirm/*/outcome.json"))]
        table = study / "trials.csv"
        rows = list(csv.DictReader(table.open(encoding="utf-8"))) if table.is_file() else []
        identity = study / "best" / "identity.json"
        data = {"command": "dsv4-tune " + " ".join(COMMAND), "date": dt.date.today().isoformat(),
                "machine": {"cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(),
                            "load_average_1m_before": round(load_before, 2),
                            "load_average_1m_after": round(os.getloadavg()[0], 2)},
                "exit_code": proc.returncode, "wall_s": round(wall_s, 1),
                "trials_csv": [{k: r.get(k) for k in ("number", "state", "baseline", "speculative", "feasible",
                                                      "failure_class", "output_throughput", "ready_s", "duration_s")}
                               for r in rows],
                "launches": launches,
                "exported": identity.is_file(),
                "confirmation_status": json.loads(identity.read_text())["confirmation_status"]
                if identity.is_file() else None,
                "last_lines": [line.replace(str(runs), "runs") for line in proc.stdout.strip().splitlines()[-6:]]}
        (HERE / "demo.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"demo: exit {proc.returncode} in {wall_s:.0f} s; wrote {(HERE / 'demo.json').relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
