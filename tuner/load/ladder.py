"""Measure one launch: a concurrency ladder against a ready server, never relaunching it.

``measure`` is the seam the trial calls. Without a ladder (``objective.ladder`` absent or None) it
runs one step at the workload's concurrency, as before. With a :class:`LadderSpec` it sends the
warm-up once, then steps concurrency up (``start``, ``start * factor``, … up to ``max``, or an
explicit ``steps`` list), each step a fresh measured window of new prompts, and stops when:

- an SLO breaks (or more requests failed than the objective allows) at a step — e.g. once the
  KV cache is full and requests queue;
- throughput stops rising: ``patience`` steps in a row without a gain of ``min_gain`` over the best
  step so far;
- the client itself saturated (its numbers above that load would rank the client, not the server);
- the tuner is stopped (``should_stop``).

A step stops early once its SLO is *clearly* lost: for an SLO on ``p<P>`` (or ``median``) of TTFT,
TPOT or E2E latency, as soon as more requests broke the limit than a ``p<P>`` could hide even if
every remaining request were instant; for failures, as soon as more failed than the objective
allows of the planned step. The requests still in flight are recorded as failed ("stopped: …").

Prompts are never re-sent within one launch: ``first_job`` says where this measurement starts in
the workload's numbered prompts, and :attr:`Measurement.next_job` where the next one (a
confirmation's next repeat) must start. After each step the server's counters are checked against
the workload (:mod:`tuner.load.freshness`); a step they contradict (a random workload that hit the
prefix cache) is refused: it is infeasible, and the measurement lists why in ``refused``.

The measurement reports the best step that meets every SLO (by the objective's metric); when no
step does, the lowest step, so the trial records its violations. Each step keeps its own summary
(``vllm bench serve`` keys, plus server queue-time percentiles), ``/metrics`` counter deltas, the
gauges sampled during its window (KV usage, running, waiting; engines added up), and the
client's own load. What the server's ``/metrics`` names mean is the engine's
(:class:`~tuner.load.metrics.ServerMetrics`); the ladder only scrapes and hands the scrapes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.load import metrics
from tuner.load.freshness import WindowCheck, check_window
from tuner.load.generator import LoadResult, RequestRecord, WindowPlan, jobs_for, run_window
from tuner.load.knee import KneeEvidence, knee_evidence, saturation
from tuner.load.metrics import ServerMetrics
from tuner.load.poller import Poller
from tuner.load.pool import ClientPool, auto_processes
from tuner.load.power import PowerReader, PowerSampler, energy_figures
from tuner.load.units import IDENTITY, Units
from tuner.load.warmup import Warmup, run_warmup
from tuner.objective import LadderSpec, Objective, score

__all__ = ["LadderSpec", "Measurement", "SloWatch", "Step", "ladder_concurrencies", "measure"]

logger = logging.getLogger(__name__)

_RATE_METRICS = ("output_throughput", "total_token_throughput", "request_throughput")
_PER_REQUEST_SLO = re.compile(r"^(median|p(\d{1,2}(?:\.\d+)?))_(ttft|tpot|e2el)_ms$")

Scrape = Callable[[], Mapping[Any, float]]


@dataclass(frozen=True)
class Step:
    concurrency: int
    summary: Mapping[str, Any]
    server: Mapping[str, Any]
    result: LoadResult
    feasible: bool = True
    violations: tuple[str, ...] = ()
    early_stop_reason: str = ""
    client: Mapping[str, Any] = field(default_factory=dict)
    check: WindowCheck = field(default_factory=WindowCheck)
    """What the server's counters say about this window (refused, or flagged)."""
    first_job: int = 0
    """The window's first prompt number (its prompts are ``first_job`` onwards, never sent before)."""

    def to_json(self, *, with_requests: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {"concurrency": self.concurrency, "feasible": self.feasible,
                                "violations": list(self.violations), "early_stop_reason": self.early_stop_reason,
                                "first_job": self.first_job, "window_check": self.check.to_json(),
                                "summary": dict(self.summary), "server": dict(self.server),
                                "client": dict(self.client)}
        if with_requests:
            data["requests"] = [asdict(r) for r in self.result.records]
        return data


@dataclass(frozen=True)
class Measurement:
    summary: Mapping[str, Any]
    """The chosen step's summary (``vllm bench serve`` keys), scored by the objective."""
    server: Mapping[str, Any]
    """The chosen step's ``/metrics`` counter deltas, speculative-decoding figures, queue time, gauges."""
    steps: tuple[Step, ...]
    stopped: bool
    chosen: int | None = None
    """Index in ``steps`` of the step reported (None when no step ran)."""
    stop_reason: str = ""
    client_saturated: bool = False
    client_starved: bool = False
    next_job: int = 0
    """The first prompt number this measurement did not send: where the next one on this server starts."""
    knee: KneeEvidence | None = None
    """Whether the top step showed the knee the ladder was sized for (None: not a knee-sized ladder)."""
    units: Units = IDENTITY
    """How the steps' client records map to the node (the summaries are node figures already)."""
    warmup: Warmup | None = None
    """What ran before the first step, and whether the server was steady by then."""

    @property
    def refused(self) -> tuple[str, ...]:
        """Every step's contradictions between the server's counters and the workload."""
        return tuple(f"concurrency {s.concurrency}: {why}" for s in self.steps for why in s.check.refused)

    def to_json(self) -> dict[str, Any]:
        return {"summary": dict(self.summary), "server": dict(self.server), "chosen_step": self.chosen,
                "stop_reason": self.stop_reason, "client_saturated": self.client_saturated,
                "client_starved": self.client_starved, "next_job": self.next_job,
                "knee": self.knee.to_json() if self.knee is not None else None, "units": self.units.to_json(),
                "refused_windows": list(self.refused),
                "warmup": self.warmup.to_json() if self.warmup is not None else None,
                "steps": [s.to_json() for s in self.steps]}


class SloWatch:
    """Decides, record by record, whether a step's SLOs are already lost for certain."""

    def __init__(self, objective: Objective, planned_requests: int, units: Units = IDENTITY) -> None:
        self.planned = planned_requests
        self.time_scale = units.time_scale  # records are client seconds, limits node milliseconds
        self.max_failed = objective.max_failed_fraction * planned_requests
        self.rules: list[tuple[str, str, float, int]] = []  # key, metric, limit in ms, violations allowed
        for key, limit in objective.slos.items():
            m = _PER_REQUEST_SLO.match(key)
            if m is None:
                continue
            pct = 50.0 if m.group(1) == "median" else float(m.group(2))
            # numpy's linear percentile interpolates between sorted values at floor(h) and ceil(h),
            # h = P/100 * (n - 1). Once n - floor(h) values exceed the limit, the one at floor(h)
            # does too, whatever the rest are: the percentile is over the limit for certain.
            n = max(1, planned_requests)
            allowed = n - math.floor(pct / 100.0 * (n - 1)) - 1
            self.rules.append((key, m.group(3), limit, allowed))
        self.violations = [0] * len(self.rules)
        self.failed = 0
        self.reason = ""

    def add(self, record: RequestRecord) -> bool:
        """Count one record; True once the step is certainly lost (then :attr:`reason` says why)."""
        if self.reason:
            return True
        if not record.ok:
            if record.error.startswith("stopped"):
                return False
            self.failed += 1
            if self.failed > self.max_failed:
                self.reason = f"{self.failed} failed requests > {self.max_failed:g} allowed"
            return bool(self.reason)
        for i, (key, metric, limit_ms, allowed) in enumerate(self.rules):
            value = _request_value(record, metric)
            # In ms, as the summary and the SLO are: a limit turned into seconds can round below a
            # request exactly at it, and call a step lost that meets its SLO. Node ms, as the summary's.
            if value is not None and value * 1000.0 * self.time_scale > limit_ms:
                self.violations[i] += 1
                if self.violations[i] > allowed:
                    self.reason = (f"{key}: {self.violations[i]} of {self.planned} requests over "
                                   f"{limit_ms:g} ms, more than the {allowed} it allows")
                    return True
        return False


def _request_value(record: RequestRecord, metric: str) -> float | None:
    if record.ttft_s is None:
        return None
    if metric == "ttft":
        return record.ttft_s
    if metric == "e2el":
        return record.e2e_s
    if record.output_tokens > 1:
        return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)
    return None


def ladder_concurrencies(spec: LadderSpec) -> list[int]:
    """The concurrencies a ladder tries, in order: ``start · factor^k`` (rounded up) to ``max``."""
    if spec.steps is not None:
        return sorted(set(spec.steps))
    out: list[int] = []
    value = float(spec.start)
    while True:
        c = min(spec.max, math.ceil(value - 1e-9))
        if not out or c > out[-1]:
            out.append(c)
        if c >= spec.max:
            return out
        value *= spec.factor


class _GaugeSampler(Poller):
    """Scrapes /metrics every ``interval_s`` in a thread while a window runs."""

    def __init__(self, scrape: Scrape, interval_s: float) -> None:
        super().__init__("gauge-sampler", interval_s, join_timeout_s=30)
        self.scrape = scrape
        self.samples: list[Mapping[Any, float]] = []

    def poll(self) -> bool:
        try:
            sample = self.scrape()
        except Exception:  # a failed scrape is a missing sample, not a failed step
            logger.debug("gauge scrape failed", exc_info=True)
            return True
        if sample:
            self.samples.append(sample)
        return True


def _percentiles(objective: Objective) -> tuple[float, ...]:
    """50, 95, 99 and every percentile an SLO or the metric names (``p90_ttft_ms`` needs 90)."""
    wanted = {50.0, 95.0, 99.0}
    for key in (*objective.slos, objective.metric):
        m = re.match(r"^p(\d{1,2}(?:\.\d+)?)_", key)
        if m:
            wanted.add(float(m.group(1)))
    return tuple(sorted(wanted))


def _rate_metric(objective: Objective) -> str:
    return objective.metric if objective.metric in _RATE_METRICS else "output_throughput"


def _value(summary: Mapping[str, Any], key: str) -> float:
    value = float(summary.get(key, math.nan))
    return value if math.isfinite(value) else math.nan


@dataclass
class _Runner:
    """Runs windows in this process or in a :class:`ClientPool`."""

    base_url: str
    model: str
    objective: Objective
    vocab_size: int
    api_key: str | None
    request_timeout_s: float
    pool: ClientPool | None = None
    power: PowerReader | None = None
    units: Units = IDENTITY
    """Client → node (tuner.load.units): steps and request counts are node figures, windows client ones."""

    def window(self, plan: WindowPlan, should_stop: Callable[[], bool],
               on_record: Callable[[RequestRecord], None] | None) -> LoadResult:
        workload = self.objective.workload
        if self.pool is not None:
            return self.pool.run_window(plan, should_stop=should_stop, on_record=on_record)
        return asyncio.run(run_window(self.base_url, self.model, workload, plan, vocab_size=self.vocab_size,
                                      api_key=self.api_key, request_timeout_s=self.request_timeout_s,
                                      should_stop=should_stop, on_record=on_record))


def _run_step(runner: _Runner, spec: LadderSpec | None, concurrency: int, first_job: int, requests: int,
              should_stop: Callable[[], bool], scrape: Scrape, server_metrics: ServerMetrics) -> Step:
    objective = runner.objective
    workload = objective.workload
    # ``concurrency`` is the node's; the client opens the streams that stand for it (tuner.load.units).
    units = runner.units
    streams = units.client_streams(concurrency)
    rate = None if workload.request_rate is None else units.client_rate(workload.request_rate)
    plan = WindowPlan(first_job=first_job, jobs=jobs_for(workload, requests), concurrency=streams,
                      request_rate=rate)
    concurrency = units.node_requests(streams)  # what the node ran: whole streams of ``multiplicity``
    planned = plan.jobs * (workload.agent_spec.turns if workload.kind == "agent" else 1)
    watch = SloWatch(objective, planned, units)
    lost = threading.Event()

    def on_record(record: RequestRecord) -> None:
        if watch.add(record) and not lost.is_set():
            logger.info("ladder: concurrency %d: SLO clearly lost (%s); ending the step", concurrency, watch.reason)
            lost.set()

    early = spec.early_stop if spec is not None else False

    def stop_window() -> bool:
        return should_stop() or lost.is_set()

    before = scrape()
    power = PowerSampler(runner.power) if runner.power is not None else None
    with contextlib.ExitStack() as stack:
        if power is not None:
            stack.enter_context(power)
        sampler = stack.enter_context(_GaugeSampler(scrape, spec.gauge_interval_s if spec else 0.5))
        result = runner.window(plan, stop_window if early else should_stop, on_record if early else None)
    outer_stopped = result.stopped and should_stop()
    after = scrape() if not outer_stopped else {}
    server = server_metrics.window(before, after, sampler.samples)
    # Client measurements become node figures here, once (tuner.load.units); the server's are node already.
    summary: dict[str, Any] = units.node_summary(metrics.summarize(result, _percentiles(objective)))
    summary["max_concurrency"] = concurrency
    if not units.identity:
        summary["client_streams"] = streams
    if power is not None:  # GPU energy of the window: tokens per joule, and $ per Mtok at the user's price
        energy = power.result()
        server = {**server, "power": energy.to_json() if energy is not None else None}
        summary.update(energy_figures(energy, summary, objective.gpu_hour_usd))
    if server["queue"]:
        summary.update({k: v for k, v in server["queue"].items() if k.endswith("_queue_ms")})
    client = result.client.to_json() if result.client is not None else {}
    verdict = score(objective, summary)
    violations = verdict.violations
    early_reason = watch.reason if lost.is_set() else ""
    if early_reason:
        violations = (*violations, f"step cut early: {early_reason}")
    check = check_window(workload, server, stopped=outer_stopped)
    for why in check.refused:
        logger.warning("ladder: concurrency %d: window refused: %s", concurrency, why)
        violations = (*violations, f"window refused: {why}")
    feasible = verdict.feasible and not early_reason and check.ok
    return Step(concurrency=concurrency, summary=summary, server=server,
                result=LoadResult(records=result.records, duration_s=result.duration_s, concurrency=streams,
                                  request_rate=result.request_rate, stopped=outer_stopped, client=result.client),
                feasible=feasible, violations=tuple(violations), early_stop_reason=early_reason, client=client,
                check=check, first_job=first_job)


def _warmup(runner: _Runner, concurrency: int, should_stop: Callable[[], bool], scrape: Scrape,
            server_metrics: ServerMetrics) -> Warmup:
    """Send the warm-up (:mod:`tuner.load.warmup`: one batch, or waves until the server's rate is steady)."""

    def server_rate(before: Mapping[Any, float], after: Mapping[Any, float]) -> float | None:
        tokens = server_metrics.window(before, after, ()).get("facts", {}).get("generation_tokens")
        return None if tokens is None else float(tokens)

    warm = run_warmup(lambda plan, stop: runner.window(plan, stop, None), runner.objective.workload, runner.units,
                      concurrency, should_stop, scrape, server_rate)
    logger.info("ladder: warm-up of %d wave(s), %d requests, %s", len(warm.waves),
                sum(w.requests for w in warm.waves), "steady" if warm.steady else "not steady")
    return warm


def window_long_enough(spec: LadderSpec | None, summary: Mapping[str, Any]) -> bool:
    """The step's window lasted ``min_window_s`` (a window too short to rank on measures its edges)."""
    if spec is None or spec.min_window_s <= 0:
        return True
    duration = summary.get("duration")
    return isinstance(duration, (int, float)) and duration >= spec.min_window_s


def _choose(objective: Objective, steps: list[Step]) -> int | None:
    if not steps:
        return None
    feasible = [i for i, s in enumerate(steps) if s.feasible and not s.result.stopped]
    if not feasible:
        return 0
    long_enough = [i for i in feasible if window_long_enough(objective.ladder, steps[i].summary)]
    if long_enough:
        feasible = long_enough
    else:
        logger.warning("ladder: no feasible step's window lasted %.0f s; ranking on the short ones",
                       objective.ladder.min_window_s if objective.ladder else 0.0)
    sign = 1.0 if objective.direction == "maximize" else -1.0

    def key(i: int) -> float:
        value = _value(steps[i].summary, objective.metric)
        return sign * value if not math.isnan(value) else -math.inf

    return max(feasible, key=key)


def measure(base_url: str, model: str, objective: Objective, *, vocab_size: int, api_key: str | None,
            should_stop: Callable[[], bool], scrape: Scrape, server_metrics: ServerMetrics,
            power: PowerReader | None = None,
            request_timeout_s: float = 600.0, first_job: int = 0, units: Units = IDENTITY,
            knee: int | None = None) -> Measurement:
    """Run the objective's load (one step, or its ladder) and pick the step the trial is scored by.

    ``power`` (when the host has GPUs to read) is sampled during every window: the window's summary
    then has ``gpu_energy_j``, ``tokens_per_joule`` and, at the objective's GPU-hour price,
    ``usd_per_mtok`` (:mod:`tuner.load.power`).
    ``scrape`` reads the server's ``/metrics`` page; ``server_metrics`` (the engine's) says what the
    scrapes mean for each window. ``first_job``: the first prompt number to send; a later
    measurement on the same server passes the earlier one's ``next_job``, so no prompt is re-sent.
    ``units`` (the engine's): steps, prompt counts and rates are node figures, and each window's
    summary is converted to node units. ``knee``: the launch's predicted KV knee the ladder was sized
    from; the top step must then show saturation (:mod:`tuner.load.knee`), and a step without gain ends
    the ladder only once one did.
    """
    spec: LadderSpec | None = getattr(objective, "ladder", None)
    if spec is not None and not isinstance(spec, LadderSpec):
        spec = LadderSpec.model_validate(spec)
    workload = objective.workload
    concurrencies = ladder_concurrencies(spec) if spec is not None else [workload.concurrency]
    processes = 1
    if spec is not None:
        processes = (auto_processes(units.client_streams(max(concurrencies)), spec.streams_per_process)
                     if spec.client_processes == "auto" else spec.client_processes)
    runner = _Runner(base_url=base_url, model=model, objective=objective, vocab_size=vocab_size,
                     api_key=api_key, request_timeout_s=request_timeout_s, power=power, units=units)
    pool = (ClientPool(processes, base_url=base_url, model=model, workload=workload, vocab_size=vocab_size,
                       api_key=api_key, request_timeout_s=request_timeout_s) if processes > 1 else None)
    steps: list[Step] = []
    stop_reason = ""
    try:
        if pool is not None:
            pool.start()
            runner.pool = pool
        warm = _warmup(runner, concurrencies[0], should_stop, scrape, server_metrics)
        if warm.stopped:
            return Measurement(summary=metrics.summarize(LoadResult((), 0.0, concurrencies[0], None, True)),
                               server={}, steps=(), stopped=True, stop_reason="stopped during warm-up",
                               next_job=first_job, warmup=warm)
        rate_key = _rate_metric(objective)
        best_rate = -math.inf
        stale = 0
        for planned in concurrencies:
            requests = units.client_requests(workload.num_prompts if spec is None else max(
                workload.num_prompts, math.ceil(planned * spec.prompts_per_concurrency), spec.min_requests))
            step = _run_step(runner, spec, planned, first_job, requests, should_stop, scrape, server_metrics)
            first_job += jobs_for(workload, requests)
            steps.append(step)
            rate = _value(step.summary, rate_key)
            concurrency = step.concurrency  # in whole client streams: what the node ran
            logger.info("ladder: concurrency %d%s: %s %.1f, %s%s", concurrency,
                        f" (step {planned} in whole streams)" if planned != concurrency else "", rate_key, rate,
                        "meets the SLOs" if step.feasible else "; ".join(step.violations),
                        " (client saturated)" if step.client.get("client_saturated") else "")
            if step.client.get("client_starved"):
                logger.warning("ladder: at concurrency %d the load generator was kept off the CPU (loop lag "
                               "p99 %.0f ms at %.0f%% CPU); its figures include that wait. Give it its own "
                               "cores: server.client_cpus in the hardware profile", concurrency,
                               step.client.get("client_loop_lag_p99_ms", 0.0),
                               100 * step.client.get("client_cpu_share", 0.0))
            if step.result.stopped:
                stop_reason = "the tuner was stopped"
                break
            if not step.feasible:
                stop_reason = f"SLO broken at concurrency {concurrency}"
                # A knee-sized ladder still goes through its knee: the steps above are measured (and
                # infeasible), so the record shows the saturation the ladder was sized for.
                if knee is None or saturation(step.server, step.concurrency, knee, step.summary):
                    break
            if spec is not None and step.client.get("client_saturated") and spec.stop_on_client_saturation:
                stop_reason = f"load generator saturated at concurrency {concurrency}"
                logger.warning("ladder: %s (cpu %.0f%%, loop lag p99 %.0f ms); higher steps would measure "
                               "the client", stop_reason, 100 * step.client.get("client_cpu_share", 0.0),
                               step.client.get("client_loop_lag_p99_ms", 0.0))
                break
            if spec is not None:
                if rate > best_rate * (1.0 + spec.min_gain) or best_rate == -math.inf:
                    stale = 0
                else:
                    stale += 1
                    # A knee-sized ladder goes on until a step shows saturation (tuner.load.knee).
                    shown = knee is None or bool(saturation(step.server, step.concurrency, knee, step.summary))
                    if stale >= spec.patience and shown:
                        stop_reason = f"throughput stopped rising at concurrency {concurrency}"
                        best_rate = max(best_rate, rate)
                        break
                best_rate = max(best_rate, rate) if not math.isnan(rate) else best_rate
        else:
            stop_reason = "ran every step" if spec is not None else "single step"
    finally:
        if pool is not None:
            pool.close()
    chosen = _choose(objective, steps)
    stopped = any(s.result.stopped for s in steps)
    if chosen is None:
        return Measurement(summary={}, server={}, steps=(), stopped=stopped, stop_reason=stop_reason,
                           next_job=first_job, warmup=warm)
    best = steps[chosen]
    evidence = (knee_evidence([(s.concurrency, s.server, s.summary) for s in steps], knee)
                if knee is not None else None)
    if evidence is not None and not evidence.shown:
        logger.warning("ladder: the knee is %s", evidence.evidence)
    saturated = any(bool(s.client.get("client_saturated")) for s in steps)
    starved = any(bool(s.client.get("client_starved")) for s in steps)
    logger.info("ladder: reporting concurrency %d (%s)", best.concurrency, stop_reason)
    return Measurement(summary=best.summary, server={**best.server, "client": dict(best.client)},
                       steps=tuple(steps), stopped=stopped, chosen=chosen, stop_reason=stop_reason,
                       client_saturated=saturated, client_starved=starved, next_job=first_job, knee=evidence,
                       units=units, warmup=warm)
