"""``dsv4-tune rehearse`` and ``run --engine``: the night on the emulated node, before the node is reserved.

``rehearse --hw gh200x4 [--objective throughput] [--budget 8h]`` shows the plan (the workload, each
launch's ladder through its KV knee, the baselines, the trials the budget holds), then runs the whole
study on the emulated node of that profile (``tuner/engines/emulated``, ``docs/emulator.md``) with the
clock in node time, so ``--budget 8h`` is 8 node hours in minutes of real time. The study goes to its
own runs folder (``runs/rehearsals`` by default), is named ``rehearsal-…``, records ``rehearsal: true``
and ``engine: emulated``, and its export says so in every file: its figures are predictions of the
emulator's performance model, never evidence of a real node. It ends with what the night predicts:
the winner and its confirmed value beside the baselines, and the night's node and wall time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tuner.cli.args import parse_duration, positive_int, record_from_args
from tuner.engines import ENGINES

if TYPE_CHECKING:
    from tuner.night import NightSummary
    from tuner.study import Study

__all__ = ["REHEARSAL_RUNS_DIR", "add_command", "add_engine_args", "cmd_rehearse", "describe_engine"]

REHEARSAL_RUNS_DIR = Path("runs") / "rehearsals"
DEFAULT_BUDGET = "8h"
"""A rehearsal without --trials or --budget rehearses the night: 8 node hours."""


def add_engine_args(parser: argparse.ArgumentParser, *, engine: bool = True) -> None:
    """``--engine`` and the emulated node's settings (on ``run``; ``rehearse`` has the settings only)."""
    group = parser.add_argument_group("engine (docs/emulator.md: the emulated node and its units)")
    if engine:
        group.add_argument("--engine", choices=sorted(ENGINES), default=None,
                           help="what serves the trials: vllm, llamacpp (llama.cpp's llama-server), or emulated (the "
                           "emulated DeepSeek-V4-Flash node of --hw, from the project's performance model); default: "
                           "the hardware profile's server.engine, else vllm")
    group.add_argument("--time-scale", type=float, metavar="S",
                       help="emulated node: node seconds per real second (default: sized so the client keeps up)")
    group.add_argument("--startup-time-scale", type=float, metavar="S",
                       help="emulated node: the same during start-up (default: --time-scale; faster start-ups "
                       "then count less node time than the node would take)")
    group.add_argument("--multiplicity", type=positive_int, metavar="M",
                       help="emulated node: node requests per client stream (default: sized from the ladder's top)")
    group.add_argument("--truth-seed", type=int, metavar="N",
                       help="emulated node: a node that differs from the tuner's prior (perturbed coefficients)")


def add_command(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Register ``rehearse``."""
    p = sub.add_parser("rehearse", help="run the whole night on the emulated node in minutes, before the node is "
                       "reserved: the plan, the study, and what it predicts it will find")
    p.add_argument("--hw", required=True, help="hardware profile: a name in search_spaces/ or a YAML path")
    p.add_argument("--objective", default="throughput", help="objective name or YAML path")
    p.add_argument("--budget", help=f"node time of the night (default {DEFAULT_BUDGET} when --trials is not given)")
    p.add_argument("--trials", type=positive_int, help="stop after this many launches")
    p.add_argument("--study", help="study name (default: rehearsal-<hw>-<objective>-<timestamp>)")
    p.add_argument("--model", help="model id (default: the profile checkpoint's repository)")
    p.add_argument("--checkpoint", help="checkpoint catalog name (default: the hardware profile's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampler", choices=["tpe", "gp", "random"], default="tpe")
    p.add_argument("--prior", choices=["model", "none"], default=None,
                   help="model (default on GPU profiles): start from the performance model, correct it per launch")
    p.add_argument("--stop-when-done", action="store_true",
                   help="end screening once no untried configuration is likely to beat the winner")
    p.add_argument("--slo", action="append", default=[], metavar="KEY=MS", help="override an SLO limit (repeatable)")
    p.add_argument("--guards", help="comma-separated guard names (default: the profile's and the objective's)")
    p.add_argument("--confirm-top-k", type=int, default=2, metavar="K")
    p.add_argument("--confirm-repeats", type=positive_int, default=3, metavar="N")
    p.add_argument("--prevalidate", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--no-export", action="store_true", help="do not export the predicted winner")
    p.add_argument("--runs-dir", type=Path, default=REHEARSAL_RUNS_DIR,
                   help=f"where rehearsals live (default ./{REHEARSAL_RUNS_DIR}, apart from real studies)")
    add_engine_args(p, engine=False)
    parser: argparse.ArgumentParser = p
    return parser


def describe_engine(study: Study) -> str | None:
    """One line on the engine when it is not vLLM on this node (the emulated node and its units); else None."""
    engine, units = study.engine, study.engine.units
    if units.identity and engine.name != "emulated":  # a real server (vLLM, llama-server): node units are real
        return None
    label = "REHEARSAL on " if study.record.rehearsal else ""
    return (f"{label}{engine.title} ({study.profile.name}): time scale {units.time_scale:g} node s per real s, "
            f"multiplicity {units.multiplicity} requests per stream; every figure is in node units "
            "(docs/emulator.md, Units)")


def _record(args: argparse.Namespace) -> argparse.Namespace:
    """``rehearse``'s arguments as ``run --engine emulated`` takes them."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = args.study or f"rehearsal-{Path(args.hw).stem}-{Path(args.objective).stem}-{stamp}"
    budget = args.budget or (None if args.trials else DEFAULT_BUDGET)
    return argparse.Namespace(**{**vars(args), "study": name, "budget": budget, "engine": "emulated",
                                 "server_cmd": None, "port": None, "ready_timeout": None, "accept_unconfirmed": False,
                                 "gpu_hour_usd": None})


def cmd_rehearse(args: argparse.Namespace, console: Console, run_study: Callable[[Study, argparse.Namespace], int]
                 ) -> int:
    """Plan, run the study on the emulated node, and say what it predicts."""
    from tuner.night import read_night
    from tuner.search import build_plan, format_plan
    from tuner.study import Study

    rargs = _record(args)
    record = record_from_args(rargs).model_copy(update={"rehearsal": True})
    budget_s = parse_duration(rargs.budget) if rargs.budget else None
    console.print(f"[bold]Rehearsal[/] of `dsv4-tune --hw {args.hw} --objective {args.objective}` on the emulated "
                  "node: what the night will do, in node time, before the node is reserved.\n")
    plan = build_plan(args.hw, args.objective, budget_s, args.checkpoint)
    console.print(format_plan(plan), markup=False, soft_wrap=True)
    study = Study.create(record, args.runs_dir)
    code = run_study(study, rargs)  # writes night.json, with the night's wall time
    summary = read_night(study)
    console.print(prediction_table(summary))
    console.print(f"night: {summary.node_s / 3600:.1f} node h in {summary.wall_s / 60:.1f} min of real time; "
                  f"figures in {study.path / 'night.json'}" if summary.node_s and summary.wall_s else "")
    console.print("[yellow]These are the emulator's predictions (docs/emulator.md: what it cannot tell), not "
                  "measurements of a node.[/]")
    return code


def prediction_table(summary: NightSummary) -> Table:
    """What the rehearsed night predicts: the baselines, then the winner."""
    table = Table(title=f"What the night predicts ({summary.metric}, {summary.direction})")
    for col in ("launch", "trial", summary.metric, "confirmed", "ladder top / knee"):
        table.add_column(col)
    by_trial = {row["trial"]: row for row in summary.trials}
    for row in summary.baselines:
        value = f"{row['value']:.1f}" if row["value"] is not None else f"failed: {row['failure_class']}"
        table.add_row(f"baseline {row['baseline']}", str(row["trial"]), value, "", _knee(row))
    if summary.winner is not None:
        w = summary.winner
        label = "winner" + (f" (baseline {w['baseline']})" if w.get("baseline") else "")
        table.add_row(f"[bold]{label}[/]", str(w["trial"]), f"{w['value']:.1f}", "yes" if w["confirmed"] else "no",
                      _knee(by_trial.get(w["trial"], {})))
    return table


def _knee(row: dict[str, object]) -> str:
    shown = row.get("knee_shown")
    if shown is None:
        return ""
    return f"{row.get('knee_top_concurrency')} / {row.get('knee_predicted')} ({'shown' if shown else 'NOT shown'})"

