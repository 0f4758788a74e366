"""Log lines in vLLM's format, on stdout, as ``vllm serve`` prints them.

vLLM's logger writes ``(<process> pid=<pid>) <LEVEL> <MM-DD HH:MM:SS> [<file>:<line>] <message>``;
uvicorn writes ``INFO:     <client> - "<request line>" <status>``; progress bars and tracebacks are
plain lines. The emulator is one process: its engine cores and workers get made-up pids beside its
own, named as vLLM names them (``EngineCore_DP0``, ``Worker_TP0``, ``Worker_DP1_TP0_EP1`` …).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

__all__ = ["VllmLog"]


class VllmLog:
    """Writes vLLM-shaped lines to ``stream`` (stdout by default), flushed line by line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.pid = os.getpid()

    def pid_of(self, process: str) -> int:
        if process == "APIServer":
            return self.pid
        return self.pid + 1 + (sum(ord(c) for c in process) % 997)

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away; nothing to tell it
            pass

    def record(self, level: str, process: str, where: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self._write(f"({process} pid={self.pid_of(process)}) {level} {stamp} [{where}] {message}")

    def info(self, process: str, where: str, message: str) -> None:
        self.record("INFO", process, where, message)

    def warning(self, process: str, where: str, message: str) -> None:
        self.record("WARNING", process, where, message)

    def error(self, process: str, where: str, message: str) -> None:
        self.record("ERROR", process, where, message)

    def plain(self, process: str | None, text: str) -> None:
        """Lines vLLM does not format (progress bars, tracebacks), with the process prefix if given."""
        for line in text.splitlines() or [""]:
            self._write(f"({process} pid={self.pid_of(process)}) {line}" if process else line)

    def access(self, peer: str, method: str, path: str, status: int, reason: str) -> None:
        self._write(f'INFO:     {peer} - "{method} {path} HTTP/1.1" {status} {reason}')
