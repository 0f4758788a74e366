"""The study: one named folder in ``runs/``, its Optuna study, and everything a driver needs to run it.

:class:`Study` creates or opens the folder (``study.json``, the snapshots of its hardware profile and
objective), opens its Optuna study (SQLite in the folder, or a shared RDB storage), builds the
trial context and the trial step, and runs the local driver (:meth:`Study.run`). The scale-out
drivers (:mod:`tuner.backends.worker`, :mod:`tuner.backends.ray`) take the same study and step.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner import catalog, store
from tuner.engines import Engine, make_engine, stop_orphans
from tuner.errors import StudyError, UsageError
from tuner.guards import GuardSuite, NoGuards, load_suite
from tuner.load.affinity import plan_cpu_split
from tuner.load.power import detect_power_reader
from tuner.objective import Objective, constraint_names, load_objective
from tuner.predict import PriorUnavailable
from tuner.search.checkpoints import Checkpoint
from tuner.search.envelope import knee_of, objective_for
from tuner.search.preflight import host_probe
from tuner.search.prelaunch import PreLaunch
from tuner.search.profile import HardwareProfile, bound_profile, load_profile, reference_requires
from tuner.search.space import ServeConfig
from tuner.study.clock import StudyClock
from tuner.study.confirm import Confirmation, ConfirmationPhase, Winner
from tuner.study.guided import GuidedSearch
from tuner.study.lessons import LeverConstraint, load_constraints, probed_constraints
from tuner.study.local import LocalLoop
from tuner.study.progress import Progress
from tuner.study.ranking import write_trials_table
from tuner.study.record import SCHEMA_VERSION, StudyLock, StudyRecord, resolve_model, vocab_size_of
from tuner.study.round import Round
from tuner.study.step import TrialStep, learn_kv
from tuner.study.storage import make_sampler, resolve_storage_url, sqlite_url
from tuner.trial import TrialContext

__all__ = ["Study", "storage_for_record"]

log = logging.getLogger(__name__)

PREVALIDATION_ATTR = "prevalidation"
"""Study attribute: whether the engine's own argument checks ran before launches (PreLaunch.validation_note)."""


def storage_for_record(record: StudyRecord, study_path: Path) -> str:
    """The Optuna storage URL of a study: SQLite in its folder, or the shared URL of ``record.storage``.

    ``study.json`` keeps a shared URL with its password masked (``***``); the real one comes from
    ``$DSV4_TUNE_STORAGE`` (see :mod:`tuner.study.storage`).
    """
    if not record.storage:
        return sqlite_url(study_path)
    return resolve_storage_url(record.storage)


class Study:
    """One named study in ``runs_dir``: create it, run it, resume it."""

    def __init__(self, record: StudyRecord, runs_dir: Path) -> None:
        self.record = record
        self.runs_dir = runs_dir
        self.path = store.study_dir(runs_dir, record.name)
        bound = bound_profile(self._snapshot_profile(), record.checkpoint)
        # The objective at this node's workload scale (server.workload_scale), then --slo: what plan showed.
        self.objective: Objective = objective_for(bound.raw, self._snapshot_objective(),
                                                  record.slo_overrides).with_price(record.gpu_hour_usd)
        self.checkpoint: Checkpoint | None = bound.checkpoint
        self.profile: HardwareProfile = bound.profile
        checkpoint_name = record.checkpoint or bound.raw.server.checkpoint
        # The engine the record names (vLLM unless --engine), for the node this study's profile snapshot is.
        self.engine: Engine = make_engine(record.engine, record.engine_options,
                                          hardware=str(store.profile_snapshot(self.path).resolve()),
                                          checkpoint=checkpoint_name)

    @property
    def clock(self) -> StudyClock:
        """The study's clock: node seconds (the engine's time scale; the wall clock on a real node)."""
        return StudyClock(time_scale=self.engine.units.time_scale)

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

    @staticmethod
    def materialize(runs_dir: Path, record: StudyRecord, profile_yaml: str, objective_yaml: str) -> None:
        """Write a study folder from a shared study's database (a node that has not seen the study)."""
        path = store.study_dir(runs_dir, record.name)
        for snap, text in ((store.profile_snapshot(path), profile_yaml),
                           (path / store.OBJECTIVE_SNAPSHOT, objective_yaml)):
            if not snap.exists():
                store.write_text(snap, text)
            elif snap.read_text(encoding="utf-8") != text:
                raise StudyError(f"{snap} differs from the study's {snap.name} in the database; the folder belongs "
                                 f"to another study of the same name. Fix: use another --runs-dir, or remove {path}")
        if not (path / "study.json").exists():
            store.write_json(path / "study.json", record.model_dump())

    def snapshots(self) -> tuple[str, str]:
        """The texts of the hardware-profile and objective snapshots (what a shared study publishes)."""
        return (store.profile_snapshot(self.path).read_text(encoding="utf-8"),
                (self.path / store.OBJECTIVE_SNAPSHOT).read_text(encoding="utf-8"))

    def _snapshot_profile(self) -> HardwareProfile:
        snap = store.profile_snapshot(self.path)
        if not snap.exists():
            source = load_profile(self.record.hw)  # validates before copying
            store.write_text(snap, catalog.resolve("search_spaces", self.record.hw).read_text(encoding="utf-8"))
            return source
        return load_profile(str(snap))

    def _snapshot_objective(self) -> Objective:
        snap = self.path / store.OBJECTIVE_SNAPSHOT
        if not snap.exists():
            source = load_objective(self.record.objective)
            store.write_text(snap, catalog.resolve("objectives", self.record.objective).read_text(encoding="utf-8"))
            return source
        return load_objective(str(snap))

    # -- Optuna ----------------------------------------------------------------------------------
    def storage(self) -> str | optuna.storages.BaseStorage:
        return storage_for_record(self.record, self.path)

    def sampler(self) -> optuna.samplers.BaseSampler:
        return make_sampler(self.record.seed, kind=self.record.sampler)

    def optuna_study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return optuna.create_study(
                study_name=self.record.name, storage=self.storage(), load_if_exists=True,
                direction=self.objective.direction, sampler=self.sampler())
        except RuntimeError as exc:
            if "schema" not in str(exc):
                raise
            raise StudyError(
                f"{self.path / 'study.db'} was written by a newer Optuna ({exc}). Fix: upgrade dsv4-tune and "
                "Optuna (pip install -U optuna), or open the study with the version that created it") from exc

    def enqueue_baselines(self, ostudy: optuna.Study) -> None:
        """Queue the hardware profile's baselines, once per study (claimed first: workers start together)."""
        if ostudy.user_attrs.get("baselines_enqueued"):
            return
        ostudy.set_user_attr("baselines_enqueued", True)
        for base in self.profile.baselines:
            ostudy.enqueue_trial(dict(base.values), user_attrs={"baseline": base.name}, skip_if_exists=True)
        ostudy.set_user_attr("constraint_names", constraint_names(self.objective))

    def prepare_queue(self, ostudy: optuna.Study) -> None:
        """Baselines first; then re-queue what an earlier run abandoned (RUNNING, or FAIL as interrupted)."""
        self.enqueue_baselines(ostudy)
        requeued: list[int] = list(ostudy.user_attrs.get("requeued", []))
        # A shared study (RDB storage, workers): other workers' RUNNING trials are alive, the dead ones are
        # retried by heartbeat, and an interrupted worker re-queues its own trial (tuner.backends.worker).
        shared = bool(self.record.storage)
        for t in ostudy.get_trials(deepcopy=False):
            abandoned = not shared and (t.state == TrialState.RUNNING or (
                t.state == TrialState.FAIL and t.user_attrs.get("interrupted")))
            if not abandoned or t.number in requeued:
                continue
            if t.state == TrialState.RUNNING:
                ostudy.tell(t.number, state=TrialState.FAIL)
            log.info("re-queueing trial %d, abandoned by an earlier run", t.number)
            ostudy.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            requeued.append(t.number)
        ostudy.set_user_attr("requeued", requeued)

    # -- trials ------------------------------------------------------------------------------------
    def guard_names(self) -> list[str]:
        """``--guards`` when given; else the hardware profile's gates (``guards.run``), then the objective's."""
        if self.record.guards is not None:
            return list(self.record.guards)
        names = list(self.profile.guards.run)
        return names + [g for g in self.objective.guards if g not in names]

    def guard_suite(self) -> GuardSuite:
        names = self.guard_names()
        if not names:
            return NoGuards()
        return load_suite(names, reference_requires=reference_requires(self.profile),
                          reference_source=f"hardware profile {self.profile.name}")

    def context(self) -> TrialContext:
        model = resolve_model(self.record.model, self.runs_dir)
        return TrialContext(
            server_cmd=self.engine.resolve_command(self.record.server_cmd), model=model, objective=self.objective,
            host=self.profile.server.host, port=self.record.port,
            ready_timeout_s=self.startup_limits_s()[0], startup_stall_s=self.startup_limits_s()[1],
            vocab_size=vocab_size_of(model), guards=self.guard_suite(), engine=self.engine,
            served_model_name=Path(model).name if Path(model).exists() else model,
            cpu_split=plan_cpu_split(self.profile.server.client_cpus,
                                     bind_omp=self.profile.hardware.accelerator == "cpu"),
            power=detect_power_reader(), knee=self.knee_predictor(), api_key=store.study_api_key(self.path))

    def startup_limits_s(self) -> tuple[float, float | None]:
        """The ready timeout and the start-up watchdog's stall time, in the seconds the launcher waits.

        The stall time is between two progress lines; until the server's first own log record the watchdog
        adds the real seconds the engine's process needs to start (``LaunchSpec.process_start_grace_s``).

        Both are node time (``--ready-timeout``, ``server.ready_timeout_s``, ``server.startup_stall_s``).
        This is the one place they become real seconds: on a node, one to one; a study clock that runs
        the node faster (the emulated node's start-up time scale) divides them here.
        """
        ready_s = self.record.ready_timeout_s or self.profile.server.ready_timeout_s
        stall_s = self.profile.server.startup_stall_s
        units = self.engine.units
        return (units.client_startup_seconds(ready_s),
                None if stall_s is None else units.client_stall_seconds(stall_s))

    def prelaunch(self, ostudy: optuna.Study) -> PreLaunch:
        """The pre-launch checks, with the KV capacity of every trial launched so far already learnt."""
        checks = PreLaunch(self.profile, self.checkpoint, self.objective, self.record.prevalidate, self.engine)
        if ostudy.user_attrs.get(PREVALIDATION_ATTR) != checks.validation_note:  # the report says whether they ran
            ostudy.set_user_attr(PREVALIDATION_ATTR, checks.validation_note)
        self.learn_kv(ostudy, checks)
        return checks

    def learn_kv(self, ostudy: optuna.Study, checks: PreLaunch) -> None:
        """Feed ``checks`` the logged KV capacity of every launched trial it has not seen yet."""
        learn_kv(ostudy, self.profile, checks)

    def step(self, ostudy: optuna.Study, ctx: TrialContext, prelaunch: PreLaunch | None = None) -> TrialStep:
        """The trial step of this study (every driver's), with the pre-launch checks learnt from ``ostudy``."""
        checks = prelaunch if prelaunch is not None else self.prelaunch(ostudy)
        if ctx.knee is not None:  # each launch's knee from the model as refitted to the night's launches so far
            ctx = dataclasses.replace(ctx, knee=self.knee_predictor(checks))
        return TrialStep(self.path, self.profile, self.objective, ostudy, ctx, checks, self.probed_constraints())

    def round(self, ostudy: optuna.Study, ctx: TrialContext, *, shared: bool = False) -> Round:
        """The study's round (every driver's): its trial step and, with ``--prior model``, the guide."""
        return Round(self.step(ostudy, ctx), self.guided_search(ostudy), shared=shared,
                     stop_when_done=self.record.stop_when_done)

    def probed_constraints(self) -> tuple[LeverConstraint, ...]:
        """The lever values a cheap probe of this host rules out before any launch (FP8 KV on a CPU
        without AVX-512); none for an engine that does not run on this host (the emulated node)."""
        if self.record.engine != "vllm":
            return ()
        return tuple(probed_constraints(self.profile, host_probe().cpu_flags()))

    def learned_constraints(self) -> list[LeverConstraint]:
        """The lever values this study never launches, with their evidence (``constraints.json``: a host probe's,
        and those a start failure taught)."""
        return load_constraints(self.path)

    def host_notes(self) -> list[str]:
        """What the morning's files say of this host beyond the trials: the pre-flight mismatches a ``--force``
        run went on with, then each learned constraint with its evidence."""
        forced = [f"pre-flight mismatch (run with --force): {line}" for line in self.record.preflight_mismatches]
        return forced + [f"learned constraint: {c.describe()}" for c in self.learned_constraints()]

    def knee_predictor(self, checks: PreLaunch | None = None) -> Callable[[ServeConfig], int] | None:
        """A configuration's KV knee (the feasibility model's max concurrency), for a ladder stepped by it.

        None when the objective's ladder is not knee-relative. ``checks`` lends its KV refit (what the
        night's launches logged) as it stands at each launch.
        """
        if not self.objective.knee_relative:
            return None

        def knee(config: ServeConfig) -> int:
            return knee_of(self.profile, config, self.checkpoint, self.objective,
                           checks.calibration if checks is not None else None)

        return knee

    def stop_orphans(self) -> list[dict[str, object]]:
        """Stop servers an earlier run of this study left behind on this node."""
        return stop_orphans(self.path / "trials", markers=(self.engine.name,))

    # -- the local driver --------------------------------------------------------------------------
    def run(self, *, on_progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> optuna.Study:
        """Screen, then confirm, on this node (:class:`~tuner.study.local.LocalLoop`)."""
        with StudyLock(self.path):
            orphans = self.stop_orphans()
            if orphans:
                log.warning("stopped %d orphaned server(s) left by an earlier run", len(orphans))
            ctx = self.context()
            ostudy = self.optuna_study()
            store.write_json(self.path / "study.json", self.record.model_dump())
            self.prepare_queue(ostudy)
            loop = LocalLoop(self.round(ostudy, ctx), self.record, self.confirmation_phase,
                             self.profile.server.expected_launch_s, clock=self.clock)
            return loop.run(on_progress or (lambda _p: None), should_stop or (lambda: False))

    def guided_search(self, ostudy: optuna.Study) -> GuidedSearch | None:
        """``--prior model``: the model-guided search, its prior picks queued after the baselines.

        None with ``--prior none``, or where the model cannot predict this study (logged with the reason:
        the sampler then searches alone).
        """
        if self.record.prior != "model":
            return None
        try:
            guided = GuidedSearch.build(self.profile, self.checkpoint, self.objective, self.path,
                                        seed=self.record.seed)
        except PriorUnavailable as exc:
            log.warning("--prior model: %s; the sampler searches alone", exc)
            return None
        guided.enqueue_prior(ostudy)
        return guided

    # -- confirmation and the winner ---------------------------------------------------------------
    @property
    def confirmation_phase(self) -> ConfirmationPhase:
        return ConfirmationPhase(self.path, self.record.confirm, self.objective, self.profile)

    def confirmations(self, ostudy: optuna.Study) -> list[Confirmation]:
        return self.confirmation_phase.confirmations(ostudy)

    def winner(self, ostudy: optuna.Study) -> Winner | None:
        """What to export: the best confirmed candidate, else the best feasible screening trial."""
        return self.confirmation_phase.winner(ostudy)

    def write_trials_table(self, ostudy: optuna.Study | None = None) -> Path:
        """``trials.csv`` of ``ostudy`` (opened here when not given)."""
        return write_trials_table(ostudy if ostudy is not None else self.optuna_study(), self.path)
