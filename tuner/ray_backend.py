"""The Ray backend: a study's trials as Ray Tune trials, one whole node each.

    dsv4-tune run --backend ray --ray-address HEAD:6379 --hw h200x8 --objective throughput --trials 40

The driver (this process) holds the study: Optuna storage, queue (baselines, re-queued trials,
speculation controls), de-duplication, constraints, the trials table. Ray Tune's ``OptunaSearch``
asks the same define-by-run space (:func:`tuner.space.suggest`) from the study's own storage, so
the result is an ordinary study: ``status``, ``export`` and ``resume`` read it as any other.

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
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from tuner import store
from tuner.launcher import stop_orphans
from tuner.objective import failed_score
from tuner.prelaunch import PreLaunch
from tuner.space import build_config, suggest
from tuner.study import MAX_DUPLICATES_IN_A_ROW, Study, StudyLock, StudyRecord, launched_keys_numbers, storage_url
from tuner.trial import TrialContext, TrialOutcome, run_trial
from tuner.worker import (
    REFERENCE_ATTR,
    NodeIdentity,
    OnMismatch,
    _materialize,
    node_identity,
    resolve_storage_url,
    shared_sampler,
)

if TYPE_CHECKING:
    from ray.tune.search.optuna import OptunaSearch

log = logging.getLogger(__name__)

LOG_CAP_BYTES = 1_000_000
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
    _materialize(runs_dir, record, job.profile_yaml, job.objective_yaml)
    study = Study(record, runs_dir)
    ctx = study.context()
    identity = node_identity(ctx.vllm_cmd)
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
    stopped = stop_orphans(study.path / "trials")
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


def _is_loopback(address: str | None) -> bool:
    if not address or address == "auto":
        return False
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _make_searcher(study: Study, storage: optuna.storages.BaseStorage, on_mismatch: OnMismatch) -> OptunaSearch:
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    profile = study.profile
    prelaunch = PreLaunch(profile, study.checkpoint, study.objective, study.record.prevalidate)

    def space(trial: optuna.Trial) -> None:
        suggest(profile, trial)

    class StudySearch(OptunaSearch):  # type: ignore[misc]
        """OptunaSearch on the study's storage, with the study's de-duplication, constraints and controls."""

        def __init__(self) -> None:
            super().__init__(space=space, metric="value", mode="max" if study.objective.direction == "maximize"
                             else "min", sampler=shared_sampler(study.record.seed), study_name=study.record.name,
                             storage=storage)
            self.running: dict[str, str] = {}
            self.ctx: TrialContext | None = None

        def suggest(self, trial_id: str) -> dict[Any, Any] | None:
            ostudy = self._study()
            for _ in range(MAX_DUPLICATES_IN_A_ROW):
                params = super().suggest(trial_id) or {}
                ot_trial: optuna.Trial = self._ot_trials[trial_id]
                config = build_config(profile, params)
                key = config.key()
                launched = study._launched_keys(ostudy)
                if key in launched or key in self.running.values():
                    if key in launched:
                        study._tell_duplicate(ostudy, ot_trial, launched[key])
                    else:
                        ot_trial.set_user_attr("skipped", "the same configuration is running on another node")
                        ostudy.tell(ot_trial, state=TrialState.FAIL)
                    del self._ot_trials[trial_id]
                    continue
                study.learn_kv(ostudy, prelaunch)  # every launch so far, this run's and a resumed study's
                verdict = prelaunch.check(config, self._context())
                if verdict is not None:  # the local loop's pre-launch pruning, before a node is spent on it
                    study._tell_pruned(ostudy, ot_trial, config, verdict)
                    del self._ot_trials[trial_id]
                    continue
                ot_trial.set_user_attr("trial_dir", str(store.trial_dir(study.path, ot_trial.number)
                                                        .relative_to(study.path)))
                ot_trial.set_user_attr("config_key", key)
                ot_trial.set_user_attr("speculative", config.is_speculative)
                ot_trial.set_user_attr("backend", "ray")
                self.running[trial_id] = key
                return {"trial_number": ot_trial.number, "params": dict(params),
                        "reference": json.dumps(ostudy.user_attrs.get(REFERENCE_ATTR))}
            log.warning("the sampler keeps proposing launched configurations; space exhausted")
            finished: Any = Searcher.FINISHED  # a string Tune takes for "no more trials"
            return finished  # type: ignore[no-any-return]

        def _context(self) -> TrialContext:
            if self.ctx is None:
                self.ctx = study.context()
            return self.ctx

        def _study(self) -> optuna.Study:
            ostudy: optuna.Study = self.__dict__["_ot_study"]  # set by OptunaSearch._setup_study
            return ostudy

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            return  # one result per trial, at its end

        def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                              error: bool = False) -> None:
            self.running.pop(trial_id, None)
            ot_trial: optuna.Trial | None = self._ot_trials.pop(trial_id, None)
            if ot_trial is None:
                return
            ostudy = self._study()
            try:
                self._complete(ostudy, ot_trial, result, error)
            finally:
                study.write_trials_table(ostudy)

        def _complete(self, ostudy: optuna.Study, ot_trial: optuna.Trial, result: dict[str, Any] | None,
                      error: bool) -> None:
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
            ostudy.set_user_attr(f"node_identity:{node.fingerprint()}", node.to_json())
            if ostudy.user_attrs.get(REFERENCE_ATTR) is None:
                ostudy.set_user_attr(REFERENCE_ATTR, node.to_json())
            diffs = node.differences(NodeIdentity.from_json(ostudy.user_attrs[REFERENCE_ATTR]))
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
            study._record(ot_trial, outcome)
            ostudy.tell(ot_trial, outcome.value)
            log.info("trial %d on %s: %s", ot_trial.number, node.hostname,
                     f"{outcome.value:.1f} {study.objective.metric}" if outcome.ok
                     else f"failed: {outcome.failure_class}")
            config = build_config(profile, dict(ot_trial.params))
            if config.is_speculative:
                study._enqueue_control(ostudy, config, study._launched_keys(ostudy))

        def save(self, checkpoint_path: str) -> None:
            raise NotImplementedError  # the study's storage is the state; `resume` reads it

        def restore(self, checkpoint_path: str) -> None:
            raise NotImplementedError

    return StudySearch()


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


def _storage_of(study: Study) -> optuna.storages.BaseStorage:
    url = resolve_storage_url(study.record.storage) if study.record.storage else storage_url(study.path)
    return optuna.storages.RDBStorage(url)


def _job(study: Study, runs_dir: Path, on_mismatch: str) -> TrialJob:
    record = study.record
    model = Path(record.model).expanduser()
    if model.exists():  # Ray runs trials in their own working directory
        record = record.model_copy(update={"model": str(model.resolve())})
    return TrialJob(record=record.model_dump(mode="json"), runs_dir=str(runs_dir.resolve()),
                    profile_yaml=(study.path / "profile.yaml").read_text(encoding="utf-8"),
                    objective_yaml=(study.path / "objective.yaml").read_text(encoding="utf-8"),
                    on_mismatch=on_mismatch)


def run_study(study: Study, options: RayOptions) -> optuna.Study:
    """Run ``study`` on a Ray cluster until its target, budget or space is exhausted."""
    address = options.address or os.environ.get("RAY_ADDRESS") or "auto"
    if _is_loopback(address):
        os.environ[LOOPBACK_ENV] = "0"  # else Ray swaps 127.0.0.1 for the host's outward address
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    # the gathered artifacts replace Tune's per-trial result files; its end-of-run analysis need not warn
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    with StudyLock(study.path):
        stopped = stop_orphans(study.path / "trials")
        if stopped:
            log.warning("stopped %d orphaned server(s) left by an earlier run", len(stopped))
        storage = _storage_of(study)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        ostudy = optuna.create_study(study_name=study.record.name, storage=storage, load_if_exists=True,
                                     direction=study.objective.direction, sampler=shared_sampler(study.record.seed))
        study._prepare_queue(ostudy)
        done = len(launched_keys_numbers(ostudy))
        remaining = None if study.record.trials is None else study.record.trials - done
        if remaining is not None and remaining <= 0:
            log.info("study %s already has %d launches", study.record.name, done)
            return ostudy
        gpus = options.gpus_per_trial if options.gpus_per_trial is not None else (
            0 if study.profile.hardware.accelerator == "cpu" else study.profile.hardware.device_count)
        if not ray.is_initialized():
            init: dict[str, Any] = {"address": address, "logging_level": logging.WARNING, "log_to_driver": False}
            if _is_loopback(address):
                init["_node_ip_address"] = "127.0.0.1"
            ray.init(**init)
        nodes = cluster_nodes(gpus)
        if nodes == 0:
            from tuner.errors import UsageError

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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            searcher = _make_searcher(study, storage, options.on_mismatch)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1 if remaining is None else remaining,
                                        max_concurrent_trials=concurrent, time_budget_s=study.record.budget_s),
            run_config=tune.RunConfig(name=f"{study.record.name}-ray", storage_path=str((study.path / "ray").resolve()),
                                      failure_config=tune.FailureConfig(max_failures=options.max_retries),
                                      verbose=0))
        tuner.fit()
        final = optuna.load_study(study_name=study.record.name, storage=storage)
        study.write_trials_table(final)
        return final
