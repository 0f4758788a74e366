"""How dsv4-tune drives llama.cpp's ``llama-server``: its answers to :class:`tuner.engines.Engine`.

- argv: ``llama-server --model GGUF --host H --port P --alias NAME <levers>`` (:mod:`.argv`); the model is
  the study's GGUF file, or the demo model converted to GGUF (:mod:`.gguf_model`); the API key travels in
  ``LLAMA_API_KEY``, never argv;
- readiness: ``/health`` answers 503 while the model loads and 200 once it serves, then ``/v1/models``;
- log diagnosis: :mod:`.logs` (an allocation failure is ``oom``, an unknown or removed argument
  ``bad_flag``, each with the line that decided it);
- metrics: ``/metrics`` (the profile sets ``metrics: true``), read by :mod:`.metrics`, prompt and decode
  tokens per second apart;
- argument validation: the program's ``--help`` (:mod:`.validate`);
- the gates speak llama-server's API (``api_dialect``: its ``/tokenize``, ``/apply-template``,
  ``/completion`` with ``n_probs``; :mod:`tuner.guards.http`);
- the export: ``serve.sh`` runs ``llama-server`` with the winner's flags (llama-server reads no config
  file), and the identity names each GGUF file by sha256 (``model_files``: every part of a split GGUF).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines.llamacpp import logs
from tuner.engines.llamacpp import validate as llama_validate
from tuner.engines.llamacpp.argv import (
    DEFAULT_COMMAND,
    SPECULATIVE_OPTION,
    draft_model_path,
    options_to_argv,
    packaged_binary,
    redact_argv,
    resolve_llama_cmd,
)
from tuner.engines.llamacpp.gguf_model import gguf_for, gguf_parts
from tuner.engines.llamacpp.metrics import LLAMACPP_METRICS, LlamaCppMetrics
from tuner.errors import UsageError
from tuner.failures import Diagnosis
from tuner.load.affinity import CpuSplit
from tuner.load.units import IDENTITY, Units

__all__ = ["LlamaCppEngine", "llama_version_of"]

_VERSION = re.compile(r"version:\s*(.+)")


def llama_version_of(command: Sequence[str], timeout_s: float = 30.0) -> str | None:
    """``llama-server --version``'s first line (``0.6.0-dev (build 0, commit unknown)``), or None."""
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=timeout_s,
                             check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.search(out.stdout + out.stderr)
    return match.group(1).strip() if match else None


@dataclass(frozen=True)
class LlamaCppEngine:
    """llama.cpp's ``llama-server`` (an :class:`~tuner.engines.Engine`)."""

    name: str = "llamacpp"
    title: str = "llama.cpp llama-server"
    default_command: str = DEFAULT_COMMAND
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    version_path: str = "/props"
    api_key_env: str = "LLAMA_API_KEY"
    command_env: str = "LLAMA_SERVER_CMD"
    """The variable ``serve.sh`` reads the program from (``verify`` sets it to the study's)."""
    api_dialect: str = "llamacpp"
    metrics: LlamaCppMetrics = field(default=LLAMACPP_METRICS)
    startup_log_bytes: int = logs.CLASSIFY_TAIL_BYTES
    units: Units = field(default=IDENTITY)

    @property
    def ready_paths(self) -> tuple[str, ...]:
        """``/health`` is 503 until the model is loaded; ``/v1/models`` then says it is served."""
        return (self.health_path, self.models_path)

    @property
    def probe_headers(self) -> dict[str, str]:
        return {}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, hardware: str, checkpoint: str | None) -> LlamaCppEngine:
        """The registry's door: llama-server takes no engine options (its flags are the profile's levers)."""
        if options:
            raise UsageError(f"the llamacpp engine takes no engine options, got {', '.join(sorted(options))}")
        return cls()

    # -- argv ----------------------------------------------------------------------------------------
    def resolve_command(self, command: str) -> list[str]:
        return resolve_llama_cmd(command)

    def serve_options(self, model: str, args: Mapping[str, Any], *, host: str, port: int,
                      served_model_name: str | None = None) -> dict[str, Any]:
        """The model as a GGUF file (the demo converted once), the draft's path resolved beside it, host and
        port, and the served name (``alias``)."""
        gguf = str(gguf_for(model))
        options: dict[str, Any] = {"model": gguf}
        for key, value in args.items():
            if key == SPECULATIVE_OPTION and isinstance(value, Mapping):
                value = {**value, "draft_model": draft_model_path(value, gguf)}
            options[key] = value
        options["host"] = host
        options["port"] = port
        if served_model_name:
            options["alias"] = served_model_name
        return options

    def build_argv(self, command: Sequence[str], options: Mapping[str, Any], *, api_key: str | None) -> list[str]:
        """``command`` then the flags; the key is not put in argv (``LLAMA_API_KEY`` carries it)."""
        return [*command, *options_to_argv(options)]

    def flags(self, args: Mapping[str, Any]) -> list[str]:
        return options_to_argv(args)

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return redact_argv(list(argv))

    def server_env(self, cpus: CpuSplit | None, args: Mapping[str, Any]) -> dict[str, str]:
        """None: the process helper pins the server to its cores, and ``threads`` is a lever."""
        return {}

    def version_of(self, command: Sequence[str]) -> str | None:
        return llama_version_of(command)

    # -- the export ------------------------------------------------------------------------------------
    def serve_command(self, options: Mapping[str, Any]) -> str:
        """``serve.sh``'s last line: llama-server with the winner's flags, then the caller's (``--port 9000``)."""
        return f'exec "${{server_argv[@]}}" {shlex.join(options_to_argv(options))} "$@"'

    def model_files(self, options: Mapping[str, Any]) -> list[str]:
        """The GGUF files a launch reads: the target's parts, then the draft's."""
        files = [str(p) for p in gguf_parts(Path(str(options["model"])))]
        spec = options.get(SPECULATIVE_OPTION)
        if isinstance(spec, Mapping) and spec.get("draft_model"):
            files += [str(p) for p in gguf_parts(Path(str(spec["draft_model"])))]
        return files

    # -- log diagnosis -----------------------------------------------------------------------------
    def diagnose_startup(self, log_tail: str, returncode: int | None) -> Diagnosis:
        return logs.classify_startup_failure(log_tail, returncode)

    def describe_stall(self, log_tail: str) -> str:
        return logs.describe_stall(log_tail)

    def is_startup_progress(self, line: str) -> bool:
        return logs.is_progress(line)

    def is_log_record(self, line: str) -> bool:
        """Every line llama-server writes is its own (no interpreter starts before it)."""
        return bool(line.strip())

    def diagnose_crash(self, log_text: str, returncode: int | None) -> Diagnosis | None:
        return logs.classify_crash(log_text, returncode)

    def kv_tokens_from_log(self, text: str) -> int | None:
        return logs.kv_tokens_from_log(text)

    # -- argument validation -----------------------------------------------------------------------
    def can_validate(self) -> bool:
        """llama-server is at hand (on PATH or packaged): its ``--help`` is the check."""
        with contextlib.suppress(UsageError):
            return bool(resolve_llama_cmd(DEFAULT_COMMAND))
        return packaged_binary() is not None

    def validate(self, options: Mapping[str, Any]) -> list[str]:
        return llama_validate.validate_options(options)
