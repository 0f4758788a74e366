"""Failure classes, and reading them off a server log.

Every trial that does not produce a score carries one of these classes and the line of evidence
that decided it. The list is documented in docs/failure-classes.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FailureClass(str, Enum):
    BAD_FLAG = "bad_flag"            # vLLM rejected an option or a value at parse/config time
    OOM = "oom"                      # device or host memory, KV cache does not fit
    TIMEOUT = "timeout"              # not ready within ready_timeout_s
    CRASH = "crash"                  # exited during startup for another reason
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
    (FailureClass.OOM, re.compile(
        r"out of memory|OutOfMemoryError|CUDA error: out of memory|cannot allocate memory|"
        r"less than desired .*memory|No available memory for the cache blocks|"
        r"insufficient .*memory|not enough (?:KV cache|memory)|larger than the available KV cache|"
        r"MemoryError", re.I)),
    (FailureClass.BAD_FLAG, re.compile(
        r"error: (?:argument|unrecognized arguments|the following arguments)|invalid choice|"
        r"ValidationError|validation error|ValueError|TypeError: .*argument|NotImplementedError|"
        r"^\S*(?:Error|Exception): .*(?:is not supported|unsupported)", re.I)),
]


@dataclass(frozen=True)
class Diagnosis:
    failure_class: FailureClass
    reason: str


def classify_startup_failure(log_tail: str, returncode: int | None) -> Diagnosis:
    """Decide why a server ended before it was ready, from the end of its log."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    for failure_class, pattern in _PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return Diagnosis(failure_class, _clip(line))
    code = f"exit code {returncode}" if returncode is not None else "no exit code"
    last = lines[-1] if lines else "(empty log)"
    return Diagnosis(FailureClass.CRASH, _clip(f"{code}; last log line: {last}"))


def _clip(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
