"""Every run is files: a study folder, one folder per trial, JSON written atomically.

    runs/<study>/study.json        what was asked (resume reads it)
    runs/<study>/study.db          Optuna storage (SQLite)
    runs/<study>/hardware_profile.yaml   the hardware profile as it was when the study began
                                   (older studies call it ``profile.yaml``; still read)
    runs/<study>/objective.yaml    the objective as it was when the study began
    runs/<study>/trials/<n>/       config.json, command.json, server.log, load.json,
                                   server_metrics.json, outcome.json (launched trials only)
    runs/<study>/pruned.jsonl      one line per proposal refused before launch (it has no folder)
    runs/<study>/best/             the exported winner
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuner.errors import DiskFullError

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE)", re.I)
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

PROFILE_SNAPSHOT = "hardware_profile.yaml"
"""The study's copy of its hardware profile (not ``profile.yaml``: that is the exported launch file)."""
OLD_PROFILE_SNAPSHOT = "profile.yaml"
"""Where studies made before the rename keep that copy; read on resume, never written."""
OBJECTIVE_SNAPSHOT = "objective.yaml"


@contextlib.contextmanager
def _disk_full_is_an_error(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL_ERRNOS:
            raise DiskFullError(path, exc) from exc
        raise


def _atomic_write(path: Path, write: Callable[[Any], None], *, mode: int | None = None) -> None:
    """Temp file beside ``path``, fsync, rename: a reader sees the old file or the new one, never half."""
    with _disk_full_is_an_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a file.

    A full disk raises :class:`DiskFullError` (a TunerError naming the file and the fix), never a
    bare OSError.
    """
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    _atomic_write(path, lambda fh: fh.write(text))


def write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write text atomically; ``mode`` sets the permission bits (``serve.sh`` is 0o755)."""
    _atomic_write(path, lambda fh: fh.write(text), mode=mode)


def append_line(path: Path, line: str) -> None:
    """Append one line to a log of records (``pruned.jsonl``), as one ``O_APPEND`` write, then fsync.

    Writers on one node (workers sharing a runs dir) never interleave inside a line; a reader sees whole
    lines plus at most a torn last one. A full disk raises :class:`DiskFullError`.
    """
    data = (line.rstrip("\n") + "\n").encode()
    with _disk_full_is_an_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: finish it (only a full disk makes one)
                os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def safe_env(env: dict[str, str]) -> dict[str, str]:
    """Environment fit to write down: values of secret-looking names are masked."""
    return {k: ("***" if SECRET_NAME.search(k) else v) for k, v in env.items()}


_API_KEYS: dict[str, str] = {}
API_KEY_ENV = "DSV4_TUNE_API_KEY"
"""An operator's API key for every launch (never written down); unset: one random key per study and process."""


def study_api_key(study_path: Path) -> str:
    """The API key every launch of a study is served with in this process: made once, kept in memory only.

    One key per study, not per launch: vLLM 0.26 hashes every ``VLLM_*`` variable it does not list as
    ignored into its torch.compile cache key, ``VLLM_API_KEY`` included, so a fresh key per launch made
    every launch on the H200 compile again (four launches, four cache folders: docs/evidence/h200.md).
    It is never written down (command files mask it, the export leaves it out), so a resumed study, a new
    process, makes a new one: one compile more, and no secret on disk. The H200 run of issue 31 was
    such a night: screening, confirmation and verify ran as separate calls, six compiled launches whose
    argv differed only in ``--port`` each got a new compile key, because each process drew a new key.
    ``DSV4_TUNE_API_KEY`` in the tuner's environment, where set, is the key of every launch of every
    process instead: nothing is written down and every relaunch with the same flags hashes the same.
    """
    given = os.environ.get(API_KEY_ENV, "").strip()
    if given:  # the operator's key: the same in every process, so a resumed study hits the compile cache
        return given
    return _API_KEYS.setdefault(str(study_path.resolve()), secrets.token_urlsafe(24))


def study_dir(runs_dir: Path, name: str) -> Path:
    return runs_dir / name


def trial_dir(study_path: Path, number: int) -> Path:
    return study_path / "trials" / f"{number:04d}"


def profile_snapshot(study_path: Path) -> Path:
    """The study's hardware-profile snapshot: the new name, or the old one in a study made before it."""
    new = study_path / PROFILE_SNAPSHOT
    old = study_path / OLD_PROFILE_SNAPSHOT
    return old if not new.exists() and old.exists() else new
