"""Load guard files into a suite that a trial runs after readiness and before load.

``load_suite(["tool_call", "reasoning", "./my-guard.yaml"])`` reads each guard (a catalog name from
``guards/`` or a path), checks it, and returns a :class:`GuardSuite`. The suite runs every guard and
never raises for the server's sake: a guard that cannot reach the server, or breaks, fails with the
reason. Equivalence guards run last, and may record the study's reference only if every other gate
of the trial passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tuner.catalog import resolve
from tuner.errors import CatalogError, UsageError
from tuner.guard_api import GuardReport, GuardResult, GuardSuite, GuardTarget
from tuner.guard_equivalence import EquivalenceGuard
from tuner.guard_needle import NeedleGuard
from tuner.guard_reasoning import ReasoningGuard
from tuner.guard_specs import EquivalenceSpec, GuardSpec, NeedleSpec, ReasoningSpec, ToolCallSpec, load_spec
from tuner.guard_tool_call import ToolCallGuard

__all__ = ["Guard", "Suite", "build_guard", "load_suite"]

log = logging.getLogger(__name__)


class Guard(Protocol):
    name: str
    kind: str

    def run(self, target: GuardTarget) -> GuardResult: ...


def build_guard(name: str, spec: GuardSpec) -> Guard | EquivalenceGuard:
    if isinstance(spec, ToolCallSpec):
        return ToolCallGuard(name, spec)
    if isinstance(spec, ReasoningSpec):
        return ReasoningGuard(name, spec)
    if isinstance(spec, NeedleSpec):
        return NeedleGuard(name, spec)
    if isinstance(spec, EquivalenceSpec):
        return EquivalenceGuard(name, spec)
    raise TypeError(f"no guard for spec {type(spec).__name__}")


class Suite:
    """Runs its guards in order (equivalence last) and collects one report."""

    def __init__(self, guards: Sequence[Guard | EquivalenceGuard]) -> None:
        self.guards = ([g for g in guards if not isinstance(g, EquivalenceGuard)]
                       + [g for g in guards if isinstance(g, EquivalenceGuard)])

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.guards]

    def run(self, target: GuardTarget) -> GuardReport:
        results: list[GuardResult] = []
        for guard in self.guards:
            started_s = time.monotonic()
            try:
                if isinstance(guard, EquivalenceGuard):
                    result = guard.run(target, may_record=all(r.passed for r in results))
                else:
                    result = guard.run(target)
            except Exception as exc:  # a broken guard fails its gate; it never kills the trial
                log.exception("guard %s raised", guard.name)
                result = GuardResult(guard.name, guard.kind, False, f"guard raised {type(exc).__name__}: {exc}")
            elapsed_s = round(time.monotonic() - started_s, 2)
            result = GuardResult(result.name, result.kind, result.passed, result.detail,
                                 {**result.evidence, "elapsed_s": elapsed_s})
            log.info("guard %s (%s): %s in %.1f s — %s", guard.name, guard.kind,
                     "passed" if result.passed else "FAILED", elapsed_s, result.detail)
            results.append(result)
        return GuardReport(tuple(results))


def load_suite(names: Sequence[str]) -> GuardSuite:
    """Guard names (``guards/<name>.yaml``) or YAML paths → a suite; errors name the file and key."""
    guards: list[Guard | EquivalenceGuard] = []
    seen: set[str] = set()
    for name in names:
        path = resolve("guards", name)
        guard_name = Path(path).stem
        if guard_name in seen:
            raise UsageError(f"guard {guard_name!r} is listed twice ({path}). Fix: list each guard once")
        seen.add(guard_name)
        try:
            spec = load_spec(path)
        except CatalogError:
            raise
        guards.append(build_guard(guard_name, spec))
    return Suite(guards)
