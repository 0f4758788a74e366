"""The engines a study can run, by name (``--engine``): the one place that picks an engine.

Each entry names the module and class of one engine folder; the class builds itself from the options a
study records (``study.json``: ``engine``, ``engine_options``) with ``from_options(options, hardware=,
checkpoint=)``. A module that sizes itself for a night (the emulated node's units) also has
``default_options(profile, checkpoint, objective, **given)``, asked once when a study is created.
Modules are imported when an engine is asked for, so the tuner never imports an engine it does not
run (the emulated node imports the search room, which imports this package).

A new engine is a folder under ``tuner/engines/`` and one line here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from tuner.engines.base import Engine
from tuner.errors import UsageError

__all__ = ["DEFAULT_ENGINE", "ENGINES", "engine_class", "engine_options", "make_engine"]

ENGINES: dict[str, str] = {
    "vllm": "tuner.engines.vllm.engine:VllmEngine",
    "emulated": "tuner.engines.emulated.engine:EmulatedEngine",
    "llamacpp": "tuner.engines.llamacpp.engine:LlamaCppEngine",
}
"""Engine name → ``module:Class``."""
DEFAULT_ENGINE = "vllm"


def _module(name: str) -> tuple[Any, str]:
    target = ENGINES.get(name)
    if target is None:
        raise UsageError(f"--engine {name!r} is not an engine. Fix: use one of {', '.join(sorted(ENGINES))}")
    module_name, _, class_name = target.partition(":")
    return importlib.import_module(module_name), class_name


def engine_class(name: str) -> Any:
    """The class registered as ``name`` (a :class:`UsageError` lists the known names)."""
    module, class_name = _module(name)
    return getattr(module, class_name)


def engine_options(name: str, profile: Any, checkpoint: Any, objective: Any, **given: Any) -> dict[str, Any]:
    """The options a new study on engine ``name`` records: the engine's own sizing for this night, if it has
    one (``default_options``), else the ``given`` ones as they are."""
    module, _ = _module(name)
    sizing = getattr(module, "default_options", None)
    if sizing is None:
        return {k: v for k, v in given.items() if v is not None}
    options: dict[str, Any] = sizing(profile, checkpoint, objective, **given)
    return options


def make_engine(name: str, options: Mapping[str, Any] | None = None, *, hardware: str,
                checkpoint: str | None = None) -> Engine:
    """The engine ``name``, built from a study's recorded options for the node ``hardware`` (a profile)."""
    engine: Engine = engine_class(name).from_options(dict(options or {}), hardware=hardware, checkpoint=checkpoint)
    return engine
