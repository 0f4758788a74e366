"""Reading the command line's values: durations, SLO overrides, guard lists, counts; the study record of ``run``.

Shared by :mod:`tuner.cli.main` and :mod:`tuner.cli.scaleout`: ``main`` imports ``scaleout``, and both
import from here, so neither imports the other back. Heavy modules (the study and Optuna) load only
inside the commands that need them.
"""

from __future__ import annotations

import argparse
import re
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from tuner.errors import UsageError

if TYPE_CHECKING:
    from tuner.search import BoundProfile
    from tuner.study import StudyRecord

__all__ = ["count", "install_signal_handlers", "parse_duration", "parse_guards", "parse_slos", "positive_int",
           "profile_of", "record_from_args", "with_engine"]

_BOUND = "_bound_profile"


def profile_of(args: argparse.Namespace) -> BoundProfile:
    """``--hw`` bound to ``--checkpoint`` (:func:`tuner.search.bound_profile`), loaded once per command: kept
    on ``args`` for every later use of the same command."""
    from tuner.search import bound_profile

    key = (args.hw, getattr(args, "checkpoint", None))
    cached = vars(args).get(_BOUND)
    if cached is None or cached[0] != key:
        cached = (key, bound_profile(*key))
        setattr(args, _BOUND, cached)
    return cached[1]

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """``8h``, ``90m``, ``1h30m``, ``45s`` or plain seconds → seconds (> 0)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise UsageError(f"--budget {text!r} is not a duration. Fix: write one such as 8h, 90m, 1h30m or 600s")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UsageError(f"--budget {text!r}: the budget must be longer than 0. Fix: give e.g. --budget 8h, "
                         "or drop --budget and use --trials N")
    return total


def parse_slos(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError as exc:
            raise UsageError(f"--slo {item!r}: write KEY=MILLISECONDS, e.g. --slo p95_ttft_ms=2000") from exc
    return out


def parse_guards(text: str | None) -> list[str] | None:
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UsageError("--guards is empty; give names such as tool_call,reasoning or 'none'")
    return names


def _whole_number(minimum: int, too_small: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from exc
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{too_small}, got {value}")
        return value

    return parse


positive_int = _whole_number(1, "must be at least 1")
"""An argparse type: a whole number of at least 1 (``--trials``)."""
count = _whole_number(0, "must be 0 or more")
"""An argparse type: a whole number of at least 0 (``--max-retries``)."""


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP stop the tuner as Ctrl-C does: the running trial is marked, its server stopped."""
    def stop(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)


def record_from_args(args: argparse.Namespace) -> StudyRecord:
    """The study record a `run` command line asks for (shared by the local and Ray backends)."""
    from tuner.engines import DEFAULT_ENGINE  # the study and its Optuna load only for the commands that run one
    from tuner.engines.registry import engine_class
    from tuner.engines.vllm import DEFAULT_VLLM_CMD
    from tuner.study import ConfirmSpec, new_record, resolve_model

    budget_s = parse_duration(args.budget) if args.budget else None
    bound = profile_of(args)
    # --engine, else the engine the hardware profile names (server.engine: llamacpp on strixhalo), else vLLM
    engine = getattr(args, "engine", None) or bound.raw.server.engine or DEFAULT_ENGINE
    # --engine-cmd's default is vLLM's; another engine runs its own program unless one is given.
    default_cmd = engine_class(engine).default_command
    server_cmd = default_cmd if args.server_cmd in (None, DEFAULT_VLLM_CMD) else args.server_cmd
    record = new_record(name=args.study, hw=args.hw, objective=args.objective, model=args.model,
                        server_cmd=server_cmd, port=args.port, trials=args.trials, budget_s=budget_s,
                        seed=args.seed, slo_overrides=parse_slos(args.slo), ready_timeout_s=args.ready_timeout,
                        guards=parse_guards(args.guards), checkpoint=args.checkpoint,
                        prevalidate=args.prevalidate,
                        confirm=ConfirmSpec(top_k=max(0, args.confirm_top_k), repeats=args.confirm_repeats),
                        sampler=args.sampler, gpu_hour_usd=getattr(args, "gpu_hour_usd", None),
                        prior=getattr(args, "prior", None), stop_when_done=getattr(args, "stop_when_done", False),
                        bound=bound)
    if engine != DEFAULT_ENGINE:
        record = with_engine(record, engine, args)
    engine_class(engine)().resolve_command(record.server_cmd)
    resolve_model(record.model, args.runs_dir)
    if record.trials is None and record.budget_s is None:  # the command as the design writes it: one night
        record = record.model_copy(update={"budget_s": bound.raw.server.night_budget_s})
    return record


def with_engine(record: StudyRecord, engine: str, args: argparse.Namespace) -> StudyRecord:
    """``record`` served by ``engine``, with the options the engine sizes for this night (the emulated
    node's units: ``--time-scale``, ``--multiplicity`` and ``--truth-seed`` win over its own choice)."""
    from tuner.engines.registry import engine_options
    from tuner.search import bound_profile
    from tuner.search.envelope import objective_for

    bound = profile_of(args) if (getattr(args, "hw", None), getattr(args, "checkpoint", None)) == (
        record.hw, record.checkpoint) else bound_profile(record.hw, record.checkpoint)
    profile, checkpoint = bound.profile, bound.checkpoint
    objective = objective_for(profile, record.objective, record.slo_overrides)
    given = {key: getattr(args, key, None) for key in ("time_scale", "startup_time_scale", "multiplicity",
                                                         "truth_seed")}
    options = engine_options(engine, profile, checkpoint, objective, **given)
    return record.model_copy(update={"engine": engine, "engine_options": options})
