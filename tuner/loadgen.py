"""Drive a server with a :class:`~tuner.workload.Workload` and time every request.

Requests are streamed ``POST {base_url}/v1/completions`` calls with token-id prompts, timed the way
``vllm bench serve`` (``async_request_openai_completions``) times them:

- ``start_s``: when the request was sent, after waiting for a concurrency slot; seconds since the
  measured window began.
- ``ttft_s``: from send to the first streamed chunk that carries non-empty text (when no chunk
  carries text, the first chunk that carries a choice).
- ``itl_s``: every gap between consecutive choice chunks from that first one on.
- ``e2e_s``: from send to the last choice chunk.
- ``output_tokens`` and ``prompt_tokens``: from the final ``usage`` chunk
  (``stream_options.include_usage``); when the server sends none, the number of choice chunks and
  the prompt's length.

A request that fails (HTTP error, timeout, dropped connection, a stream that ends before
``data: [DONE]``, an error object inside the stream, no token at all) becomes a record with
``ok=False`` and its reason; it is never dropped and never raises out of :func:`run_load`.
"""

from __future__ import annotations

import asyncio
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
from tuner.workload import PromptSpec, Workload, make_prompts, make_warmup_prompts

__all__ = ["LoadResult", "RequestRecord", "run_load", "run_load_sync"]

logger = logging.getLogger(__name__)

# How often a waiting run looks at ``should_stop``.
_POLL_S = 0.1
# Connecting and sending a prompt are quick even on a loaded server; waiting for tokens is not.
_CONNECT_TIMEOUT_S = 30.0
_WRITE_TIMEOUT_S = 30.0
# Arrival times come from their own stream, so pacing does not change the prompts.
_ARRIVAL_SEED_OFFSET = 7_919
_ERROR_BODY_CHARS = 300


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


@dataclass(frozen=True)
class LoadResult:
    """Every record of the measured window (in prompt order) and how long the window took."""

    records: tuple[RequestRecord, ...]
    duration_s: float
    concurrency: int
    request_rate: float | None
    stopped: bool = False  # ``should_stop`` cut the window short: prompts may be missing


class _RequestFailed(Exception):
    """The server answered, but not with a complete, usable stream."""


@dataclass
class _Stream:
    """What one request has seen so far; survives a timeout or a cancellation."""

    start_t: float = 0.0
    chunk_t: list[float] = field(default_factory=list)  # arrival of each chunk with a choice
    first_text_index: int | None = None
    usage_prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    done: bool = False


def _record(stream: _Stream, prompt: PromptSpec, window_t0: float, error: str) -> RequestRecord:
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
                     else len(prompt.token_ids))
    return RequestRecord(ok=ok, error=error, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         start_s=stream.start_t - window_t0, ttft_s=ttft_s, itl_s=itl_s, e2e_s=e2e_s)


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _take_event(payload: str, stream: _Stream) -> None:
    """Fold one ``data:`` payload (not ``[DONE]``) into the stream's state."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise _RequestFailed(f"malformed SSE data: {payload[:120]!r}") from exc
    if not isinstance(data, dict):
        raise _RequestFailed(f"malformed SSE data: {payload[:120]!r}")
    if data.get("error") is not None:
        raise _RequestFailed(f"server error in stream: {data['error']}")
    choices = data.get("choices")
    if isinstance(choices, list) and choices:
        now = time.perf_counter()
        first_choice = choices[0] if isinstance(choices[0], dict) else {}
        text = first_choice.get("text")
        if stream.first_text_index is None and isinstance(text, str) and text:
            stream.first_text_index = len(stream.chunk_t)
        stream.chunk_t.append(now)
    usage = data.get("usage")
    if isinstance(usage, dict):
        completion = _as_int(usage.get("completion_tokens"))
        prompt = _as_int(usage.get("prompt_tokens"))
        if completion is not None:
            stream.usage_output_tokens = completion
        if prompt is not None:
            stream.usage_prompt_tokens = prompt


async def _stream_completion(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                             headers: dict[str, str], stream: _Stream) -> None:
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != httpx.codes.OK:
            detail = (await response.aread()).decode("utf-8", "replace").strip()
            raise _RequestFailed(f"HTTP {response.status_code}: {detail[:_ERROR_BODY_CHARS]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, ":" comments / pings, other SSE fields
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                # Read on to the end of the body (vLLM ends it right away) so the connection
                # goes back to the pool instead of being closed half-read.
                stream.done = True
            elif payload and not stream.done:
                _take_event(payload, stream)
    if not stream.done:
        raise _RequestFailed("the stream ended before data: [DONE] (truncated response)")


async def _request(client: httpx.AsyncClient, url: str, model: str, prompt: PromptSpec,
                   workload: Workload, headers: dict[str, str], timeout_s: float,
                   stream: _Stream) -> str:
    """Send one prompt; return "" on success or the reason it failed."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt.token_ids),
        "max_tokens": prompt.output_len,
        "ignore_eos": workload.ignore_eos,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream.start_t = time.perf_counter()
    try:
        await asyncio.wait_for(_stream_completion(client, url, body, headers, stream), timeout_s)
    except _RequestFailed as exc:
        return str(exc)
    except asyncio.TimeoutError:
        return f"timeout: no complete response within {timeout_s:g} s"
    except httpx.TimeoutException as exc:
        return f"timeout ({type(exc).__name__}): {exc}"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a load run records every failure, whatever raised it
        logger.debug("unexpected error in a request to %s", url, exc_info=True)
        return f"unexpected {type(exc).__name__}: {exc}"
    return ""


@dataclass
class _Window:
    """One batch of prompts sent under a concurrency cap, optionally Poisson-paced."""

    client: httpx.AsyncClient
    url: str
    model: str
    workload: Workload
    headers: dict[str, str]
    timeout_s: float
    should_stop: Callable[[], bool] | None
    stopped: bool = False
    records: dict[int, RequestRecord] = field(default_factory=dict)

    def stopping(self) -> bool:
        if not self.stopped and self.should_stop is not None and self.should_stop():
            logger.info("load run: stop requested; sending no new requests")
            self.stopped = True
        return self.stopped

    async def _one(self, index: int, prompt: PromptSpec, slots: asyncio.Semaphore,
                   window_t0: float) -> None:
        async with slots:
            if self.stopping():
                return
            stream = _Stream()
            try:
                error = await _request(self.client, self.url, self.model, prompt, self.workload,
                                       self.headers, self.timeout_s, stream)
            except asyncio.CancelledError:
                self.records[index] = _record(stream, prompt, window_t0,
                                              "stopped: the run was asked to stop mid-request")
                raise
            self.records[index] = _record(stream, prompt, window_t0, error)

    async def _sleep(self, delay_s: float) -> None:
        deadline = time.perf_counter() + delay_s
        while not self.stopping():
            left_s = deadline - time.perf_counter()
            if left_s <= 0:
                return
            await asyncio.sleep(min(left_s, _POLL_S))

    async def run(self, prompts: Sequence[PromptSpec], request_rate: float | None,
                  arrivals: random.Random) -> float:
        """Send every prompt and wait for all of them; return the window's duration in seconds."""
        slots = asyncio.Semaphore(self.workload.concurrency)
        tasks: list[asyncio.Task[None]] = []
        window_t0 = time.perf_counter()

        async def dispatch() -> None:
            for index, prompt in enumerate(prompts):
                if request_rate is not None and index > 0:
                    await self._sleep(arrivals.expovariate(request_rate))
                if self.stopping():
                    return
                tasks.append(asyncio.create_task(self._one(index, prompt, slots, window_t0)))

        dispatcher = asyncio.create_task(dispatch())
        try:
            while True:
                waiting = {task for task in (dispatcher, *tasks) if not task.done()}
                if not waiting:
                    break
                await asyncio.wait(waiting, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                if self.stopping():
                    break
        finally:
            unfinished = [task for task in (dispatcher, *tasks) if not task.done()]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                logger.error("load run: a request task crashed", exc_info=task.exception())
        return time.perf_counter() - window_t0


def _client(workload: Workload, timeout_s: float,
            transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=min(_CONNECT_TIMEOUT_S, timeout_s), read=timeout_s,
                              write=min(_WRITE_TIMEOUT_S, timeout_s), pool=timeout_s),
        limits=httpx.Limits(max_connections=workload.concurrency,
                            max_keepalive_connections=workload.concurrency),
        transport=transport,
        trust_env=False,  # a proxy from the environment would sit inside every measured latency
    )


async def run_load(base_url: str, model: str, workload: Workload, *, vocab_size: int,
                   api_key: str | None = None, request_timeout_s: float = 600.0,
                   should_stop: Callable[[], bool] | None = None,
                   transport: httpx.AsyncBaseTransport | None = None) -> LoadResult:
    """Send the workload's warm-up prompts, then measure its ``num_prompts`` requests.

    ``request_timeout_s`` bounds each request from send to ``[DONE]`` (and each read within it).
    ``should_stop`` is polled between requests and while waiting (every 0.1 s; keep it cheap):
    once it returns True no new request is sent, requests in flight are cancelled and recorded as
    failed, and the result says ``stopped=True``. ``transport`` replaces the network (tests).
    Raises :class:`LoadError` only for unusable arguments; failed requests are records.
    """
    if request_timeout_s <= 0:
        raise LoadError(f"request_timeout_s must be positive, got {request_timeout_s}")
    measured = make_prompts(workload, vocab_size)
    warmup = make_warmup_prompts(workload, vocab_size)
    url = f"{base_url.rstrip('/')}/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    arrivals = random.Random(workload.seed + _ARRIVAL_SEED_OFFSET)

    async with _client(workload, request_timeout_s, transport) as client:
        def window() -> _Window:
            return _Window(client=client, url=url, model=model, workload=workload, headers=headers,
                           timeout_s=request_timeout_s, should_stop=should_stop)

        if warmup:
            warm = window()
            warm_s = await warm.run(warmup, None, arrivals)
            failed = [r.error for r in warm.records.values() if not r.ok]
            logger.info("load run: %d warm-up requests in %.2f s, %d failed",
                        len(warm.records), warm_s, len(failed))
            if failed:
                logger.warning("load run: warm-up request failed: %s", failed[0])
            if warm.stopped:
                return LoadResult(records=(), duration_s=0.0, concurrency=workload.concurrency,
                                  request_rate=workload.request_rate, stopped=True)

        main = window()
        logger.info("load run: %d prompts to %s, concurrency %d, request rate %s",
                    len(measured), url, workload.concurrency, workload.request_rate or "unpaced")
        duration_s = await main.run(measured, workload.request_rate, arrivals)

    records = tuple(main.records[i] for i in sorted(main.records))
    failures = [r.error for r in records if not r.ok]
    logger.info("load run: %d requests in %.2f s, %d failed%s", len(records), duration_s,
                len(failures), " (stopped early)" if main.stopped else "")
    if failures:
        logger.warning("load run: first failure: %s", failures[0])
    return LoadResult(records=records, duration_s=duration_s, concurrency=workload.concurrency,
                      request_rate=workload.request_rate, stopped=main.stopped)


def run_load_sync(base_url: str, model: str, workload: Workload, *, vocab_size: int,
                  api_key: str | None = None, request_timeout_s: float = 600.0,
                  should_stop: Callable[[], bool] | None = None,
                  transport: httpx.AsyncBaseTransport | None = None) -> LoadResult:
    """:func:`run_load` for callers without an event loop (it runs one with ``asyncio.run``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise LoadError("run_load_sync was called inside a running event loop; await run_load instead")
    return asyncio.run(run_load(base_url, model, workload, vocab_size=vocab_size, api_key=api_key,
                                request_timeout_s=request_timeout_s, should_stop=should_stop,
                                transport=transport))
