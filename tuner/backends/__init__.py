"""Backends: where a study's trials run beyond this node, one floor above the study.

    node.py      node identity: whether two nodes' results may be ranked together
    worker.py    the PostgreSQL worker driver: several nodes, one shared study
    ray.py       the Ray driver: a study's trials as Ray Tune trials, one node each

The drivers are built on :mod:`tuner.study` (its trial step; the Optuna side, storage and samplers, is
:mod:`tuner.study.storage`); nothing under the study imports this package. This door re-exports node
identity only; import a driver by its path (``tuner.backends.worker``, ``tuner.backends.ray``), so that
importing node identity (as ``export`` does) never imports a driver (or Ray).
"""

from __future__ import annotations

from tuner.backends.node import REFERENCE_ATTR, NodeIdentity, check_node, node_identity, runtime_identity

__all__ = [
    "REFERENCE_ATTR",
    "NodeIdentity",
    "check_node",
    "node_identity",
    "runtime_identity",
]
