"""The engine seam: everything dsv4-tune needs to know about the server it tunes.

An engine is one folder under ``tuner/engines/`` whose class satisfies :class:`Engine`: vLLM in
``vllm/``; an emulated node, SGLang or llama.cpp each in a folder of their own. The trial, the
process helper, the load generator, the pre-launch checks and the node identity talk to this
protocol only, never to an engine's module.

What an engine answers:

- argv: the program (``resolve_command``), the option mapping of one launch (``serve_options``),
  its argv (``build_argv``; ``flags`` for the options alone), a copy safe to write down
  (``redact_argv``), the variable its API key travels in (``api_key_env``), the environment that
  binds its threads to the server's cores (``server_env``), and the version the program would run
  (``version_of``);
- readiness: the paths that answer 200 once it serves (``ready_paths``), the liveness path polled
  during the load (``health_path``), and the ``models_path``, ``metrics_path`` and ``version_path``;
- metrics: the metric-name map (``metrics``: what its ``/metrics`` page says about one window);
- log diagnosis: the failure class of a start that ended (``diagnose_startup``), where a start that
  never became ready got to (``describe_stall``), whether a start-up log line is progress
  (``is_startup_progress``: the start-up watchdog's clock), why a server that was serving died
  (``diagnose_crash``), and the KV capacity it allocated (``kv_tokens_from_log``);
- argument validation: whether its own parser is at hand (``can_validate``), and what it finds
  wrong with a launch's options (``validate``), before any launch;
- units: how what the tuner's client measures maps to the node (``units``; the identity for a real
  server, a time scale and a request multiplicity for the emulated node: ``docs/emulator.md``);
- the API its gates speak (``api_dialect``: ``vllm``, OpenAI's routes with vLLM's extensions, or
  ``llamacpp``, llama-server's own routes; :mod:`tuner.guards.http`);
- the export: the last line of ``serve.sh`` (``serve_command``), the variable it reads the program from
  (``command_env``), and the weight files the identity names by sha256 (``model_files``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tuner.failures import Diagnosis
from tuner.load.affinity import CpuSplit
from tuner.load.metrics import ServerMetrics
from tuner.load.units import Units

__all__ = ["Engine"]


class Engine(Protocol):
    """One serving engine (see the module docstring for what each member answers)."""

    @property
    def name(self) -> str:
        """Short name (``vllm``); also a word that marks the engine's processes when orphans are stopped."""

    @property
    def title(self) -> str:
        """The name people read in messages (``vLLM``)."""

    @property
    def default_command(self) -> str:
        """The program when none is given (``--engine-cmd``'s default)."""

    @property
    def health_path(self) -> str:
        """Answers 200 while the server is alive (polled during the load)."""

    @property
    def ready_paths(self) -> tuple[str, ...]:
        """Every one answers 200 once the server serves (checked in order)."""

    @property
    def models_path(self) -> str: ...

    @property
    def metrics_path(self) -> str: ...

    @property
    def version_path(self) -> str: ...

    @property
    def metrics(self) -> ServerMetrics:
        """The metric-name map: what the engine's ``/metrics`` page says about one measured window."""

    @property
    def api_key_env(self) -> str:
        """The environment variable the server reads its API key from (never argv: ``ps`` shows argv)."""

    @property
    def startup_log_bytes(self) -> int:
        """How much of the end of a failed start's log :meth:`diagnose_startup` reads."""

    @property
    def units(self) -> Units:
        """How the client's measurements map to the node's (:data:`tuner.load.units.IDENTITY` for a real
        server); the study's clock runs at ``units.time_scale`` node seconds per real second."""

    @property
    def probe_headers(self) -> dict[str, str]:
        """Headers the correctness gates add to their requests (the emulated node: one request, not M)."""

    @property
    def api_dialect(self) -> str:
        """The HTTP API the gates speak to it: ``vllm`` or ``llamacpp`` (:mod:`tuner.guards.http`)."""

    @property
    def command_env(self) -> str:
        """The environment variable the exported ``serve.sh`` reads the server program from (vLLM's ``VLLM_CMD``,
        llama-server's ``LLAMA_SERVER_CMD``)."""

    # -- argv ----------------------------------------------------------------------------------------
    def resolve_command(self, command: str) -> list[str]:
        """The program (a path, a module run by a Python, or a container prefix) as argv; UsageError if absent."""

    def serve_options(self, model: str, args: Mapping[str, Any], *, host: str, port: int,
                      served_model_name: str | None = None) -> dict[str, Any]:
        """The full option mapping of one launch (what the exported launch file holds, minus secrets)."""

    def build_argv(self, command: Sequence[str], options: Mapping[str, Any], *, api_key: str | None) -> list[str]:
        """The launch's argv: ``command``, then ``options`` spelled as the engine's flags."""

    def flags(self, args: Mapping[str, Any]) -> list[str]:
        """``args`` spelled as the engine's flags (for reports and plans)."""

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        """A copy of ``argv`` fit to write to disk (secrets masked)."""

    def server_env(self, cpus: CpuSplit | None, args: Mapping[str, Any]) -> dict[str, str]:
        """Environment that keeps the server's threads on ``cpus.server`` for a launch of ``args``."""

    def version_of(self, command: Sequence[str]) -> str | None:
        """The engine version ``command`` would run (None when it cannot tell)."""

    # -- the export --------------------------------------------------------------------------------
    def serve_command(self, options: Mapping[str, Any]) -> str:
        """The last line of the exported ``serve.sh``: exec ``"${server_argv[@]}"`` (the program) with the
        winner's ``options`` (``profile.yaml`` beside it holds them), then ``"$@"``."""

    def model_files(self, options: Mapping[str, Any]) -> list[str]:
        """The weight files a launch of ``options`` reads, which the export's identity names by sha256
        (empty: the identity names the model folder by its config instead)."""

    # -- log diagnosis -----------------------------------------------------------------------------
    def diagnose_startup(self, log_tail: str, returncode: int | None) -> Diagnosis:
        """Why a server ended before it was ready, from the end of its log."""

    def describe_stall(self, log_tail: str) -> str:
        """Where a server that never became ready got to ("" when the log does not say)."""

    def is_startup_progress(self, line: str) -> bool:
        """Whether one start-up log line shows the start moving on (a hung worker's heartbeat does not)."""

    def is_log_record(self, line: str) -> bool:
        """Whether a line is one of the server's own log records: the first one ends its process's start (what
        an import prints before it, such as a library's warning, does not)."""

    def diagnose_crash(self, log_text: str, returncode: int | None) -> Diagnosis | None:
        """Why a server that was serving died or stopped answering, from what it logged after it was
        ready (``returncode``: None while the process lives); None when the log names no cause."""

    def kv_tokens_from_log(self, text: str) -> int | None:
        """The KV-cache capacity per rank the server's start-up log states, if it does."""

    # -- argument validation -----------------------------------------------------------------------
    def can_validate(self) -> bool:
        """The engine's own argument checks can run in this environment."""

    def validate(self, options: Mapping[str, Any]) -> list[str]:
        """What the engine's own argument checks find wrong with ``options`` (empty: valid)."""
