"""How dsv4-tune drives ``vllm serve``: vLLM's answers to :class:`tuner.engines.Engine`."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines.vllm import logs
from tuner.engines.vllm import validate as vllm_validate
from tuner.engines.vllm.argv import DEFAULT_VLLM_CMD, options_to_argv, redact_argv, resolve_vllm_cmd
from tuner.engines.vllm.metrics import VLLM_METRICS, VllmMetrics
from tuner.errors import UsageError
from tuner.failures import Diagnosis
from tuner.load.affinity import CpuSplit, format_cpu_list
from tuner.load.units import IDENTITY, Units

__all__ = ["OMP_BIND_ENV", "VllmEngine", "local_ranks", "omp_bind_env", "vllm_version_of"]

log = logging.getLogger(__name__)

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""The vLLM CPU build's OpenMP binding: one core list per local rank, ``|``-separated."""


def local_ranks(args: Mapping[str, Any]) -> int:
    """Worker processes one server starts here: tensor × pipeline × data parallel sizes."""
    ranks = 1
    for key in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        value = args.get(key, 1)
        ranks *= value if isinstance(value, int) and value > 0 else 1
    return ranks


def omp_bind_env(split: CpuSplit, ranks: int = 1) -> dict[str, str]:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a server with ``ranks`` local workers (TP × PP × DP on the CPU build).

    vLLM wants one core list per rank, ``|``-separated; with fewer cores than ranks nothing is
    bound (vLLM's own ``auto`` then applies, still inside the server's affinity).
    """
    if not split.bind_omp:
        return {}
    if ranks > len(split.server):
        log.warning("cpu split: %d server cores cannot be shared by %d ranks; leaving %s to vLLM",
                    len(split.server), ranks, OMP_BIND_ENV)
        return {}
    share = len(split.server) // ranks
    groups = [split.server[i * share:(i + 1) * share] for i in range(ranks)]
    return {OMP_BIND_ENV: "|".join(format_cpu_list(group) for group in groups)}


def vllm_version_of(server_cmd: Sequence[str], timeout_s: float = 120.0) -> str | None:
    """The vLLM version the launch command would run, without importing vLLM when possible."""
    python: str | None = None
    if len(server_cmd) >= 3 and server_cmd[1] == "-m":
        python = server_cmd[0]
    else:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            with open(server_cmd[0], "rb") as fh:
                first = fh.readline(400).decode().strip()
            if first.startswith("#!") and "python" in first:
                shebang = first[2:].split()
                python = shebang[-1] if Path(shebang[0]).name == "env" else shebang[0]
    code = ("import importlib.metadata as m\n"
            "for d in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(m.version(d)); break\n"
            "    except m.PackageNotFoundError:\n        pass\n")
    attempts = ([[python, "-c", code]] if python else []) + [[*server_cmd, "--version"]]
    for argv in attempts:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and lines:
            return lines[-1]
    return None


@dataclass(frozen=True)
class VllmEngine:
    """How dsv4-tune drives ``vllm serve`` (an :class:`~tuner.engines.Engine`)."""

    name: str = "vllm"
    title: str = "vLLM"
    default_command: str = DEFAULT_VLLM_CMD
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    version_path: str = "/version"
    api_key_env: str = "VLLM_API_KEY"
    command_env: str = "VLLM_CMD"
    api_dialect: str = "vllm"
    metrics: VllmMetrics = field(default=VLLM_METRICS)
    startup_log_bytes: int = logs.CLASSIFY_TAIL_BYTES
    units: Units = field(default=IDENTITY)
    """A real server: the client measures the node itself."""

    @property
    def ready_paths(self) -> tuple[str, ...]:
        """``/health`` answers before the API does; ``/v1/models`` says the model is served."""
        return (self.health_path, self.models_path)

    @property
    def probe_headers(self) -> dict[str, str]:
        """None: a gate's request to vLLM is one request."""
        return {}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, hardware: str, checkpoint: str | None) -> VllmEngine:
        """The registry's door (:mod:`tuner.engines.registry`): vLLM takes no engine options."""
        if options:
            raise UsageError(f"the vllm engine takes no engine options, got {', '.join(sorted(options))}")
        return cls()

    # -- argv ----------------------------------------------------------------------------------------
    def resolve_command(self, command: str) -> list[str]:
        return resolve_vllm_cmd(command)

    def serve_options(self, model: str, args: Mapping[str, Any], *, host: str, port: int,
                      served_model_name: str | None = None) -> dict[str, Any]:
        """The full option mapping of one launch (what ``profile.yaml`` holds, minus the API key)."""
        options: dict[str, Any] = {"model": model}
        options.update(args)
        options["host"] = host
        options["port"] = port
        if served_model_name:
            options["served-model-name"] = served_model_name
        return options

    def build_argv(self, command: Sequence[str], options: Mapping[str, Any], *, api_key: str | None) -> list[str]:
        rest = {k: v for k, v in options.items() if k != "model"}
        argv = [*command, "serve", str(options["model"]), *options_to_argv(rest)]
        if api_key:
            argv += ["--api-key", api_key]
        return argv

    def flags(self, args: Mapping[str, Any]) -> list[str]:
        return options_to_argv(args)

    def redact_argv(self, argv: Sequence[str]) -> list[str]:
        return redact_argv(list(argv))

    def server_env(self, cpus: CpuSplit | None, args: Mapping[str, Any]) -> dict[str, str]:
        return omp_bind_env(cpus, local_ranks(args)) if cpus is not None else {}

    def version_of(self, command: Sequence[str]) -> str | None:
        return vllm_version_of(command)

    # -- the export ------------------------------------------------------------------------------------
    def serve_command(self, options: Mapping[str, Any]) -> str:
        """``vllm serve --config profile.yaml`` (the options are the file beside serve.sh)."""
        return 'exec "${server_argv[@]}" serve --config "$here/profile.yaml" "$@"'

    def model_files(self, options: Mapping[str, Any]) -> list[str]:
        """None: a vLLM model is a folder (or a hub id), named by its config's hash."""
        return []

    # -- log diagnosis -----------------------------------------------------------------------------
    def diagnose_startup(self, log_tail: str, returncode: int | None) -> Diagnosis:
        return logs.classify_startup_failure(log_tail, returncode)

    def describe_stall(self, log_tail: str) -> str:
        return logs.describe_stall(log_tail)

    def is_startup_progress(self, line: str) -> bool:
        return logs.is_progress(line)

    def is_log_record(self, line: str) -> bool:
        return logs.is_log_record(line)

    def diagnose_crash(self, log_text: str, returncode: int | None) -> Diagnosis | None:
        return logs.classify_crash(log_text, returncode)

    def kv_tokens_from_log(self, text: str) -> int | None:
        return logs.kv_tokens_from_log(text)

    # -- argument validation -----------------------------------------------------------------------
    def can_validate(self) -> bool:
        """vLLM imports here and its serve parser builds (looked up at call time, so tests can stub it)."""
        return vllm_validate.vllm_available()

    def validate(self, options: Mapping[str, Any]) -> list[str]:
        return vllm_validate.validate_options(options)
