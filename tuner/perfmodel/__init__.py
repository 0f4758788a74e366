"""The performance model: how fast and how big one launch of DeepSeek-V4-Flash is on a node.

What the prior predicts with (``tuner/predict/``) and what the emulated node performs by
(``tuner/engines/emulated/``): both import it from here, and it imports neither. Pure arithmetic, no I/O,
no vLLM, no server.

    architecture.py  DeepSeek-V4-Flash as the model sees it: FLOPs and bytes per token, experts, the
                     attention's context cap, the draft passes
    coefficients.py  every tunable number in one frozen dataclass: :data:`NOMINAL` (the prior, calibrated
                     to the blog), :func:`perturbed` (a "true" node that differs from it), the MoE backends
    hardware.py      the node a hardware profile names, in a roofline's units: :data:`DEVICES` (one row per
                     GPU kind, with sources), :func:`node_spec`
    serve_config.py  :class:`EmulatedConfig`: the levers of one launch the model reads, from vLLM's parsed
                     arguments or the tuner's option mapping
    step.py          one engine step, term by term: :class:`NodeModel`, :class:`EngineBatch`,
                     :func:`step_time` (a roofline; the equations are in its docstring)
    capacity.py      memory and KV capacity of a launch, from the feasibility model
                     (:mod:`tuner.search.feasibility`); the :class:`NodeModel` built on it (:func:`node_model`);
                     vLLM's start-up memory checks (:func:`startup_verdict`)
    transfer.py      a prefill/decode layout's KV transfer: its efficiency, its fixed cost, :func:`transfer_s`
    _deps.py         the few names the model takes from the search room (the memory model, the profile,
                     the checkpoint), in one place

The independent truth (``tuner/engines/emulated/independent/``, issue 24) shares no code with this room.
"""

from __future__ import annotations

from tuner.perfmodel.capacity import Capacity, StartupVerdict, capacity, node_model, startup_verdict
from tuner.perfmodel.coefficients import MOE_BACKENDS, NOMINAL, Coefficients, moe_backend, perturbed
from tuner.perfmodel.hardware import DEVICES, DeviceSpec, NodeSpec, UnknownDeviceError, node_spec
from tuner.perfmodel.serve_config import EmulatedConfig
from tuner.perfmodel.step import EngineBatch, NodeModel, StepTime, step_time
from tuner.perfmodel.transfer import TRANSFER_EFFICIENCY, TRANSFER_LATENCY_S, transfer_s

__all__ = [
    "DEVICES",
    "MOE_BACKENDS",
    "NOMINAL",
    "TRANSFER_EFFICIENCY",
    "TRANSFER_LATENCY_S",
    "Capacity",
    "Coefficients",
    "DeviceSpec",
    "EmulatedConfig",
    "EngineBatch",
    "NodeModel",
    "NodeSpec",
    "StartupVerdict",
    "StepTime",
    "UnknownDeviceError",
    "capacity",
    "moe_backend",
    "node_model",
    "node_spec",
    "perturbed",
    "startup_verdict",
    "step_time",
    "transfer_s",
]
