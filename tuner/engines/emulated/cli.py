"""``python -m tuner.engines.emulated serve MODEL <vllm serve flags>``: start an emulated node like vLLM.

The command line is vLLM's and is read by vLLM's parser (:mod:`~.vllm_cli`); the node, its truth and
its units come from ``DSV4_EMULATOR_*`` (:mod:`~.settings`). Exit statuses are vLLM's: 2 for an
argument the parser refuses, 1 for a failed start or an engine that died, 0 after SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from tuner.engines.emulated._deps import Checkpoint, HardwareProfile, load_catalog, load_checkpoint, load_profile
from tuner.engines.emulated.disagg import KvTransfer
from tuner.engines.emulated.frontend import Frontend
from tuner.engines.emulated.server import EmulatedServer, access_logger
from tuner.engines.emulated.settings import EmulatorSettings, SettingsError
from tuner.engines.emulated.startup import StartupPlan, run_startup
from tuner.engines.emulated.truth import Truth, nominal_truth, truth_from_seed
from tuner.engines.emulated.vllm_cli import (
    ServeArgsError,
    build_parser,
    nondefault_args,
    parse_serve_args,
    vllm_version,
)
from tuner.engines.emulated.vllm_log import VllmLog
from tuner.perfmodel.capacity import capacity, node_model, startup_verdict
from tuner.perfmodel.hardware import node_spec
from tuner.perfmodel.serve_config import EmulatedConfig

__all__ = ["main", "resolve_checkpoint", "resolve_truth", "unreadable_checkpoint"]

log = logging.getLogger(__name__)

USAGE = "usage: python -m tuner.engines.emulated serve [model_tag] [vllm serve options]"
SHUTDOWN_TIMEOUT_S = 2.0
"""How long a stop waits for requests still open (vLLM's uvicorn does not wait for idle connections)."""


def resolve_truth(settings: EmulatorSettings) -> Truth:
    if settings.truth_file:
        truth = Truth.load(Path(settings.truth_file))
    elif settings.truth_seed is not None:
        truth = truth_from_seed(settings.truth_seed)
    else:
        truth = nominal_truth()
    return truth.with_faults(settings.faults)


def resolve_checkpoint(settings: EmulatorSettings, model: str, profile: HardwareProfile) -> Checkpoint:
    """The catalog checkpoint: named in the settings, else the one whose repo is ``model``, else the profile's."""
    if settings.checkpoint:
        return load_checkpoint(settings.checkpoint)
    catalog = load_catalog()
    for ckpt in catalog.checkpoints.values():
        if model in (ckpt.repo, ckpt.name):
            return ckpt
    return load_checkpoint(profile.server.checkpoint)


def unreadable_checkpoint(model: str) -> tuple[str, str] | None:
    """What vLLM's config step raises for a local checkpoint folder whose config cannot be read: (exception,
    message), as transformers words it; None when ``model`` is no local folder (a catalog or hub name: the
    emulated node loads no weights) or its config reads."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    config = folder / "config.json"
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except ValueError:
        return "OSError", f"It looks like the config file at '{config}' is not a valid JSON file."
    except OSError as exc:
        return type(exc).__name__, str(exc)
    return None


def _traceback(kind: str, message: str) -> None:
    sys.stderr.write("Traceback (most recent call last):\n  File \".../vllm/entrypoints/cli/main.py\", line 97, "
                     f"in main\n    args.dispatch_function(args)\n{kind}: {message}\n")
    sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "serve":
        sys.stderr.write(f"{USAGE}\n")
        return 2
    try:
        settings = EmulatorSettings.from_env()
    except SettingsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    parser = build_parser()
    try:
        ns = parse_serve_args(args[1:], parser)
    except ServeArgsError as exc:
        _traceback(exc.kind, exc.message)
        return 1
    try:
        config = EmulatedConfig.from_namespace(ns)
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < config.max_model_len:
            raise ServeArgsError("pydantic_core._pydantic_core.ValidationError", (
                f"1 validation error for SchedulerConfig\n  Value error, max_num_batched_tokens "
                f"({config.max_num_batched_tokens}) is smaller than max_model_len ({config.max_model_len}). This "
                "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
                "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len. "
                "[type=value_error]"))
    except ServeArgsError as exc:
        _traceback(exc.kind, exc.message)
        return 1
    unreadable = unreadable_checkpoint(config.model)
    if unreadable is not None:
        _traceback(*unreadable)
        return 1
    frontend = Frontend.from_namespace(ns, os.environ.get("VLLM_API_KEY"))
    profile = load_profile(settings.hardware)
    checkpoint = resolve_checkpoint(settings, config.model, profile)
    truth = resolve_truth(settings)
    return asyncio.run(_serve(settings, config, frontend, profile, checkpoint, truth,
                              nondefault_args(ns, parser), getattr(ns, "kv_transfer_config", None)))


async def _serve(settings: EmulatorSettings, config: EmulatedConfig, frontend: Frontend, profile: HardwareProfile,
                 checkpoint: Checkpoint, truth: Truth, nondefault: dict[str, object],
                 kv_transfer_config: object = None) -> int:
    vlog = VllmLog()
    units = settings.units
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[int] = loop.create_future()

    def stop() -> None:
        if not stopped.done():
            vlog.info("APIServer", "launcher.py:254", "[shutdown] API server: shutdown triggered")
            stopped.set_result(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    node = node_spec(profile)
    cap = capacity(profile, config, checkpoint, truth.coefficients)
    plan = StartupPlan(config=config, frontend=frontend, checkpoint=checkpoint, capacity=cap,
                       verdict=startup_verdict(node, config, cap, checkpoint), truth=truth, version=vllm_version(),
                       nondefault_args=nondefault)

    async def sleep_v(seconds: float) -> None:
        await asyncio.sleep(seconds / units.startup_time_scale)

    starting = asyncio.create_task(run_startup(plan, vlog, sleep_v))
    waiters: list[asyncio.Future[Any]] = [starting, stopped]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if stopped.done():
        starting.cancel()
        return stopped.result()
    code = starting.result()
    if code is not None:
        return code
    server = EmulatedServer(config=config, frontend=frontend, model=node_model(profile, config, checkpoint,
                                                                             truth.coefficients, node),
                            capacity=cap, truth=truth, units=units, vllm_log=vlog, version=plan.version,
                            seed=settings.seed, stats_interval_s=settings.stats_interval_s,
                            generation=node.generation,
                            kv_transfer=KvTransfer.from_config(
                                kv_transfer_config, kv_bytes_per_token=cap.kv_bytes_per_token,
                                link_bytes_s=node.device.link_bytes_s))
    if server.kv_transfer is not None:
        vlog.info("EngineCore", "factory.py:67", f"Creating v1 connector with name: {server.kv_transfer.connector} "
                                                 f"and engine_id: {server.kv_transfer.engine_id}")
    # SIGTERM closes idle keep-alive connections at once, as uvicorn does for vLLM; aiohttp would wait 60 s
    # for them (measured: 9 s a stop in a rehearsal, every launch).
    if frontend.access_log:
        runner = web.AppRunner(server.app(), access_log_class=access_logger(vlog),
                               access_log=logging.getLogger("tuner.engines.emulated.access"), handle_signals=False,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    else:
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, frontend.host, frontend.port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        vlog.error("APIServer", "launcher.py:98", f"OSError: [Errno {exc.errno}] {exc.strerror}: address already "
                                                  f"in use ({frontend.host}:{frontend.port})")
        await runner.cleanup()
        return 1
    vlog.info("APIServer", "entry.py:140", f"Starting vLLM server on http://{frontend.host}:{frontend.port}")
    vlog.info("APIServer", "launcher.py:186", "Available routes are:")
    for path, method in server.routes:
        vlog.info("APIServer", "launcher.py:195", f"Route: {path}, Methods: {method}")
    vlog.plain(None, f"INFO:     Started server process [{os.getpid()}]")
    vlog.plain(None, "INFO:     Waiting for application startup.")
    vlog.plain(None, "INFO:     Application startup complete.")
    server.start()
    assert server.exit_code is not None
    await asyncio.wait({stopped, server.exit_code}, return_when=asyncio.FIRST_COMPLETED)
    code = stopped.result() if stopped.done() else server.exit_code.result()
    await server.close()
    await runner.cleanup()
    return code
