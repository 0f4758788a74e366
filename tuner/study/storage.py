"""The study's Optuna side: storage URLs, RDB storage with heartbeats, samplers, trials created RUNNING.

This is the one module that reaches into Optuna's internals (``Study._storage``, ``Study._study_id``,
``Trial._trial_id``), where Optuna has no public API for what dsv4-tune needs:

- :func:`ask_fixed`: a trial created RUNNING with fixed parameters and owned by the caller. The
  public ``enqueue_trial`` + ``ask`` races with other workers of a shared study (another worker may
  pop the queued trial), and ``add_trial`` takes finished trials only.
- :class:`Heartbeat`: stamping a trial's heartbeat while it runs outside ``Study.optimize`` (Optuna
  beats only inside ``optimize``; the storage's ``record_heartbeat`` wants the internal trial id).

Everything else here, and everywhere else in ``tuner/``, uses Optuna's public API.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.errors import UsageError
from tuner.load.poller import Poller

__all__ = [
    "STORAGE_ENV",
    "Heartbeat",
    "ask_fixed",
    "heartbeat",
    "make_sampler",
    "make_storage",
    "mask_url",
    "resolve_storage_url",
    "retried_trial_number",
    "shared_sampler",
    "sqlite_url",
    "study_exists",
]

log = logging.getLogger(__name__)

STORAGE_ENV = "DSV4_TUNE_STORAGE"
"""Environment variable holding the storage URL (with its password); preferred over ``--storage``."""


# -- storage URLs ----------------------------------------------------------------------------------
def sqlite_url(study_path: Path) -> str:
    """The storage of a study that is not shared: SQLite in its folder."""
    return f"sqlite:///{study_path / 'study.db'}"


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


def study_exists(storage: optuna.storages.BaseStorage, name: str) -> bool:
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}


# -- samplers ----------------------------------------------------------------------------------------
def make_sampler(seed: int, n_startup_trials: int = 4, kind: str = "tpe") -> optuna.samplers.BaseSampler:
    """The study's sampler; every kind reads the trials' named constraints (``Trial.set_constraint``).

    ``tpe`` (default): multivariate TPE, not grouped (on the emulated h200x8 node it reached 95 % of the
    optimum in half the launches the grouped one took, and the same on gh200x4: docs/search.md).
    ``gp``: Optuna's GPSampler, a little ahead at 98 % there but it needs scipy and torch and seconds
    of CPU a trial. ``random``: the baseline to compare against. With ``--prior model`` (the default
    on GPU profiles) the model proposes and the sampler is the fallback.
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
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=n_startup_trials)


def shared_sampler(seed: int, n_startup_trials: int = 4) -> optuna.samplers.BaseSampler:
    """Constrained TPE as the local study uses, with the constant liar: trials that other workers are
    running count as bad guesses, so concurrent workers do not all draw the same point."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                          n_startup_trials=n_startup_trials)


# -- trials --------------------------------------------------------------------------------------------
def ask_fixed(study: optuna.Study, params: Mapping[str, Any], user_attrs: dict[str, Any]) -> optuna.Trial:
    """A RUNNING trial with these parameters, owned by the caller.

    ``enqueue_trial`` + ``ask`` does the same in one process, but in a shared study another worker may
    pop the queued trial first, or this one may pop an older queued trial; creating the trial RUNNING
    takes it straight to the caller. Optuna's ``suggest_*`` return the fixed values, as for a queued trial.
    No public API creates a RUNNING trial from a template: this uses the storage and the study id.
    """
    template = optuna.trial.create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": dict(params)},
                                         user_attrs=user_attrs)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=template)
    return optuna.Trial(study, trial_id)


def retried_trial_number(trial: optuna.trial.FrozenTrial) -> int | None:
    """The original trial a heartbeat retry re-runs (Optuna's ``failed_trial`` system attribute)."""
    value = trial.system_attrs.get("failed_trial")
    return int(value) if value is not None else None


class Heartbeat(Poller):
    """Stamps one trial in the database every ``interval_s`` seconds while a trial runs."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int, interval_s: float) -> None:
        super().__init__(f"heartbeat-{trial_id}", interval_s, join_timeout_s=30)
        self.storage = storage
        self.trial_id = trial_id

    def _beat(self) -> None:
        record = getattr(self.storage, "record_heartbeat", None)
        if record is None:
            return
        try:
            record(self.trial_id)
        except Exception as exc:  # a database blip must not kill the trial
            log.warning("heartbeat of trial id %d not recorded: %s", self.trial_id, exc)

    def poll(self) -> bool:
        self._beat()
        return True

    def __enter__(self) -> Heartbeat:
        self._beat()
        return super().__enter__()


def heartbeat(trial: optuna.Trial, interval_s: float) -> Heartbeat:
    """The heartbeat of ``trial`` in its study's storage (Optuna beats only inside ``optimize``)."""
    return Heartbeat(trial.study._storage, trial._trial_id, interval_s)
