"""What a study was asked to do (``study.json``), and the one-tuner-per-study lock.

:class:`StudyRecord` is what ``dsv4-tune run`` (or a first worker) asked for; ``resume`` rebuilds the
run from it. :func:`new_record` checks a command line's names before anything is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from tuner import catalog
from tuner.demo_model import write_demo_model
from tuner.errors import StudyLockedError, UsageError
from tuner.load.power import detect_power_reader, power_unavailable_reason
from tuner.objective import ENERGY_METRICS, Objective
from tuner.search.envelope import objective_for
from tuner.search.profile import BoundProfile, bound_profile
from tuner.study.confirm import ConfirmSpec

__all__ = ["DEMO_MODEL", "SCHEMA_VERSION", "StudyLock", "StudyRecord", "new_record", "resolve_model",
           "vocab_size_of"]

SCHEMA_VERSION = 1
DEMO_MODEL = "demo"


class StudyRecord(BaseModel):
    """What the user asked for; ``study.json``. ``resume`` rebuilds the run from it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: str
    hw: str
    """The hardware profile: a catalog name (``search_spaces/<hw>.yaml``) or a YAML path."""
    objective: str
    model: str
    server_cmd: str = Field("vllm", validation_alias=AliasChoices("server_cmd", "vllm_cmd"))
    """The engine's program (``--engine-cmd``); a study.json written before the rename names it ``vllm_cmd``."""
    port: int | None = None
    trials: int | None = None
    budget_s: float | None = None
    seed: int = 0
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    slo_overrides: dict[str, float] = Field(default_factory=dict)
    ready_timeout_s: float | None = None
    guards: list[str] | None = None
    """Guard names or YAML paths; None = the objective's ``guards`` list."""
    checkpoint: str | None = None
    """Checkpoint catalog name (``search_spaces/_checkpoints.yaml``); None = the hardware profile's default."""
    prevalidate: Literal["auto", "on", "off"] = "auto"
    """Check each configuration with vLLM's own parser before launching it (auto: when vLLM imports)."""
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    gpu_hour_usd: float | None = Field(default=None, gt=0)
    """``--gpu-hour-usd``: the GPU-hour price windows report ``usd_per_mtok`` at (None: the objective's own)."""
    storage: str | None = None
    """Optuna storage URL; None = SQLite in the study folder. Never holds a password on disk: see
    :func:`tuner.study.storage.resolve_storage_url`."""
    engine: str = "vllm"
    """The engine that serves the trials (``--engine``; :mod:`tuner.engines.registry`)."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """What that engine was built with (the emulated node: time scale, multiplicity, truth), so a
    resumed study runs the same engine."""
    rehearsal: bool = False
    """A rehearsal (``dsv4-tune rehearse``): the night on the emulated node, not evidence of a real one."""
    prior: Literal["model", "none"] = "none"
    """``--prior``: ``model`` starts from the performance model and corrects it after each launch
    (:mod:`tuner.study.guided`); ``none``, the sampler alone. ``run`` picks ``model`` on GPU profiles."""
    stop_when_done: bool = False
    """``--stop-when-done``: end screening once the model gives an untried configuration under 5 % chance
    of beating the winner, and spend the rest of the budget on confirmation repeats."""
    preflight_mismatches: list[str] = Field(default_factory=list)
    """What the pre-flight check found wrong with the host when ``--force`` ran the study anyway."""
    created_at: float = Field(default_factory=time.time)


class StudyLock:
    """One tuner per study and node: an exclusive, non-blocking flock on ``<study>/.lock[.<slot>]``.

    Workers that share a study over RDB storage each take their own slot (``--worker-id``).
    """

    def __init__(self, study_path: Path, slot: str = "") -> None:
        self.path = study_path / (f".lock.{slot}" if slot else ".lock")
        self._fd: int | None = None

    def __enter__(self) -> StudyLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StudyLockedError(
                f"study {self.path.parent.name!r} is already being run by another tuner (pid {holder}); "
                "wait for it, or stop it first") from exc
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def resolve_model(model: str, runs_dir: Path) -> str:
    """``demo`` → the shipped demo model, written out once; a local path must exist; anything else is a hub id."""
    if model == DEMO_MODEL:
        return str(write_demo_model(runs_dir / "_models" / "demo").resolve())
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        raise UsageError(f"--model {model!r}: no such file or directory. Fix: give the path of a model "
                         "folder (with config.json), a hub id such as deepseek-ai/DeepSeek-V4-Flash-0731, "
                         "or 'demo' for the shipped tiny demo model")
    return model


def vocab_size_of(model: str, default: int = 32000) -> int:
    config = Path(model) / "config.json"
    try:
        return int(json.loads(config.read_text()).get("vocab_size", default))
    except (OSError, ValueError, TypeError):
        return default


def new_record(*, name: str | None, hw: str, objective: str, model: str | None, server_cmd: str,
               port: int | None, trials: int | None, budget_s: float | None, seed: int,
               slo_overrides: dict[str, float], ready_timeout_s: float | None,
               guards: list[str] | None = None, storage: str | None = None, checkpoint: str | None = None,
               prevalidate: Literal["auto", "on", "off"] = "auto",
               confirm: ConfirmSpec | None = None, sampler: Literal["tpe", "gp", "random"] = "tpe",
               gpu_hour_usd: float | None = None, engine: str = "vllm",
               engine_options: dict[str, Any] | None = None, rehearsal: bool = False,
               prior: Literal["model", "none"] | None = None, stop_when_done: bool = False,
               bound: BoundProfile | None = None) -> StudyRecord:
    """``bound``: ``hw`` bound to ``checkpoint`` already (the CLI loads it once per command)."""
    bound = bound or bound_profile(hw, checkpoint)
    profile = bound.profile
    loaded_objective = objective_for(profile, objective)
    try:
        loaded_objective.with_slos(slo_overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"--slo: {first['msg']}. Fix: write --slo <stat>_<metric>_ms=LIMIT, "
                         "e.g. --slo p95_ttft_ms=2000") from exc
    _check_energy_metric(loaded_objective, gpu_hour_usd)
    for guard in guards if guards is not None else loaded_objective.guards:
        catalog.resolve("guards", guard)
    # The model: --model, else the profile's, else the repository of the checkpoint the profile serves.
    chosen_model = model or profile.server.model or (bound.checkpoint.repo if bound.checkpoint else None)
    if not chosen_model:
        raise UsageError(f"hardware profile {profile.name!r} names no default model. Fix: pass --model PATH_OR_ID")
    study_name = name or f"{profile.name}-{Path(objective).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    return StudyRecord(name=study_name, hw=hw, objective=objective, model=chosen_model, server_cmd=server_cmd,
                       port=port, trials=trials, budget_s=budget_s, seed=seed, slo_overrides=slo_overrides,
                       ready_timeout_s=ready_timeout_s, guards=guards, storage=storage, checkpoint=checkpoint,
                       prevalidate=prevalidate, confirm=confirm or ConfirmSpec(), sampler=sampler,
                       gpu_hour_usd=gpu_hour_usd, engine=engine, engine_options=dict(engine_options or {}),
                       rehearsal=rehearsal, prior=prior or default_prior(profile.hardware.accelerator),
                       stop_when_done=stop_when_done)


def default_prior(accelerator: str) -> Literal["model", "none"]:
    """``--prior`` when not given: the model on GPU nodes (docs/search.md measures why), none on the CPU build."""
    return "none" if accelerator == "cpu" else "model"


def _check_energy_metric(objective: Objective, gpu_hour_usd: float | None) -> None:
    """A price must be positive; an energy metric needs GPU power readings and, for dollars, a price."""
    if gpu_hour_usd is not None and gpu_hour_usd <= 0:
        raise UsageError(f"--gpu-hour-usd {gpu_hour_usd:g}: a price must be above 0. Fix: give e.g. --gpu-hour-usd 3.5")
    if objective.metric not in ENERGY_METRICS:
        return
    if objective.metric == "usd_per_mtok" and gpu_hour_usd is None and objective.gpu_hour_usd is None:
        raise UsageError(f"objective {objective.name!r} ranks by usd_per_mtok but names no GPU-hour price. "
                         "Fix: pass --gpu-hour-usd 3.5 (your price), or set gpu_hour_usd in the objective")
    if detect_power_reader() is None:
        raise UsageError(f"objective {objective.name!r} ranks by {objective.metric}, which needs the GPUs' power, "
                         f"and this host has no GPU to read ({power_unavailable_reason()}). Fix: run it on the "
                         "GPU node, or rank by output_throughput")
