"""The Ray driver: a study's trials as Ray Tune trials, one whole node each.

    dsv4-tune run --backend ray --ray-address HEAD:6379 --hw h200x8 --objective throughput --trials 40

The driver (this process) holds the study: Optuna storage, queue (baselines, re-queued trials),
de-duplication, constraints, the trials table. Its Tune searcher takes the study's round
(:mod:`tuner.study.round`) as the local loop does: propose, screen, a speculative proposal's control
first, pre-launch checks; it ships each trial to a node (:meth:`~tuner.study.step.TrialStep.begin`)
and learns from the result that comes back (:meth:`~tuner.study.round.Round.learned`: the record, the
KV refit, start failures and, with ``--prior model``, the prior's correction and stop estimate).
The result is an ordinary study: ``status``, ``export`` and ``resume`` read it as any other.

Controls first, side by side: a speculative proposal whose control has not run yet is held while
its control runs (on whichever node is free), and shipped when the control's result is in, so its
equivalence gate can compare with the control, as on the other drivers. Other proposals fill the
other nodes meanwhile. ``--trials N`` counts shipped trials; a held twin is shipped even past it
(the pair may pass ``--trials`` by one, as locally). A twin still held when Tune stops (its budget)
is marked interrupted, and ``resume`` queues it again.

Each Ray trial reserves a placement group of one bundle holding all of a node's GPUs
(``STRICT_PACK``: one node), and runs the one trial implementation, :func:`tuner.trial.run_trial`,
there (guards included). ``max_concurrent_trials`` defaults to the number of nodes that can hold a
trial. A trial whose node (or worker process) dies is retried by Tune (``--max-retries``) on any
node with room; the lost attempt's folder is kept beside it as ``<n>.lost-<k>``.

Artifacts are gathered: a trial returns its folder's files (the server log capped) with its result,
and the driver writes those missing under its own ``--runs-dir``; nodes need no shared filesystem.
Each node must have dsv4-tune, vLLM and the model at the same paths.
"""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import logging
import os
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from tuner import store
from tuner.backends.node import REFERENCE_ATTR, NodeIdentity, check_node, node_identity
from tuner.backends.worker import OnMismatch
from tuner.errors import SearchStalledError, UsageError
from tuner.objective import failed_score
from tuner.search.space import build_config
from tuner.study import Proposal, Study, StudyLock, StudyRecord
from tuner.study.ranking import launched_numbers
from tuner.study.round import Round
from tuner.study.storage import shared_sampler
from tuner.study.study import storage_for_record
from tuner.trial import TrialOutcome, run_trial

if TYPE_CHECKING:
    from ray.tune.search import Searcher

__all__ = ["RayOptions", "TrialJob", "cluster_nodes", "is_loopback", "make_searcher", "outcome_from_json",
           "pack_folder", "ray_trial", "run_study", "unpack_folder"]

log = logging.getLogger(__name__)

LOG_CAP_BYTES = 1_000_000
MAX_WAITING_PER_SUGGEST = 50
"""Proposals one ``suggest`` may set aside (held for a running control, or running on another node) before
it answers "nothing now": Tune asks again when a node frees. These are neither launches nor refusals."""
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None
    max_concurrent_trials: int | None = None
    gpus_per_trial: int | None = None
    max_retries: int = 2
    on_mismatch: OnMismatch = "refuse"


@dataclass(frozen=True)
class TrialJob:
    """What a Ray trial needs on its node (pickled once, shipped by ``tune.with_parameters``)."""

    record: dict[str, Any]
    runs_dir: str
    profile_yaml: str
    objective_yaml: str
    on_mismatch: str


# -- on the node -------------------------------------------------------------------------------------
def pack_folder(folder: Path) -> str:
    """The trial folder's files as base64 tar.gz; the server log keeps its last ``LOG_CAP_BYTES``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if not path.is_file() or path.name.startswith("."):
                continue
            data = path.read_bytes()
            if len(data) > LOG_CAP_BYTES:
                data = data[-LOG_CAP_BYTES:]
            info = tarfile.TarInfo(path.name)
            info.size = len(data)
            info.mtime = int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def unpack_folder(blob: str, folder: Path) -> list[str]:
    """Write the packed files that ``folder`` lacks (a shared runs dir already has them)."""
    written: list[str] = []
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(blob)), mode="r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if not member.isfile() or name != member.name or (folder / name).exists():
                continue
            fh = tar.extractfile(member)
            if fh is not None:
                (folder / name).write_bytes(fh.read())
                written.append(name)
    return written


def _set_aside_lost_attempts(tdir: Path) -> int:
    """A folder without ``outcome.json`` is what a dead attempt left: keep it as ``<n>.lost-<k>``."""
    attempt = 1
    while tdir.with_name(f"{tdir.name}.lost-{attempt}").exists():
        attempt += 1
    if tdir.exists() and not (tdir / "outcome.json").exists():
        tdir.rename(tdir.with_name(f"{tdir.name}.lost-{attempt}"))
        return attempt + 1
    return attempt


def ray_trial(config: Mapping[str, Any], job: TrialJob) -> dict[str, Any]:
    """One Ray trial on its node: the study's own ``run_trial``, then the result and the folder's files."""
    import ray

    runs_dir = Path(job.runs_dir)
    record = StudyRecord.model_validate(job.record)
    Study.materialize(runs_dir, record, job.profile_yaml, job.objective_yaml)
    study = Study(record, runs_dir)
    ctx = study.context()
    identity = node_identity(ctx.server_cmd, study.engine)
    context = ray.get_runtime_context()
    # JSON strings, not nested dicts: Tune flattens nested results before the searcher sees them
    base: dict[str, Any] = {"node": json.dumps(identity.to_json()),
                            "gpu_ids": json.dumps([str(g) for g in ray.get_gpu_ids()]),
                            "ray_node_id": context.get_node_id(), "pid": os.getpid()}
    reference = json.loads(str(config.get("reference") or "null"))
    if reference and job.on_mismatch == "refuse":
        diffs = identity.differences(NodeIdentity.from_json(reference))
        if diffs:
            return {**base, "value": failed_score(study.objective).value, "node_mismatch": json.dumps(diffs)}
    stopped = study.stop_orphans()
    if stopped:
        log.warning("stopped %d server(s) left by a lost attempt on this node", len(stopped))
    tdir = store.trial_dir(study.path, int(config["trial_number"]))
    attempt = _set_aside_lost_attempts(tdir)
    outcome = run_trial(ctx, build_config(study.profile, dict(config["params"])), tdir)
    return {**base, "value": outcome.value, "outcome": json.dumps(outcome.to_json(), default=str), "attempt": attempt,
            "artifacts": pack_folder(tdir)}


# -- in the driver -----------------------------------------------------------------------------------
def outcome_from_json(data: Mapping[str, Any]) -> TrialOutcome:
    fields = set(TrialOutcome.__dataclass_fields__)
    values = {k: v for k, v in data.items() if k in fields}
    values["constraints"] = tuple(float(c) for c in values.get("constraints", ()))
    return TrialOutcome(**values)


def is_loopback(address: str | None) -> bool:
    if not address or address == "auto":
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_searcher(study: Study, rnd: Round,
                  budget: int | None) -> tuple[Searcher, Callable[[], SearchStalledError | None]]:
    """Tune's searcher over the study's round, and what to call once Tune stops: it closes the twins the
    searcher still holds, and returns why the search stopped when the step's stop rule ended it (else None)."""
    from ray.tune.search import Searcher

    ostudy = rnd.ostudy

    class StudySearch(Searcher):  # type: ignore[misc]
        """Tune's searcher over the study's round: ships proposals, learns from results, controls first."""

        def __init__(self) -> None:
            super().__init__(metric="value", mode="max" if study.objective.direction == "maximize" else "min")
            self.running: dict[str, Proposal] = {}
            """Tune trial id → the proposal it runs."""
            self.held: dict[str, list[Proposal]] = {}
            """Tune trial id of a running control → the speculative proposals waiting for it."""
            self.ready: list[Proposal] = []
            """Speculative proposals whose control has ended: shipped before anything new."""
            self.shipped = 0
            self.stalled: SearchStalledError | None = None
            """The step's stop rule ended the search (space exhausted, or every proposal refused)."""

        def suggest(self, trial_id: str) -> dict[Any, Any] | None:
            finished: Any = Searcher.FINISHED  # a string Tune takes for "no more trials"
            if self.stalled is not None:
                return None if self.held or self.ready else finished  # type: ignore[no-any-return]
            try:
                return self._suggest(trial_id)
            except SearchStalledError as exc:  # the step's stop rule, as on the other drivers
                log.warning("search stopped (%s): %s", exc.kind, exc)
                self.stalled = exc
                return None if self.held or self.ready else finished  # type: ignore[no-any-return]

        def _suggest(self, trial_id: str) -> dict[Any, Any] | None:
            while self.ready:  # a twin whose control ended; the pair may pass --trials by one
                twin = self.ready.pop(0)
                rnd.step.learn_kv()
                if rnd.admit(twin) is None:
                    return self._ship(trial_id, twin)
            if (budget is not None and self.shipped >= budget) or rnd.done():
                finished: Any = Searcher.FINISHED
                return None if self.held else finished  # type: ignore[no-any-return]
            for _ in range(MAX_WAITING_PER_SUGGEST):  # duplicates and refusals count in the step's stop rule
                busy = {p.key: p.number for p in self._busy()}
                opening = rnd.open(rnd.propose(), busy=busy, hold=self._hold)
                if opening.status != "go":
                    continue
                if opening.control is not None:
                    try:
                        control_refused = rnd.admit(opening.control) is not None
                    except SearchStalledError:
                        rnd.step.skip(opening.proposal, "the search stopped on its control's refusal, before it "
                                                        "launched")
                        raise
                    if not control_refused:
                        self.held[trial_id] = [opening.proposal]  # shipped once the control's result is in
                        return self._ship(trial_id, opening.control)
                if rnd.admit(opening.proposal) is None:  # the pre-launch checks, before a node is spent on it
                    return self._ship(trial_id, opening.proposal)
            return None  # proposals waiting on busy nodes only: ask again later

        def _hold(self, proposal: Proposal) -> bool:
            """Hold a speculative proposal whose control runs already (for another twin) until that ends."""
            control_key = proposal.config.control().key()
            holder = next((tid for tid, p in self.running.items() if p.key == control_key), None)
            if holder is None:
                return False
            self.held.setdefault(holder, []).append(proposal)
            return True

        def _busy(self) -> list[Proposal]:
            """Proposals on a node now, or held for one."""
            held = [p for twins in self.held.values() for p in twins]
            return [*self.running.values(), *held, *self.ready]

        def _ship(self, trial_id: str, proposal: Proposal) -> dict[str, Any]:
            rnd.step.begin(proposal)
            proposal.trial.set_user_attr("backend", "ray")
            self.running[trial_id] = proposal
            self.shipped += 1
            return {"trial_number": proposal.number, "params": dict(proposal.trial.params),
                    "reference": json.dumps(ostudy.user_attrs.get(REFERENCE_ATTR))}

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            return  # one result per trial, at its end

        def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                              error: bool = False) -> None:
            proposal = self.running.pop(trial_id, None)
            if proposal is None:
                return
            try:
                self._complete(proposal, result, error)
            finally:
                self.ready.extend(self.held.pop(trial_id, []))
                study.write_trials_table(ostudy)

        def abandon_held(self) -> SearchStalledError | None:
            """Twins never shipped (Tune stopped first): interrupted, so ``resume`` queues them again.

            Returns the step's stop, if that is what ended the search.
            """
            for twin in [*self.ready, *(p for held in self.held.values() for p in held)]:
                log.warning("trial %d: its control ran but Tune stopped before it; resume runs it", twin.number)
                rnd.step.interrupted(twin)
            self.ready.clear()
            self.held.clear()
            return self.stalled

        def _complete(self, proposal: Proposal, result: dict[str, Any] | None, error: bool) -> None:
            ot_trial = proposal.trial
            if error or not result or "value" not in result:
                ot_trial.set_user_attr("failure_class", "node_lost")
                ot_trial.set_user_attr("reason", "the trial's node or Ray worker died on every attempt")
                ostudy.tell(ot_trial, state=TrialState.FAIL)
                log.error("trial %d lost on every attempt", ot_trial.number)
                return
            node = NodeIdentity.from_json(json.loads(result["node"]))
            gpu_ids = json.loads(result.get("gpu_ids") or "[]")
            for key, value in (("node", node.hostname), ("node_fingerprint", node.fingerprint()),
                               ("ray_node_id", result.get("ray_node_id")), ("ray_gpu_ids", gpu_ids),
                               ("attempt", result.get("attempt", 1))):
                ot_trial.set_user_attr(key, value)
            diffs = check_node(ostudy, node)
            if "outcome" in result:
                tdir = store.trial_dir(study.path, ot_trial.number)
                gathered = unpack_folder(str(result.get("artifacts", "")), tdir) if result.get("artifacts") else []
                if gathered:
                    log.info("trial %d: gathered %d file(s) from %s", ot_trial.number, len(gathered), node.hostname)
            if diffs:
                ot_trial.set_user_attr("failure_class", "node_mismatch")
                ot_trial.set_user_attr("reason", "node differs from the study's: " + "; ".join(diffs))
                ostudy.tell(ot_trial, state=TrialState.FAIL)
                log.error("trial %d ran on a node unlike the study's (%s); not ranked", ot_trial.number,
                          "; ".join(diffs))
                return
            outcome = outcome_from_json(json.loads(result["outcome"]))
            rnd.learned(proposal, outcome)
            log.info("trial %d on %s: %s", ot_trial.number, node.hostname,
                     f"{outcome.value:.1f} {study.objective.metric}" if outcome.ok
                     else f"failed: {outcome.failure_class}")

        def save(self, checkpoint_path: str) -> None:
            raise NotImplementedError  # the study's storage is the state; `resume` reads it

        def restore(self, checkpoint_path: str) -> None:
            raise NotImplementedError

    searcher = StudySearch()
    return searcher, searcher.abandon_held


def cluster_nodes(gpus_per_trial: int) -> int:
    """Alive nodes that can hold one trial."""
    import ray

    count = 0
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        resources = node.get("Resources", {})
        if node.get("Alive") and (resources.get("GPU", 0) >= gpus_per_trial if gpus_per_trial
                                  else resources.get("CPU", 0) >= 1):
            count += 1
    return count


def _job(study: Study, runs_dir: Path, on_mismatch: str) -> TrialJob:
    record = study.record
    model = Path(record.model).expanduser()
    if model.exists():  # Ray runs trials in their own working directory
        record = record.model_copy(update={"model": str(model.resolve())})
    profile_yaml, objective_yaml = study.snapshots()
    return TrialJob(record=record.model_dump(mode="json"), runs_dir=str(runs_dir.resolve()),
                    profile_yaml=profile_yaml, objective_yaml=objective_yaml, on_mismatch=on_mismatch)


def run_study(study: Study, options: RayOptions) -> optuna.Study:
    """Run ``study`` on a Ray cluster until its target, budget or space is exhausted."""
    address = options.address or os.environ.get("RAY_ADDRESS") or "auto"
    if is_loopback(address):
        os.environ[LOOPBACK_ENV] = "0"  # else Ray swaps 127.0.0.1 for the host's outward address
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    # the gathered artifacts replace Tune's per-trial result files; its end-of-run analysis need not warn
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    with StudyLock(study.path):
        stopped = study.stop_orphans()
        if stopped:
            log.warning("stopped %d orphaned server(s) left by an earlier run", len(stopped))
        storage = optuna.storages.RDBStorage(storage_for_record(study.record, study.path))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        ostudy = optuna.create_study(study_name=study.record.name, storage=storage, load_if_exists=True,
                                     direction=study.objective.direction, sampler=shared_sampler(study.record.seed))
        study.prepare_queue(ostudy)
        done = len(launched_numbers(ostudy))
        remaining = None if study.record.trials is None else study.record.trials - done
        if remaining is not None and remaining <= 0:
            log.info("study %s already has %d launches", study.record.name, done)
            return ostudy
        gpus = options.gpus_per_trial if options.gpus_per_trial is not None else (
            0 if study.profile.hardware.accelerator == "cpu" else study.profile.hardware.device_count)
        if not ray.is_initialized():
            init: dict[str, Any] = {"address": address, "logging_level": logging.WARNING, "log_to_driver": False}
            if is_loopback(address):
                init["_node_ip_address"] = "127.0.0.1"
                # Ray reads LOOPBACK_ENV once, when it is first imported; a process that imported it before
                # this call (a notebook, a test session) has the outward address already: say it again here.
                from ray._private import ray_constants

                ray_constants.ENABLE_RAY_CLUSTER = False
            ray.init(**init)
        nodes = cluster_nodes(gpus)
        if nodes == 0:
            raise UsageError(f"no node of the Ray cluster at {address} has {gpus} GPU(s) for one trial. Fix: "
                             "check `ray status`, or pass --gpus-per-trial")
        concurrent = options.max_concurrent_trials or nodes
        log.info("Ray cluster %s: %d node(s) for trials of %d GPU(s); %d at once", address, nodes, gpus, concurrent)
        bundle: dict[str, float] = {"CPU": 1}
        if gpus:
            bundle["GPU"] = gpus
        trainable = tune.with_resources(
            tune.with_parameters(ray_trial, job=_job(study, study.runs_dir, options.on_mismatch)),
            tune.PlacementGroupFactory([bundle], strategy="STRICT_PACK"))
        searcher, abandon_held = make_searcher(study, study.round(ostudy, study.context()), remaining)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=concurrent,
                                        time_budget_s=study.record.budget_s),
            run_config=tune.RunConfig(name=f"{study.record.name}-ray", storage_path=str((study.path / "ray").resolve()),
                                      failure_config=tune.FailureConfig(max_failures=options.max_retries),
                                      verbose=0))
        stalled: SearchStalledError | None = None
        try:
            tuner.fit()
        finally:
            stalled = abandon_held()
        final = optuna.load_study(study_name=study.record.name, storage=storage)
        study.write_trials_table(final)
        if stalled is not None and stalled.kind == "refused":
            raise stalled
        return final
