"""The seam between a trial and its correctness gates.

A trial calls ``suite.run(target)`` after the server is ready and before any load. The suite
returns a :class:`GuardReport`; a report that did not pass makes the trial infeasible (failure
class ``guard_failed``) and it can never be exported. Guard kinds live in ``tuner/guards*.py``;
their probes are declared in ``guards/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class GuardTarget:
    """What a guard may touch: the live server, the trial's folder and the study's folder."""

    base_url: str
    headers: Mapping[str, str]
    model: str
    trial_dir: Path
    study_dir: Path
    params: Mapping[str, Any]
    args: Mapping[str, Any]
    is_speculative: bool
    control_key: str | None = None
    """``ServeConfig.key()`` of this trial's no-speculation control (speculative trials only)."""


@dataclass(frozen=True)
class GuardResult:
    name: str
    kind: str
    passed: bool
    detail: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GuardReport:
    results: tuple[GuardResult, ...] = ()

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def reason(self) -> str:
        failed = [f"{r.name}: {r.detail}" for r in self.results if not r.passed]
        return "; ".join(failed) if failed else "all gates passed"

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "results": [asdict(r) for r in self.results]}


class GuardSuite(Protocol):
    def run(self, target: GuardTarget) -> GuardReport: ...


class NoGuards:
    """The empty suite: every trial passes (used when a study declares no guards)."""

    def run(self, target: GuardTarget) -> GuardReport:
        return GuardReport()
