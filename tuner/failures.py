"""Failure classes, and reading them off a server log.

Every trial that does not produce a score carries one of these classes and the line of evidence
that decided it. The list is documented in docs/failure-classes.md.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from enum import Enum


class FailureClass(str, Enum):
    BAD_FLAG = "bad_flag"            # vLLM rejected an option or a value at parse/config time
    OOM = "oom"                      # device or host memory, KV cache does not fit
    TIMEOUT = "timeout"              # not ready within ready_timeout_s
    CRASH = "crash"                  # exited during startup for another reason (incl. killed by a signal)
    DISK_FULL = "disk_full"          # the server could not write (caches, logs): no space left on device
    DIED_DURING_LOAD = "died_during_load"  # server process ended while the load ran
    UNHEALTHY = "unhealthy"          # /health stopped answering 200 while the load ran
    PORT_IN_USE = "port_in_use"
    INFEASIBLE = "infeasible"        # pruned before launch by the feasibility model
    GUARD_FAILED = "guard_failed"    # a correctness gate failed
    SLO_VIOLATED = "slo_violated"    # ran fine, missed an SLO (recorded as constraint, not failure)
    LOAD_ERRORS = "load_errors"      # too many failed requests in the load run
    INTERRUPTED = "interrupted"      # the tuner was stopped during this trial


_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.PORT_IN_USE, re.compile(r"address already in use", re.I)),
    (FailureClass.DISK_FULL, re.compile(r"No space left on device|Disk quota exceeded|\bENOSPC\b", re.I)),
    (FailureClass.OOM, re.compile(
        r"out of memory|OutOfMemoryError|CUDA error: out of memory|cannot allocate memory|"
        r"less than (?:desired|requested) .*memory|No available memory for the cache blocks|"
        r"insufficient .*memory|not enough (?:KV cache|memory)|larger than the available KV cache|"
        r"MemoryError", re.I)),
    (FailureClass.BAD_FLAG, re.compile(
        r"error: (?:argument|unrecognized arguments|the following arguments)|invalid choice|"
        r"ValidationError|validation error|ValueError|TypeError: .*argument|NotImplementedError|"
        r"is not supported|unsupported", re.I)),
]

# Lines that never decide a failure: log records below ERROR (vLLM prints many WARNINGs that say
# "not supported" or mention OSError on a healthy start), Python warnings, and torch's C++ warnings.
_BENIGN = re.compile(
    r"^(?:\([^)]*\)\s*)?(?:DEBUG|INFO|WARNING|WARN)\b"
    r"|\b(?:User|Future|Deprecation|Runtime|Resource)Warning:"
    r"|^warnings\.warn\("
    r"|^(?:\[rank\d+\]:)?\[W\d{4} ")  # torch C++ warnings; rank-prefixed under torch.distributed

# How much of the log end classification reads: vLLM prints the root cause of a failed engine
# start (a worker's ValueError) well above the API server's own traceback.
CLASSIFY_TAIL_BYTES = 65536


@dataclass(frozen=True)
class Diagnosis:
    failure_class: FailureClass
    reason: str


def describe_returncode(returncode: int | None) -> str:
    """``-9`` → ``killed by SIGKILL``; ``1`` → ``exit code 1``."""
    if returncode is None:
        return "no exit code"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the kernel OOM killer sends SIGKILL: check `dmesg`)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exit code {returncode}"


def classify_startup_failure(log_tail: str, returncode: int | None) -> Diagnosis:
    """Decide why a server ended before it was ready, from the end of its log.

    Only lines that can carry an error are read (log records at ERROR or above, tracebacks,
    argparse messages); a WARNING that says "not supported" on a start that then crashed for
    another reason does not make the crash a bad flag.
    """
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    evidence = [ln for ln in lines if not _BENIGN.search(ln)]
    for failure_class, pattern in _PATTERNS:
        for line in reversed(evidence):
            if pattern.search(line):
                return Diagnosis(failure_class, _clip(line))
    last = evidence[-1] if evidence else (lines[-1] if lines else "(empty log)")
    return Diagnosis(FailureClass.CRASH, _clip(f"{describe_returncode(returncode)}; last log line: {last}"))


_LOG_RECORD = re.compile(r"^(?:\([^)]*\)\s*)?(?:INFO|WARNING|WARN|ERROR)\s+\S+\s+\S+\s+\[[^\]]+\]\s*(.*)$")


def describe_stall(log_tail: str) -> str:
    """Where a server that never became ready got to: its last log record, for a TIMEOUT reason.

    On a GPU a start can stall after torch.compile (CUDA-graph capture, collective setup, KV sizing);
    the last record says which, e.g. ``torch.compile took 16.19 s in total`` or vLLM's
    ``No available shared memory broadcast block found in 60 seconds`` (a worker hangs).
    """
    for line in reversed([ln.strip() for ln in log_tail.splitlines() if ln.strip()]):
        match = _LOG_RECORD.match(line)
        if match and match.group(1):
            return _clip(match.group(1), 300)
    return ""


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
