"""The emulated node: vLLM serving DeepSeek-V4-Flash on a hardware profile's node, from a performance model.

It is test equipment and a user feature (a night rehearsed in minutes). Two doors:

- the model, importable without vLLM or a server: :func:`predict` (what a benchmark of a workload
  on a launch would measure), :func:`step_time` and :class:`NodeModel` (one engine step, term by
  term), :func:`capacity` (memory and KV, from the feasibility model), :data:`NOMINAL` and
  :func:`perturbed` (the prior and a "true" node that differs from it), :class:`Truth`;
- the server: ``python -m tuner.engines.emulated serve MODEL <vllm serve flags>`` with
  ``DSV4_EMULATOR_*`` settings (:class:`EmulatorSettings`); its units (:class:`Units`) say how a
  client's measurements map to the node's. ``docs/emulator.md`` is the manual.
"""

from __future__ import annotations

from tuner.engines.emulated.capacity import Capacity, StartupVerdict, capacity, node_model, startup_verdict
from tuner.engines.emulated.coefficients import MOE_BACKENDS, NOMINAL, Coefficients, moe_backend, perturbed
from tuner.engines.emulated.hardware import DEVICES, DeviceSpec, NodeSpec, UnknownDeviceError, node_spec
from tuner.engines.emulated.perf_model import EngineBatch, NodeModel, StepTime, step_time
from tuner.engines.emulated.serve_config import EmulatedConfig, Frontend
from tuner.engines.emulated.settings import ENV_PREFIX, EmulatorSettings, SettingsError
from tuner.engines.emulated.steady_state import BenchmarkShape, Prediction, predict
from tuner.engines.emulated.truth import Drift, FailureRule, TrapRule, Truth, nominal_truth, truth_from_seed
from tuner.engines.emulated.units import Units

__all__ = [
    "DEVICES",
    "ENV_PREFIX",
    "MODULE",
    "MOE_BACKENDS",
    "NOMINAL",
    "BenchmarkShape",
    "Capacity",
    "Coefficients",
    "DeviceSpec",
    "Drift",
    "EmulatedConfig",
    "EmulatorSettings",
    "EngineBatch",
    "FailureRule",
    "Frontend",
    "NodeModel",
    "NodeSpec",
    "Prediction",
    "SettingsError",
    "StartupVerdict",
    "StepTime",
    "TrapRule",
    "Truth",
    "Units",
    "UnknownDeviceError",
    "capacity",
    "moe_backend",
    "node_model",
    "node_spec",
    "nominal_truth",
    "perturbed",
    "predict",
    "startup_verdict",
    "step_time",
    "truth_from_seed",
]

MODULE = "tuner.engines.emulated"
"""What an adapter runs: ``[python, "-m", MODULE, "serve", model, *vllm_flags]``."""
