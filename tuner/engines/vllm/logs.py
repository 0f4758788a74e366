"""Reading vLLM's server log: why a start failed, where a slow start got to, how much KV it allocated.

- :func:`classify_startup_failure`: the failure class of a server that ended before it was ready,
  from the end of its log (only lines that can carry an error are read).
- :func:`describe_stall`: the last log record of a server that never became ready (a TIMEOUT's reason).
- :func:`kv_tokens_from_log`: the KV capacity per rank vLLM states at start-up
  (``GPU KV cache size: N tokens``); the feasibility model refits itself to it.
"""

from __future__ import annotations

import re

from tuner.failures import Diagnosis, FailureClass, clip, describe_returncode

__all__ = ["CLASSIFY_TAIL_BYTES", "classify_startup_failure", "describe_stall", "kv_tokens_from_log"]

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
                return Diagnosis(failure_class, clip(line))
    last = evidence[-1] if evidence else (lines[-1] if lines else "(empty log)")
    return Diagnosis(FailureClass.CRASH, clip(f"{describe_returncode(returncode)}; last log line: {last}"))


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
            return clip(match.group(1), 300)
    return ""


_KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")  # "GPU KV cache size: 1,048,576 tokens, ..."


def kv_tokens_from_log(text: str) -> int | None:
    """The KV capacity per rank a vLLM server log states (the smallest engine's under DP), if any."""
    found = [int(m.group(1).replace(",", "")) for m in _KV_LINE.finditer(text)]
    return min(found) if found else None
