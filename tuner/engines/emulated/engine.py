"""``--engine emulated``: the emulated node behind the engine seam (an :class:`~tuner.engines.Engine`).

The emulator takes ``vllm serve``'s command line, prints vLLM's log and serves vLLM's routes and
``/metrics`` names (``docs/emulator.md``), so everything vLLM's engine answers applies unchanged: the
argv rules, the redaction, the log diagnosis, the argument validation and the metric-name map. This
adapter is vLLM's engine with five answers of its own:

- the program: ``python -m tuner.engines.emulated`` (``serve MODEL <flags>`` follows, as for vLLM);
- the environment: the node to emulate and its settings (``DSV4_EMULATOR_*``), never a CPU binding;
- the version: vLLM's, marked ``(emulated node)``, so a node identity can never pass for a real one;
- the units: the time scale and request multiplicity the server runs at (:class:`tuner.load.units.Units`);
- the gates' probes carry ``X-DSV4-Emulator-Multiplicity: 1``: each is one request, not M copies.

:func:`choose_units` picks units for a profile and an objective so that a 2-core client keeps up
(a bounded rate of streamed chunks) while every DP engine still gets several streams.
"""

from __future__ import annotations

import logging
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from tuner.engines.emulated._deps import Checkpoint, HardwareProfile
from tuner.engines.emulated.settings import ENV_PREFIX, MULTIPLICITY_HEADER
from tuner.engines.emulated.steady_state import BenchmarkShape, predict
from tuner.engines.vllm.engine import VllmEngine
from tuner.errors import UsageError
from tuner.load.affinity import CpuSplit
from tuner.load.units import Units
from tuner.objective import Objective
from tuner.search.envelope import envelope
from tuner.search.space import ServeConfig

__all__ = ["CHUNK_RATE_PER_S", "DEFAULT_COMMAND", "MAX_TIME_SCALE", "PROCESS_START_S", "STREAMS_PER_ENGINE",
           "EmulatedEngine", "choose_units", "default_options"]

log = logging.getLogger(__name__)

MODULE = "tuner.engines.emulated"
DEFAULT_COMMAND = f"{shlex.quote(sys.executable)} -m {MODULE}"
"""The emulator, run by the tuner's own Python."""
STREAMS_PER_ENGINE = 8
"""Streams per DP engine at the top ladder step (the DP balancer works per stream: docs/emulator.md)."""
CHUNK_RATE_PER_S = 5000.0
"""Streamed chunks per real second the rehearsal aims at. Measured here: ~40 µs of server and ~35 µs of
client CPU per chunk (docs/emulator.md, "Units"), so about 40 % of one of the two cores."""
PROCESS_START_S = 60.0
"""Real seconds the emulator may take before its first log line: importing vLLM's parser takes ~10 s on an
idle 2-core machine, several times that on a busy one. Added to the ready timeout and the start-up
watchdog when they become real seconds (a node's start-up limits are node time)."""
MAX_TIME_SCALE = 25.0
"""Above this the client's own loop lag (a few ms on a busy 2-core machine) becomes a visible share of
the node's inter-token latency once multiplied back (lag × time scale: 8 ms at 25 is 200 ms)."""
MIN_TIME_SCALE = 20.0
"""The speed-up the multiplicity is raised for (when the node's token rate needs it)."""


@dataclass(frozen=True)
class EmulatedEngine(VllmEngine):
    """The emulated DSV4 node of a hardware profile, driven as vLLM is."""

    name: str = "emulated"
    title: str = "the emulated node"
    default_command: str = DEFAULT_COMMAND
    units: Units = field(default_factory=Units)
    hardware: str = "gh200x4"
    """The hardware profile the node is (name or YAML path): ``DSV4_EMULATOR_HW``."""
    checkpoint: str | None = None
    truth_seed: int | None = None
    """A perturbed true node (``DSV4_EMULATOR_TRUTH_SEED``); None: the nominal node."""
    truth_file: str | None = None
    faults: tuple[str, ...] = ()

    # -- argv ----------------------------------------------------------------------------------------
    def resolve_command(self, command: str) -> list[str]:
        parts = shlex.split(command)
        if not parts:
            raise UsageError(f"--engine-cmd is empty; the emulated node runs as {DEFAULT_COMMAND!r}")
        if find_spec(MODULE) is None:  # pragma: no cover - the module is part of this package
            raise UsageError(f"{MODULE} is not importable here. Fix: pip install dsv4-tune")
        return parts

    def server_env(self, cpus: CpuSplit | None, args: Mapping[str, Any]) -> dict[str, str]:
        """The node and its settings; no CPU binding (the emulator is one Python process)."""
        env = {f"{ENV_PREFIX}HW": self.hardware,
               f"{ENV_PREFIX}TIME_SCALE": _number(self.units.time_scale),
               f"{ENV_PREFIX}STARTUP_TIME_SCALE": _number(self.units.startup_time_scale),
               f"{ENV_PREFIX}MULTIPLICITY": str(self.units.multiplicity)}
        if self.checkpoint:
            env[f"{ENV_PREFIX}CHECKPOINT"] = self.checkpoint
        if self.truth_seed is not None:
            env[f"{ENV_PREFIX}TRUTH_SEED"] = str(self.truth_seed)
        if self.truth_file:
            env[f"{ENV_PREFIX}TRUTH_FILE"] = self.truth_file
        if self.faults:
            env[f"{ENV_PREFIX}FAULT"] = ",".join(self.faults)
        return env

    @property
    def probe_headers(self) -> dict[str, str]:
        """A gate's probe is one request, not ``multiplicity`` copies (a 100k-token needle times 128 would
        cost the rehearsal minutes of prefill that measure nothing)."""
        return {MULTIPLICITY_HEADER: "1"}

    def version_of(self, command: Sequence[str]) -> str | None:
        """vLLM's version, as the emulator reports it, marked as emulated."""
        return f"{super().version_of(command) or 'unknown'} (emulated node)"

    # -- the registry's door ---------------------------------------------------------------------------
    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, hardware: str, checkpoint: str | None) -> EmulatedEngine:
        """Build from a study's recorded engine options (``study.json``: ``engine_options``)."""
        known = {"time_scale", "startup_time_scale", "multiplicity", "process_start_s", "truth_seed", "truth_file",
                 "faults"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise UsageError(f"emulated engine: unknown option(s) {', '.join(unknown)}. "
                             f"Fix: use {', '.join(sorted(known))}")
        scale = float(options.get("time_scale", 1.0))
        units = Units(time_scale=scale, multiplicity=int(options.get("multiplicity", 1)),
                      startup_time_scale=float(options.get("startup_time_scale", scale)),
                      process_start_s=float(options.get("process_start_s", PROCESS_START_S)))
        seed = options.get("truth_seed")
        faults = options.get("faults") or ()
        return cls(units=units, hardware=hardware, checkpoint=checkpoint,
                   truth_seed=None if seed is None else int(seed), truth_file=options.get("truth_file"),
                   faults=tuple(str(f) for f in faults))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def default_options(profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective, *,
                    time_scale: float | None = None, multiplicity: int | None = None,
                    startup_time_scale: float | None = None,
                    streams_per_engine: int = STREAMS_PER_ENGINE, chunk_rate_per_s: float = CHUNK_RATE_PER_S,
                    **given: Any) -> dict[str, Any]:
    """The engine options of a night on the emulated ``profile`` under ``objective`` (at the profile's scale).

    The units are sized from the night's envelope (:func:`tuner.search.envelope.envelope`): its highest
    ladder step, the widest DP, and the emulator's own prediction of the token rate there. Given
    ``time_scale`` / ``multiplicity`` win; other ``given`` options (``truth_seed``, ...) pass through.
    """
    env = envelope(profile, checkpoint, objective)
    top = env.top_concurrency
    workload = objective.workload
    rate = _node_tok_s(profile, checkpoint, objective, env.top_row.config if env.top_row else None, top,
                       multiplicity or max(1, top // max(1, streams_per_engine * env.max_dp)))
    if workload.request_rate is not None:  # paced: the node serves the arrivals, not its capacity
        rate = min(rate, workload.request_rate * workload.output_len)
    units = choose_units(top_concurrency=top, max_dp=env.max_dp, node_tok_s=rate, time_scale=time_scale,
                         paced=workload.request_rate is not None, chunk_rate_per_s=chunk_rate_per_s,
                         streams_per_engine=streams_per_engine)
    if multiplicity is not None or startup_time_scale is not None:
        units = Units(time_scale=units.time_scale, multiplicity=multiplicity or units.multiplicity,
                      startup_time_scale=startup_time_scale or units.startup_time_scale,
                      process_start_s=units.process_start_s)
    log.info("emulated node for %s / %s (%s): top step %d, predicted %.0f tok/s there", profile.name,
             objective.name, workload.kind, top, rate)
    return {**{k: v for k, v in given.items() if v is not None}, "time_scale": units.time_scale,
            "startup_time_scale": units.startup_time_scale, "multiplicity": units.multiplicity,
            "process_start_s": units.process_start_s}


def _node_tok_s(profile: HardwareProfile, checkpoint: Checkpoint | None, objective: Objective,
                config: ServeConfig | None, concurrency: int, multiplicity: int) -> float:
    """The emulator's own prediction of the node's output tok/s at ``concurrency`` (one wave), for sizing."""
    workload = objective.workload
    if workload.kind == "agent":
        spec = workload.agent_spec
        prompt = spec.system_len + spec.tools * spec.tool_schema_len + spec.context_len
        shape = BenchmarkShape(input_len=prompt, output_len=workload.output_len, concurrency=concurrency,
                               num_prompts=concurrency)
    else:
        shape = BenchmarkShape(input_len=workload.input_len + workload.prefix_len, output_len=workload.output_len,
                               concurrency=concurrency, num_prompts=concurrency, range_ratio=workload.range_ratio)
    if config is None or checkpoint is None:
        return 10.0 * concurrency
    try:
        return predict(profile, config.args, shape, checkpoint=checkpoint, multiplicity=multiplicity).output_tok_s
    except (ValueError, RuntimeError) as exc:
        log.warning("emulated node: no rate prediction for sizing its units (%s); assuming 10 tok/s a request", exc)
        return 10.0 * concurrency


def choose_units(*, top_concurrency: int, max_dp: int, node_tok_s: float, paced: bool = False,
                 time_scale: float | None = None, chunk_rate_per_s: float = CHUNK_RATE_PER_S,
                 streams_per_engine: int = STREAMS_PER_ENGINE, min_time_scale: float = MIN_TIME_SCALE,
                 max_time_scale: float = MAX_TIME_SCALE) -> Units:
    """Units for a night whose highest step runs ``top_concurrency`` node requests at ``node_tok_s``.

    A streamed chunk carries one token of one stream, so the client receives ``node_tok_s × time_scale /
    multiplicity`` chunks a second; the two settings keep that near ``chunk_rate_per_s``:

    - multiplicity: enough that ``min_time_scale`` fits the chunk rate, but never fewer than
      ``top_concurrency / (streams_per_engine × max_dp)`` (more streams than needed cost CPU) nor more
      than one stream per DP engine allows. A paced workload (a request rate) keeps multiplicity 1: a
      stream of M copies would turn its Poisson arrivals into bursts of M;
    - time scale: what the chunk rate allows at that multiplicity, between 1 and ``max_time_scale``,
      unless ``time_scale`` is given. Start-up runs at the same scale: one clock for the whole night.
    """
    lowest = max(1, top_concurrency // max(1, streams_per_engine * max_dp))
    highest = max(1, top_concurrency // max(1, max_dp))
    needed = math.ceil(max(1.0, node_tok_s) * min_time_scale / chunk_rate_per_s)
    multiplicity = 1 if paced else min(highest, max(lowest, needed))
    if time_scale is None:
        fitting = chunk_rate_per_s * multiplicity / max(1.0, node_tok_s)
        time_scale = float(max(1, min(int(max_time_scale), math.floor(fitting))))
    log.info("emulated node: multiplicity %d (%d streams at node concurrency %d), time scale %g",
             multiplicity, -(-top_concurrency // multiplicity), top_concurrency, time_scale)
    return Units(time_scale=time_scale, multiplicity=multiplicity, startup_time_scale=time_scale,
                 process_start_s=PROCESS_START_S)
