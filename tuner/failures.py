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
    HANG = "hang"                    # the start-up log made no progress for startup_stall_s (watchdog)
    CRASH = "crash"                  # exited (at start-up, or under load) for another reason (incl. a signal)
    NCCL = "nccl"                    # a collective failed or timed out (NCCL error, watchdog timeout)
    ASSERTION = "assertion"          # an assertion in the engine or a kernel (AssertionError, device-side assert)
    DISK_FULL = "disk_full"          # the server could not write (caches, logs): no space left on device
    DIED_DURING_LOAD = "died_during_load"  # server process ended while serving; its log names no cause
    UNHEALTHY = "unhealthy"          # /health stopped answering 200 while serving; its log names no cause
    PORT_IN_USE = "port_in_use"
    INFEASIBLE = "infeasible"        # pruned before launch by the feasibility model
    GUARD_FAILED = "guard_failed"    # a correctness gate failed
    SLO_VIOLATED = "slo_violated"    # ran fine, missed an SLO (recorded as constraint, not failure)
    LOAD_ERRORS = "load_errors"      # too many failed requests in the load run
    INTERRUPTED = "interrupted"      # the tuner was stopped during this trial
    INVALID_WINDOW = "invalid_window"  # the server's counters contradict the workload (a random workload hit
    #                                    the prefix cache): the measurement is refused (tuner/load/freshness.py)


START_FAILURES = frozenset({FailureClass.BAD_FLAG, FailureClass.OOM, FailureClass.TIMEOUT, FailureClass.HANG,
                            FailureClass.CRASH, FailureClass.NCCL, FailureClass.ASSERTION})
"""Classes of a launch that never became ready because of its flags: a configuration with the same base
flags (a speculative twin of it) would fail the same way, so it is not launched. Not here: a port
someone held, a full disk, an interrupt (the node's or the tuner's fault, not the flags')."""

SERVING_CRASHES = frozenset({FailureClass.OOM, FailureClass.NCCL, FailureClass.ASSERTION, FailureClass.CRASH,
                             FailureClass.DISK_FULL, FailureClass.DIED_DURING_LOAD, FailureClass.UNHEALTHY})
"""Classes of a server that was ready and then died or stopped answering (during the gates or the load)."""


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
