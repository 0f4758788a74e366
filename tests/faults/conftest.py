"""Helpers for the fault suite: drive `python -m tuner.cli` as a real process and watch it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
SENTINEL = "hf_fault_sentinel_do_not_leak_0123456789"


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_TOKEN": SENTINEL, "PYTHONUNBUFFERED": "1", "COLUMNS": "250", **extra}


class Tuner:
    """One `dsv4-tune` process; its output is collected line by line as it runs."""

    def __init__(self, *args: str, runs: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", *args, "--runs-dir", str(runs)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env or cli_env(), cwd=REPO)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> bool:
        """True once a line matches ``pattern``; False on timeout or when the tuner has exited."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            lines = list(self.lines)
            if any(regex.search(line) for line in lines[seen:]):
                return True
            seen = max(0, len(lines) - 1)
            if self.proc.poll() is not None and not self._reader.is_alive():
                return any(regex.search(line) for line in self.lines)
            time.sleep(0.2)
        return False

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def wait_file(path: Path, timeout_s: float, proc: subprocess.Popen[str] | None = None) -> dict[str, Any] | None:
    """The JSON in ``path`` once it exists (None on timeout or if ``proc`` exits first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return data
        except (OSError, ValueError):
            pass
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.2)
    return None


def listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) that listen on ``port``."""
    out: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            addr, _, hex_port = parts[1].rpartition(":")
            if parts[3] == "0A" and int(hex_port, 16) == port:
                out.append(addr)
    return out


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def files_containing(root: Path, needle: str) -> list[Path]:
    """Every file under ``root`` (any kind, the SQLite DB included) whose bytes contain ``needle``."""
    hits: list[Path] = []
    blob = needle.encode()
    for path in root.rglob("*"):
        if path.is_file() and blob in path.read_bytes():
            hits.append(path)
    return hits
