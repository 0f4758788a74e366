"""Run the README's demo as a new user would, and keep what it took: ``demo.json`` beside this file.

    flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/cpu-demo/run.py

runs ``dsv4-tune --hw cpu --objective throughput --trials 4`` (the README's first command after setup)
in a fresh runs folder (so the demo model is copied out as on a new machine) and records the wall time,
the exit code, the machine (CPU model, cores, whether it has AVX-512) and its load (the 1-minute load
average before, every 10 s during, and after), and per launch (trials, controls, confirmations): its
class, when it was ready, how long it took, and its throughput, with where its time went, read from the
launch's own files: to ready (``outcome.json``), the gates (``guards.json``, each gate's ``elapsed_s``),
the measured windows (``load.json``, each window's ``duration``) and the rest (warm-up, metrics, stopping
the server). What no launch accounts for (imports, copying the model, the pre-launch checks, the report
and the export) is the wall time less the launches'. ``tables.py`` turns it into the README's timing rows
and the breakdown. Paths are not kept.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
COMMAND = ["--hw", "cpu", "--objective", "throughput", "--trials", "4"]


def _json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def _launch(outcome_path: Path) -> dict[str, Any]:
    folder = outcome_path.parent
    outcome = _json(outcome_path)
    summary = outcome.get("summary") or {}
    gates = [r for r in _json(folder / "guards.json").get("results", [])]
    windows = [step for repeat in _json(folder / "load.json").get("repeats", []) for step in repeat.get("steps", [])]
    return {"launch": folder.parent.name + "/" + folder.name,
            "ok": outcome.get("ok"), "failure_class": outcome.get("failure_class"),
            "ready_s": None if outcome.get("ready_s") is None else round(float(outcome["ready_s"]), 1),
            "duration_s": round(float(outcome["duration_s"]), 1),
            "gates_s": round(sum(float(r.get("evidence", {}).get("elapsed_s", 0.0)) for r in gates), 1),
            "windows_s": round(sum(float(w["summary"].get("duration", 0.0)) for w in windows), 1),
            "windows": [{"concurrency": w["concurrency"], "duration_s": round(float(w["summary"]["duration"]), 2),
                         "output_throughput": round(float(w["summary"].get("output_throughput", 0.0)), 1),
                         "client_loop_lag_p99_ms": round(float(w["client"]["client_loop_lag_p99_ms"]), 1),
                         "client_starved": w["client"].get("client_starved")} for w in windows],
            "repeat_values": [round(float(v), 1) for v in outcome.get("repeat_values") or ()],
            "output_throughput": None if summary.get("output_throughput") is None
            else round(float(summary["output_throughput"]), 1)}


def _avx512() -> bool:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    return any(line.startswith("flags") and " avx512f" in line for line in lines)


class _LoadSampler(threading.Thread):
    """The 1-minute load average every ``every_s`` seconds, while the demo runs (other work on the machine)."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.samples.append(round(os.getloadavg()[0], 2))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cpu-demo-") as tmp:
        runs = Path(tmp) / "runs"
        load_before = os.getloadavg()[0]
        sampler = _LoadSampler()
        sampler.start()
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "tuner.cli", *COMMAND, "--study", "demo", "--runs-dir", str(runs)],
                              cwd=REPO, capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        wall_s = time.monotonic() - started
        sampler.done.set()
        study = runs / "demo"
        launches = [_launch(p) for p in sorted(study.glob("trials/*/outcome.json"))]
        launches += [_launch(p) for p in sorted(study.glob("confirm/*/outcome.json"))]
        table = study / "trials.csv"
        rows = list(csv.DictReader(table.open(encoding="utf-8"))) if table.is_file() else []
        identity = study / "best" / "identity.json"
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=False).stdout.strip()
        data = {"command": "dsv4-tune " + " ".join(COMMAND), "date": dt.date.today().isoformat(), "commit": commit,
                "machine": {"cpus": len(os.sched_getaffinity(0)), "cpu_model": _cpu_model(), "avx512": _avx512(),
                            "nice": os.nice(0),
                            "load_average_1m_before": round(load_before, 2),
                            "load_average_1m_during": sampler.samples,
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
