"""The study: Optuna ask/tell around ``run_trial``, on SQLite storage in the run folder.

Only this module imports Optuna. A trial that could not launch, crashed, or missed an SLO is told
to Optuna as COMPLETE with its constraint margins (> 0 = violated) so the constrained TPE sampler
learns from it; it is never left out as FAIL. FAIL is kept for trials the tuner itself abandoned
(interrupted), which ``resume`` queues again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.trial import TrialState
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner import catalog, store
from tuner.affinity import plan_cpu_split
from tuner.checkpoints import Checkpoint, load_checkpoint
from tuner.confirm import Confirmation, ConfirmSpec
from tuner.confirm_phase import ConfirmationPhase, Winner, best_feasible_trial
from tuner.engine import resolve_vllm_cmd
from tuner.errors import StudyError, StudyLockedError, UsageError
from tuner.failures import FailureClass
from tuner.guard_api import GuardSuite, NoGuards
from tuner.launcher import stop_orphans
from tuner.objective import Objective, constraint_names, failed_score, load_objective
from tuner.prelaunch import PreLaunch
from tuner.profile import HardwareProfile, bind_checkpoint, load_profile
from tuner.space import ServeConfig, build_config, suggest
from tuner.trial import TrialContext, TrialOutcome, run_trial

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEMO_MODEL = "demo"
MAX_DUPLICATES_IN_A_ROW = 50
# Attributes about a trial's place in the study, not about its result: never copied to a duplicate.
_BOOKKEEPING_ATTRS = frozenset({"trial_dir", "retry_of", "baseline", "control_for", "interrupted"})


class StudyRecord(BaseModel):
    """What the user asked for; ``study.json``. ``resume`` rebuilds the run from it."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: str
    hw: str
    objective: str
    model: str
    vllm_cmd: str = "vllm"
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
    """Checkpoint catalog name (``search_spaces/_checkpoints.yaml``); None = the profile's default."""
    prevalidate: Literal["auto", "on", "off"] = "auto"
    """Check each configuration with vLLM's own parser before launching it (auto: when vLLM imports)."""
    confirm: ConfirmSpec = Field(default_factory=ConfirmSpec)
    storage: str | None = None
    """Optuna storage URL; None = SQLite in the study folder. Never holds a password on disk: see
    :func:`storage_for_record`."""
    created_at: float = Field(default_factory=time.time)


@dataclass
class Progress:
    """What the CLI shows: updated at every phase change."""

    study: str
    launched: int = 0
    target: int | None = None
    phase: str = "starting"
    trial_number: int | None = None
    best_value: float | None = None
    best_trial: int | None = None
    deadline: float | None = None
    last: str = ""
    events: list[str] = field(default_factory=list)

    @property
    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.time())


def storage_url(study_path: Path) -> str:
    return f"sqlite:///{study_path / 'study.db'}"


def storage_for_record(record: StudyRecord, study_path: Path) -> str:
    """The Optuna storage URL of a study: SQLite in its folder, or the shared URL of ``record.storage``.

    ``study.json`` keeps a shared URL with its password masked (``***``); the real one comes from
    ``$DSV4_TUNE_STORAGE`` (see :mod:`tuner.worker`).
    """
    if not record.storage:
        return storage_url(study_path)
    from tuner.worker import resolve_storage_url

    return resolve_storage_url(record.storage)


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
    """``demo`` → the generated tiny model; a local path must exist; anything else is a hub id."""
    if model == DEMO_MODEL:
        from tuner.demo_model import build_demo_model

        return str(build_demo_model(runs_dir / "_models" / "demo").resolve())
    path = Path(model).expanduser()
    if path.exists():
        return str(path.resolve())
    if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        raise UsageError(f"--model {model!r}: no such file or directory. Fix: give the path of a model "
                         "folder (with config.json), a hub id such as deepseek-ai/DeepSeek-V4-Flash-0731, "
                         "or 'demo' for the generated tiny model")
    return model


def vocab_size_of(model: str, default: int = 32000) -> int:
    config = Path(model) / "config.json"
    try:
        return int(json.loads(config.read_text()).get("vocab_size", default))
    except (OSError, ValueError, TypeError):
        return default


def make_sampler(seed: int, n_startup_trials: int = 4, kind: str = "tpe") -> optuna.samplers.BaseSampler:
    """The study's sampler; every kind reads the trials' named constraints (``Trial.set_constraint``).

    ``tpe`` (default): multivariate, grouped TPE. ``gp``: Optuna's GPSampler, measured more
    sample-efficient on the benchmark surfaces (docs/search.md) but needs scipy and ~1 CPU s a trial.
    ``random``: the baseline to compare against.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if kind == "gp":
            try:
                import scipy  # noqa: F401
            except ImportError as exc:
                raise UsageError("--sampler gp needs scipy. Fix: pip install scipy, or use --sampler tpe") from exc
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials)
        if kind == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                          n_startup_trials=n_startup_trials)


class Study:
    """One named study in ``runs_dir``: create it, run it, resume it."""

    def __init__(self, record: StudyRecord, runs_dir: Path) -> None:
        self.record = record
        self.runs_dir = runs_dir
        self.path = store.study_dir(runs_dir, record.name)
        self.profile: HardwareProfile = self._snapshot_profile()
        self.objective: Objective = self._snapshot_objective().with_slos(record.slo_overrides)
        self.checkpoint: Checkpoint | None = None
        checkpoint_name = record.checkpoint or self.profile.server.checkpoint
        if checkpoint_name:
            self.checkpoint = load_checkpoint(checkpoint_name)
            self.profile = bind_checkpoint(self.profile, self.checkpoint)

    # -- creation and loading ------------------------------------------------------------------
    @classmethod
    def create(cls, record: StudyRecord, runs_dir: Path) -> Study:
        if not store.STUDY_NAME.match(record.name):
            raise UsageError(f"--study {record.name!r}: use letters, digits, '.', '_' and '-' only")
        path = store.study_dir(runs_dir, record.name)
        if (path / "study.json").exists():
            raise StudyError(f"study {record.name!r} already exists in {path}. Fix: "
                             f"`dsv4-tune resume {record.name}`, or pick another --study name")
        path.mkdir(parents=True, exist_ok=True)
        store.write_json(path / "study.json", record.model_dump())
        return cls(record, runs_dir)

    @classmethod
    def open(cls, name: str, runs_dir: Path) -> Study:
        path = store.study_dir(runs_dir, name)
        record_path = path / "study.json"
        if not record_path.is_file():
            known = sorted(p.parent.name for p in runs_dir.glob("*/study.json")) if runs_dir.is_dir() else []
            raise StudyError(f"no study {name!r} in {runs_dir}; known: {', '.join(known) or '(none)'}. "
                             "Fix: check --runs-dir and the name (`dsv4-tune list --runs-dir DIR` lists studies)")
        data = store.read_json(record_path)
        version = int(data.get("schema_version", 0)) if isinstance(data, dict) else 0
        if version > SCHEMA_VERSION:
            raise StudyError(f"{record_path}: schema_version {version} is newer than this dsv4-tune "
                             f"understands ({SCHEMA_VERSION}). Fix: upgrade dsv4-tune")
        return cls(StudyRecord.model_validate(data), runs_dir)

    def _snapshot_profile(self) -> HardwareProfile:
        snap = self.path / "profile.yaml"
        if not snap.exists():
            source = load_profile(self.record.hw)  # validates before copying
            from tuner.catalog import resolve
            store.write_text(snap, resolve("search_spaces", self.record.hw).read_text(encoding="utf-8"))
            return source
        return load_profile(str(snap))

    def _snapshot_objective(self) -> Objective:
        snap = self.path / "objective.yaml"
        if not snap.exists():
            source = load_objective(self.record.objective)
            from tuner.catalog import resolve
            store.write_text(snap, resolve("objectives", self.record.objective).read_text(encoding="utf-8"))
            return source
        return load_objective(str(snap))

    def storage(self) -> str | optuna.storages.BaseStorage:
        return storage_for_record(self.record, self.path)

    def optuna_study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return optuna.create_study(
                study_name=self.record.name, storage=self.storage(), load_if_exists=True,
                direction=self.objective.direction, sampler=make_sampler(self.record.seed, kind=self.record.sampler))
        except RuntimeError as exc:
            if "schema" not in str(exc):
                raise
            raise StudyError(
                f"{self.path / 'study.db'} was written by a newer Optuna ({exc}). Fix: upgrade dsv4-tune and "
                "Optuna (pip install -U optuna), or open the study with the version that created it") from exc

    def guard_names(self) -> list[str]:
        return list(self.record.guards if self.record.guards is not None else self.objective.guards)

    def guard_suite(self) -> GuardSuite:
        names = self.guard_names()
        if not names:
            return NoGuards()
        from tuner.guards import load_suite

        suite: GuardSuite = load_suite(names)
        return suite

    def context(self) -> TrialContext:
        model = resolve_model(self.record.model, self.runs_dir)
        return TrialContext(
            vllm_cmd=resolve_vllm_cmd(self.record.vllm_cmd), model=model, objective=self.objective,
            host=self.profile.server.host, port=self.record.port,
            ready_timeout_s=self.record.ready_timeout_s or self.profile.server.ready_timeout_s,
            vocab_size=vocab_size_of(model), guards=self.guard_suite(),
            served_model_name=Path(model).name if Path(model).exists() else model,
            cpu_split=plan_cpu_split(self.profile.server.client_cpus,
                                     bind_omp=self.profile.hardware.accelerator == "cpu"))

    # -- the loop ------------------------------------------------------------------------------
    def run(self, *, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> optuna.Study:
        with StudyLock(self.path):
            orphans = stop_orphans(self.path / "trials")
            if orphans:
                log.warning("stopped %d orphaned server(s) left by an earlier run", len(orphans))
            ctx = self.context()
            study = self.optuna_study()
            store.write_json(self.path / "study.json", self.record.model_dump())
            self._prepare_queue(study)
            return self._loop(study, ctx, on_progress or (lambda _p: None), should_stop or (lambda: False))

    def _prepare_queue(self, study: optuna.Study) -> None:
        if not study.user_attrs.get("baselines_enqueued"):
            for base in self.profile.baselines:
                study.enqueue_trial(dict(base.values), user_attrs={"baseline": base.name},
                                    skip_if_exists=True)
            study.set_user_attr("baselines_enqueued", True)
            study.set_user_attr("constraint_names", constraint_names(self.objective))
        requeued: list[int] = list(study.user_attrs.get("requeued", []))
        # A shared study (RDB storage, workers): other workers' RUNNING trials are alive, the dead ones are
        # retried by heartbeat, and an interrupted worker re-queues its own trial (tuner.worker).
        shared = bool(self.record.storage)
        for t in study.get_trials(deepcopy=False):
            abandoned = not shared and (t.state == TrialState.RUNNING or (
                t.state == TrialState.FAIL and t.user_attrs.get("interrupted")))
            if not abandoned or t.number in requeued:
                continue
            if t.state == TrialState.RUNNING:
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            log.info("re-queueing trial %d, abandoned by an earlier run", t.number)
            study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            requeued.append(t.number)
        study.set_user_attr("requeued", requeued)

    def _loop(self, study: optuna.Study, ctx: TrialContext, on_progress: Callable[[Progress], None],
              should_stop: Callable[[], bool]) -> optuna.Study:
        started = time.time()
        deadline = started + self.record.budget_s if self.record.budget_s else None
        progress = Progress(study=self.record.name, target=self.record.trials, deadline=deadline)
        launched_keys = self._launched_keys(study)
        prelaunch = self.prelaunch(study)
        progress.launched = len(launched_keys_numbers(study))
        self._update_best(study, progress)
        duplicates = 0
        while True:
            if self.record.trials is not None and progress.launched >= self.record.trials:
                progress.last = f"reached --trials {self.record.trials}"
                break
            # Keep time for confirmation, but never more than a third of the budget for it.
            reserve_s = min(self._confirm_reserve_s(study), (self.record.budget_s or 0.0) / 3)
            if deadline is not None and not self._time_for_another(study, deadline, reserve_s):
                progress.last = "budget left is shorter than one trial; stopping"
                break
            if should_stop():
                break
            trial = study.ask()
            config = suggest(self.profile, trial)
            if config.is_speculative and config.control().key() not in launched_keys:
                # The control launches first, beside its speculative twin, so that the twin's gates can
                # compare with it and the report can show the speculative gain.
                control = ask_fixed(study, config.control().params, {"control_for": config.key()})
                try:
                    self._attempt(study, control, suggest(self.profile, control), ctx, prelaunch, launched_keys,
                                  progress, on_progress, should_stop)
                except BaseException:
                    trial.set_user_attr("interrupted", True)
                    study.tell(trial, state=TrialState.FAIL)
                    raise
            status = self._attempt(study, trial, config, ctx, prelaunch, launched_keys, progress, on_progress,
                                   should_stop)
            duplicates = duplicates + 1 if status == "duplicate" else 0
            if duplicates >= MAX_DUPLICATES_IN_A_ROW:
                progress.last = "the sampler keeps proposing launched configurations; space exhausted"
                break
        if not should_stop():
            self._confirm(study, ctx, progress, on_progress, should_stop, deadline)
        progress.phase = "done"
        on_progress(progress)
        self.write_trials_table(study)
        return study

    def prelaunch(self, study: optuna.Study) -> PreLaunch:
        """The pre-launch checks, with the KV capacity of every trial launched so far already learnt."""
        checks = PreLaunch(self.profile, self.checkpoint, self.objective, self.record.prevalidate)
        self.learn_kv(study, checks)
        return checks

    def learn_kv(self, study: optuna.Study, checks: PreLaunch) -> None:
        """Feed ``checks`` the logged KV capacity of every launched trial it has not seen yet.

        A worker calls this before each launch, so it also learns from the other workers' launches.
        """
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            tokens = t.user_attrs.get("kv_cache_tokens")
            if (not isinstance(tokens, int) or "duplicate_of" in t.user_attrs
                    or t.number in checks.observed_trials):
                continue
            try:
                args = build_config(self.profile, t.params).args
            except (KeyError, ValueError) as exc:  # params of an older profile: learn from the others
                log.warning("trial %d: its parameters no longer build a configuration (%s); its KV "
                            "capacity is not used for the feasibility fit", t.number, exc)
                checks.observed_trials.add(t.number)
                continue
            checks.observe(args, tokens, t.number)

    def _attempt(self, study: optuna.Study, trial: optuna.Trial, config: ServeConfig, ctx: TrialContext,
                 prelaunch: PreLaunch, launched_keys: dict[str, int], progress: Progress,
                 on_progress: Callable[[Progress], None], should_stop: Callable[[], bool]) -> str:
        """Tell one asked trial: reuse a duplicate, refuse before launch, or launch it."""
        key = config.key()
        if key in launched_keys:
            self._tell_duplicate(study, trial, launched_keys[key])
            return "duplicate"
        verdict = prelaunch.check(config, ctx)
        if verdict is not None:
            self._tell_pruned(study, trial, config, verdict)
            launched_keys[key] = trial.number
            progress.events.append(f"trial {trial.number} pruned before launch: {verdict.reason[:100]}")
            on_progress(progress)
            return "pruned"
        outcome = self._run_one(study, trial, config, ctx, progress, on_progress, should_stop)
        prelaunch.observe(config.args, outcome.kv_cache_tokens, trial.number)
        launched_keys[key] = trial.number
        progress.launched += 1
        self._update_best(study, progress)
        progress.last = (f"trial {trial.number}: {outcome.value:.1f} {self.objective.metric}"
                         if outcome.ok else f"trial {trial.number} failed: {outcome.failure_class}")
        progress.events.append(progress.last)
        on_progress(progress)
        self.write_trials_table(study)
        return "launched"

    # -- pre-launch pruning --------------------------------------------------------------------
    def _tell_pruned(self, study: optuna.Study, trial: optuna.Trial, config: ServeConfig, verdict: Any) -> None:
        """Record a configuration refused before launch; the sampler learns it is infeasible."""
        tdir = store.trial_dir(self.path, trial.number)
        store.write_json(tdir / "config.json", {"args": config.args, "env": store.safe_env(dict(config.env)),
                                                "params": config.params, "key": config.key(),
                                                "speculative": config.is_speculative})
        score_ = failed_score(self.objective)
        store.write_json(tdir / "outcome.json", {
            "ok": False, "feasible": False, "launched": False, "failure_class": verdict.failure_class,
            "reason": verdict.reason, "value": score_.value, "constraints": list(score_.constraints),
            "evidence": verdict.evidence, "config_key": config.key(), "trial_dir": str(tdir)})
        trial.set_user_attr("trial_dir", str(tdir.relative_to(self.path)))
        trial.set_user_attr("config_key", config.key())
        trial.set_user_attr("launched", False)
        trial.set_user_attr("constraints", list(score_.constraints))
        for name, margin in zip(constraint_names(self.objective), score_.constraints, strict=True):
            trial.set_constraint(name, margin)
        trial.set_user_attr("ok", False)
        trial.set_user_attr("feasible", False)
        trial.set_user_attr("failure_class", verdict.failure_class)
        trial.set_user_attr("reason", verdict.reason[:1000])
        study.tell(trial, score_.value)

    # -- confirmation (tuner.confirm_phase) ----------------------------------------------------
    @property
    def confirmation_phase(self) -> ConfirmationPhase:
        return ConfirmationPhase(self.path, self.record.confirm, self.objective, self.profile)

    def confirmations(self, study: optuna.Study) -> list[Confirmation]:
        return self.confirmation_phase.confirmations(study)

    def winner(self, study: optuna.Study) -> Winner | None:
        """What to export: the best confirmed candidate, else the best feasible screening trial."""
        return self.confirmation_phase.winner(study)

    def _confirm(self, study: optuna.Study, ctx: TrialContext, progress: Progress,
                 on_progress: Callable[[Progress], None], should_stop: Callable[[], bool],
                 deadline: float | None = None) -> None:
        # run_trial is looked up here, at call time, so that tests replacing tuner.study.run_trial reach it.
        self.confirmation_phase.run(study, ctx, run_trial, progress, on_progress, should_stop, deadline)

    def _confirm_reserve_s(self, study: optuna.Study) -> float:
        return self.confirmation_phase.reserve_s(study)

    def _run_one(self, study: optuna.Study, trial: optuna.Trial, config: ServeConfig, ctx: TrialContext,
                 progress: Progress, on_progress: Callable[[Progress], None],
                 should_stop: Callable[[], bool]) -> TrialOutcome:
        tdir = store.trial_dir(self.path, trial.number)
        trial.set_user_attr("trial_dir", str(tdir.relative_to(self.path)))
        trial.set_user_attr("config_key", config.key())
        trial.set_user_attr("speculative", config.is_speculative)
        progress.trial_number = trial.number

        def phase(name: str) -> None:
            progress.phase = name
            on_progress(progress)

        try:
            outcome = run_trial(ctx, config, tdir, should_stop=should_stop, on_phase=phase)
        except BaseException:
            try:
                trial.set_user_attr("interrupted", True)
                trial.set_user_attr("failure_class", FailureClass.INTERRUPTED.value)
                study.tell(trial, state=TrialState.FAIL)
            except Exception as book_exc:  # e.g. the disk is full: keep the first error, not this one
                log.warning("could not mark trial %d as interrupted (%s); `resume` re-runs it anyway",
                            trial.number, book_exc)
            raise
        if outcome.failure_class == FailureClass.INTERRUPTED.value:
            trial.set_user_attr("interrupted", True)
            trial.set_user_attr("failure_class", outcome.failure_class)
            study.tell(trial, state=TrialState.FAIL)
            raise KeyboardInterrupt
        self._record(trial, outcome)
        study.tell(trial, outcome.value)
        return outcome

    def _record(self, trial: optuna.Trial, outcome: TrialOutcome) -> None:
        trial.set_user_attr("constraints", list(outcome.constraints))
        for name, margin in zip(constraint_names(self.objective), outcome.constraints, strict=True):
            trial.set_constraint(name, margin)
        trial.set_user_attr("ok", outcome.ok)
        trial.set_user_attr("feasible", outcome.feasible)
        trial.set_user_attr("failure_class", outcome.failure_class)
        trial.set_user_attr("reason", outcome.reason[:1000])
        trial.set_user_attr("duration_s", round(outcome.duration_s, 2))
        trial.set_user_attr("ready_s", outcome.ready_s)
        if outcome.kv_cache_tokens is not None:
            trial.set_user_attr("kv_cache_tokens", outcome.kv_cache_tokens)
        client = outcome.server_metrics.get("client") or {}
        for flag in ("client_saturated", "client_starved"):  # the chosen step's load generator
            if client.get(flag):
                trial.set_user_attr(flag, True)
        for key in ("p95_ttft_ms", "p95_itl_ms", "p95_tpot_ms", "output_throughput", "request_throughput",
                    "request_goodput", "completed", "failed", "max_concurrency"):
            if key in outcome.summary:
                trial.set_user_attr(key, outcome.summary[key])

    def _tell_duplicate(self, study: optuna.Study, trial: optuna.Trial, original: int) -> None:
        """A configuration already launched: reuse its result instead of launching it again."""
        first = study.trials[original]
        for key, value in first.user_attrs.items():
            if key not in _BOOKKEEPING_ATTRS:
                trial.set_user_attr(key, value)
        trial.set_user_attr("duplicate_of", original)
        for name, margin in first.constraints.items():
            trial.set_constraint(name, margin)
        value = first.value if first.value is not None else failed_score(self.objective).value
        study.tell(trial, value)

    def _enqueue_control(self, study: optuna.Study, config: ServeConfig, launched: dict[str, int]) -> None:
        """Queue the no-speculation control of a speculative trial (distributed runners: no local order)."""
        control = config.control()
        if control.key() in launched:
            return
        study.enqueue_trial(dict(control.params), user_attrs={"control_for": config.key()}, skip_if_exists=True)

    @staticmethod
    def _launched_keys(study: optuna.Study) -> dict[str, int]:
        keys: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            key = t.user_attrs.get("config_key")
            if key and "duplicate_of" not in t.user_attrs and key not in keys:
                keys[key] = t.number
        return keys

    def _time_for_another(self, study: optuna.Study, deadline: float, reserve_s: float = 0.0) -> bool:
        """Start another trial only if it can finish (longest duration so far) before the deadline."""
        durations = [float(t.user_attrs["duration_s"]) for t in study.get_trials(deepcopy=False)
                     if "duration_s" in t.user_attrs and "duplicate_of" not in t.user_attrs]
        # The longest trial so far, not the median: a trial that overruns the night is worse than one fewer.
        estimate = max(durations) if durations else self.profile.server.expected_launch_s
        return time.time() + estimate + reserve_s <= deadline

    def _update_best(self, study: optuna.Study, progress: Progress) -> None:
        best = best_feasible_trial(study)
        if best is not None and best.value is not None:
            progress.best_value = best.value
            progress.best_trial = best.number

    def write_trials_table(self, study: optuna.Study) -> Path:
        frame = trials_frame(study)
        out = self.path / "trials.csv"
        store.write_text(out, frame.to_csv(index=False))
        return out


def ask_fixed(study: optuna.Study, params: Mapping[str, Any], user_attrs: dict[str, Any]) -> optuna.Trial:
    """A RUNNING trial with these parameters, owned by the caller.

    ``enqueue_trial`` + ``ask`` does the same in one process, but in a shared study another worker may
    pop the queued trial first, or this one may pop an older queued trial; creating the trial RUNNING
    takes it straight to the caller. Optuna's ``suggest_*`` return the fixed values, as for a queued trial.
    """
    template = optuna.trial.create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": dict(params)},
                                         user_attrs=user_attrs)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return optuna.Trial(study, trial_id)


def launched_keys_numbers(study: optuna.Study) -> list[int]:
    return [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if "duplicate_of" not in t.user_attrs and t.user_attrs.get("launched", True)]


def trials_frame(study: optuna.Study) -> Any:
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {"number": t.number, "state": t.state.name, "value": t.value}
        row.update({f"param.{k}": v for k, v in t.params.items()})
        row.update({k: v for k, v in t.user_attrs.items() if k != "constraints"})
        row["constraints"] = json.dumps(t.user_attrs.get("constraints"))
        rows.append(row)
    return pd.DataFrame(rows)


def new_record(*, name: str | None, hw: str, objective: str, model: str | None, vllm_cmd: str,
               port: int | None, trials: int | None, budget_s: float | None, seed: int,
               slo_overrides: dict[str, float], ready_timeout_s: float | None,
               guards: list[str] | None = None, storage: str | None = None, checkpoint: str | None = None,
               prevalidate: Literal["auto", "on", "off"] = "auto",
               confirm: ConfirmSpec | None = None, sampler: Literal["tpe", "gp", "random"] = "tpe") -> StudyRecord:
    profile = load_profile(hw)
    checkpoint_name = checkpoint or profile.server.checkpoint
    if checkpoint_name:
        profile = bind_checkpoint(profile, load_checkpoint(checkpoint_name))
    loaded_objective = load_objective(objective)
    try:
        loaded_objective.with_slos(slo_overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"--slo: {first['msg']}. Fix: write --slo <stat>_<metric>_ms=LIMIT, "
                         "e.g. --slo p95_ttft_ms=2000") from exc
    for guard in guards if guards is not None else loaded_objective.guards:
        catalog.resolve("guards", guard)
    chosen_model = model or profile.server.model
    if not chosen_model:
        raise UsageError(f"profile {profile.name!r} names no default model. Fix: pass --model PATH_OR_ID")
    study_name = name or f"{profile.name}-{Path(objective).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    return StudyRecord(name=study_name, hw=hw, objective=objective, model=chosen_model, vllm_cmd=vllm_cmd,
                       port=port, trials=trials, budget_s=budget_s, seed=seed, slo_overrides=slo_overrides,
                       ready_timeout_s=ready_timeout_s, guards=guards, storage=storage, checkpoint=checkpoint,
                       prevalidate=prevalidate, confirm=confirm or ConfirmSpec(), sampler=sampler)

