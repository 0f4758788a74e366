"""The search: what may be launched on a node, and what is worth launching.

    profile.py       the hardware profile (``--hw``, ``search_spaces/<name>.yaml``): node, fixed flags,
                     levers and their rules
    space.py         configurations drawn from a hardware profile's levers (``suggest``, ``build_config``)
    checkpoints.py   the checkpoint catalog (``search_spaces/_checkpoints.yaml``)
    feasibility.py   the memory model: will a configuration fit, and with how much KV cache
    prelaunch.py     the checks before a launch: the feasibility model, the engine's own argument checks
    plan.py          ``dsv4-tune plan``: a hardware profile's space, sized without a launch
    preflight.py     does this host serve this profile? (``dsv4-tune doctor``, and before a run's first launch)
"""

from __future__ import annotations

from tuner.search.checkpoints import Checkpoint, load_checkpoint
from tuner.search.feasibility import Feasibility, KvCalibration, check, fit_kv_bytes_per_token
from tuner.search.plan import Plan, build_plan, format_plan
from tuner.search.prelaunch import LaunchTarget, PreLaunch, Refusal
from tuner.search.profile import (
    BoundProfile,
    HardwareProfile,
    Topology,
    bind_checkpoint,
    bound_profile,
    load_profile,
    reference_requires,
)
from tuner.search.space import FixedParams, ParamSource, RandomParams, ServeConfig, build_config, suggest

__all__ = [
    "BoundProfile",
    "Checkpoint",
    "Feasibility",
    "FixedParams",
    "HardwareProfile",
    "KvCalibration",
    "LaunchTarget",
    "ParamSource",
    "Plan",
    "PreLaunch",
    "RandomParams",
    "Refusal",
    "ServeConfig",
    "Topology",
    "bind_checkpoint",
    "bound_profile",
    "build_config",
    "build_plan",
    "check",
    "fit_kv_bytes_per_token",
    "format_plan",
    "load_checkpoint",
    "load_profile",
    "reference_requires",
    "suggest",
]
