"""Failure classes: why a trial produced no score.

Every trial that does not produce a score carries one of these classes and the line of evidence
that decided it. The list is documented in docs/failure-classes.md. Reading a class off a server's
log is the engine's (``Engine.diagnose_startup``; vLLM's patterns are in
:mod:`tuner.engines.vllm.logs`); :func:`generic_startup_failure` is what is left without one.
"""

from __future__ import annotations

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
    INVALID_WINDOW = "invalid_window"  # the server's counters contradict the workload (a random workload hit
    #                                    the prefix cache): the measurement is refused (tuner/load/freshness.py)


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


def generic_startup_failure(log_tail: str, returncode: int | None) -> Diagnosis:
    """A server that ended before it was ready, read without an engine's patterns: a crash, with its exit."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    last = lines[-1] if lines else "(empty log)"
    return Diagnosis(FailureClass.CRASH, clip(f"{describe_returncode(returncode)}; last log line: {last}"))


def clip(text: str, limit: int = 400) -> str:
    """``text`` cut to ``limit`` characters, an ellipsis marking the cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
