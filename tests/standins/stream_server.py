"""A STAND-IN for a vLLM OpenAI server: it does no inference, it only streams as fast as it can.

Used to measure the load generator's own capacity (``scripts/bench_client_capacity.py``) and to
drive the concurrency ladder in unit tests without a model. It speaks just enough HTTP/1.1 (keep-alive,
chunked transfer encoding, server-sent events) for httpx, aiohttp and ``vllm bench serve``:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: ``max_tokens`` chunks, one SSE event
  (one write) per token, then a usage chunk when ``stream_options.include_usage``, then ``[DONE]``.
- ``GET /health``, ``GET /v1/models``, ``GET /metrics``: a Prometheus page with vLLM's counter,
  histogram and gauge names, split over two ``engine`` label values (as vLLM does under DP).

Optional server behaviour, to give the ladder something to find: ``itl_s`` (a sleep between
tokens), ``ttft_s`` (before the first one) and ``capacity`` (at most that many requests decode at
once; the others queue, and their wait is recorded in ``vllm:request_queue_time_seconds``). With
all three at 0 it is a pure streaming stand-in.

Run it alone: ``python tests/standins/stream_server.py --port 8100 [--workers N]`` (``--workers``
forks N processes sharing the port with ``SO_REUSEPORT``, so the stand-in is not the bottleneck).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("standin")

QUEUE_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ENGINES = ("0", "1")


@dataclass
class StandInBehaviour:
    itl_s: float = 0.0
    ttft_s: float = 0.0
    capacity: int = 0  # 0 = unlimited


@dataclass
class _Stats:
    """Counters shown on /metrics, per engine (a request's engine is its number modulo 2)."""

    prompt_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    generation_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    queue_buckets: dict[str, list[int]] = field(
        default_factory=lambda: {e: [0] * (len(QUEUE_BUCKETS_S) + 1) for e in ENGINES})
    queue_sum_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    running: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))

    def observe_queue(self, engine: str, wait_s: float) -> None:
        for i, bound in enumerate(QUEUE_BUCKETS_S):
            if wait_s <= bound:
                self.queue_buckets[engine][i] += 1
        self.queue_buckets[engine][-1] += 1
        self.queue_sum_s[engine] += wait_s

    def page(self, capacity: int) -> str:
        lines = ["# HELP vllm:prompt_tokens_total stand-in", "# TYPE vllm:prompt_tokens_total counter"]
        for e in ENGINES:
            lines.append(f'vllm:prompt_tokens_total{{engine="{e}",model_name="standin"}} {self.prompt_tokens[e]}')
        lines.append("# TYPE vllm:generation_tokens_total counter")
        for e in ENGINES:
            lines.append(f'vllm:generation_tokens_total{{engine="{e}",model_name="standin"}} '
                         f"{self.generation_tokens[e]}")
        lines.append("# TYPE vllm:request_queue_time_seconds histogram")
        for e in ENGINES:
            for bound, count in zip(QUEUE_BUCKETS_S, self.queue_buckets[e], strict=False):
                lines.append(f'vllm:request_queue_time_seconds_bucket{{engine="{e}",le="{bound}",'
                             f'model_name="standin"}} {count}')
            lines.append(f'vllm:request_queue_time_seconds_bucket{{engine="{e}",le="+Inf",model_name="standin"}} '
                         f"{self.queue_buckets[e][-1]}")
            lines.append(f'vllm:request_queue_time_seconds_count{{engine="{e}",model_name="standin"}} '
                         f"{self.queue_buckets[e][-1]}")
            lines.append(f'vllm:request_queue_time_seconds_sum{{engine="{e}",model_name="standin"}} '
                         f"{self.queue_sum_s[e]}")
        lines.append("# TYPE vllm:num_requests_running gauge")
        for e in ENGINES:
            lines.append(f'vllm:num_requests_running{{engine="{e}",model_name="standin"}} {self.running[e]}')
        lines.append("# TYPE vllm:num_requests_waiting gauge")
        for e in ENGINES:
            lines.append(f'vllm:num_requests_waiting{{engine="{e}",model_name="standin"}} {self.waiting[e]}')
        lines.append("# TYPE vllm:kv_cache_usage_perc gauge")
        for e in ENGINES:
            usage = min(1.0, self.running[e] / max(1, capacity / 2)) if capacity else 0.0
            lines.append(f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="standin"}} {usage}')
        return "\n".join(lines) + "\n"


class StandInServer:
    """The stand-in's request handling; :meth:`serve` runs it on a socket in the current loop."""

    def __init__(self, behaviour: StandInBehaviour | None = None) -> None:
        self.behaviour = behaviour or StandInBehaviour()
        self.stats = _Stats()
        self._slots: asyncio.Semaphore | None = None
        self._count = 0

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await reader.readexactly(length) if length else b""
        return method, path, body

    @staticmethod
    def _plain(writer: asyncio.StreamWriter, status: str, body: bytes, ctype: str) -> None:
        writer.write(f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n"
                     "connection: keep-alive\r\n\r\n".encode() + body)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    request = await self._read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if request is None:
                    return
                method, path, body = request
                if method == "GET" and path == "/metrics":
                    self._plain(writer, "200 OK", self.stats.page(self.behaviour.capacity).encode(),
                                "text/plain; version=0.0.4")
                elif method == "GET" and path in ("/health", "/v1/models"):
                    self._plain(writer, "200 OK", b'{"object":"list","data":[{"id":"standin"}]}',
                                "application/json")
                elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
                    await self._stream(writer, json.loads(body or b"{}"), chat=path.endswith("chat/completions"))
                else:
                    self._plain(writer, "404 Not Found", b'{"error":"not found"}', "application/json")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, body: dict[str, Any], *, chat: bool) -> None:
        b = self.behaviour
        n_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            n_in = len(prompt)
        elif chat:
            n_in = max(1, len(json.dumps(body.get("messages", []))) // 4)
        else:
            n_in = max(1, len(str(prompt or "")) // 4)
        engine = ENGINES[self._count % len(ENGINES)]
        self._count += 1
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")
        if b.capacity and self._slots is None:
            self._slots = asyncio.Semaphore(b.capacity)
        queued_t = time.perf_counter()
        self.stats.waiting[engine] += 1
        if self._slots is not None:
            await self._slots.acquire()
        self.stats.waiting[engine] -= 1
        self.stats.observe_queue(engine, time.perf_counter() - queued_t)
        self.stats.running[engine] += 1
        self.stats.requests[engine] += 1
        self.stats.prompt_tokens[engine] += n_in
        try:
            if b.ttft_s:
                await asyncio.sleep(b.ttft_s)
            obj = "chat.completion.chunk" if chat else "text_completion"
            for i in range(n_out):
                if i and b.itl_s:
                    await asyncio.sleep(b.itl_s)
                finish = '"length"' if i == n_out - 1 else "null"
                if chat:
                    choice = f'{{"index":0,"delta":{{"content":"tok{i}"}},"finish_reason":{finish},"stop_reason":null}}'
                else:
                    choice = (f'{{"index":0,"text":"tok{i}","logprobs":null,"finish_reason":{finish},'
                              '"stop_reason":null}')
                # vLLM-sized events (~200 bytes): id, created, model, choices, usage null.
                event = (f'data: {{"id":"cmpl-standin-0123456789abcdef","object":"{obj}",'
                         f'"created":1764460800,"model":"standin","choices":[{choice}],"usage":null}}\n\n').encode()
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.stats.generation_tokens[engine] += 1
                await writer.drain()
            if usage:
                event = (f'data: {{"id":"cmpl-standin","object":"{obj}","model":"standin","choices":[],'
                         f'"usage":{{"prompt_tokens":{n_in},"completion_tokens":{n_out},'
                         f'"total_tokens":{n_in + n_out}}}}}\n\n').encode()
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        finally:
            self.stats.running[engine] -= 1
            if self._slots is not None:
                self._slots.release()

    async def serve(self, sock: socket.socket, started: threading.Event | None = None,
                    stop: asyncio.Event | None = None) -> None:
        server = await asyncio.start_server(self.handle, sock=sock, backlog=4096)
        if started is not None:
            started.set()
        async with server:
            if stop is None:
                await server.serve_forever()
            else:
                await stop.wait()


def _listen(host: str, port: int, reuse_port: bool) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


class StandInThread:
    """The stand-in in a background thread of this process (for tests): ``with StandInThread() as s:``."""

    def __init__(self, behaviour: StandInBehaviour | None = None, host: str = "127.0.0.1") -> None:
        self.server = StandInServer(behaviour)
        self.sock = _listen(host, 0, reuse_port=False)
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standin", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            await self.server.serve(self.sock, self._started, self._stop)

        try:
            self._loop.run_until_complete(main())
            self._loop.run_until_complete(self._cancel_open_connections())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    @staticmethod
    async def _cancel_open_connections() -> None:
        """Ends the handlers still streaming, here in the loop, so none is left for the garbage collector.

        A pending task destroyed later by the collector logs from whatever thread and frame collects it;
        on CPython 3.11 that once landed inside pytest's own ``ast.parse`` and failed an unrelated test.
        """
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> StandInThread:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the stand-in server did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


def _worker(host: str, port: int, behaviour: StandInBehaviour) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    sock = _listen(host, port, reuse_port=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(StandInServer(behaviour).serve(sock))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the port (SO_REUSEPORT)")
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--capacity", type=int, default=0)
    args = parser.parse_args()
    behaviour = StandInBehaviour(itl_s=args.itl_ms / 1000, ttft_s=args.ttft_ms / 1000, capacity=args.capacity)
    children: list[int] = []
    for _ in range(args.workers - 1):
        pid = os.fork()
        if pid == 0:
            _worker(args.host, args.port, behaviour)
            os._exit(0)
        children.append(pid)
    try:
        _worker(args.host, args.port, behaviour)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
