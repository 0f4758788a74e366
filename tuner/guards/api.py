"""The seam between a trial and its correctness gates.

A trial calls ``suite.run(target)`` after the server is ready and before any load. The suite
returns a :class:`GuardReport`; a report that did not pass makes the trial infeasible (failure
class ``guard_failed``) and it can never be exported. Guard kinds are modules of
:mod:`tuner.guards` (one per kind, listed in its registry); their probes are declared in
``guards/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

__all__ = ["Guard", "GuardKind", "GuardReport", "GuardResult", "GuardSuite", "GuardTarget", "NoGuards",
           "ProbeFailure", "ProbeLog", "SpecGuard"]


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
    earlier_gates_passed: bool = True
    """Every guard the suite ran before this one passed (set by the suite, for guards that run last)."""
    kv_cache_tokens: int | None = None
    """The KV capacity (tokens per engine) the server logged at start-up, when it did; the needle gate
    sizes its prompts to the context the trial really allocated."""
    dialect: str = "vllm"
    """The server's API beyond OpenAI's routes (``Engine.api_dialect``): ``vllm`` (its ``/tokenize`` of chats,
    ``prompt_logprobs``) or ``llamacpp`` (``/apply-template``, ``/tokenize``, ``/completion`` with
    ``n_probs``); :class:`tuner.guards.http.GuardClient` speaks either."""


@dataclass(frozen=True)
class GuardResult:
    name: str
    kind: str
    passed: bool
    detail: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    not_run: bool = False
    """The gate could not run against this server (``detail`` says why): it is not a pass, and every report
    says so; it does not fail the trial either. Build one with :meth:`skipped`."""

    @classmethod
    def skipped(cls, name: str, kind: str, why: str, **evidence: Any) -> GuardResult:
        """A gate this server cannot run, with the reason (``passed`` is False: it proved nothing)."""
        return cls(name, kind, False, f"not run: {why}", evidence, not_run=True)


@dataclass(frozen=True)
class GuardReport:
    results: tuple[GuardResult, ...] = ()

    @property
    def passed(self) -> bool:
        """Every gate that ran passed (a gate that could not run is listed in :attr:`not_run`, never a pass)."""
        return all(r.passed for r in self.results if not r.not_run)

    @property
    def not_run(self) -> tuple[GuardResult, ...]:
        return tuple(r for r in self.results if r.not_run)

    @property
    def reason(self) -> str:
        failed = [f"{r.name}: {r.detail}" for r in self.results if not r.passed and not r.not_run]
        skipped = [f"{r.name}: {r.detail}" for r in self.not_run]
        if failed:
            return "; ".join(failed + skipped)
        return "all gates passed" + (f" that ran ({'; '.join(skipped)})" if skipped else "")

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "not_run": [r.name for r in self.not_run],
                "results": [asdict(r) for r in self.results]}


class GuardSuite(Protocol):
    def run(self, target: GuardTarget) -> GuardReport: ...


class NoGuards:
    """The empty suite: every trial passes (used when a study declares no guards)."""

    def run(self, target: GuardTarget) -> GuardReport:
        return GuardReport()


class Guard(Protocol):
    """One gate. ``name`` is its file's stem, ``kind`` its YAML ``kind:``."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    def run(self, target: GuardTarget) -> GuardResult: ...


S = TypeVar("S", bound=BaseModel)


class SpecGuard(Generic[S]):
    """A guard built from its YAML spec. Subclasses set ``kind`` and, if they need it, ``runs_last``."""

    kind: ClassVar[str] = ""
    runs_last: ClassVar[bool] = False
    """Run after every other guard of the suite (which then sets ``target.earlier_gates_passed``):
    a guard that records the study's reference may do so only when every other gate passed."""

    def __init__(self, name: str, spec: S) -> None:
        self.name = name
        self.spec = spec


@dataclass(frozen=True)
class GuardKind:
    """One kind of guard: the ``kind:`` its YAML files name, the model they are read with, the guard built."""

    name: str
    spec: type[BaseModel]
    guard: Callable[[str, Any], Guard]
    """``guard(name, spec)``: usually the guard class itself."""


class ProbeFailure(Exception):
    """A probe request the server refused or could not answer (a gate failure, not a tool error)."""


class ProbeLog:
    """What a guard's probes found: one evidence record per probe, and the failures, labelled."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.failures: list[str] = []

    def check(self, label: str, record: dict[str, Any], probe: Callable[[dict[str, Any]], str | None]) -> None:
        """Run one probe (it fills ``record`` and returns its problem, or None); a ProbeFailure is its problem."""
        self.records.append(record)
        try:
            problem = probe(record)
        except ProbeFailure as exc:
            problem = str(exc)
        record["passed"] = problem is None
        if problem is not None:
            record["problem"] = problem
            self.failures.append(f"{label}: {problem}")

    def result(self, guard: Guard, passed_detail: str, **evidence: Any) -> GuardResult:
        """The guard's result: failed with the failures joined, or passed with ``passed_detail``."""
        detail = "; ".join(self.failures) if self.failures else passed_detail
        return GuardResult(guard.name, guard.kind, not self.failures, detail, {"probes": self.records, **evidence})
