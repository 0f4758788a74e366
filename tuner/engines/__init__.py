"""Engines: the servers dsv4-tune tunes, each one folder behind one protocol.

    base.py      Engine: argv, readiness and metrics paths, the metric-name map, log diagnosis,
                 argument validation
    process.py   the process helper: start a server in its own process group, wait until ready,
                 stop it and all it spawned, stop orphans
    registry.py  the engines by name (``--engine``): the one place that picks an engine
    vllm/        vLLM's Engine
    emulated/    the emulated DSV4 node (``--engine emulated``, ``dsv4-tune rehearse``)
    llamacpp/    llama.cpp's llama-server (``--engine llamacpp``, or a profile's ``server.engine``)

A new engine (SGLang) is a new folder here with a class that satisfies :class:`Engine`, and
one line in ``registry.py``; nothing outside ``engines/`` imports an engine's folder.
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
from tuner.engines.registry import DEFAULT_ENGINE, ENGINES, make_engine
from tuner.engines.vllm import VllmEngine

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "PID_FILE",
    "Engine",
    "LaunchSpec",
    "ServerProcess",
    "choose_port",
    "default_engine",
    "free_port",
    "group_alive",
    "make_engine",
    "stop_orphans",
    "tail",
]


def default_engine() -> Engine:
    """The engine a study runs when it names none: vLLM."""
    return VllmEngine()
