"""Engines: the servers dsv4-tune tunes, each one folder behind one protocol.

    base.py      Engine: argv, readiness and metrics paths, the metric-name map, log diagnosis,
                 argument validation
    process.py   the process helper: start a server in its own process group, wait until ready,
                 stop it and all it spawned, stop orphans
    vllm/        vLLM's Engine

A new engine (SGLang, llama.cpp, an emulated node) is a new folder here with a class that satisfies
:class:`Engine`; nothing outside ``engines/`` imports it but the code that picks the engine.
"""

from __future__ import annotations

from tuner.engines.base import Engine
from tuner.engines.process import (
    PID_FILE,
    LaunchSpec,
    ServerProcess,
    choose_port,
    free_port,
    group_alive,
    stop_orphans,
    tail,
)
from tuner.engines.vllm import VllmEngine

__all__ = [
    "PID_FILE",
    "Engine",
    "LaunchSpec",
    "ServerProcess",
    "choose_port",
    "default_engine",
    "free_port",
    "group_alive",
    "stop_orphans",
    "tail",
]


def default_engine() -> Engine:
    """The engine a study runs when it names none: vLLM."""
    return VllmEngine()
