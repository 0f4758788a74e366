"""The HTTP side of the load generator: streamed SSE parsing and the two transports.

A :class:`Stream` collects what one request has seen (chunk arrival times, the usage chunk, and for
agent sessions the text and tool calls); :func:`take_line` folds each ``data:`` line into it, the way
``vllm bench serve`` reads the stream. Transports: aiohttp when it is installed (measured ~5x more
streamed events per second per process than httpx; ``docs/loadgen.md``), httpx otherwise or when a
test passes an ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from tuner.load.agent import merge_tool_call_deltas

Backend = Literal["auto", "aiohttp", "httpx"]

# Connecting and sending a prompt are quick even on a loaded server; waiting for tokens is not.
_CONNECT_TIMEOUT_S = 30.0
_WRITE_TIMEOUT_S = 30.0
_ERROR_BODY_CHARS = 300


class RequestFailed(Exception):
    """The server answered, but not with a complete, usable stream."""


@dataclass
class Stream:
    """What one request has seen so far; survives a timeout or a cancellation."""

    chat: bool = False
    start_t: float = 0.0
    chunk_t: list[float] = field(default_factory=list)  # arrival of each chunk with a choice
    first_text_index: int | None = None
    usage_prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    done: bool = False
    keep_text: bool = False  # agent sessions need the answer for their next turn
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    server_prompt_tok_s: float | None = None
    """The server's own prompt-processing speed for this request (llama-server's ``timings``), if it sent one."""
    server_decode_tok_s: float | None = None
    """The server's own decode speed for this request (``timings.predicted_per_second``), if it sent one."""


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def take_event(payload: str, stream: Stream) -> None:
    """Fold one ``data:`` payload (not ``[DONE]``) into the stream's state."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise RequestFailed(f"malformed SSE data: {payload[:120]!r}") from exc
    if not isinstance(data, dict):
        raise RequestFailed(f"malformed SSE data: {payload[:120]!r}")
    if data.get("error") is not None:
        raise RequestFailed(f"server error in stream: {data['error']}")
    choices = data.get("choices")
    if isinstance(choices, list) and choices:
        now = time.perf_counter()
        first_choice = choices[0] if isinstance(choices[0], dict) else {}
        if stream.chat:
            delta = first_choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            text = delta.get("content")
            reasoning = delta.get("reasoning_content", delta.get("reasoning"))
            calls = delta.get("tool_calls")
            has_token = bool(text) or bool(reasoning) or bool(calls)
            if stream.keep_text:
                if isinstance(text, str):
                    stream.content.append(text)
                if isinstance(reasoning, str):
                    stream.reasoning.append(reasoning)
                merge_tool_call_deltas(stream.tool_calls, calls)
        else:
            text = first_choice.get("text")
            has_token = isinstance(text, str) and bool(text)
        if stream.first_text_index is None and has_token:
            stream.first_text_index = len(stream.chunk_t)
        stream.chunk_t.append(now)
    timings = data.get("timings")  # llama-server: prompt and decode speed of this request, measured apart
    if isinstance(timings, dict):
        stream.server_prompt_tok_s = _as_float(timings.get("prompt_per_second"))
        stream.server_decode_tok_s = _as_float(timings.get("predicted_per_second"))
    usage = data.get("usage")
    if isinstance(usage, dict):
        completion = _as_int(usage.get("completion_tokens"))
        prompt = _as_int(usage.get("prompt_tokens"))
        if completion is not None:
            stream.usage_output_tokens = completion
        if prompt is not None:
            stream.usage_prompt_tokens = prompt


def take_line(line: str, stream: Stream) -> None:
    if not line.startswith("data:"):
        return  # blank separators, ":" comments / pings, other SSE fields
    payload = line[len("data:"):].strip()
    if payload == "[DONE]":
        # Read on to the end of the body (vLLM ends it right away) so the connection goes back
        # to the pool instead of being closed half-read.
        stream.done = True
    elif payload and not stream.done:
        take_event(payload, stream)


# --- transports -----------------------------------------------------------------------------------


class Transport(Protocol):
    async def stream(self, url: str, body: bytes, headers: dict[str, str], stream: Stream) -> None: ...

    async def aclose(self) -> None: ...


class HttpxTransport:
    def __init__(self, concurrency: int, timeout_s: float, transport: httpx.AsyncBaseTransport | None) -> None:
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=min(_CONNECT_TIMEOUT_S, timeout_s), read=timeout_s,
                                  write=min(_WRITE_TIMEOUT_S, timeout_s), pool=timeout_s),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            transport=transport,
            trust_env=False,  # a proxy from the environment would sit inside every measured latency
        )

    async def stream(self, url: str, body: bytes, headers: dict[str, str], stream: Stream) -> None:
        async with self.client.stream("POST", url, content=body,
                                      headers={**headers, "content-type": "application/json"}) as response:
            if response.status_code != httpx.codes.OK:
                detail = (await response.aread()).decode("utf-8", "replace").strip()
                raise RequestFailed(f"HTTP {response.status_code}: {detail[:_ERROR_BODY_CHARS]}")
            async for line in response.aiter_lines():
                take_line(line, stream)

    async def aclose(self) -> None:
        await self.client.aclose()


class AiohttpTransport:
    """aiohttp, connections kept alive. A request whose pooled connection the server had already closed (the
    write fails, or the server hangs up before any response: llama-server's HTTP library closes a kept-alive
    connection without saying so in its streamed responses) never reached the server, and is sent once more on
    a fresh connection (``retries``); anything after the response started is the request's own failure."""

    def __init__(self, concurrency: int, timeout_s: float) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        timeout = aiohttp.ClientTimeout(total=None, connect=min(_CONNECT_TIMEOUT_S, timeout_s), sock_read=timeout_s)
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, force_close=False,
                                         enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=2**18,
                                             timeout=timeout)
        self.fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), trust_env=False,
                                           read_bufsize=2**18, timeout=timeout)
        self.retries = 0

    async def stream(self, url: str, body: bytes, headers: dict[str, str], stream: Stream) -> None:
        started: list[bool] = []
        try:
            await self._send(self.session, url, body, headers, stream, started)
        except (self._aiohttp.ClientOSError, self._aiohttp.ServerDisconnectedError):
            if started:
                raise
            self.retries += 1
            await self._send(self.fresh, url, body, headers, stream, started)

    async def _send(self, session: Any, url: str, body: bytes, headers: dict[str, str], stream: Stream,
                    started: list[bool]) -> None:
        async with session.post(url, data=body, headers={**headers, "content-type": "application/json"}) as response:
            started.append(True)
            if response.status != 200:
                detail = (await response.read()).decode("utf-8", "replace").strip()
                raise RequestFailed(f"HTTP {response.status}: {detail[:_ERROR_BODY_CHARS]}")
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                if b"\n" not in chunk:
                    continue
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    if raw:
                        take_line(raw.decode("utf-8", "replace"), stream)
            if pending:
                take_line(pending.decode("utf-8", "replace"), stream)

    async def aclose(self) -> None:
        await self.session.close()
        await self.fresh.close()


def available_backend(requested: Backend = "auto") -> Literal["aiohttp", "httpx"]:
    """The transport a run will use: ``auto`` is aiohttp when importable, else httpx."""
    if requested != "auto":
        return requested
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return "httpx"
    return "aiohttp"


def make_transport(backend: Backend, concurrency: int, timeout_s: float,
               transport: httpx.AsyncBaseTransport | None) -> tuple[Transport, str]:
    chosen = "httpx" if transport is not None else available_backend(backend)
    if chosen == "aiohttp":
        return AiohttpTransport(concurrency, timeout_s), "aiohttp"
    return HttpxTransport(concurrency, timeout_s, transport), "httpx"


def failure_text(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, RequestFailed):
        return str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return f"timeout: no complete response within {timeout_s:g} s"
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout ({type(exc).__name__}): {exc}"
    name = type(exc).__name__
    if "Timeout" in name:
        return f"timeout ({name}): {exc}"
    return f"{name}: {exc}"


