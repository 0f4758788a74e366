"""Every run is files: a study folder, one folder per trial, JSON written atomically.

    runs/<study>/study.json        what was asked (resume reads it)
    runs/<study>/study.db          Optuna storage (SQLite)
    runs/<study>/profile.yaml      the hardware profile as it was when the study began
    runs/<study>/objective.yaml    the objective as it was when the study began
    runs/<study>/trials/<n>/       config.json, command.json, server.log, load.json,
                                   server_metrics.json, outcome.json
    runs/<study>/best/             the exported winner
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE)", re.I)
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def safe_env(env: dict[str, str]) -> dict[str, str]:
    """Environment fit to write down: values of secret-looking names are masked."""
    return {k: ("***" if SECRET_NAME.search(k) else v) for k, v in env.items()}


def study_dir(runs_dir: Path, name: str) -> Path:
    return runs_dir / name


def trial_dir(study_path: Path, number: int) -> Path:
    return study_path / "trials" / f"{number:04d}"
