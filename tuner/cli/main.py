"""The command line: the parser and the commands. ``cli/`` is the only package that prints for people
and chooses exit codes.

    dsv4-tune --hw cpu --objective throughput --trials 4      (same as: dsv4-tune run ...)
    dsv4-tune resume NAME | export NAME | status NAME | list | plan --hw HW | demo-model DIR
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from tuner import catalog
from tuner.cli import doctor, rehearse, scaleout
from tuner.cli.args import install_signal_handlers, parse_duration, positive_int, profile_of, record_from_args
from tuner.engines import default_engine
from tuner.errors import (
    CatalogError,
    SearchStalledError,
    TunerError,
    UnconfirmedWinnerError,
    UnknownNameError,
    UsageError,
)

if TYPE_CHECKING:
    from tuner.search import BoundProfile, HardwareProfile
    from tuner.study import Study
    from tuner.study.lessons import LeverConstraint

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)  # errors go to stderr
SCALEOUT: dict[str, scaleout.Command] = {}
SUBCOMMANDS = {"run", "resume", "export", "list", "status", "plan", "demo-model", "report", "worker",
               "verify", "rehearse", "doctor"}
EXIT_UNCONFIRMED = 3
"""Exit code when the study found feasible trials but confirmed none (and --accept-unconfirmed was not given)."""
HW_HELP = "hardware profile: a name in search_spaces/ (see `dsv4-tune list`) or a YAML path"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsv4-tune", description=(
        "Find the fastest correct vLLM launch for a model on this node, unattended, and export it."))
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="start a new study (the default command)")
    run.add_argument("--hw", required=True, help=HW_HELP)
    run.add_argument("--objective", default="throughput", help="objective name or YAML path")
    run.add_argument("--trials", type=positive_int, help="stop after this many launches")
    run.add_argument("--budget", help="stop before this much wall time is spent, e.g. 8h, 90m (default, with no "
                     "--trials either: the profile's night, server.night_budget_s)")
    run.add_argument("--force", action="store_true", help="run although the pre-flight check finds mismatches; "
                     "they are recorded in study.json, the report and the export's identity")
    run.add_argument("--study", help="study name (default: <hw>-<objective>-<timestamp>)")
    run.add_argument("--model", help="model path or hub id (default: the hardware profile's; 'demo' = the shipped "
                     "tiny DSV4-token model)")
    run.add_argument("--engine-cmd", "--vllm-cmd", dest="server_cmd", default=default_engine().default_command,
                     help="how to start the engine's server program: a path, "
                     "'python3 -m vllm.entrypoints.cli.main', or a prefix (default: the engine's own; "
                     "--vllm-cmd: alias of --engine-cmd)")
    run.add_argument("--port", type=int, help="server port (default: a free one)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--sampler", choices=["tpe", "gp", "random"], default="tpe",
                     help="search: constrained TPE (default), GP (needs scipy; docs/search.md), or random")
    run.add_argument("--prior", choices=["model", "none"], default=None,
                     help="model: start from the performance model's predicted best and correct it after each "
                     "launch; none: the sampler alone (default: model on GPU profiles, none on cpu)")
    run.add_argument("--stop-when-done", action="store_true",
                     help="end screening once no untried configuration has a 5%% chance (per the corrected "
                     "model) to beat the winner by more than the noise; the rest goes to confirmation repeats")
    run.add_argument("--slo", action="append", default=[], metavar="KEY=MS",
                     help="override an SLO limit, e.g. --slo p95_ttft_ms=2000 (repeatable)")
    run.add_argument("--ready-timeout", type=float, help="seconds a launch may take to become ready")
    run.add_argument("--no-export", action="store_true", help="do not export the winner at the end")
    _add_accept_unconfirmed(run)
    run.add_argument("--checkpoint", help="checkpoint catalog name (preview, 0731, w4a16-fp8-mtp, nvfp4-fp8); "
                     "binds the draft method, size and revision (default: the hardware profile's)")
    run.add_argument("--prevalidate", choices=["auto", "on", "off"], default="auto",
                     help="check each configuration with vLLM's own parser before launching it (auto: when "
                     "vLLM imports here; use off when --engine-cmd runs another vLLM version)")
    run.add_argument("--confirm-top-k", type=int, default=2, metavar="K",
                     help="confirm the K best screening trials with longer, repeated runs (0 = off)")
    run.add_argument("--confirm-repeats", type=positive_int, default=3, metavar="N",
                     help="measurement repeats per confirmation launch (default 3)")
    run.add_argument("--gpu-hour-usd", type=float, metavar="USD",
                     help="price of one GPU-hour: every window then reports usd_per_mtok ($ per million output "
                     "tokens), also usable as --objective metric")
    run.add_argument("--guards", help="comma-separated guard names or YAML paths (default: the objective's); "
                     "'none' for no gates")
    _add_runs_dir(run)
    scaleout.add_run_args(run)
    rehearse.add_engine_args(run)

    resume = sub.add_parser("resume", help="continue a stopped study")
    resume.add_argument("name")
    resume.add_argument("--trials", type=positive_int, help="new total trial target")
    resume.add_argument("--budget", help="wall time for this session of the study")
    resume.add_argument("--confirm-top-k", type=int, metavar="K",
                        help="confirm the K best screening trials from now on (e.g. after screening with 0)")
    resume.add_argument("--confirm-repeats", type=positive_int, metavar="N", help="repeats per confirmation launch")
    resume.add_argument("--no-export", action="store_true")
    _add_accept_unconfirmed(resume)
    _add_runs_dir(resume)

    export = sub.add_parser("export", help="write the best feasible trial's launch files to <study>/best/")
    export.add_argument("name")
    _add_accept_unconfirmed(export)
    _add_runs_dir(export)

    verify = sub.add_parser("verify", help="serve the exported best/serve.sh as it is, measure it with the "
                            "confirmation's workload, and compare with the reported figure")
    verify.add_argument("name")
    verify.add_argument("--repeats", type=positive_int, help="measurement repeats (default: the confirmation's)")
    _add_runs_dir(verify)

    report = sub.add_parser("report", help="write report.md / report.html with plots for a study")
    report.add_argument("name")
    _add_runs_dir(report)

    status = sub.add_parser("status", help="show a study's progress (from another shell)")
    status.add_argument("name")
    _add_runs_dir(status)

    lst = sub.add_parser("list", help="list hardware profiles and objectives (and studies)")
    _add_runs_dir(lst)

    plan = sub.add_parser("plan", help="size a hardware profile's search space: feasible share, KV capacity, "
                          "baselines")
    plan.add_argument("--hw", required=True, help=HW_HELP)
    plan.add_argument("--objective")
    plan.add_argument("--budget")
    plan.add_argument("--checkpoint")

    demo = sub.add_parser("demo-model", help="write the shipped tiny demo model (DSV4 tokens, trained on the gates' "
                          "probes) to DIR")
    demo.add_argument("dir", type=Path)
    demo.add_argument("--random", action="store_true", help="instead generate a tiny model with random weights")
    demo.add_argument("--seed", type=int, default=0, help="with --random: the seed of the weights")
    doctor.add_command(sub)
    SCALEOUT.update(scaleout.add_commands(sub))
    rehearse.add_command(sub)
    return parser


def _add_accept_unconfirmed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accept-unconfirmed", action="store_true",
                   help="when no candidate was confirmed, export the best screening trial anyway, labelled "
                   "with its rejected repeats (without it the study exits with code 3 and writes no launch file)")


def _add_runs_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where studies live (default ./runs)")


def _run_study(study: Study, args: argparse.Namespace) -> int:
    from tuner.cli.progress_view import progress_printer
    from tuner.export import export_best
    from tuner.night import write_night
    from tuner.report import write_report
    from tuner.study.reader import read_study

    install_signal_handlers()
    console.print(f"study [bold]{study.record.name}[/] in {study.path}", soft_wrap=True)
    engine_line = rehearse.describe_engine(study)
    if engine_line:
        console.print(f"[yellow]{engine_line}[/]")
    stalled: SearchStalledError | None = None
    started = time.monotonic()
    try:
        optuna_study = study.run(on_progress=progress_printer(console, time.time(), study.clock))
    except KeyboardInterrupt:
        console.print(f"[yellow]stopped.[/] finished trials are kept; continue with "
                      f"`dsv4-tune resume {study.record.name}`")
        return 130
    except SearchStalledError as exc:  # it spun on refusals: the morning's files first, then the error
        stalled = exc
        optuna_study = study.optuna_study()
    reading = read_study(study, optuna_study, importances=True)
    report = write_report(study, reading)
    console.print(f"report: {report}", soft_wrap=True)
    write_night(study, wall_s=time.monotonic() - started)
    if stalled is not None:
        err_console.print(f"[red]error:[/] {stalled}", markup=True, highlight=False, soft_wrap=True)
    winner = reading.winner
    if winner is None:
        console.print("[red]no trial passed its gates and met its SLOs[/]; see "
                      f"{study.path / 'trials.csv'}")
        return 1
    if not winner.exportable_without_consent and not args.accept_unconfirmed:
        err_console.print(f"[red]error:[/] {winner.refusal(study.record.name, study.objective.metric)}",
                          markup=True, highlight=False, soft_wrap=True)
        return EXIT_UNCONFIRMED
    console.print(f"winner: trial {winner.trial}, {study.objective.metric} = {winner.value:.2f} "
                  f"({winner.describe(study.objective.metric)})", markup=False, soft_wrap=True)
    if not args.no_export:
        out = export_best(study, accept_unconfirmed=args.accept_unconfirmed)
        console.print(f"exported: {out}/profile.yaml and {out}/serve.sh", soft_wrap=True)
    return 1 if stalled is not None else 0


def cmd_run(args: argparse.Namespace) -> int:
    from tuner.study import Study

    if args.backend == "ray":
        return SCALEOUT["ray"](args)
    record = record_from_args(args)
    mismatches = doctor.preflight_or_stop(profile_of(args), args.model, args.runs_dir, args.port,
                                          record.engine, args.force)
    if mismatches:
        record = record.model_copy(update={"preflight_mismatches": mismatches})
        for line in mismatches:
            err_console.print(f"[yellow]warning (--force):[/] {line}", markup=True, highlight=False, soft_wrap=True)
    if args.trials is None and not args.budget:
        hours = (record.budget_s or 0) / 3600
        console.print(f"budget: the profile's night, {hours:g} h (no --trials or --budget given). "
                      f"Stop any time with Ctrl-C; continue with `dsv4-tune resume {record.name}`", markup=False,
                      soft_wrap=True)
    study = Study.create(record, args.runs_dir)
    return _run_study(study, args)


def cmd_doctor(args: argparse.Namespace) -> int:
    lines = [m.line() for m in doctor.mismatches_for(profile_of(args), args.model, args.runs_dir, args.port)]
    for line in lines:
        err_console.print(f"[red]error:[/] {line}", markup=True, highlight=False, soft_wrap=True)
    if lines:
        return 1
    console.print(f"doctor: this host can serve {args.hw} (GPUs, engine, checkpoint offline, disk, port)",
                  markup=False)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from tuner.study import Study

    study = Study.open(args.name, args.runs_dir)
    if args.trials is not None:
        study.record = study.record.model_copy(update={"trials": args.trials})
    if args.budget:
        study.record = study.record.model_copy(update={"budget_s": parse_duration(args.budget)})
    confirm = {k: v for k, v in (("top_k", args.confirm_top_k), ("repeats", args.confirm_repeats)) if v is not None}
    if confirm:  # screen now, confirm later: the record keeps the new settings (study.json)
        confirm["top_k"] = max(0, confirm.get("top_k", study.record.confirm.top_k))
        study.record = study.record.model_copy(update={"confirm": study.record.confirm.model_copy(update=confirm)})
    return _run_study(study, args)


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.export import export_best
    from tuner.study import Study

    out = export_best(Study.open(args.name, args.runs_dir), accept_unconfirmed=args.accept_unconfirmed)
    console.print(f"exported: {out}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from tuner.study import Study
    from tuner.verify import verify_export

    install_signal_handlers()
    study = Study.open(args.name, args.runs_dir)
    try:
        result = verify_export(study, repeats=args.repeats)
    except KeyboardInterrupt:
        console.print("[yellow]stopped.[/] the re-served server was stopped; nothing was recorded")
        return 130
    if not result.get("ready_s"):
        console.print(f"[red]best/serve.sh did not serve:[/] {result.get('reason', '')}")
        return 1
    console.print(result["verdict"])
    console.print(f"recorded: {study.path / 'verify' / 'verify.json'}")
    return 0 if result["within"] else 1


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import write_report
    from tuner.study import Study

    study = Study.open(args.name, args.runs_dir)
    console.print(f"report: {write_report(study)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from tuner.study import Study
    from tuner.study.reader import read_study

    study = Study.open(args.name, args.runs_dir)
    reading = read_study(study)
    table = Table(title=f"study {study.record.name}")
    for col in ("trial", "state", "value", "failure", "reason"):
        table.add_column(col)
    for t in reading.trials:
        value = "" if t.value is None else f"{t.value:.2f}"
        table.add_row(str(t.number), t.state, value, str(t.user_attrs.get("failure_class") or ""),
                      str(t.user_attrs.get("reason", ""))[:80])
    console.print(table)
    best = reading.best_feasible()
    console.print(f"best: trial {best.number} = {best.value:.2f}" if best else "best: none feasible yet")
    for note in study.host_notes():
        console.print(note, markup=False, soft_wrap=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from tuner.objective import load_objective
    from tuner.search.profile import load_profile

    table = Table(title="hardware profiles (--hw; search_spaces/)")
    table.add_column("name")
    table.add_column("devices")
    table.add_column("description")
    for name in catalog.known_names("search_spaces"):
        try:
            prof = load_profile(name)
            table.add_row(name, f"{prof.hardware.device_count}× {prof.hardware.device_name}", prof.description)
        except TunerError as exc:
            table.add_row(name, "-", f"[red]invalid: {exc}[/]")
    console.print(table)
    obj_table = Table(title="objectives (--objective)")
    obj_table.add_column("name")
    obj_table.add_column("description")
    for name in catalog.known_names("objectives"):
        try:
            obj_table.add_row(name, load_objective(name).description)
        except TunerError as exc:
            obj_table.add_row(name, f"[red]invalid: {exc}[/]")
    console.print(obj_table)
    if args.runs_dir.is_dir():
        studies = sorted(p.parent.name for p in args.runs_dir.glob("*/study.json"))
        console.print(f"studies in {args.runs_dir}: {', '.join(studies) or '(none)'}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from tuner.engines import DEFAULT_ENGINE
    from tuner.engines.registry import engine_class
    from tuner.search import build_plan, format_plan

    budget_s = parse_duration(args.budget) if args.budget else None
    bound = profile_of(args)
    engine = engine_class(bound.raw.server.engine or DEFAULT_ENGINE)()  # the engine `run` would use
    report = build_plan(bound, args.objective, budget_s, engine=engine)
    console.print(format_plan(report), markup=False, soft_wrap=True)
    if report.envelopes is None:  # the performance model's prior is vLLM's on a GPU node
        console.print(_prior_section(bound, args.objective), markup=False, soft_wrap=True)
    for ruled_out in _probed_on_this_host(bound.raw):
        console.print(f"Ruled out on this host before any launch: {ruled_out.describe()}", markup=False,
                      soft_wrap=True)
    checks = ("will run before every launch" if engine.can_validate() else  # when not, the engine logs why
              "cannot run in this environment (the reason is logged above): configurations launch unchecked")
    console.print(f"Pre-launch argument checks (--prevalidate auto): {engine.title}'s own checks {checks}.",
                  markup=False, soft_wrap=True)
    return 0


def _probed_on_this_host(profile: HardwareProfile) -> list[LeverConstraint]:
    """The lever values a cheap probe of this host rules out (what a study here refuses before any launch)."""
    from tuner.search.preflight import host_probe
    from tuner.study.lessons import probed_constraints

    return probed_constraints(profile, host_probe().cpu_flags())


def _prior_section(bound: BoundProfile, objective: str | None) -> str:
    """``plan``'s prior section: the performance model's predicted top configurations and optimum."""
    from tuner.predict.plan import format_prior, prior_plan
    from tuner.search.envelope import objective_for

    return format_prior(prior_plan(bound.profile, bound.checkpoint, objective_for(bound.raw, objective)))


def cmd_demo_model(args: argparse.Namespace) -> int:
    from tuner.demo_model import build_demo_model, write_demo_model

    out = build_demo_model(args.dir, seed=args.seed) if args.random else write_demo_model(args.dir)
    console.print(f"demo model ready: {out}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    return SCALEOUT["worker"](args)


def cmd_rehearse(args: argparse.Namespace) -> int:
    return rehearse.cmd_rehearse(args, console, _run_study)


COMMANDS = {"rehearse": cmd_rehearse, "doctor": cmd_doctor,
            "worker": cmd_worker, "run": cmd_run, "resume": cmd_resume, "export": cmd_export, "status": cmd_status,
            "list": cmd_list, "plan": cmd_plan, "demo-model": cmd_demo_model, "report": cmd_report,
            "verify": cmd_verify}


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    first = next((w for w in words if w not in ("-v", "--verbose")), None)
    if first is not None and first not in SUBCOMMANDS and first not in ("-h", "--help"):
        index = words.index(first)
        words.insert(index, "run")
    parser = build_parser()
    args = parser.parse_args(words)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except (UsageError, CatalogError, UnknownNameError) as exc:
        err_console.print(f"[red]error:[/] {exc}", markup=True, soft_wrap=True)
        return 2
    except UnconfirmedWinnerError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        return EXIT_UNCONFIRMED
    except TunerError as exc:
        err_console.print(f"[red]error:[/] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
