"""Reading vLLM's server log: why a start failed, where a slow start got to, how much KV it allocated.

- :func:`classify_startup_failure`: the failure class of a server that ended before it was ready,
  from the end of its log (only lines that can carry an error are read).
- :func:`describe_stall`: the last progress line of a server that never became ready (a TIMEOUT's or
  a HANG's reason).
- :func:`is_progress`: whether a start-up log line shows the start moving on (the start-up watchdog
  of :mod:`tuner.engines.process`); vLLM's "No available shared memory broadcast block" does not.
- :func:`classify_crash`: the failure class of a server that was ready and then died or stopped
  answering (OOM, NCCL, assertion), from the log it wrote after it became ready.
- :func:`kv_tokens_from_log`: the KV capacity per rank vLLM states at start-up
  (``GPU KV cache size: N tokens``); the feasibility model refits itself to it.
"""

from __future__ import annotations

import re

from tuner.failures import Diagnosis, FailureClass, clip, describe_returncode

__all__ = ["CLASSIFY_TAIL_BYTES", "classify_crash", "classify_startup_failure", "describe_stall", "is_progress",
           "kv_tokens_from_log"]

_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|\bENOSPC\b", re.I)
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|CUDA error: out of memory|cannot allocate memory|"
    r"less than (?:desired|requested) .*memory|No available memory for the cache blocks|"
    r"insufficient .*memory|not enough (?:KV cache|memory)|larger than the available KV cache|"
    r"MemoryError", re.I)
_NCCL = re.compile(
    r"NCCL error|nccl(?:UnhandledCuda|System|Internal|Remote|InvalidUsage|InvalidArgument)Error|"
    r"Watchdog caught collective operation timeout|DistBackendError|NCCL communicator was aborted|"
    r"ProcessGroupNCCL's watchdog got stuck", re.I)
_ASSERTION = re.compile(r"AssertionError|Assertion `.*' failed|Assertion .* failed|device-side assert", re.I)
_CUDA_FAULT = re.compile(r"CUDA error: |illegal memory access|Segmentation fault|core dumped", re.I)

_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.PORT_IN_USE, re.compile(r"address already in use", re.I)),
    (FailureClass.DISK_FULL, _DISK_FULL),
    (FailureClass.OOM, _OOM),
    (FailureClass.BAD_FLAG, re.compile(
        r"error: (?:argument|unrecognized arguments|the following arguments)|invalid choice|"
        r"ValidationError|validation error|ValueError|TypeError: .*argument|NotImplementedError|"
        r"is not supported|unsupported", re.I)),
    (FailureClass.NCCL, _NCCL),
    (FailureClass.ASSERTION, _ASSERTION),
]
"""Start-up classes, by priority. NCCL and assertion come after bad_flag: a start that ended with a
config-time ValueError was refused for its flags even when a rank then tripped an assertion."""

_CRASH_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.DISK_FULL, _DISK_FULL),
    (FailureClass.OOM, _OOM),
    (FailureClass.NCCL, _NCCL),
    (FailureClass.ASSERTION, _ASSERTION),
    (FailureClass.CRASH, _CUDA_FAULT),
]
"""Classes of a server that died while serving. No bad_flag here: a request-level ValueError logged at
ERROR (a malformed request) does not kill an engine, and the flags were accepted at start-up."""

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


def _evidence(log_tail: str) -> tuple[list[str], list[str]]:
    """The log's non-empty lines, and those of them that can carry an error."""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", log_tail) if ln.strip()]
    return lines, [ln for ln in lines if not _BENIGN.search(ln)]


def classify_startup_failure(log_tail: str, returncode: int | None) -> Diagnosis:
    """Decide why a server ended before it was ready, from the end of its log.

    Only lines that can carry an error are read (log records at ERROR or above, tracebacks,
    argparse messages); a WARNING that says "not supported" on a start that then crashed for
    another reason does not make the crash a bad flag.
    """
    lines, evidence = _evidence(log_tail)
    for failure_class, pattern in _PATTERNS:
        for line in reversed(evidence):
            if pattern.search(line):
                return Diagnosis(failure_class, clip(line))
    last = evidence[-1] if evidence else (lines[-1] if lines else "(empty log)")
    return Diagnosis(FailureClass.CRASH, clip(f"{describe_returncode(returncode)}; last log line: {last}"))


def classify_crash(log_text: str, returncode: int | None) -> Diagnosis | None:
    """Why a server that was ready died or stopped answering, from the log it wrote since; None: not said.

    ``log_text`` is what the server logged after it became ready (the start-up log's warnings decide
    nothing here). The classes are tried in order (disk full, OOM, NCCL, assertion, a CUDA fault), each
    from the last line up; the matching line is the reason, with the exit status when it has one.
    """
    _, evidence = _evidence(log_text)
    for failure_class, pattern in _CRASH_PATTERNS:
        for line in reversed(evidence):
            if pattern.search(line):
                status = f"{describe_returncode(returncode)}; " if returncode is not None else ""
                return Diagnosis(failure_class, clip(status + line))
    return None


_LOG_RECORD = re.compile(r"^(?:\([^)]*\)\s*)?(?:DEBUG|INFO|WARNING|WARN|ERROR)\s+\S+\s+\S+\s+\[[^\]]+\]\s*(.*)$")
_PROCESS_PREFIX = re.compile(r"^\([^)]*pid=\d+\)\s?")
_PROGRESS_BAR = re.compile(r"\d+%\s*(?:\||Completed)")
_HEARTBEATS = re.compile(
    r"No available shared memory broadcast block found"  # shm_broadcast: a worker has not answered for 60 s
    r"|Waiting for \d+ local, \d+ remote core engine proc")  # engine/utils.py, every 10 s at DEBUG
"""Lines vLLM repeats while nothing moves: they say a process is silent, not that the start advanced."""


def is_progress(line: str) -> bool:
    """Whether one start-up log line shows the start moving on (anything but a heartbeat or a blank)."""
    text = _PROCESS_PREFIX.sub("", line.strip()).strip()
    return bool(text) and not _HEARTBEATS.search(text)


def is_log_record(line: str) -> bool:
    """Whether a line is one of vLLM's log records (``INFO 12-02 04:45:36 [file.py:347] ...``, with or without
    its process prefix); a banner or an import's print is not."""
    return bool(_LOG_RECORD.match(line.strip()))


def progress_text(line: str) -> str:
    """What a progress line says, for a reason: a log record's message, or a progress bar ("" otherwise)."""
    stripped = line.strip()
    match = _LOG_RECORD.match(stripped)
    if match:
        return match.group(1).strip()
    text = _PROCESS_PREFIX.sub("", stripped).strip()
    return text if _PROGRESS_BAR.search(text) else ""


def describe_stall(log_tail: str) -> str:
    """Where a server that never became ready got to: its last progress line, for a TIMEOUT or HANG reason.

    On a GPU a start can stall after torch.compile (CUDA-graph capture, collective setup, KV sizing);
    the last progress says which, e.g. ``torch.compile took 16.19 s in total`` or a
    ``Capturing CUDA graphs (mixed prefill-decode, FULL): 33%|…`` bar. vLLM's ``No available shared
    memory broadcast block found in 60 seconds`` says a worker is silent, not where it got to: it is
    skipped.
    """
    for line in reversed([ln for ln in re.split(r"[\r\n]+", log_tail) if ln.strip()]):
        if is_progress(line):
            text = progress_text(line)
            if text:
                return clip(text, 300)
    return ""


_KV_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")  # "GPU KV cache size: 1,048,576 tokens, ..."


def kv_tokens_from_log(text: str) -> int | None:
    """The KV capacity per rank a vLLM server log states (the smallest engine's under DP), if any."""
    found = [int(m.group(1).replace(",", "")) for m in _KV_LINE.finditer(text)]
    return min(found) if found else None
