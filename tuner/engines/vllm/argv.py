"""vLLM's command line: the program (``--engine-cmd``), and argv from an option mapping.

The argv is produced with the same rules ``vllm serve --config file.yaml`` applies to a YAML file
(bool → ``--x`` / ``--no-x``, list → repeated values, dict → JSON), so a trial's command line and the
exported ``profile.yaml`` are two spellings of one thing.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

__all__ = ["DEFAULT_VLLM_CMD", "TRUE_ONLY_FLAGS", "options_to_argv", "redact_argv", "resolve_vllm_cmd"]

DEFAULT_VLLM_CMD = "vllm"
# vLLM 0.32 store_true flags with no ``--no-`` form: a false value means "leave the flag out", as
# vLLM's own --config loader does (it emits --no-KEY only where the parser defines it).
TRUE_ONLY_FLAGS = frozenset({"disable-log-stats", "headless", "grpc", "aggregate-engine-logging",
                             "data-parallel-multi-port-external-lb"})


def resolve_vllm_cmd(server_cmd: str) -> list[str]:
    """Split ``--engine-cmd`` into argv and check its program exists.

    ``vllm`` falls back to the script beside the running interpreter (a venv that is not
    activated). A container or scheduler prefix (``srun ... vllm``) is taken as given after its
    first word is found.
    """
    parts = shlex.split(server_cmd)
    if not parts:
        raise UsageError("--engine-cmd is empty; give a path, 'vllm', or 'python3 -m vllm.entrypoints.cli.main'")
    program = parts[0]
    found = shutil.which(program)
    if found is None and program == DEFAULT_VLLM_CMD:
        beside = Path(sys.executable).parent / "vllm"
        if beside.is_file():
            found = str(beside)
    if found is None:
        raise UsageError(
            f"--engine-cmd {server_cmd!r}: program {program!r} not found on PATH. Fix: install vLLM "
            "(bash scripts/setup.sh), give its full path, or use "
            "--engine-cmd 'python3 -m vllm.entrypoints.cli.main'")
    return [found, *parts[1:]]


def options_to_argv(options: Mapping[str, Any], *, negatable: frozenset[str] | None = None) -> list[str]:
    """vLLM's own ``--config`` flattening rules, applied to a mapping of options."""
    argv: list[str] = []
    for key, value in options.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if value:
                argv.append(flag)
            elif (key in negatable) if negatable is not None else (key not in TRUE_ONLY_FLAGS):
                argv.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                argv.append(flag)
                argv.extend(str(item) for item in value)
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, sort_keys=True)]
        elif value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of argv safe to write to disk: the value after ``--api-key`` is masked."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--api-key":
            out[i + 1] = "***"
    return out
