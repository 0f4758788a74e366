"""Correctness gates, and the one registry of guard kinds.

    api.py          the seam: GuardTarget, GuardResult, GuardReport, GuardSuite; Guard, SpecGuard,
                    GuardKind; ProbeFailure and ProbeLog for guards that send probes
    specs.py        the YAML shapes several kinds share, and reading one guard file
    suite.py        Suite: runs a trial's guards, those that run last after the others
    http.py         the guards' one HTTP client
    chat.py         chat-probe helpers (tool-call and reasoning guards)
    tool_call.py    reasoning.py    needle.py    equivalence.py    the kinds

A kind is one module of this package that defines ``KIND = GuardKind(name, spec model, guard class)``;
the registry below finds it (no list to edit), so a new kind is one new module plus one
``guards/<name>.yaml`` that names it. A kind defined elsewhere (a plugin, a test) joins with
:func:`register_kind`.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tuner.catalog import resolve
from tuner.errors import UsageError
from tuner.guards.api import (
    Guard,
    GuardKind,
    GuardReport,
    GuardResult,
    GuardSuite,
    GuardTarget,
    NoGuards,
    ProbeFailure,
    ProbeLog,
    SpecGuard,
)
from tuner.guards.equivalence import EquivalenceGuard, EquivalenceProbe, EquivalenceSpec, EquivalenceThresholds
from tuner.guards.needle import Needle, NeedleGuard, NeedleSpec
from tuner.guards.reasoning import ReasoningCarryProbe, ReasoningGuard, ReasoningSpec, ReasoningSplitProbe
from tuner.guards.specs import ChatProbe, ExpectedCall, StrictModel, ToolRoundTrip, read_spec
from tuner.guards.suite import Suite
from tuner.guards.tool_call import ToolCallGuard, ToolCallProbe, ToolCallSpec

__all__ = [
    "KINDS",
    "ChatProbe",
    "EquivalenceGuard",
    "EquivalenceProbe",
    "EquivalenceSpec",
    "EquivalenceThresholds",
    "ExpectedCall",
    "Guard",
    "GuardKind",
    "GuardReport",
    "GuardResult",
    "GuardSuite",
    "GuardTarget",
    "Needle",
    "NeedleGuard",
    "NeedleSpec",
    "NoGuards",
    "ProbeFailure",
    "ProbeLog",
    "ReasoningCarryProbe",
    "ReasoningGuard",
    "ReasoningSpec",
    "ReasoningSplitProbe",
    "SpecGuard",
    "StrictModel",
    "Suite",
    "ToolCallGuard",
    "ToolCallProbe",
    "ToolCallSpec",
    "ToolRoundTrip",
    "build_guard",
    "discover_kinds",
    "load_spec",
    "load_suite",
    "register_kind",
]

log = logging.getLogger(__name__)

KINDS: dict[str, GuardKind] = {}
"""The guard kinds, by the ``kind:`` their YAML files name: every module of this package with a ``KIND``."""


def register_kind(kind: GuardKind) -> GuardKind:
    """Add a kind to :data:`KINDS` (a kind of this package is found without it); its name must be new."""
    known = KINDS.get(kind.name)
    if known is not None and known != kind:
        raise ValueError(f"guard kind {kind.name!r} is registered twice ({known.guard} and {kind.guard})")
    KINDS[kind.name] = kind
    return kind


def discover_kinds() -> list[str]:
    """Register every module of this package that defines ``KIND``; return the kinds' names, sorted."""
    found: list[str] = []
    for module in pkgutil.iter_modules(__path__):
        kind = getattr(importlib.import_module(f"{__name__}.{module.name}"), "KIND", None)
        if isinstance(kind, GuardKind):
            found.append(register_kind(kind).name)
    return sorted(found)


discover_kinds()


def load_spec(path: Path) -> BaseModel:
    """Read one guard file as its kind's model; every problem is a CatalogError naming file, key and fix."""
    return read_spec(path, {name: kind.spec for name, kind in KINDS.items()})


def build_guard(name: str, spec: BaseModel) -> Guard:
    """The guard of a spec read by :func:`load_spec`, built by its kind."""
    for kind in KINDS.values():
        if type(spec) is kind.spec:
            return kind.guard(name, spec)
    raise TypeError(f"no guard kind reads {type(spec).__name__}")


def load_suite(names: Sequence[str], *, reference_requires: Mapping[str, Sequence[Any]] | None = None,
               reference_source: str = "") -> GuardSuite:
    """Guard names (``guards/<name>.yaml``) or YAML paths → a suite; errors name the file and key.

    ``reference_requires`` (the hardware profile's reference numerics,
    :func:`tuner.search.profile.reference_requires`) goes into every spec that has that key and leaves it
    unset; ``reference_source`` says where it came from, for the messages.
    """
    guards: list[Guard] = []
    seen: set[str] = set()
    for name in names:
        path = resolve("guards", name)
        guard_name = Path(path).stem
        if guard_name in seen:
            raise UsageError(f"guard {guard_name!r} is listed twice ({path}). Fix: list each guard once")
        seen.add(guard_name)
        spec = load_spec(path)
        if reference_requires is not None and "reference_requires" in type(spec).model_fields \
                and getattr(spec, "reference_requires", None) is None:
            spec = spec.model_copy(update={"reference_requires": {k: list(v) for k, v in reference_requires.items()},
                                           "reference_source": reference_source})
        guards.append(build_guard(guard_name, spec))
    return Suite(guards)
