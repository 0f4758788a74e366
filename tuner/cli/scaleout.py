"""Command line of the scale-out modes: ``dsv4-tune worker`` and ``dsv4-tune run --backend ray``.

:mod:`tuner.cli` registers them: ``add_commands`` adds the ``worker`` subcommand and returns the
runners, ``add_run_args`` adds ``--backend ray`` and its options to ``run``.
"""

from __future__ import annotations

import argparse
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.cli.args import (
    count,
    install_signal_handlers,
    parse_duration,
    parse_guards,
    parse_slos,
    positive_int,
    record_from_args,
)
from tuner.errors import UsageError

if TYPE_CHECKING:
    from tuner.study import StudyRecord

log = logging.getLogger(__name__)

Command = Callable[[argparse.Namespace], int]


def add_commands(sub: argparse._SubParsersAction) -> dict[str, Command]:  # type: ignore[type-arg]
    """Register ``worker``; return the runners: ``worker`` and ``ray`` (for ``run --backend ray``)."""
    worker = sub.add_parser("worker", help="join a study shared on PostgreSQL and run its trials on this node")
    worker.add_argument("--storage", help="Optuna storage URL, e.g. postgresql://USER@HOST:5432/DB "
                        "(default: $DSV4_TUNE_STORAGE; keep the password there or in $PGPASSWORD)")
    worker.add_argument("--study", required=True, help="name of the shared study")
    worker.add_argument("--worker-id", default=None,
                        help="this worker's name, unique per node (default: the hostname); two workers on "
                        "one node need two ids")
    worker.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="where trial folders go; share it between nodes (NFS) so export works anywhere")
    worker.add_argument("--heartbeat-interval", type=positive_int, default=30, metavar="S",
                        help="seconds between heartbeats of a running trial (default 30)")
    worker.add_argument("--grace-period", type=positive_int, default=None, metavar="S",
                        help="a trial without a heartbeat for this long is re-queued (default 4 × interval)")
    worker.add_argument("--max-retry", type=count, default=3, help="times a dead worker's trial is re-queued")
    worker.add_argument("--on-mismatch", choices=("refuse", "label"), default="refuse",
                        help="when this node differs from the study's (GPU, driver, vLLM): refuse to join, or "
                        "report into a separate study <study>.<fingerprint>")
    worker.add_argument("--budget", help="stop this worker before this much wall time is spent, e.g. 8h")
    worker.add_argument("--launch-lock", type=Path, default=None,
                        help="a lock file that serializes launches of workers sharing one machine's devices")
    new = worker.add_argument_group("creating the study (first worker only; ignored if it exists)")
    new.add_argument("--hw", help="hardware profile: a name in search_spaces/ or a YAML path")
    new.add_argument("--objective", default="throughput")
    new.add_argument("--model")
    new.add_argument("--trials", type=positive_int, help="launches for the whole study (all workers together)")
    new.add_argument("--seed", type=int, default=0)
    new.add_argument("--engine-cmd", "--vllm-cmd", dest="server_cmd", default="vllm",
                     help="the engine's server program (--vllm-cmd: alias of --engine-cmd)")
    new.add_argument("--port", type=int)
    new.add_argument("--slo", action="append", default=[], metavar="KEY=MS")
    new.add_argument("--ready-timeout", type=float)
    new.add_argument("--guards")
    return {"worker": cmd_worker, "ray": cmd_ray}


def add_run_args(run: argparse.ArgumentParser) -> None:
    """The ``run`` parser's scale-out options."""
    group = run.add_argument_group("scale-out over a Ray cluster")
    group.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="local: trials one after another on this node; ray: trials as Ray Tune trials, "
                       "one node each")
    group.add_argument("--ray-address", default=None,
                       help="Ray cluster address, e.g. 10.0.0.1:6379 (default: $RAY_ADDRESS, else 'auto')")
    group.add_argument("--max-concurrent-trials", type=positive_int, default=None,
                       help="trials at once (default: the number of nodes that can hold one trial)")
    group.add_argument("--gpus-per-trial", type=count, default=None,
                       help="GPUs each trial reserves (default: the hardware profile's device_count; 0 on CPU "
                       "profiles)")
    group.add_argument("--max-retries", type=count, default=2,
                       help="times a trial whose node died is retried on another node (default 2)")
    group.add_argument("--on-mismatch", choices=("refuse", "label"), default="refuse",
                       help="a trial on a node unlike the study's first: refuse (FAIL, not ranked) or label")


def _creation_record(args: argparse.Namespace) -> StudyRecord | None:
    if not args.hw:
        return None
    from tuner.study import new_record

    return new_record(name=args.study, hw=args.hw, objective=args.objective, model=args.model,
                      server_cmd=args.server_cmd, port=args.port, trials=args.trials, budget_s=None, seed=args.seed,
                      slo_overrides=parse_slos(args.slo), ready_timeout_s=args.ready_timeout,
                      guards=parse_guards(args.guards))


def cmd_worker(args: argparse.Namespace) -> int:
    from tuner.backends.worker import WorkerOptions, run_worker
    from tuner.study import best_feasible_trial

    record = _creation_record(args)
    if record is not None and record.trials is None and not args.budget:
        raise UsageError("creating a shared study: give --trials N (launches of all workers together) or "
                         "--budget DURATION, so the workers know when to stop")
    options = WorkerOptions(worker_id=args.worker_id or socket.gethostname(), launch_lock=args.launch_lock,
                            on_mismatch=args.on_mismatch,
                            budget_s=parse_duration(args.budget) if args.budget else None)
    install_signal_handlers()
    try:
        study = run_worker(args.study, args.runs_dir, options, storage_url=args.storage,
                           heartbeat_interval_s=args.heartbeat_interval, grace_period_s=args.grace_period,
                           max_retry=args.max_retry, create=record)
    except KeyboardInterrupt:
        log.warning("worker %s stopped; its trial went back to the queue", options.worker_id)
        return 130
    best = best_feasible_trial(study)
    log.info("worker %s done; best so far: %s", options.worker_id,
             f"trial {best.number} = {best.value:.2f}" if best is not None and best.value is not None else "none")
    log.info("workers screen only: once every worker is done, run `dsv4-tune resume %s --runs-dir %s` on one "
             "node (with $DSV4_TUNE_STORAGE set) to confirm the best candidates there and export the winner",
             args.study, args.runs_dir)
    return 0


def cmd_ray(args: argparse.Namespace) -> int:
    """``dsv4-tune run --backend ray ...``: the same study, its trials spread over a Ray cluster."""
    from tuner.backends.ray import RayOptions, run_study
    from tuner.export import export_best
    from tuner.study import Study

    record = record_from_args(args)
    study = Study.create(record, args.runs_dir)
    options = RayOptions(address=args.ray_address, max_concurrent_trials=args.max_concurrent_trials,
                         gpus_per_trial=args.gpus_per_trial, max_retries=args.max_retries,
                         on_mismatch=args.on_mismatch)
    install_signal_handlers()
    try:
        optuna_study = run_study(study, options)
    except KeyboardInterrupt:
        log.warning("stopped; finished trials are kept in %s", study.path)
        return 130
    winner = study.winner(optuna_study)
    if winner is None:
        log.error("no trial passed its gates and met its SLOs; see %s", study.path / "trials.csv")
        return 1
    metric = study.objective.metric
    if not winner.exportable_without_consent and not args.accept_unconfirmed:
        # The Ray driver screens only: confirmation runs on one node (`dsv4-tune resume NAME`).
        log.error("%s", winner.refusal(study.record.name, metric))
        return 3
    log.info("best: trial %d, %s = %.2f (%s)", winner.trial, metric, winner.value, winner.describe(metric))
    if not args.no_export:
        log.info("exported: %s", export_best(study, accept_unconfirmed=args.accept_unconfirmed))
    return 0
