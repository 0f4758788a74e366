"""scripts/gpu/pack.py: a study folder always comes back from the device, under the size limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

PACK = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "pack.py"


def _study(root: Path, requests: int) -> Path:
    study = root / "h200x1-tiny"
    trial = study / "trials" / "0000"
    trial.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"name": "h200x1-tiny"}))
    step = {"concurrency": 64, "summary": {"output_throughput": 1.0},
            "requests": [{"ok": True, "error": os.urandom(64).hex()} for _ in range(requests)]}
    (trial / "load.json").write_text(json.dumps({"summary": {}, "repeats": [{"steps": [step]}]}))
    (trial / "server.log").write_bytes(os.urandom(300_000).hex().encode())
    return study


def _pack(study: Path, out: Path, max_mib: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PACK), str(study), str(out), "--max-mib", str(max_mib)],
                          capture_output=True, text=True, check=False)


def test_a_study_that_fits_is_packed_whole(tmp_path: Path) -> None:
    study = _study(tmp_path, requests=10)
    proc = _pack(study, tmp_path / "study.tar.gz", 15)
    assert proc.returncode == 0 and "whole" in proc.stdout
    with tarfile.open(tmp_path / "study.tar.gz") as tar:
        load = json.load(tar.extractfile("h200x1-tiny/trials/0000/load.json"))  # type: ignore[arg-type]
    assert len(load["repeats"][0]["steps"][0]["requests"]) == 10


def test_an_oversized_study_loses_its_per_request_records_then_log_heads_and_says_so(tmp_path: Path) -> None:
    study = _study(tmp_path, requests=20_000)  # ~2.6 MB of random text: does not compress
    proc = _pack(study, tmp_path / "study.tar.gz", 0.2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "study.tar.gz").stat().st_size <= 0.2 * 1024 * 1024
    with tarfile.open(tmp_path / "study.tar.gz") as tar:
        load = json.load(tar.extractfile("h200x1-tiny/trials/0000/load.json"))  # type: ignore[arg-type]
        note = tar.extractfile("h200x1-tiny/PACKED.txt").read().decode()  # type: ignore[union-attr]
        log = tar.extractfile("h200x1-tiny/trials/0000/server.log").read()  # type: ignore[union-attr]
    step = load["repeats"][0]["steps"][0]
    assert "requests" not in step and step["summary"]["output_throughput"] == 1.0
    assert "20000 requests" in note and "cut to their last" in note
    assert log.startswith(b"[... cut by pack.py")
    assert len(json.loads((study / "trials" / "0000" / "load.json").read_text())["repeats"][0]["steps"][0]
               ["requests"]) == 20_000  # the study itself is left whole
