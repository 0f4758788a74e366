"""Drive a server with a :class:`~tuner.objective.Workload` and time every request.

Requests are streamed ``POST {base_url}/v1/completions`` calls with token-id prompts (kinds
``random`` and ``shared_prefix``) or ``/v1/chat/completions`` calls of agent sessions (kind
``agent``), timed the way ``vllm bench serve`` (``async_request_openai_completions`` /
``..._chat_completions``) times them:

- ``start_s``: when the request was sent, after waiting for a concurrency slot; seconds since the
  measured window began.
- ``ttft_s``: from send to the first streamed chunk that carries non-empty text (chat: content,
  reasoning or a tool call; when no chunk carries any, the first chunk that carries a choice).
- ``itl_s``: every gap between consecutive choice chunks from that first one on.
- ``e2e_s``: from send to the last choice chunk.
- ``output_tokens`` and ``prompt_tokens``: from the final ``usage`` chunk
  (``stream_options.include_usage``); when the server sends none, the number of choice chunks and
  the prompt's length.

A request that fails (HTTP error, timeout, dropped connection, a stream that ends before
``data: [DONE]``, an error object inside the stream, no token at all) becomes a record with
``ok=False`` and its reason; it is never dropped and never raises out of :func:`run_load`.

Reading the stream and the transports (aiohttp when installed, httpx otherwise) live in
:mod:`tuner.load.stream`. The client watches itself: event-loop lag and the
process's CPU share during the window go into :class:`ClientStats`, and ``saturated`` says when the
client, not the server, may have been the limit. :mod:`tuner.load.pool` spreads one window over
several processes when one is not enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuner.errors import LoadError
from tuner.load.agent import AgentSession, AgentTurnReply, session_count
from tuner.load.stream import (
    Backend,
    RequestFailed,
    Stream,
    Transport,
    available_backend,
    failure_text,
    make_transport,
)
from tuner.load.workload import PromptSpec, arrival_gaps_s, make_warmup_prompts, prompt_at
from tuner.objective import Workload

__all__ = ["Backend", "ClientStats", "LoadResult", "RequestRecord", "WindowPlan", "available_backend",
           "run_load", "run_load_sync", "run_window"]

logger = logging.getLogger(__name__)

# How often a waiting run looks at ``should_stop``.
_POLL_S = 0.1
# Arrival times come from their own stream, so pacing does not change the prompts.
_ARRIVAL_SEED_OFFSET = 7_919
# The client watches its own event loop: a tick every _LAG_TICK_S; late ticks are lag.
_LAG_TICK_S = 0.05
# Saturation: the client process was busy this share of the window, or its loop lagged this much
# while busy at least half the time (lag alone can be another process taking the core).
SATURATED_CPU_SHARE = 0.9
SATURATED_LAG_P99_S = 0.05


@dataclass(frozen=True)
class RequestRecord:
    """One request of the measured window, successful or not. Times in seconds."""

    ok: bool
    error: str  # "" when ok
    prompt_tokens: int
    output_tokens: int
    start_s: float  # send time, since the start of the measured window
    ttft_s: float | None  # None when no token arrived
    itl_s: tuple[float, ...]
    e2e_s: float  # to the last token when ok; to the failure otherwise
    job: int = 0  # prompt number (agent: session number)
    turn: int = 0  # agent: request number inside its session
    server_prompt_tok_s: float | None = None  # the server's own timings, where it reports them (llama-server)
    server_decode_tok_s: float | None = None


@dataclass(frozen=True)
class ClientStats:
    """How hard the load generator itself worked during a window (per process, then combined)."""

    processes: int
    backend: str
    cpu_share: float  # busiest process: CPU seconds / wall seconds
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    events: int  # streamed chunks handled
    events_per_s: float
    saturated: bool
    starved: bool = False
    """The loop lagged while the process hardly ran: the OS kept it off the CPU (shared cores), so
    the window's latencies and duration include time the client was not running at all."""

    def to_json(self) -> dict[str, Any]:
        return {"client_processes": self.processes, "client_backend": self.backend,
                "client_cpu_share": self.cpu_share, "client_loop_lag_p99_ms": self.loop_lag_p99_ms,
                "client_loop_lag_max_ms": self.loop_lag_max_ms, "client_events": self.events,
                "client_events_per_s": self.events_per_s, "client_saturated": self.saturated,
                "client_starved": self.starved}


@dataclass(frozen=True)
class LoadResult:
    """Every record of the measured window (in prompt order) and how long the window took."""

    records: tuple[RequestRecord, ...]
    duration_s: float
    concurrency: int
    request_rate: float | None
    stopped: bool = False  # ``should_stop`` cut the window short: prompts may be missing
    client: ClientStats | None = None


@dataclass(frozen=True)
class WindowPlan:
    """One measured window: which jobs (prompts or sessions) to send, how many at once, how fast."""

    first_job: int
    jobs: int
    concurrency: int
    request_rate: float | None
    warmup: bool = False


def _record(stream: Stream, prompt_tokens_sent: int, window_t0: float, error: str,
            job: int, turn: int) -> RequestRecord:
    ended_t = time.perf_counter()
    ok = not error
    if ok and not stream.chunk_t:
        ok, error = False, "the stream finished without any generated token"
    first = stream.first_text_index if stream.first_text_index is not None else 0
    token_t = stream.chunk_t[first:]
    ttft_s = token_t[0] - stream.start_t if token_t else None
    itl_s = tuple(later - earlier for earlier, later in itertools.pairwise(token_t))
    e2e_s = (token_t[-1] if ok else ended_t) - stream.start_t
    output_tokens = (stream.usage_output_tokens if stream.usage_output_tokens is not None
                     else len(stream.chunk_t))
    prompt_tokens = (stream.usage_prompt_tokens if stream.usage_prompt_tokens is not None
                     else prompt_tokens_sent)
    return RequestRecord(ok=ok, error=error, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         start_s=stream.start_t - window_t0, ttft_s=ttft_s, itl_s=itl_s, e2e_s=e2e_s,
                         job=job, turn=turn, server_prompt_tok_s=stream.server_prompt_tok_s,
                         server_decode_tok_s=stream.server_decode_tok_s)


# --- self-watch -----------------------------------------------------------------------------------


class _SelfWatch:
    """Event-loop lag and CPU share of this process over a window."""

    def __init__(self) -> None:
        self.lags_s: list[float] = []
        self.events = 0
        self._task: asyncio.Task[None] | None = None
        self._wall0 = self._cpu0 = 0.0
        self.wall_s = self.cpu_s = 0.0

    async def _tick(self) -> None:
        while True:
            planned = time.perf_counter() + _LAG_TICK_S
            await asyncio.sleep(_LAG_TICK_S)
            self.lags_s.append(max(0.0, time.perf_counter() - planned))

    def start(self) -> None:
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()
        self._task = asyncio.create_task(self._tick())

    async def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._wall0
        self.cpu_s = time.process_time() - self._cpu0
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def stats(self, backend: str) -> ClientStats:
        return combine_client_stats([self.raw()], backend)

    def raw(self) -> dict[str, Any]:
        return {"lags_s": self.lags_s, "cpu_s": self.cpu_s, "wall_s": self.wall_s, "events": self.events}


def combine_client_stats(raws: Sequence[dict[str, Any]], backend: str) -> ClientStats:
    """One :class:`ClientStats` from the per-process figures of :meth:`_SelfWatch.raw`."""
    lags = sorted(lag for raw in raws for lag in raw["lags_s"])
    p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else 0.0
    lag_max = lags[-1] if lags else 0.0
    shares = [raw["cpu_s"] / raw["wall_s"] for raw in raws if raw["wall_s"] > 0]
    cpu_share = max(shares, default=0.0)
    events = sum(int(raw["events"]) for raw in raws)
    wall = max((raw["wall_s"] for raw in raws), default=0.0)
    saturated = cpu_share >= SATURATED_CPU_SHARE or (p99 >= SATURATED_LAG_P99_S and cpu_share >= 0.5)
    starved = p99 >= SATURATED_LAG_P99_S and cpu_share < 0.5
    return ClientStats(processes=len(raws), backend=backend, cpu_share=cpu_share, loop_lag_p99_ms=p99 * 1e3,
                       loop_lag_max_ms=lag_max * 1e3, events=events,
                       events_per_s=events / wall if wall > 0 else 0.0, saturated=saturated, starved=starved)


# --- one window -----------------------------------------------------------------------------------


@dataclass
class _Window:
    """One batch of jobs sent under a concurrency cap, optionally paced."""

    transport: Transport
    base_url: str
    model: str
    workload: Workload
    vocab_size: int
    headers: dict[str, str]
    timeout_s: float
    should_stop: Callable[[], bool] | None
    take: Callable[[], int | None]
    on_record: Callable[[RequestRecord], None] | None = None
    warmup: bool = False
    watch: _SelfWatch = field(default_factory=_SelfWatch)
    stopped: bool = False
    records: dict[tuple[int, int], RequestRecord] = field(default_factory=dict)
    window_t0: float = 0.0

    def stopping(self) -> bool:
        if not self.stopped and self.should_stop is not None and self.should_stop():
            logger.info("load run: stop requested; sending no new requests")
            self.stopped = True
        return self.stopped

    def _keep(self, record: RequestRecord) -> None:
        self.records[(record.job, record.turn)] = record
        if self.on_record is not None:
            self.on_record(record)

    async def _request(self, url: str, body: dict[str, Any], prompt_tokens: int, job: int, turn: int,
                       chat: bool) -> Stream | None:
        stream = Stream(chat=chat, keep_text=chat)
        payload = json.dumps(body, separators=(",", ":")).encode()
        stream.start_t = time.perf_counter()
        error = ""
        try:
            await asyncio.wait_for(self.transport.stream(url, payload, self.headers, stream), self.timeout_s)
            if not stream.done:
                error = "the stream ended before data: [DONE] (truncated response)"
        except asyncio.CancelledError:
            self._keep(_record(stream, prompt_tokens, self.window_t0,
                               "stopped: the run was asked to stop mid-request", job, turn))
            raise
        except Exception as exc:  # a load run records every failure, whatever raised it
            if not isinstance(exc, (RequestFailed, asyncio.TimeoutError, httpx.HTTPError)):
                logger.debug("error in a request to %s", url, exc_info=True)
            error = failure_text(exc, self.timeout_s)
        self.watch.events += len(stream.chunk_t)
        record = _record(stream, prompt_tokens, self.window_t0, error, job, turn)
        self._keep(record)
        return stream if record.ok else None

    async def _job(self, index: int) -> None:
        base = self.base_url
        if self.workload.kind == "agent":
            session = AgentSession.create(self.workload, index, self.model, warmup=self.warmup)
            turns = 1 if self.warmup else self.workload.agent_spec.turns
            for turn in range(turns):
                if turn and self.stopping():
                    return
                body = session.body()
                stream = await self._request(f"{base}/v1/chat/completions", body,
                                             len(json.dumps(body["messages"])) // 4, index, turn, chat=True)
                if stream is None:
                    return  # a session whose turn failed ends: its next prompt would be made up
                session.add_reply(AgentTurnReply(content="".join(stream.content),
                                                 reasoning="".join(stream.reasoning),
                                                 tool_calls=tuple(stream.tool_calls[k]
                                                                  for k in sorted(stream.tool_calls))), turn)
            return
        prompt: PromptSpec = prompt_at(self.workload, self.vocab_size, index, warmup=self.warmup)
        body = {"model": self.model, "prompt": list(prompt.token_ids), "max_tokens": prompt.output_len,
                "ignore_eos": self.workload.ignore_eos, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        await self._request(f"{base}/v1/completions", body, len(prompt.token_ids), index, 0, chat=False)

    async def _slot_loop(self) -> None:
        while not self.stopping():
            index = self.take()
            if index is None:
                return
            await self._job(index)

    async def _sleep(self, delay_s: float) -> None:
        deadline = time.perf_counter() + delay_s
        while not self.stopping():
            left_s = deadline - time.perf_counter()
            if left_s <= 0:
                return
            await asyncio.sleep(min(left_s, _POLL_S))

    async def run(self, concurrency: int, request_rate_scale: float | None, max_jobs: int,
                  arrivals: random.Random, t0: float | None = None) -> float:
        """Send jobs until ``take`` runs dry; return the window's duration in seconds."""
        if t0 is not None:
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        self.window_t0 = time.perf_counter()
        self.watch.start()
        tasks: list[asyncio.Task[None]] = []
        if request_rate_scale is None or self.workload.request_rate is None:
            tasks = [asyncio.create_task(self._slot_loop()) for _ in range(concurrency)]
            dispatcher: asyncio.Task[None] | None = None
        else:
            slots = asyncio.Semaphore(concurrency)
            gaps = arrival_gaps_s(self.workload, max_jobs, arrivals, request_rate_scale)

            async def gated(index: int) -> None:
                async with slots:
                    if not self.stopping():
                        await self._job(index)

            async def dispatch() -> None:
                for gap_s in gaps:
                    if gap_s:
                        await self._sleep(gap_s)
                    if self.stopping():
                        return
                    index = self.take()
                    if index is None:
                        return
                    tasks.append(asyncio.create_task(gated(index)))

            dispatcher = asyncio.create_task(dispatch())
        try:
            while True:
                waiting = {task for task in (dispatcher, *tasks) if task is not None and not task.done()}
                if not waiting:
                    break
                await asyncio.wait(waiting, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                if self.stopping():
                    break
        finally:
            unfinished = [task for task in (dispatcher, *tasks) if task is not None and not task.done()]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            await self.watch.stop()
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                logger.error("load run: a request task crashed", exc_info=task.exception())
        return time.perf_counter() - self.window_t0


def _counter(first: int, count: int) -> Callable[[], int | None]:
    numbers = iter(range(first, first + count))

    def take() -> int | None:
        return next(numbers, None)

    return take


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def run_window(base_url: str, model: str, workload: Workload, plan: WindowPlan, *, vocab_size: int,
                     api_key: str | None = None, request_timeout_s: float = 600.0,
                     should_stop: Callable[[], bool] | None = None,
                     on_record: Callable[[RequestRecord], None] | None = None,
                     transport: httpx.AsyncBaseTransport | None = None, backend: Backend = "auto",
                     take: Callable[[], int | None] | None = None, rate_scale: float = 1.0,
                     t0: float | None = None, watch_raw: list[dict[str, Any]] | None = None) -> LoadResult:
    """Send one window's jobs from this process and return its records.

    ``take`` hands out job numbers (default: ``plan.first_job`` on, ``plan.jobs`` of them);
    :mod:`tuner.load.pool` passes one shared between processes, with ``rate_scale`` (this
    process's share of the rate) and ``t0`` (a common ``perf_counter`` start). ``on_record`` sees
    every record as it is made (the ladder's early stop). Failed requests are records.
    """
    if request_timeout_s <= 0:
        raise LoadError(f"request_timeout_s must be positive, got {request_timeout_s}")
    if workload.kind != "agent":
        prompt_at(workload, vocab_size, 0)  # fail early on an unusable vocabulary
    chosen, backend_name = make_transport(backend, plan.concurrency, request_timeout_s, transport)
    arrivals = random.Random(workload.seed + _ARRIVAL_SEED_OFFSET + plan.first_job)
    window = _Window(transport=chosen, base_url=base_url.rstrip("/"), model=model, workload=workload,
                     vocab_size=vocab_size, headers=_headers(api_key), timeout_s=request_timeout_s,
                     should_stop=should_stop, take=take or _counter(plan.first_job, plan.jobs),
                     on_record=on_record, warmup=plan.warmup)
    try:
        duration_s = await window.run(plan.concurrency, None if plan.request_rate is None else rate_scale,
                                      plan.jobs, arrivals, t0)
    finally:
        await chosen.aclose()
    if watch_raw is not None:
        watch_raw.append(window.watch.raw())
    records = tuple(window.records[k] for k in sorted(window.records))
    return LoadResult(records=records, duration_s=duration_s, concurrency=plan.concurrency,
                      request_rate=plan.request_rate, stopped=window.stopped,
                      client=window.watch.stats(backend_name))


def jobs_for(workload: Workload, requests: int) -> int:
    """How many jobs make about ``requests`` requests (agent sessions make ``turns`` each)."""
    return session_count(workload, requests) if workload.kind == "agent" else requests


async def run_load(base_url: str, model: str, workload: Workload, *, vocab_size: int,
                   api_key: str | None = None, request_timeout_s: float = 600.0,
                   should_stop: Callable[[], bool] | None = None,
                   transport: httpx.AsyncBaseTransport | None = None, backend: Backend = "auto") -> LoadResult:
    """Send the workload's warm-up prompts, then measure its ``num_prompts`` requests.

    ``request_timeout_s`` bounds each request from send to ``[DONE]`` (and each read within it).
    ``should_stop`` is polled between requests and while waiting (every 0.1 s; keep it cheap):
    once it returns True no new request is sent, requests in flight are cancelled and recorded as
    failed, and the result says ``stopped=True``. ``transport`` replaces the network (tests; it
    implies the httpx backend). Raises :class:`LoadError` only for unusable arguments.
    """
    if request_timeout_s <= 0:
        raise LoadError(f"request_timeout_s must be positive, got {request_timeout_s}")
    if workload.kind != "agent":
        make_warmup_prompts(workload, vocab_size)
        prompt_at(workload, vocab_size, 0)
    common: dict[str, Any] = {"vocab_size": vocab_size, "api_key": api_key, "request_timeout_s": request_timeout_s,
                              "should_stop": should_stop, "transport": transport, "backend": backend}
    if workload.warmup_prompts:
        warm = await run_window(base_url, model, workload,
                                WindowPlan(0, workload.warmup_prompts, workload.concurrency, None, warmup=True),
                                **common)
        failed = [r.error for r in warm.records if not r.ok]
        logger.info("load run: %d warm-up requests in %.2f s, %d failed",
                    len(warm.records), warm.duration_s, len(failed))
        if failed:
            logger.warning("load run: warm-up request failed: %s", failed[0])
        if warm.stopped:
            return LoadResult(records=(), duration_s=0.0, concurrency=workload.concurrency,
                              request_rate=workload.request_rate, stopped=True)
    plan = WindowPlan(0, jobs_for(workload, workload.num_prompts), workload.concurrency, workload.request_rate)
    logger.info("load run: %d jobs to %s, concurrency %d, request rate %s", plan.jobs, base_url,
                plan.concurrency, plan.request_rate or "unpaced")
    result = await run_window(base_url, model, workload, plan, **common)
    failures = [r.error for r in result.records if not r.ok]
    logger.info("load run: %d requests in %.2f s, %d failed%s", len(result.records), result.duration_s,
                len(failures), " (stopped early)" if result.stopped else "")
    if failures:
        logger.warning("load run: first failure: %s", failures[0])
    return result


def run_load_sync(base_url: str, model: str, workload: Workload, *, vocab_size: int,
                  api_key: str | None = None, request_timeout_s: float = 600.0,
                  should_stop: Callable[[], bool] | None = None,
                  transport: httpx.AsyncBaseTransport | None = None, backend: Backend = "auto") -> LoadResult:
    """:func:`run_load` for callers without an event loop (it runs one with ``asyncio.run``)."""
    _no_running_loop("run_load_sync")
    return asyncio.run(run_load(base_url, model, workload, vocab_size=vocab_size, api_key=api_key,
                                request_timeout_s=request_timeout_s, should_stop=should_stop,
                                transport=transport, backend=backend))


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise LoadError(f"{name} was called inside a running event loop; await the async version instead")
