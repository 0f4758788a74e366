"""Checks that run before a launch, so no launch is spent on a configuration that cannot work.

1. The feasibility model (memory, KV capacity, rules), where the study serves a catalogued checkpoint;
   its KV bytes per token is refitted to every launched trial's logged KV capacity (:meth:`observe`).
2. vLLM's own argument parser and engine-args checks, where vLLM is importable in this environment
   (``prevalidate``: ``auto`` = when it imports, ``on`` = required, ``off`` = never; turn it off when
   ``--vllm-cmd`` runs another vLLM version, e.g. in a container).

A refused configuration is recorded as a trial that violated its constraints, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.errors import UsageError
from tuner.failures import FailureClass
from tuner.objective import Objective
from tuner.profile import HardwareProfile
from tuner.space import ServeConfig

if TYPE_CHECKING:
    from tuner.checkpoints import Checkpoint
    from tuner.feasibility import KvCalibration
    from tuner.trial import TrialContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    failure_class: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


class PreLaunch:
    def __init__(self, profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective,
                 prevalidate: str) -> None:
        self.profile = profile
        self.checkpoint = checkpoint
        self.objective = objective
        self.validate = self._decide_validation(prevalidate)
        self.kv_observations: list[tuple[Mapping[str, Any], int]] = []
        self.calibration: KvCalibration | None = None
        self.observed_trials: set[int] = set()

    def observe(self, args: Mapping[str, Any], kv_tokens_per_rank: int | None, trial: int | None = None) -> None:
        """Learn from a launched trial's KV capacity (its server log); refits the bytes per token.

        ``trial`` (its Optuna number) makes this idempotent: a trial already learnt is not counted twice.
        """
        if kv_tokens_per_rank is None or self.checkpoint is None or trial in self.observed_trials:
            return
        if trial is not None:
            self.observed_trials.add(trial)
        from tuner.feasibility import fit_kv_bytes_per_token

        self.kv_observations.append((dict(args), kv_tokens_per_rank))
        fitted = fit_kv_bytes_per_token(self.profile, self.checkpoint, self.kv_observations)
        if fitted is not None and fitted != self.calibration:
            log.info("feasibility: %s (spread %.0f%%)", fitted.describe(), 100 * fitted.spread)
        self.calibration = fitted

    @staticmethod
    def _decide_validation(mode: str) -> bool:
        if mode == "off":
            return False
        from tuner.vllm_validate import vllm_available

        available = vllm_available()
        if mode == "on" and not available:
            raise UsageError("--prevalidate on, but vLLM cannot be imported here. Fix: install vLLM in the "
                             "tuner's environment, or use --prevalidate off")
        return available

    def check(self, config: ServeConfig, ctx: TrialContext) -> Refusal | None:
        if self.checkpoint is not None:
            from tuner import feasibility

            verdict = feasibility.check(self.profile, config, self.checkpoint, self.objective.workload,
                                        self.calibration)
            if not verdict.ok:
                basis = self.calibration.describe() if self.calibration else "default KV bytes/token, not yet fitted"
                return Refusal(FailureClass.INFEASIBLE.value,
                               f"pruned by the feasibility model ({basis}): {verdict.reason}",
                               {"kv_tokens_per_rank": verdict.kv_tokens_per_rank,
                                "max_concurrency": verdict.max_concurrency,
                                "memory_gib": verdict.memory.as_gib(),
                                "kv_bytes_per_token_fp8": self.calibration.base if self.calibration else None})
        if self.validate:
            from tuner.vllm_validate import validate_options

            options = ctx.engine.serve_options(ctx.model, config.args, host=ctx.host, port=ctx.port or 8000,
                                               served_model_name=ctx.served_model_name)
            problems = validate_options(options)
            if problems:
                return Refusal(FailureClass.BAD_FLAG.value,
                               "rejected by vLLM's own argument checks before launch: " + "; ".join(problems),
                               {"problems": problems})
        return None
