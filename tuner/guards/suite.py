"""A suite of guards, run by a trial after readiness and before load.

The suite runs every guard and never raises for the server's sake: a guard that cannot reach the
server, or breaks, fails with the reason. Guards that run last (``runs_last``: equivalence, which
may record the study's reference) run after the others and are told whether they all passed
(``GuardTarget.earlier_gates_passed``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from tuner.guards.api import Guard, GuardReport, GuardResult, GuardTarget

__all__ = ["Suite"]

log = logging.getLogger(__name__)


def _runs_last(guard: Guard) -> bool:
    return bool(getattr(guard, "runs_last", False))  # a guard that does not say runs in its place


class Suite:
    """Runs its guards in order (those that run last, last) and collects one report."""

    def __init__(self, guards: Sequence[Guard]) -> None:
        self.guards = [g for g in guards if not _runs_last(g)] + [g for g in guards if _runs_last(g)]

    @property
    def names(self) -> list[str]:
        return [g.name for g in self.guards]

    def run(self, target: GuardTarget) -> GuardReport:
        results: list[GuardResult] = []
        for guard in self.guards:
            started_s = time.monotonic()
            try:
                result = guard.run(dataclasses.replace(
                    target, earlier_gates_passed=all(r.passed for r in results if not r.not_run)))
            except Exception as exc:  # a broken guard fails its gate; it never kills the trial
                log.exception("guard %s raised", guard.name)
                result = GuardResult(guard.name, guard.kind, False, f"guard raised {type(exc).__name__}: {exc}")
            elapsed_s = round(time.monotonic() - started_s, 2)
            result = GuardResult(result.name, result.kind, result.passed, result.detail,
                                 {**result.evidence, "elapsed_s": elapsed_s}, not_run=result.not_run)
            verdict = "NOT RUN" if result.not_run else "passed" if result.passed else "FAILED"
            (log.warning if result.not_run else log.info)("guard %s (%s): %s in %.1f s — %s", guard.name,
                                                          guard.kind, verdict, elapsed_s, result.detail)
            results.append(result)
        return GuardReport(tuple(results))
