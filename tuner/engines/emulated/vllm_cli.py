"""The ``vllm serve`` command line, read by vLLM's own parser.

``make_arg_parser`` builds the same parser ``vllm serve`` uses (usage ``vllm serve [model_tag]
[options]``), so an unknown flag, a bad type or a bad choice ends the emulator exactly as it ends
vLLM: argparse's usage and error on stderr, exit status 2. The checks vLLM runs next
(``validate_parsed_serve_args``, ``AsyncEngineArgs.from_cli_args``) and the scheduler-config rule it
applies when it builds the engine config (max-num-batched-tokens ≥ max-num-seqs) end it with their
exception and exit status 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from tuner.engines.vllm.validate import cli_args_module

__all__ = ["ServeArgsError", "nondefault_args", "parse_serve_args"]

VLLM_VERSION_FALLBACK = "0.32.0"


class ServeArgsError(Exception):
    """vLLM would refuse these arguments after parsing them: ``kind`` is the exception type it raises."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message




def build_parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]",  # type: ignore[no-untyped-call]
                                    description="Launch a local OpenAI-compatible API server to serve LLM "
                                                "completions via HTTP.")
    built: argparse.ArgumentParser = cli_args_module().make_arg_parser(parser)
    return built


def parse_serve_args(argv: Sequence[str], parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """Parse and check ``argv`` (what follows ``serve``) as vLLM does.

    argparse errors raise ``SystemExit(2)`` after printing usage and error (vLLM's behaviour);
    later checks raise :class:`ServeArgsError`.
    """
    parser = parser or build_parser()
    args = parser.parse_args(list(argv))
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    try:
        cli_args_module().validate_parsed_serve_args(args)
        from vllm.engine.arg_utils import AsyncEngineArgs

        AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:
        raise ServeArgsError(type(exc).__name__, str(exc)) from exc
    seqs, batched = args.max_num_seqs, args.max_num_batched_tokens
    if seqs is not None and batched is not None and batched < seqs:
        raise ServeArgsError("pydantic_core._pydantic_core.ValidationError", (
            "1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens "
            f"({batched}) must be greater than or equal to max_num_seqs ({seqs}). [type=value_error]"))
    return args


SENSITIVE_ARGS = frozenset({"api_key", "hf_token", "watermark_config"})
"""Logged as ``***`` (vLLM's ``redact_sensitive_args``)."""


def nondefault_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """What vLLM logs as ``non-default args``: every option whose value differs from the parser's default,
    secrets redacted."""
    out: dict[str, Any] = {}
    for key, value in vars(args).items():
        try:
            default = parser.get_default(key)
        except AttributeError:
            continue
        if value != default and value is not None:
            if key in SENSITIVE_ARGS:
                out[key] = "***"
            else:
                out[key] = value if isinstance(value, (str, int, float, bool, list, dict)) else str(value)
    return out


def vllm_version() -> str:
    try:
        from vllm import __version__

        return str(__version__).split("+")[0]
    except Exception:  # vLLM's version module can fail to import on odd builds
        return VLLM_VERSION_FALLBACK
