"""The emulated node: vLLM serving DeepSeek-V4-Flash on a hardware profile's node, from a performance model.

It is test equipment and a user feature (a night rehearsed in minutes). The performance model it performs
by (step time, capacity, coefficients, the node's rates) is :mod:`tuner.perfmodel`, imported from there as
any user does. This folder adds:

- what a benchmark would measure, importable without vLLM or a server: :func:`predict` (a workload on a
  launch, run through the emulated scheduler), :class:`Truth` (a node's coefficients, failure and trap
  rules: :func:`nominal_truth`, :func:`truth_from_seed`);
- the server: ``python -m tuner.engines.emulated serve MODEL <vllm serve flags>`` with
  ``DSV4_EMULATOR_*`` settings (:class:`EmulatorSettings`); its units (:class:`Units`) say how a
  client's measurements map to the node's. ``docs/emulator.md`` is the manual.
"""

from __future__ import annotations

from tuner.engines.emulated.frontend import Frontend
from tuner.engines.emulated.settings import ENV_PREFIX, EmulatorSettings, SettingsError
from tuner.engines.emulated.steady_state import BenchmarkShape, Prediction, predict
from tuner.engines.emulated.truth import Drift, FailureRule, TrapRule, Truth, nominal_truth, truth_from_seed
from tuner.engines.emulated.units import Units

__all__ = [
    "ENV_PREFIX",
    "MODULE",
    "BenchmarkShape",
    "Drift",
    "EmulatorSettings",
    "FailureRule",
    "Frontend",
    "Prediction",
    "SettingsError",
    "TrapRule",
    "Truth",
    "Units",
    "nominal_truth",
    "predict",
    "truth_from_seed",
]

MODULE = "tuner.engines.emulated"
"""What an adapter runs: ``[python, "-m", MODULE, "serve", model, *vllm_flags]``."""
