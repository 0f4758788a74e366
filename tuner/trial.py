"""One trial: launch → readiness → (guards) → load → score → stop.

``run_trial`` is the plain function the study's trial step (:mod:`tuner.study.step`) wraps in
Optuna's ask/tell; it never imports Optuna. It never raises for a failure of the server: every
outcome, good or bad, comes back as a :class:`TrialOutcome` and is written to the trial's folder.
Only an interrupt of the tuner itself propagates (after the server has been stopped).

The server is whatever engine the context names (:class:`~tuner.engines.Engine`, vLLM by default):
the trial asks it for the argv, the readiness and metrics paths, what its log says, and what its
``/metrics`` page means; it starts the server only through the process helper.

A server that was ready and then exits or stops answering (during the gates or the load) is a crash
whatever the SLOs or the gates say: its class comes from the engine's reading of what it logged after
it became ready (``Engine.diagnose_crash``: ``oom``, ``nccl``, ``assertion``, ...), else
``died_during_load`` / ``unhealthy``. ``ready_s`` tells the two apart in the record: None for a start
that never became ready, a number for a server that died serving.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuner import store
from tuner.engines import Engine, LaunchSpec, ServerProcess, choose_port, default_engine, tail
from tuner.engines.group import ServerGroup, build_group
from tuner.errors import LaunchError, PortInUseError, UsageError
from tuner.failures import Diagnosis, FailureClass, describe_returncode
from tuner.guards.api import GuardSuite, GuardTarget, NoGuards
from tuner.load.affinity import CpuSplit, pinned
from tuner.load.buckets import context_edges, ttft_by_context
from tuner.load.goodput import request_goodput
from tuner.load.ladder import Measurement, measure
from tuner.load.metrics import ServerMetrics, parse_prometheus
from tuner.load.poller import Poller
from tuner.load.pools import PoolMetrics
from tuner.load.power import PowerReader
from tuner.load.units import Units
from tuner.objective import Objective, Score, failed_score, score
from tuner.search.space import ServeConfig

log = logging.getLogger(__name__)


LOG_TAIL_CHARS = 4000
"""How much of server.log a failed trial keeps in outcome.json."""
Served = ServerProcess | ServerGroup
"""One server, or a prefill/decode layout's group (its router answers; :mod:`tuner.engines.group`)."""

@dataclass(frozen=True)
class TrialContext:
    """What every trial of a study shares."""

    server_cmd: list[str]
    model: str
    objective: Objective
    host: str = "127.0.0.1"
    port: int | None = None
    ready_timeout_s: float = 600.0
    startup_stall_s: float | None = None
    """The start-up watchdog (real seconds): no progress in the server's log for this long ends the launch
    as ``hang``. None: off (the ready timeout alone)."""
    vocab_size: int = 32000
    served_model_name: str = "model"
    engine: Engine = field(default_factory=default_engine)
    guards: GuardSuite = field(default_factory=NoGuards)
    health_poll_s: float = 2.0
    cpu_split: CpuSplit | None = None
    """Server cores and client cores, kept apart (``None``: both use the whole host)."""
    power: PowerReader | None = None
    """Reads the node's GPU power during each window (``None``: no GPU here; no energy figures)."""
    knee: Callable[[ServeConfig], int] | None = None
    """A configuration's predicted KV knee (node concurrency), for an objective whose ladder is stepped
    relative to it (``knee_fractions``); the study sets it from the feasibility model."""
    api_key: str | None = None
    """The key every launch of the study is served with (:func:`tuner.store.study_api_key`); ``None``: a
    fresh one per launch."""


@dataclass(frozen=True)
class TrialOutcome:
    ok: bool
    value: float
    constraints: tuple[float, ...]
    failure_class: str | None
    reason: str
    summary: Mapping[str, Any]
    server_metrics: Mapping[str, Any]
    ready_s: float | None
    duration_s: float
    trial_dir: str
    config_key: str
    repeat_values: tuple[float, ...] = ()
    log_tail: str = ""
    """The end of server.log when the server failed to start or died (the evidence beside the reason)."""
    kv_cache_tokens: int | None = None
    """KV capacity per rank that vLLM logged at start-up (``GPU KV cache size: N tokens``)."""

    @property
    def feasible(self) -> bool:
        return self.ok and all(c <= 0 for c in self.constraints)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["feasible"] = self.feasible
        return data


class _HealthWatch(Poller):
    """Polls the engine's health path during the load; trips after 3 misses in a row, or when the process exits."""

    def __init__(self, server: Served, poll_s: float) -> None:
        super().__init__("health-watch", poll_s, join_timeout_s=10)
        self.server = server
        self.poll_s = poll_s
        self.tripped: FailureClass | None = None
        self._misses = 0

    def poll(self) -> bool:
        if self.server.exited() is not None:
            self.tripped = FailureClass.DIED_DURING_LOAD
            return False
        self._misses = 0 if self.server.healthy(timeout_s=max(1.0, self.poll_s)) else self._misses + 1
        if self._misses >= 3:
            self.tripped = FailureClass.UNHEALTHY
            return False
        return True

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        # A server that died makes every request fail fast, so the load can end between two polls.
        if self.tripped is None and self.server.exited() is not None:
            self.tripped = FailureClass.DIED_DURING_LOAD

    def settle(self) -> FailureClass | None:
        """After the load (or the gates): is the server still serving? The verdict, as the poll would give it.

        A dying server fails every request at once, so the load can end before the poll saw 3 misses: a
        miss here is polled again, up to 3 in a row, before it counts.
        """
        misses = 0
        while self.tripped is None:
            if self.server.exited() is not None:
                self.tripped = FailureClass.DIED_DURING_LOAD
            elif self.server.healthy(timeout_s=max(1.0, self.poll_s)):
                break
            else:
                misses += 1
                if misses >= 3:
                    self.tripped = FailureClass.UNHEALTHY
                else:
                    time.sleep(self.poll_s)
        return self.tripped


def _log_since(path: Path, offset: int, max_bytes: int) -> str:
    """What the server logged from byte ``offset`` on (its last ``max_bytes``): the log of a serving server."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(offset, size - max_bytes))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _crash(ctx: TrialContext, server: Served, ready_offset: int, seen: FailureClass) -> Diagnosis:
    """Why a server that was ready died (``seen``: what the health watch saw): the engine's reading of its log."""
    if isinstance(server, ServerGroup):  # the member that died, its pool and its log's last line
        return server.diagnose_crash(seen, ctx.engine.startup_log_bytes)
    code = server.exited()
    diag = ctx.engine.diagnose_crash(_log_since(server.log_path, ready_offset, ctx.engine.startup_log_bytes), code)
    if diag is not None:
        return diag
    what = f"it exited ({describe_returncode(code)})" if code is not None else "it stopped answering its health check"
    return Diagnosis(seen, f"server {seen.value.replace('_', ' ')}: {what} while serving; its log since it became "
                           "ready names no cause")


def scrape_metrics(server: Served, path: str) -> dict[Any, float]:
    """The server's Prometheus page as {(name, labels): value}; empty (and a warning) when it cannot be read.

    A prefill/decode group's is every member's page, each sample labelled with its pool."""
    if isinstance(server, ServerGroup):
        return server.scrape(path)
    try:
        resp = httpx.get(server.base_url + path, timeout=10.0, headers=server.headers)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("could not read %s: %s", path, exc)
        return {}
    return dict(parse_prometheus(resp.text))


def _server_version(server: Served, path: str) -> str | None:
    """``version`` of the engine's version page (vLLM's ``/version``), or ``build_info`` (llama-server's ``/props``)."""
    if isinstance(server, ServerGroup):  # the router answers no /version: ask a member
        server = server.members[0].process
    try:
        resp = httpx.get(server.base_url + path, timeout=5.0, headers=server.headers)
        body = resp.json() if resp.status_code == 200 else {}
        found = body.get("version") or body.get("build_info")
        return str(found) if found else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _outcome(ctx: TrialContext, config: ServeConfig, tdir: Path, started: float, *, score_: Score,
             ok: bool, failure_class: str | None, reason: str, summary: Mapping[str, Any] | None = None,
             server_metrics: Mapping[str, Any] | None = None, ready_s: float | None = None,
             repeat_values: tuple[float, ...] = (), log_tail: str = "",
             kv_cache_tokens: int | None = None) -> TrialOutcome:
    outcome = TrialOutcome(
        ok=ok, value=score_.value, constraints=score_.constraints, failure_class=failure_class,
        reason=reason, summary=dict(summary or {}), server_metrics=dict(server_metrics or {}),
        # Node seconds, as the study clock counts (the engine's time scale; one to one on a real node).
        ready_s=None if ready_s is None else ctx.engine.units.node_seconds(ready_s),
        duration_s=ctx.engine.units.node_seconds(time.monotonic() - started), trial_dir=str(tdir),
        config_key=config.key(),
        repeat_values=repeat_values, log_tail=log_tail[-LOG_TAIL_CHARS:], kv_cache_tokens=kv_cache_tokens)
    store.write_json(tdir / "outcome.json", outcome.to_json())
    return outcome


def _with_goodput(objective: Objective, run: Measurement, units: Units) -> dict[str, Any]:
    """The chosen step's summary, with its goodput (node units), its TTFT per context bucket (prompts of a range
    of lengths) and, for a knee-sized ladder, the knee's verdict."""
    summary = dict(run.summary)
    if objective.goodput_slos and run.steps:
        chosen = run.steps[run.chosen if run.chosen is not None else -1]
        summary["request_goodput"] = request_goodput(chosen.result, objective.goodput_slos, units)
    edges = context_edges(objective.workload)
    if edges and run.steps:
        chosen = run.steps[run.chosen if run.chosen is not None else -1]
        summary["ttft_by_context"] = ttft_by_context(chosen.result.records, edges, units)
    if run.steps:  # where confirmation steps down to when a repeat misses an SLO at the chosen step
        summary["feasible_concurrencies"] = sorted(s.concurrency for s in run.steps if s.feasible)
    if run.knee is not None:
        summary["knee_predicted"] = run.knee.predicted
        summary["knee_top_concurrency"] = run.knee.top_concurrency
        summary["knee_shown"] = run.knee.shown
    return summary


def _median_index(values: list[float]) -> int:
    """Index of the (lower) median value: the repeat whose summary stands for the trial."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def launch_group(ctx: TrialContext, config: ServeConfig, tdir: Path, *, port: int) -> ServerGroup:
    """The servers of a prefill/decode layout and its router (:mod:`tuner.engines.group`), not started.

    Each member gets the configuration's environment and its own CPU binding; no API key (the router cannot
    pass one: :mod:`tuner.engines.group`). A missing router or connector is a :class:`UsageError` naming the fix.
    """
    assert config.disaggregation is not None
    split = ctx.cpu_split
    return build_group(ctx.engine, ctx.server_cmd, ctx.model, config.disaggregation, tdir, host=ctx.host,
                       served_model_name=ctx.served_model_name, env=dict(config.env),
                       member_env=lambda m: {**ctx.engine.server_env(split, m.args), **config.env},
                       ready_timeout_s=ctx.ready_timeout_s, startup_stall_s=ctx.startup_stall_s,
                       cpus=split.server if split else None, port=port,
                       check_installed=ctx.engine.name != "emulated")


def launch_argv(ctx: TrialContext, config: ServeConfig, *, port: int) -> list[str]:
    """The argv one launch of ``config`` runs, as the context's engine spells it (the API key is not in it)."""
    options = ctx.engine.serve_options(ctx.model, config.args, host=ctx.host, port=port,
                                       served_model_name=ctx.served_model_name)
    return ctx.engine.build_argv(ctx.server_cmd, options, api_key=None)


def run_trial(ctx: TrialContext, config: ServeConfig, tdir: Path, *,
              should_stop: Callable[[], bool] | None = None,
              on_phase: Callable[[str], None] | None = None, repeats: int = 1) -> TrialOutcome:
    """Run one trial end to end and record it under ``tdir``.

    ``repeats`` > 1 measures the workload that many times within the one launch (confirmation
    runs); the trial's value is then the median repeat, and every repeat must meet the SLOs.
    """
    started = time.monotonic()
    phase = on_phase or (lambda _p: None)
    tdir.mkdir(parents=True, exist_ok=True)
    knee: int | None = None
    if ctx.objective.knee_relative:  # this launch's own ladder, through its own predicted knee
        if ctx.knee is None:
            raise UsageError(f"objective {ctx.objective.name!r} steps its ladder by the KV knee, and this study "
                             "cannot predict one. Fix: give the study a catalogued --checkpoint, or an objective "
                             "file whose ladder gives explicit steps")
        knee = ctx.knee(config)
        ctx = dataclasses.replace(ctx, objective=ctx.objective.for_knee(knee))
    api_key = ctx.api_key or secrets.token_urlsafe(24)
    port = choose_port(ctx.host, ctx.port)
    split = ctx.cpu_split
    store.write_json(tdir / "config.json", config.to_json())
    server: Served
    server_metrics_map: ServerMetrics = ctx.engine.metrics
    if config.disaggregation is not None:
        server = launch_group(ctx, config, tdir, port=port)
        server_metrics_map = PoolMetrics(ctx.engine.metrics)
        store.write_json(tdir / "command.json", {"group": server.commands, "env": store.safe_env(dict(config.env)),
                                                 "port": port, "host": ctx.host, "layout": config.disaggregation.layout,
                                                 "cpus": split.to_json() if split else None})
    else:
        argv = launch_argv(ctx, config, port=port)
        # The profile's own environment wins over the computed binding (a hand-written TP/DP layout).
        env = {**ctx.engine.server_env(split, config.args), **config.env, ctx.engine.api_key_env: api_key}
        store.write_json(tdir / "command.json", {"argv": ctx.engine.redact_argv(argv), "env": store.safe_env(env),
                                                 "port": port, "host": ctx.host,
                                                 "cpus": split.to_json() if split else None})
        spec = LaunchSpec(argv=argv, env=env, host=ctx.host, port=port, workdir=tdir,
                          ready_timeout_s=ctx.ready_timeout_s, startup_stall_s=ctx.startup_stall_s, api_key=api_key,
                          model_name=ctx.served_model_name, cpus=split.server if split else None, engine=ctx.engine)
        server = ServerProcess(spec)
    try:
        phase("launch")
        # The tuner's side (readiness polls, guards, load) runs on the client cores from here on.
        with pinned(split.client if split else None), server:
            try:
                ready_s = server.wait_ready(should_stop=should_stop)
            except LaunchError as exc:
                return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                                failure_class=exc.failure_class, reason=str(exc),
                                log_tail=exc.log_tail or tail(server.log_path))
            startup_log = server.log_path.read_bytes()
            ready_offset = len(startup_log)  # what the server logs from here on is its serving log
            kv_tokens = ctx.engine.kv_tokens_from_log(startup_log.decode(errors="replace"))
            log.info("server ready in %.1f s (KV cache: %s tokens per rank)", ready_s, kv_tokens)
            phase("guards")
            guard_report = ctx.guards.run(GuardTarget(
                base_url=server.base_url, headers={**server.headers, **ctx.engine.probe_headers},
                model=ctx.served_model_name, trial_dir=tdir,
                study_dir=tdir.parent.parent, params=config.params, args=config.args,
                is_speculative=config.is_speculative,
                control_key=config.control().key() if config.is_speculative else None, kv_cache_tokens=kv_tokens,
                dialect=ctx.engine.api_dialect))
            store.write_json(tdir / "guards.json", guard_report.to_json())
            if not guard_report.passed:
                died = _HealthWatch(server, ctx.health_poll_s).settle()  # a gate that failed on a dead server
                if died is not None:
                    diag = _crash(ctx, server, ready_offset, died)
                    return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                                    failure_class=diag.failure_class.value,
                                    reason=f"server died during the gates: {diag.reason}", ready_s=ready_s,
                                    kv_cache_tokens=kv_tokens, log_tail=tail(server.log_path))
                return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                                failure_class=FailureClass.GUARD_FAILED.value, reason=guard_report.reason,
                                ready_s=ready_s, kv_cache_tokens=kv_tokens)
            phase("load")
            with _HealthWatch(server, ctx.health_poll_s) as watch:
                def stop_load() -> bool:
                    return watch.tripped is not None or bool(should_stop and should_stop())

                runs = []
                next_job = 0  # each repeat sends prompts this server has not seen (tuner.load.freshness)
                for index in range(repeats):
                    if repeats > 1:
                        phase(f"load {index + 1}/{repeats}")
                    run = measure(server.base_url, ctx.served_model_name, ctx.objective,
                                  vocab_size=ctx.vocab_size, api_key=api_key, should_stop=stop_load,
                                  scrape=lambda: scrape_metrics(server, ctx.engine.metrics_path), power=ctx.power,
                                  server_metrics=server_metrics_map, first_job=next_job,
                                  units=ctx.engine.units, knee=knee)
                    next_job = run.next_job
                    runs.append(run)
                    if run.stopped:
                        break
            if not (should_stop and should_stop()):
                watch.settle()  # the load can end before the poll sees a server that died under it
            summaries = [_with_goodput(ctx.objective, run, ctx.engine.units) for run in runs]
            scores = [score(ctx.objective, s) for s in summaries]
            middle = _median_index([sc.value for sc in scores])
            measurement, summary = runs[middle], summaries[middle]
            server_metrics = {**measurement.server, "server_version": _server_version(server, ctx.engine.version_path),
                              "kv_cache_tokens_per_rank": kv_tokens}
            load_record = {"summary": summary, "repeat_values": [sc.value for sc in scores],
                           "repeats": [{**run.to_json(), "summary": s} for run, s in zip(runs, summaries,
                                                                                        strict=True)]}
            store.write_json(tdir / "load.json", load_record)
            store.write_json(tdir / "server_metrics.json", server_metrics)
            if watch.tripped is not None:
                crash = _crash(ctx, server, ready_offset, watch.tripped)
                crash_tail = tail(server.log_path)
    except PortInUseError as exc:
        return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                        failure_class=FailureClass.PORT_IN_USE.value, reason=str(exc))
    except OSError as exc:
        return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                        failure_class=FailureClass.CRASH.value, reason=f"could not start the server: {exc}")
    if watch.tripped is not None:
        # A crash, whatever the SLOs say of the requests it failed: classified from the serving log.
        reason = (f"server crashed under load ({crash.failure_class.value}): {crash.reason}; "
                  f"{summary.get('completed', 0)} requests completed, {summary.get('failed', 0)} failed")
        return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                        failure_class=crash.failure_class.value, reason=reason, summary=summary,
                        server_metrics=server_metrics, ready_s=ready_s, kv_cache_tokens=kv_tokens,
                        log_tail=crash_tail)
    if any(run.stopped for run in runs):
        return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                        failure_class=FailureClass.INTERRUPTED.value, reason="tuner stopped during the load",
                        summary=summary, ready_s=ready_s, kv_cache_tokens=kv_tokens)
    refused = [why for run in runs for why in run.refused]
    if refused:
        more = f" (and {len(refused) - 1} more window(s); see load.json)" if len(refused) > 1 else ""
        return _outcome(ctx, config, tdir, started, score_=failed_score(ctx.objective), ok=False,
                        failure_class=FailureClass.INVALID_WINDOW.value,
                        reason=f"measurement refused, the server's counters contradict the workload: "
                               f"{refused[0]}{more}",
                        summary=summary, server_metrics=server_metrics, ready_s=ready_s, kv_cache_tokens=kv_tokens)
    result_score = scores[middle]
    if repeats > 1 and not all(sc.feasible for sc in scores):
        # A candidate is confirmed only if every repeat met the SLOs.
        worst = max(scores, key=lambda sc: max(sc.constraints))
        result_score = Score(value=result_score.value, constraints=worst.constraints,
                             violations=worst.violations)
    reason = "; ".join(result_score.violations) or "met every SLO"
    return _outcome(ctx, config, tdir, started, score_=result_score, ok=True,
                    failure_class=None if result_score.feasible else FailureClass.SLO_VIOLATED.value,
                    reason=reason, summary=summary, server_metrics=server_metrics, ready_s=ready_s,
                    kv_cache_tokens=kv_tokens, repeat_values=tuple(sc.value for sc in scores))
