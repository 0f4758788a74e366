"""Where a vLLM start spent its time, read off its log: weights, torch.compile, its cache, CUDA graphs.

A launch on a GPU node is mostly start-up, and most of that is caches: the first launch on a machine
compiles Python bytecode, Triton kernels and torch.compile's graphs; a later launch with the same
compile key loads the graphs from ``~/.cache/vllm/torch_compile_cache`` instead. :func:`startup_phases`
turns the lines vLLM (0.26 on the H200 machine, 0.32 here) logs for each phase into seconds, and says
whether the compiled graphs came from the cache (``hit``), were compiled (``miss``), or both
(``mixed``: several compile ranges), and under which compile key (``compile_key``, the cache
folder's hash), so the launch times of a study can be read as what they are.

Every key is absent when its line is (an eager launch logs no compile and no capture).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["startup_phases"]

_SECONDS = {
    "weights_load_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "dynamo_s": re.compile(r"Dynamo bytecode transform time: ([\d.]+) s"),
    "torch_compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}
_COMPILED = re.compile(r"Compiling a graph for compile range \S+(?: \S+)? takes ([\d.]+) s")
_LOADED = re.compile(r"Directly load the compiled graph\(s\) for compile range \S+(?: \S+)? from the cache, "
                     r"took ([\d.]+) s")
_CAPTURE_GIB = re.compile(r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB")
_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
# the compile key's folder: two launches with the same flags that name different folders compiled twice
_CACHE_KEY = re.compile(r"Using cache directory: \S*/torch_compile_cache/([0-9a-f]+)/")


def startup_phases(log_text: str) -> dict[str, Any]:
    """Seconds per start-up phase, the compile cache's verdict and the KV capacity, from a server log."""
    out: dict[str, Any] = {}
    for key, pattern in _SECONDS.items():
        found = pattern.findall(log_text)
        if found:
            out[key] = round(max(float(x) for x in found), 2)  # one line per rank: the slowest rank
    compiled = [float(x) for x in _COMPILED.findall(log_text)]
    loaded = [float(x) for x in _LOADED.findall(log_text)]
    if compiled or loaded:
        out["compile_cache"] = "mixed" if compiled and loaded else ("miss" if compiled else "hit")
        out["inductor_compile_s"] = round(sum(compiled), 2)
        out["cache_load_s"] = round(sum(loaded), 3)
    keys = _CACHE_KEY.findall(log_text)
    if keys:
        out["compile_key"] = keys[-1]   # a log that holds several starts: the last one served
    capture = _CAPTURE_GIB.findall(log_text)
    if capture:
        out["graph_memory_gib"] = max(float(x) for x in capture)
    kv = [int(x.replace(",", "")) for x in _KV_TOKENS.findall(log_text)]
    if kv:
        out["kv_cache_tokens"] = min(kv)
    return out
