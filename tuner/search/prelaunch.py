"""Checks that run before a launch, so no launch is spent on a configuration that cannot work.

0. On a unified-memory host (``unified_memory`` in the profile: Strix Halo, a CPU), the files the launch reads,
   its KV cache and compute buffers against the host's limit (:mod:`tuner.search.unified`).
1. The feasibility model (memory, KV capacity, rules), where the study serves a catalogued checkpoint;
   its KV bytes per token is refitted to every launched trial's logged KV capacity (:meth:`observe`),
   as far as the fit is trusted (:class:`~tuner.search.feasibility.KvCalibration`).
2. What launches that ran out of memory taught (:meth:`observe_failure`): a configuration as hungry
   with no more room than one that did is refused (:class:`~tuner.search.feasibility.MemoryLesson`).
3. The engine's own argument checks (``Engine.validate``; vLLM's parser and engine-args checks),
   where the engine can run them in this environment (``prevalidate``: ``auto`` = when it can,
   ``on`` = required, ``off`` = never; turn it off when ``--engine-cmd`` runs another vLLM version,
   e.g. in a container).

A refused configuration is recorded as a trial that violated its constraints, with the reason and
the rule (:attr:`Refusal.rule`) that refused it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.engines import Engine, default_engine
from tuner.errors import UsageError
from tuner.failures import FailureClass
from tuner.objective import Objective
from tuner.search import feasibility
from tuner.search.checkpoints import Checkpoint
from tuner.search.feasibility import (
    KvCalibration,
    MemoryLesson,
    fit_kv_bytes_per_token,
    lesson_from_oom,
    memory_args,
    prior_kv_bytes_per_token,
)
from tuner.search.profile import HardwareProfile
from tuner.search.space import ServeConfig
from tuner.search.unified import unified_fit

__all__ = ["LaunchTarget", "PreLaunch", "Refusal"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    failure_class: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    rule: str = ""
    """Which check refused (``memory``, ``kv_capacity``, ``topology``, ``learned_oom``, ``engine_args``, ...):
    what a study that stops on refusals counts them by."""


class LaunchTarget(Protocol):
    """Where a configuration would launch (a :class:`~tuner.trial.TrialContext` is one)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def server_cmd(self) -> Sequence[str]: ...

    @property
    def model(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int | None: ...

    @property
    def served_model_name(self) -> str: ...


class PreLaunch:
    def __init__(self, profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective,
                 prevalidate: str, engine: Engine | None = None) -> None:
        self.profile = profile
        self.checkpoint = checkpoint
        self.objective = objective
        self.engine = engine if engine is not None else default_engine()
        self.validation_note = ""
        """Whether the engine's own argument checks run, and why not when they do not (report, status)."""
        self.validate = self._decide_validation(prevalidate)
        self.kv_observations: list[tuple[Mapping[str, Any], int]] = []
        self.calibration: KvCalibration | None = None
        self.observed_trials: set[int] = set()
        self.lessons: list[MemoryLesson] = []
        self.failed_trials: set[int] = set()

    def observe(self, args: Mapping[str, Any], kv_tokens_per_rank: int | None, trial: int | None = None) -> None:
        """Learn from a launched trial's KV capacity (its server log); refits the bytes per token.

        ``trial`` (its Optuna number) makes this idempotent: a trial already learnt is not counted twice.
        """
        if kv_tokens_per_rank is None or self.checkpoint is None or trial in self.observed_trials:
            return
        if trial is not None:
            self.observed_trials.add(trial)
        self.kv_observations.append((dict(args), kv_tokens_per_rank))
        fitted = fit_kv_bytes_per_token(self.profile, self.checkpoint, self.kv_observations)
        if fitted is not None and fitted != self.calibration:
            log.info("feasibility: %s (spread %.0f%%)", fitted.describe(), 100 * fitted.spread)
        self.calibration = fitted

    def observe_failure(self, args: Mapping[str, Any], failure_class: str | None, *, started: bool,
                        trial: int | None = None, evidence: str = "") -> None:
        """Learn from a launch that failed: an out-of-memory (at start-up, or once ``started``) becomes a lesson.

        ``trial`` makes this idempotent, as :meth:`observe`. Other classes teach the sampler (their
        constraints are violated) but not the memory model.
        """
        if failure_class != FailureClass.OOM.value or (trial is not None and trial in self.failed_trials):
            return
        if self.profile.unified_memory is not None:
            # a lesson is read in vLLM's memory options (gpu-memory-utilization, max-num-seqs...); a unified-memory
            # host's launches have none of them and its memory model prices each launch already
            log.info("feasibility: trial %s ran out of memory on a unified-memory host: %s", trial, evidence[:200])
            return
        if trial is not None:
            self.failed_trials.add(trial)
        lesson = lesson_from_oom(args, during="load" if started else "start", trial=trial, evidence=evidence[:300])
        log.info("feasibility: learnt from an out-of-memory: %s", lesson.describe())
        self.lessons.append(lesson)

    def kv_basis(self) -> str:
        """What the KV capacity of a verdict rests on, in words (with the fitted figure and the prior)."""
        if self.calibration is not None:
            return self.calibration.describe()
        prior = prior_kv_bytes_per_token(self.checkpoint) if self.checkpoint is not None else None
        return f"prior KV bytes/token {prior:,.0f}, not yet fitted" if prior else "no KV model"

    def _decide_validation(self, mode: str) -> bool:
        if mode == "off":
            self.validation_note = f"off (--prevalidate off): {self.engine.title}'s own argument checks not run"
            return False
        available = self.engine.can_validate()  # when it cannot, the engine logs why, once
        if mode == "on" and not available:
            raise UsageError(f"--prevalidate on, but {self.engine.title} cannot be imported here. Fix: install "
                             f"{self.engine.title} in the tuner's environment, or use --prevalidate off")
        self.validation_note = (f"on (--prevalidate {mode}): {self.engine.title}'s own argument checks run before "
                                "every launch" if available else
                                f"OFF (--prevalidate auto): {self.engine.title}'s own argument checks cannot run in "
                                "the tuner's environment (the reason is logged when the study starts); "
                                "configurations launched unchecked")
        return available

    def check(self, config: ServeConfig, ctx: LaunchTarget) -> Refusal | None:
        lesson = next((les for les in self.lessons if les.covers(memory_args(config))), None)
        if lesson is not None:
            return Refusal(FailureClass.INFEASIBLE.value, f"pruned by what an out-of-memory taught: {lesson.describe()}"
                           + (f" ({lesson.evidence})" if lesson.evidence else ""),
                           {"lesson": lesson.to_json()}, rule="learned_oom")
        if self.profile.unified_memory is not None:
            refusal = self._unified_refusal(config, ctx)
            if refusal is not None:
                return refusal
        if self.checkpoint is not None:
            verdict = feasibility.check(self.profile, config, self.checkpoint, self.objective.workload,
                                        self.calibration)
            if not verdict.ok:
                calibration = self.calibration
                return Refusal(FailureClass.INFEASIBLE.value,
                               f"pruned by the feasibility model ({self.kv_basis()}): {verdict.reason}",
                               {"kv_tokens_per_rank": verdict.kv_tokens_per_rank,
                                "max_concurrency": verdict.max_concurrency,
                                "memory_gib": verdict.memory.as_gib(),
                                "kv_bytes_per_token_fp8": calibration.base if calibration else None,
                                "kv_bytes_per_token_prior": prior_kv_bytes_per_token(self.checkpoint),
                                "kv_bytes_per_token_pruning": calibration.pruning_base if calibration else None,
                                "kv_fit_trusted": calibration.trusted if calibration else None},
                               rule=verdict.rules[0] if verdict.rules else "feasibility")
        if self.validate:
            options = ctx.engine.serve_options(ctx.model, config.args, host=ctx.host, port=ctx.port or 8000,
                                               served_model_name=ctx.served_model_name)
            problems = ctx.engine.validate(options)
            if problems:
                return Refusal(FailureClass.BAD_FLAG.value,
                               f"rejected by {ctx.engine.title}'s own argument checks before launch: "
                               + "; ".join(problems), {"problems": problems}, rule="engine_args")
        return None

    def _unified_refusal(self, config: ServeConfig, ctx: LaunchTarget) -> Refusal | None:
        """A unified-memory host: the files this launch would read, its KV and compute, against the limit."""
        memory = self.profile.unified_memory
        assert memory is not None
        options = ctx.engine.serve_options(ctx.model, config.args, host=ctx.host, port=ctx.port or 8000,
                                           served_model_name=ctx.served_model_name)
        files = [Path(f) for f in ctx.engine.model_files(options)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            return Refusal(FailureClass.BAD_FLAG.value, f"the launch would read {', '.join(missing)}, which is not "
                           "there. Fix: put the file there, or name the one you have (--model; the profile's "
                           "speculative.config.draft_model)", {"missing": missing}, rule="model_files")
        weights = float(sum(f.stat().st_size for f in files))
        fit = unified_fit(memory, config.args, target_bytes=weights, draft_bytes=0.0)
        if fit.ok:
            return None
        return Refusal(FailureClass.INFEASIBLE.value, f"pruned by the unified memory model: {fit.describe()}",
                       {"unified_memory": fit.to_json()}, rule="unified_memory")
