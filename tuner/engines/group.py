"""A prefill/decode layout as one launch: every pool member, the router in front, started and stopped together.

:func:`build_group` turns a :class:`~tuner.search.pools.Disaggregated` launch into a :class:`ServerGroup`:
one server per pool member (the engine's argv, the member's own options, its ``--kv-transfer-config``, its
GPUs), then the router (``vllm-router --vllm-pd-disaggregation``: docs/decisions.md, issue 27) on the port
the load and the gates use. Each member is a :class:`~tuner.engines.process.ServerProcess` in its own
folder (``prefill-0/``, ``decode-0/``, ``router/``), so each has its log and its pid file, and a killed
tuner's orphans are found by :func:`~tuner.engines.process.stop_orphans` as any server's.

The group answers what the trial asks of a server: ready only once every member and the router answer
(:meth:`ServerGroup.wait_ready`; a member that exits or hangs ends the wait at once, named with its pool and
its log's last line), healthy only while all are, exited as soon as one has, stopped as one (the router
first, then every member at once), and its ``/metrics`` pages read as one, each sample labelled with its
member's pool (:data:`POOL_LABEL`: :mod:`tuner.load.pools` reads them pool by pool).

Keys: vLLM-router 0.1.17's P/D mode sends its prefill requests with an empty bearer token (measured:
every prefill leg refused with 401 by a member started with ``--api-key``), so the members run without a
key, on 127.0.0.1 like every server here; the router takes no client key.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tuner.engines.base import Engine
from tuner.engines.process import LaunchSpec, ServerProcess, free_port, tail
from tuner.errors import LaunchError, UsageError
from tuner.failures import Diagnosis, FailureClass, describe_returncode
from tuner.load.metrics import MetricKey, parse_prometheus
from tuner.load.pools import MEMBER_LABEL, POOL_LABEL
from tuner.search.pools import (
    CONNECTOR_MODULES,
    Disaggregated,
    PoolMember,
    connector_missing,
    kv_transfer_config,
    router_missing,
)

__all__ = ["GroupMember", "ServerGroup", "build_group", "connector_problem",
           "router_argv", "router_problem"]

log = logging.getLogger(__name__)

ROUTER_KV_CONNECTOR: Mapping[str, str] = {"MooncakeConnector": "mooncake", "MoRIIOConnector": "moriio"}
"""``vllm-router --kv-connector`` for connectors other than NIXL (its default)."""
SHARED_STORAGE_CONNECTORS = frozenset({"ExampleConnector"})
"""Connectors that move the KV through a folder both sides read (``shared_storage_path``): one per trial."""


# -- what must be installed ------------------------------------------------------------------------------
def _python_of(command: Sequence[str]) -> str | None:
    """The Python a server command runs (``python -m vllm...``, or a console script's shebang)."""
    if len(command) >= 3 and command[1] == "-m":
        return command[0]
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(command[0], "rb") as fh:
            first = fh.readline(400).decode().strip()
        if first.startswith("#!") and "python" in first:
            shebang = first[2:].split()
            return shebang[-1] if Path(shebang[0]).name == "env" else shebang[0]
    return None


def connector_problem(connector: str, command: Sequence[str], *, env: Mapping[str, str] | None = None,
                      timeout_s: float = 60.0) -> str | None:
    """Why ``connector`` cannot run under the engine ``command`` with ``env`` (its Python module missing), or None."""
    module = CONNECTOR_MODULES.get(connector)
    if module is None:
        return None
    python = _python_of(command)
    if python is None:
        return None  # a container or a wrapper: the member's start-up log will say
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=timeout_s, check=False,
                              stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError):
        return None
    return None if done.returncode == 0 else connector_missing(connector, python)


def find_router(program: str) -> str | None:
    """The router program's path: on PATH, a file named as such, or beside this Python (the venv the
    ``pd`` extra installed it into, not activated: as ``vllm`` itself is found)."""
    found = shutil.which(program)
    if found is not None:
        return found
    if Path(program).is_file():
        return program
    beside = Path(sys.executable).parent / program
    return str(beside) if "/" not in program and beside.is_file() and os.access(beside, os.X_OK) else None


def router_problem(router: str) -> str | None:
    """Why the router program cannot start (not found), or None."""
    parts = shlex.split(router)
    if parts and find_router(parts[0]) is not None:
        return None
    return router_missing(router)


def router_argv(router: str, launch: Disaggregated, urls: Mapping[str, str], *, host: str, port: int,
                metrics_port: int, startup_timeout_s: float = 600.0) -> list[str]:
    """``vllm-router``'s P/D mode in front of the members (``urls``: member name → its base URL)."""
    parts = shlex.split(router)
    found = find_router(parts[0]) if parts else None
    argv = [found or parts[0], *parts[1:], "--host", host, "--port", str(port), "--vllm-pd-disaggregation"]
    for member in launch.pool("prefill"):
        argv += ["--prefill", urls[member.name]]
    for member in launch.pool("decode"):
        argv += ["--decode", urls[member.name]]
    if launch.connector in ROUTER_KV_CONNECTOR:
        argv += ["--kv-connector", ROUTER_KV_CONNECTOR[launch.connector]]
    return [*argv, "--policy", "round_robin", "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            "--worker-startup-timeout-secs", str(int(startup_timeout_s)), "--worker-startup-check-interval", "1",
            "--log-level", "info"]


# -- the group -------------------------------------------------------------------------------------------
@dataclass
class GroupMember:
    """One server of the group (a pool member, or the router) and where it stands."""

    name: str
    role: str
    """``prefill``, ``decode`` or ``router``."""
    process: ServerProcess
    ready_offset: int = 0
    """The size of its log when the group became ready: what it logs after is its serving log."""

    @property
    def label(self) -> str:
        return "the router" if self.role == "router" else f"{self.name} ({self.role} pool)"


_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): \S")


def last_line(text: str) -> str:
    """What a member said before it died: its last error line (``RuntimeError: ...``), else its last line.

    A vLLM engine that dies still shuts its API server down cleanly, so the log ends with shutdown noise
    (a resource tracker's warning); the exception that killed it comes before."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    if errors:
        return errors[-1][:300]
    return lines[-1][:300] if lines else "(its log is empty)"


class ServerGroup:
    """Every member of a prefill/decode launch and its router; a server as the trial sees it (module docstring)."""

    def __init__(self, members: Sequence[GroupMember], router: GroupMember, *, engine: Engine | None,
                 launch: Disaggregated, commands: Mapping[str, Any]) -> None:
        self.members = list(members)
        self.router = router
        self.engine = engine
        self.launch = launch
        self.commands = dict(commands)
        """Member name → its argv, env, port (what ``command.json`` records)."""

    # -- what the trial reads ------------------------------------------------------------------------
    @property
    def everyone(self) -> list[GroupMember]:
        return [*self.members, self.router]

    @property
    def base_url(self) -> str:
        return self.router.process.base_url

    @property
    def headers(self) -> dict[str, str]:
        return {}

    @property
    def log_path(self) -> Path:
        """The first decode member's log: the KV capacity the study learns from is the decode pool's."""
        return next(m for m in self.members if m.role == "decode").process.log_path

    def member(self, name: str) -> GroupMember:
        return next(m for m in self.everyone if m.name == name)

    def dead_member(self) -> GroupMember | None:
        return next((m for m in self.everyone if m.process.exited() is not None), None)

    def exited(self) -> int | None:
        dead = self.dead_member()
        return None if dead is None else dead.process.exited()

    def healthy(self, timeout_s: float = 5.0) -> bool:
        return all(m.process.healthy(timeout_s=timeout_s) for m in self.everyone)

    # -- life ----------------------------------------------------------------------------------------
    def start(self) -> None:
        started: list[GroupMember] = []
        try:
            for member in self.everyone:
                member.process.start()
                started.append(member)
        except BaseException:
            self._stop(started)
            raise

    def wait_ready(self, *, should_stop: Callable[[], bool] | None = None) -> float:
        """Wait until every member, then the router, answers; a member that dies or hangs ends it, named."""
        import time

        begun = time.monotonic()

        def stop_now() -> bool:
            return bool(should_stop and should_stop()) or self.dead_member() is not None

        for member in self.everyone:
            try:
                member.process.wait_ready(should_stop=stop_now)
            except LaunchError as exc:
                dead = self.dead_member()
                if exc.failure_class == FailureClass.INTERRUPTED.value and dead is not None and dead is not member:
                    raise self._death(dead) from exc
                if exc.failure_class == FailureClass.INTERRUPTED.value and dead is None:
                    raise
                text = tail(member.process.log_path)
                raise LaunchError(f"{member.label}: {exc}; its log's last line: {last_line(text)}",
                                  failure_class=exc.failure_class, log_path=member.process.log_path,
                                  log_tail=text) from exc
        for member in self.everyone:
            with contextlib.suppress(OSError):
                member.ready_offset = member.process.log_path.stat().st_size
        return time.monotonic() - begun

    def _death(self, member: GroupMember) -> LaunchError:
        text = tail(member.process.log_path)
        code = member.process.exited()
        diag = member.process.spec.diagnose(member.process.log_path, code)
        return LaunchError(f"{member.label} exited during startup ({diag.failure_class.value}): {diag.reason}; "
                           f"its log's last line: {last_line(text)}", failure_class=diag.failure_class.value,
                           log_path=member.process.log_path, log_tail=text)

    def diagnose_crash(self, seen: FailureClass, max_bytes: int) -> Diagnosis:
        """Why the group stopped serving: the first member that died (or does not answer), from its serving log."""
        culprit = self.dead_member() or next((m for m in self.everyone if not m.process.healthy(timeout_s=2.0)),
                                             None)
        if culprit is None:
            return Diagnosis(seen, "a member of the prefill/decode group stopped answering; every member answers "
                                   "again now")
        text = _log_since(culprit.process.log_path, culprit.ready_offset, max_bytes)
        code = culprit.process.exited()
        diag = self.engine.diagnose_crash(text, code) if self.engine is not None and culprit.role != "router" \
            else None
        what = f"it exited ({describe_returncode(code)})" if code is not None else \
            "it stopped answering its health check"
        reason = diag.reason if diag is not None else f"{what} while serving"
        return Diagnosis(diag.failure_class if diag is not None else seen,
                         f"{culprit.label}: {reason}; its log's last line: {last_line(text)}")

    def stop(self) -> None:
        """The router first (no new request reaches a member), then every member at once."""
        self._stop(self.everyone)

    def _stop(self, members: Sequence[GroupMember]) -> None:
        routers = [m for m in members if m.role == "router"]
        for member in routers:
            member.process.stop()
        threads = [threading.Thread(target=m.process.stop, name=f"stop-{m.name}")
                   for m in members if m.role != "router"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def __enter__(self) -> ServerGroup:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- metrics -------------------------------------------------------------------------------------
    def scrape(self, path: str) -> dict[MetricKey, float]:
        """Every member's ``/metrics`` page as one, each sample labelled with its pool and member."""
        out: dict[MetricKey, float] = {}
        for member in self.members:
            try:
                resp = httpx.get(member.process.base_url + path, timeout=10.0)
                resp.raise_for_status()
            except httpx.HTTPError as exc:
                log.warning("could not read %s of %s: %s", path, member.label, exc)
                continue
            extra = ((POOL_LABEL, member.role), (MEMBER_LABEL, member.name))
            for (name, labels), value in parse_prometheus(resp.text).items():
                out[(name, tuple(sorted((*labels, *extra))))] = value
        return out


def _log_since(path: Path, offset: int, max_bytes: int) -> str:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(offset, size - max_bytes))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _gpu_env(member: PoolMember) -> dict[str, str]:
    """The member's GPUs, through the devices this tuner itself may use (``CUDA_VISIBLE_DEVICES``)."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    gpus = [visible[g] if g < len(visible) else str(g) for g in member.gpus] if visible else \
        [str(g) for g in member.gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus)}


def build_group(engine: Engine, command: Sequence[str], model: str, launch: Disaggregated, workdir: Path, *,
                host: str, served_model_name: str, env: Mapping[str, str], member_env: Callable[[PoolMember],
                                                                                              Mapping[str, str]],
                ready_timeout_s: float, startup_stall_s: float | None, cpus: tuple[int, ...] | None,
                port: int | None = None, check_installed: bool = True) -> ServerGroup:
    """The servers of one prefill/decode launch (not started; see the module docstring).

    ``env`` is every member's environment (the configuration's), ``member_env`` what one member adds (its CPU
    binding); ``port`` is the router's (the one clients use). ``check_installed`` refuses a missing router or
    connector before anything starts (a :class:`UsageError` that names the fix): off for an engine that
    emulates both.
    """
    problems = [p for p in (router_problem(launch.router),
                            connector_problem(launch.connector, command, env=env) if check_installed else None)
                if p]
    if problems:
        raise UsageError("; ".join(problems))
    members: list[GroupMember] = []
    commands: dict[str, Any] = {}
    urls: dict[str, str] = {}
    storage = workdir / "kv-shared"
    for member in launch.members:
        member_port = free_port(host)
        extra: dict[str, Any] = {}
        member_environment = {**env, **member_env(member), **_gpu_env(member)}
        if launch.connector in SHARED_STORAGE_CONNECTORS:
            storage.mkdir(parents=True, exist_ok=True)
            extra["shared_storage_path"] = str(storage)
        if launch.connector.startswith("Nixl"):
            member_environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port(host))
            member_environment["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
        args = {**member.args, "kv-transfer-config": kv_transfer_config(launch, member, extra)}
        options = engine.serve_options(model, args, host=host, port=member_port, served_model_name=served_model_name)
        argv = engine.build_argv(command, options, api_key=None)
        spec = LaunchSpec(argv=argv, env=member_environment, host=host, port=member_port,
                          workdir=workdir / member.name, ready_timeout_s=ready_timeout_s,
                          startup_stall_s=startup_stall_s, engine=engine, cpus=cpus)
        members.append(GroupMember(name=member.name, role=member.role, process=ServerProcess(spec)))
        urls[member.name] = f"http://{host}:{member_port}"
        commands[member.name] = {"argv": engine.redact_argv(argv), "port": member_port, "role": member.role,
                                 "gpus": list(member.gpus)}
    router_port = port or free_port(host)
    # The router waits for its workers on its own clock from its own start, and gives up; the members are
    # waited for one after another, each with the full ready timeout: the router must outwait them all.
    argv = router_argv(launch.router, launch, urls, host=host, port=router_port, metrics_port=free_port(host),
                       startup_timeout_s=ready_timeout_s * (len(members) + 1))
    router_dir = workdir / "router"
    spec = LaunchSpec(argv=argv, env={}, host=host, port=router_port, workdir=router_dir,
                      ready_timeout_s=ready_timeout_s, startup_stall_s=None, engine=None)
    router = GroupMember(name="router", role="router", process=ServerProcess(spec, gpu_probe=None))
    commands["router"] = {"argv": argv, "port": router_port, "role": "router"}
    return ServerGroup(members, router, engine=engine, launch=launch, commands=commands)
