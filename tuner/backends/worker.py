"""Worker mode: several tuners, one per node, share one study on Optuna RDB storage (PostgreSQL).

    dsv4-tune worker --storage postgresql://user@db-host/dsv4 --study NAME [--runs-dir DIR] [--worker-id ID]

Every worker runs its own server on its own GPUs and tells into the same Optuna study, one round at
a time (:mod:`tuner.study.round`, as the local loop; with ``--prior model`` the guide learns from every
launch, the other workers' too). While a trial runs, a heartbeat thread
stamps it in the database; before each ask a worker fails the trials whose heartbeat went stale (a
worker that died, or a node that lost power) and Optuna's retry callback queues them again, so a
dead worker's trial is finished by another one.

The study's settings travel in the database (``dsv4_record``, and the hardware-profile and objective
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
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import optuna

from tuner import store
from tuner.backends.node import NodeIdentity, check_node, node_identity
from tuner.errors import NodeMismatchError, SearchStalledError, StudyError
from tuner.study import Progress, Proposal, Study, StudyLock, StudyRecord
from tuner.study.ranking import launched_numbers, time_for_another
from tuner.study.round import ProgressSeat, Round
from tuner.study.storage import heartbeat, make_storage, mask_url, resolve_storage_url, shared_sampler, study_exists

__all__ = ["LABEL_OF_ATTR", "OnMismatch", "SharedStudy", "Worker", "WorkerOptions", "labelled_sibling",
           "launch_lock", "open_shared", "publish", "run_worker"]

log = logging.getLogger(__name__)

RECORD_ATTR = "dsv4_record"
PROFILE_ATTR = "dsv4_profile_yaml"
OBJECTIVE_ATTR = "dsv4_objective_yaml"
LABEL_OF_ATTR = "label_of"
OnMismatch = Literal["refuse", "label"]


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

    def sampler(self) -> optuna.samplers.BaseSampler:
        return shared_sampler(self.record.seed)


def publish(study: SharedStudy) -> None:
    """Put the study's settings in the database, so workers on other nodes can join it."""
    ostudy = study.optuna_study()
    if RECORD_ATTR in ostudy.user_attrs:
        return
    profile_yaml, objective_yaml = study.snapshots()
    ostudy.set_user_attr(RECORD_ATTR, json.loads(study.record.model_dump_json()))
    ostudy.set_user_attr(PROFILE_ATTR, profile_yaml)
    ostudy.set_user_attr(OBJECTIVE_ATTR, objective_yaml)


def open_shared(name: str, runs_dir: Path, storage: optuna.storages.BaseStorage, *, url: str,
                create: StudyRecord | None = None) -> SharedStudy:
    """Join study ``name`` on ``storage``; create it from ``create`` if it is not there yet."""
    if study_exists(storage, name):
        attrs = optuna.load_study(study_name=name, storage=storage).user_attrs
        if RECORD_ATTR not in attrs:
            raise StudyError(f"study {name!r} on {mask_url(url)} was not made by dsv4-tune (no {RECORD_ATTR}). "
                             "Fix: pick another --study name")
        record = StudyRecord.model_validate(attrs[RECORD_ATTR])
        Study.materialize(runs_dir, record, str(attrs[PROFILE_ATTR]), str(attrs[OBJECTIVE_ATTR]))
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


class Worker:
    """One worker of a shared study: the trial step in a loop, plus heartbeats and stale-trial retry."""

    def __init__(self, study: SharedStudy, options: WorkerOptions, *, url: str,
                 identity: NodeIdentity | None = None) -> None:
        self.study = study
        self.options = options
        self.url = url
        self._identity = identity

    def identity(self) -> NodeIdentity:
        if self._identity is None:
            self._identity = node_identity(self.study.context().server_cmd, self.study.engine)
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
            study.enqueue_baselines(ostudy)
            return self._loop(study.round(ostudy, ctx, shared=True), show)

    def _loop(self, rnd: Round, on_progress: Callable[[Progress], None]) -> optuna.Study:
        """The study's round, one at a time on this node, until the study's target or this worker's budget."""
        study, record, ostudy = self.study, self.study.record, rnd.ostudy
        budget_s = self.options.budget_s if self.options.budget_s is not None else record.budget_s
        deadline = time.time() + budget_s if budget_s else None
        progress = Progress(study=record.name, target=record.trials, deadline=deadline)
        seat = _WorkerSeat(progress, on_progress, metric=rnd.step.objective.metric, worker=self)

        def room(launches: int) -> bool:
            return deadline is None or time_for_another(ostudy, deadline, study.profile.server.expected_launch_s,
                                                        launches=launches)

        stalled: SearchStalledError | None = None
        while True:
            with launch_lock(self.options.launch_lock):
                stopped = study.stop_orphans()
                if stopped:
                    log.warning("stopped %d server(s) left by a dead worker on this node", len(stopped))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    optuna.storages.fail_stale_trials(ostudy)
                progress.launched = len(launched_numbers(ostudy))
                if record.trials is not None and progress.launched >= record.trials:
                    progress.last = f"the study reached --trials {record.trials}"
                    break
                if not room(1):
                    progress.last = "budget left is shorter than one trial; stopping"
                    break
                if rnd.done():
                    progress.last = "--stop-when-done: the model's stop estimate says the night is won"
                    break
                trial = rnd.ask()
                try:
                    with heartbeat(trial, self.options.heartbeat_interval_s):
                        self.stamp(trial)
                        played = rnd.play(seat, trial, room)
                    if played == "no_room":
                        progress.last = ("budget left is shorter than a speculative trial with its control (two "
                                         "launches); stopping, the trial goes back to the queue")
                        break
                except SearchStalledError as exc:  # the step's stop rule, as in the local loop
                    stalled = exc
                    progress.last = str(exc)
                    log.warning("worker %s: search stopped (%s): %s", self.options.worker_id, exc.kind, exc)
                    break
            study.write_trials_table(ostudy)
        progress.phase = "done"
        on_progress(progress)
        study.write_trials_table(ostudy)
        if stalled is not None and stalled.kind == "refused":
            raise stalled
        return ostudy

    def stamp(self, trial: optuna.Trial) -> None:
        """The node a trial ran on, on the trial: its worker, host and node fingerprint."""
        identity = self.identity()
        trial.set_user_attr("worker_id", self.options.worker_id)
        trial.set_user_attr("node", identity.hostname)
        trial.set_user_attr("node_fingerprint", identity.fingerprint())


@dataclass
class _WorkerSeat(ProgressSeat):
    """A worker's launches run here; a control (asked inside the round) gets its own heartbeat and node stamp.

    The control runs on this node, so the speculative trial's equivalence gate finds the control's outputs
    in this node's study folder. A control already launched is not run again; one running on another worker
    is left to it (the twin's gate then compares with the other baselines only).
    """

    worker: Worker = field(kw_only=True)

    @contextlib.contextmanager
    def around(self, proposal: Proposal) -> Iterator[None]:
        if "control_for" not in proposal.trial.user_attrs:
            yield  # the proposal itself: the worker's loop holds its heartbeat
            return
        with heartbeat(proposal.trial, self.worker.options.heartbeat_interval_s):
            self.worker.stamp(proposal.trial)
            yield


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
