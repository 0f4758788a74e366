"""Backends: where a study's state lives and where its trials run beyond this node.

    storage.py   the Optuna side: storage URLs, RDB storage with heartbeats, samplers, trials
                 created RUNNING (the one module that touches Optuna's internals)
    node.py      node identity: whether two nodes' results may be ranked together
    worker.py    the PostgreSQL worker driver: several nodes, one shared study
    ray.py       the Ray driver: a study's trials as Ray Tune trials, one node each

Two floors: ``storage`` and ``node`` are leaves that :mod:`tuner.study` stands on; ``worker`` and
``ray`` are drivers built on :mod:`tuner.study` (its trial step). This door re-exports the leaves
only; import a driver by its path (``tuner.backends.worker``, ``tuner.backends.ray``), so that
importing the study never imports a driver (or Ray).
"""

from __future__ import annotations

from tuner.backends.node import REFERENCE_ATTR, NodeIdentity, check_node, node_identity, runtime_identity
from tuner.backends.storage import (
    STORAGE_ENV,
    ask_fixed,
    heartbeat,
    make_sampler,
    make_storage,
    mask_url,
    resolve_storage_url,
    retried_trial_number,
    shared_sampler,
    sqlite_url,
    study_exists,
)

__all__ = [
    "REFERENCE_ATTR",
    "STORAGE_ENV",
    "NodeIdentity",
    "ask_fixed",
    "check_node",
    "heartbeat",
    "make_sampler",
    "make_storage",
    "mask_url",
    "node_identity",
    "resolve_storage_url",
    "retried_trial_number",
    "runtime_identity",
    "shared_sampler",
    "sqlite_url",
    "study_exists",
]
