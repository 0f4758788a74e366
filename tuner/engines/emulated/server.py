"""The emulated node as an HTTP server: vLLM's OpenAI-compatible routes over the virtual-time scheduler.

One asyncio loop runs everything. The node task plans a step in virtual time, sleeps until the step's
end in real time (virtual seconds / ``time_scale``), applies it, and wakes the streams whose requests
produced tokens; a stream handler then writes one SSE chunk for what its request got in that step.
The virtual timeline is the scheduler's: if the real loop lags, tokens reach clients late but the
node's own accounting (``/metrics``) is unchanged. Each HTTP request stands for ``multiplicity``
virtual requests (:mod:`~tuner.engines.emulated.units`).

Routes: ``/health``, ``/v1/models``, ``/version``, ``/metrics``, ``/tokenize``, ``/detokenize``,
``/v1/completions``, ``/v1/chat/completions`` (vLLM's), and ``/emulator`` (the units, for an adapter).
Paths under ``/v1`` need the API key when one is set, as vLLM's middleware checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from tuner.engines.emulated.chat_render import render_chat
from tuner.engines.emulated.disagg import (
    NIXL_BYTES_BUCKETS,
    NIXL_TIME_BUCKETS,
    KvTransfer,
    has_remote_prefill,
    wants_remote_decode,
)
from tuner.engines.emulated.dsv4_output import build_chat_output
from tuner.engines.emulated.frontend import Frontend
from tuner.engines.emulated.hashing import stable_hash
from tuner.engines.emulated.openai_api import (
    DONE,
    Answer,
    ApiError,
    chat_chunk,
    chat_logprobs,
    chat_response,
    completion_chunk,
    completion_logprobs,
    completion_response,
    error_body,
    error_chunk,
    merge_deltas,
    prompt_logprobs,
    usage_chunk,
)
from tuner.engines.emulated.prom import Registry
from tuner.engines.emulated.pseudo_model import PseudoModel, filler_ids
from tuner.engines.emulated.responder import garble, respond
from tuner.engines.emulated.scheduler import Group, Node, Step
from tuner.engines.emulated.settings import MULTIPLICITY_HEADER
from tuner.engines.emulated.tokenizer import TOKENIZER, VOCAB_SIZE
from tuner.engines.emulated.truth import Truth
from tuner.engines.emulated.units import Units
from tuner.engines.emulated.vllm_log import VllmLog
from tuner.perfmodel.capacity import Capacity
from tuner.perfmodel.serve_config import EmulatedConfig
from tuner.perfmodel.step import NodeModel

__all__ = ["EmulatedServer"]

log = logging.getLogger(__name__)

SHORT_ANSWER_TOKENS = 256
"""Completions up to this long come from the pseudo-model (probes compare them); longer ones
(the load generator's) are filler text, which costs nothing per token."""
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


class StreamSink:
    """What one HTTP request has received from the scheduler so far."""

    __slots__ = ("error", "event", "finished", "tokens")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.tokens = 0
        self.finished = False
        self.error: str | None = None

    def emit(self, group: Group, tokens: int, t_v: float, finished: bool) -> None:
        self.tokens += tokens
        self.finished = self.finished or finished
        self.event.set()

    def fail(self, message: str) -> None:
        self.error = message
        self.event.set()


class _AccessLog(AbstractAccessLogger):
    """uvicorn's access line for every request, as vLLM's server prints it."""

    vllm_log: VllmLog | None = None

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.vllm_log is None:
            return
        peer = request.remote or "127.0.0.1"
        port = ""
        transport = request.transport
        if transport is not None:
            info = transport.get_extra_info("peername")
            if isinstance(info, tuple) and len(info) >= 2:
                port = f":{info[1]}"
        self.vllm_log.access(f"{peer}{port}", request.method, request.path_qs, response.status,
                             _REASONS.get(response.status, ""))


class EmulatedServer:
    """The serving side of one emulated launch (built once start-up succeeded)."""

    def __init__(self, *, config: EmulatedConfig, frontend: Frontend, model: NodeModel, capacity: Capacity,
                 truth: Truth, units: Units, vllm_log: VllmLog, version: str, seed: int = 0,
                 stats_interval_s: float = 10.0, generation: str = "hopper",
                 kv_transfer: KvTransfer | None = None) -> None:
        self.config = config
        self.frontend = frontend
        self.capacity = capacity
        self.truth = truth
        self.units = units
        self.vllm_log = vllm_log
        self.version = version
        self.stats_interval_s = stats_interval_s
        info = {"block_size": str(config.block_size), "cache_dtype": config.kv_cache_dtype,
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "gpu_memory_utilization": str(config.gpu_memory_utilization),
                "num_gpu_blocks": str(capacity.num_blocks)}
        self.registry = Registry(frontend.model_name, config.dp, max_model_len=config.max_model_len,
                                 speculative=config.speculative, info=info)
        self.kv_transfer = kv_transfer
        if kv_transfer is not None:
            self._add_connector_metrics(kv_transfer)
        self.node = Node(model, capacity.num_blocks, self.registry, seed=seed)
        self.trap = truth.trap(config)
        self.pseudo = PseudoModel(truth.numerics(config, generation))
        self.oom_rule = truth.failure(config, "oom_under_load")
        self.dead = False
        self.exit_code: asyncio.Future[int] | None = None
        self._wake = asyncio.Event()
        self._sinks: set[StreamSink] = set()
        self._t0 = time.monotonic()
        self._uid = 0
        self._tasks: list[asyncio.Task[None]] = []

    def _add_connector_metrics(self, kv: KvTransfer) -> None:
        reg = self.registry
        reg.add_counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector "
                        "cross-instance cache sharing, in terms of number of queried tokens.")
        reg.add_counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                        "cross-instance cache sharing, in terms of number of cached tokens.")
        if kv.nixl:
            reg.add_histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache "
                              "transfers.", NIXL_TIME_BUCKETS)
            reg.add_histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache "
                              "transfers.", NIXL_BYTES_BUCKETS)
            reg.add_counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers, including "
                            "handshake and notification failures.")

    def _remote_prefill(self, group: Group, body: Mapping[str, Any]) -> None:
        """A decode member's request whose prompt was prefilled elsewhere: its KV arrives over the link first."""
        kv = self.kv_transfer
        if kv is None or not has_remote_prefill(body.get("kv_transfer_params")):
            return
        seconds = kv.seconds(group.prompt_len)
        group.remote_tokens = group.prompt_len - 1  # vLLM's decode instance computes the last prompt token itself
        group.arrival_v += seconds
        if kv.nixl:
            self.registry.observe(0, "vllm:nixl_xfer_time_seconds", seconds, group.multiplicity)
            self.registry.observe(0, "vllm:nixl_bytes_transferred", kv.bytes_of(group.prompt_len), group.multiplicity)

    def _kv_answer(self, response: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
        """A prefill member's answer names the blocks a decode member pulls (NIXL's ``kv_transfer_params``)."""
        kv = self.kv_transfer
        if kv is not None and wants_remote_decode(body.get("kv_transfer_params")):
            blocks = -(-int(response.get("usage", {}).get("prompt_tokens", 0)) // self.config.block_size)
            response["kv_transfer_params"] = kv.prefill_answer(list(range(blocks)), self.frontend.host,
                                                               self.frontend.port, self.config.tp)
        return response

    # -- time ----------------------------------------------------------------------------------------
    def now_v(self) -> float:
        return (time.monotonic() - self._t0) * self.units.time_scale

    async def sleep_until_v(self, t_v: float) -> None:
        delay = self._t0 + t_v / self.units.time_scale - time.monotonic()
        await asyncio.sleep(max(0.0, delay))

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._t0 = time.monotonic()
        self.exit_code = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._node_loop()), asyncio.create_task(self._stats_loop())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._middleware])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version_route)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/emulator", self.emulator)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    @property
    def routes(self) -> list[tuple[str, str]]:
        return [("/health", "GET"), ("/v1/models", "GET"), ("/version", "GET"), ("/metrics", "GET"),
                ("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/completions", "POST"),
                ("/v1/chat/completions", "POST")]

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        keys = self.frontend.api_keys
        if keys and request.path.startswith(("/v1", "/v2", "/inference", "/cohere")) and request.method != "OPTIONS":
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token not in keys:
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:
            if exc.status == 404:
                return web.json_response({"detail": "Not Found"}, status=404)
            if exc.status == 405:
                return web.json_response({"detail": "Method Not Allowed"}, status=405)
            raise

    # -- the node ------------------------------------------------------------------------------------
    async def _node_loop(self) -> None:
        node = self.node
        while not self.dead:
            if not node.busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            step = node.plan(node.now_v)
            if step is None:
                upcoming = node.next_arrival_v()
                if upcoming is None or upcoming <= node.now_v:
                    self._wake.clear()
                    await self._wake.wait()
                else:
                    node.now_v = upcoming
                continue
            if self.oom_rule is not None and max(step.batched_tokens) >= self.oom_rule.min_batched_tokens:
                self._die_oom(step)
                return
            await self.sleep_until_v(step.end_v)
            node.apply(step)

    def _copies(self, request: web.Request) -> int:
        """Virtual requests this HTTP request stands for: the multiplicity, or fewer when the request asks.

        A correctness probe (the tuner's gates) sends ``X-DSV4-Emulator-Multiplicity: 1``: one request,
        not ``M`` copies of a 100k-token needle. Not a vLLM header; vLLM ignores it.
        """
        asked = request.headers.get(MULTIPLICITY_HEADER)
        if asked is None:
            return self.units.multiplicity
        try:
            copies = int(asked)
        except ValueError as exc:
            raise ApiError(f"{MULTIPLICITY_HEADER} must be a whole number, got {asked!r}") from exc
        return max(1, min(self.units.multiplicity, copies))

    def _submit(self, prompt_ids: Sequence[int], output_ids: Sequence[int], finish_reason: str,
                copies: int | None = None, body: Mapping[str, Any] | None = None) -> tuple[Group, StreamSink]:
        if self.dead:
            raise ApiError(ENGINE_DEAD, 500, "InternalServerError")
        sink = StreamSink()
        self._uid += 1
        group = Group(self._uid, copies or self.units.multiplicity, len(prompt_ids), max(1, len(output_ids)),
                      max(self.now_v(), self.node.now_v),
                      token_ids=[*prompt_ids, *output_ids], sink=sink, finish_reason=finish_reason)
        if body is not None:
            self._remote_prefill(group, body)
        self.node.submit(group)
        self._sinks.add(sink)
        self._wake.set()
        return group, sink

    def _die_oom(self, step: Step) -> None:
        """The engine runs out of memory in a step: vLLM's fatal-error lines, every request fails, exit 1."""
        self.dead = True
        lg = self.vllm_log
        engine = f"EngineCore_DP{step.batched_tokens.index(max(step.batched_tokens))}" if self.config.dp > 1 \
            else "EngineCore"
        device_gib = self.capacity.memory.usable_bytes / max(1e-9, self.config.gpu_memory_utilization) / (1 << 30)
        tried = 0.35 + max(step.batched_tokens) * 0.3 / 1000
        free = max(0.05, device_gib * (1 - self.config.gpu_memory_utilization) - 1.4)
        lg.error(engine, "core.py:1512", "EngineCore encountered a fatal error.")
        lg.plain(engine, "Traceback (most recent call last):")
        lg.plain(engine, '  File ".../vllm/v1/engine/core.py", line 1503, in run_engine_core')
        lg.plain(engine, '  File ".../vllm/v1/worker/gpu_model_runner.py", line 3402, in execute_model')
        lg.plain(engine, '  File ".../vllm/model_executor/layers/fused_moe/layer.py", line 2011, in forward_impl')
        lg.plain(engine, (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total "
            f"capacity of {device_gib:.2f} GiB of which {free:.2f} GiB is free. Including non-PyTorch memory, this "
            f"process has {device_gib - free:.2f} GiB memory in use. If reserved but unallocated memory is large try "
            "setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."))
        lg.error("APIServer", "async_llm.py:906", "AsyncLLM output_handler failed.")
        lg.plain("APIServer", "Traceback (most recent call last):")
        lg.plain("APIServer", f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}")
        for sink in list(self._sinks):
            sink.fail(ENGINE_DEAD)
        lg.plain(None, "INFO:     Shutting down")
        lg.plain(None, "INFO:     Waiting for application shutdown.")
        lg.plain(None, "INFO:     Application shutdown complete.")
        asyncio.get_running_loop().call_later(0.3, self._exit, 1)

    def _exit(self, code: int) -> None:
        if self.exit_code is not None and not self.exit_code.done():
            self.exit_code.set_result(code)

    async def _stats_loop(self) -> None:
        """vLLM's periodic per-engine line (only while an engine is busy)."""
        last: dict[int, tuple[float, ...]] = {e: (0.0, 0.0, 0.0, 0.0) for e in range(self.config.dp)}
        real_interval = max(1.0, self.stats_interval_s / self.units.time_scale)
        while not self.dead:
            await asyncio.sleep(real_interval)
            span = real_interval * self.units.time_scale
            for e, engine in enumerate(self.node.engines):
                reg = self.registry
                now = tuple(reg.counter_total(name, e) for name in (
                    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prefix_cache_queries",
                    "vllm:prefix_cache_hits"))
                prompt, gen, queries, hits = (a - b for a, b in zip(now, last[e], strict=True))
                last[e] = now
                if not (prompt or gen or engine.running_reqs or engine.waiting_reqs):
                    continue
                rate = 100.0 * hits / queries if queries else 0.0
                self.vllm_log.info(f"EngineCore_DP{e}" if self.config.dp > 1 else "EngineCore", "loggers.py:283", (
                    f"Engine {e:03d}: Avg prompt throughput: {prompt / span:.1f} tokens/s, Avg generation "
                    f"throughput: {gen / span:.1f} tokens/s, Running: {engine.running_reqs} reqs, Waiting: "
                    f"{engine.waiting_reqs} reqs, GPU KV cache usage: {100 * engine.pool.usage:.1f}%, "
                    f"Prefix cache hit rate: {rate:.1f}%"))

    # -- small routes --------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200)

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": self.config.model,
                 "parent": None, "max_model_len": self.config.max_model_len,
                 "permission": [{"id": f"modelperm-{stable_hash(name) & 0xFFFFFFFF:08x}", "object": "model_permission",
                                 "created": created, "allow_create_engine": False, "allow_sampling": True,
                                 "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                 "allow_fine_tuning": False, "organization": "*", "group": None,
                                 "is_blocking": False}]}
                for name in self.frontend.served_model_names]
        return web.json_response({"object": "list", "data": data})

    async def version_route(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.registry.render(), content_type="text/plain",
                            headers={"X-Units": "node"})

    async def emulator(self, request: web.Request) -> web.Response:
        return web.json_response({"units": self.units.to_json(), "kv_tokens_per_engine": self.capacity.kv_tokens,
                                  "engines": self.config.dp})

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError("The request body must be a JSON object")
        return body

    def _check_model(self, body: Mapping[str, Any]) -> str:
        name = body.get("model")
        if name is None:
            return self.frontend.model_name
        if name not in self.frontend.served_model_names:
            raise ApiError(f"The model `{name}` does not exist.", 404, "NotFoundError", "model")
        return str(name)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        if "messages" in body:
            ids = TOKENIZER.encode(render_chat(body).prompt)
        else:
            ids = TOKENIZER.encode(str(body.get("prompt", "")),
                                   add_special_tokens=bool(body.get("add_special_tokens", True)))
        strs = [TOKENIZER.token_str(i) for i in ids] if body.get("return_token_strs") else None
        return web.json_response({"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        self._check_model(body)
        ids = _token_ids(body.get("tokens"), "tokens")
        return web.json_response({"prompt": TOKENIZER.decode(ids)})

    # -- generation ----------------------------------------------------------------------------------
    def _max_tokens(self, body: Mapping[str, Any], prompt_len: int, default: int | None) -> int:
        if prompt_len > self.config.max_model_len:
            raise ApiError(
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, your prompt "
                f"contains {prompt_len} input tokens, which exceeds this limit even without any output tokens. "
                "Please reduce the length of the input prompt.", param="input_tokens")
        room = self.config.max_model_len - prompt_len
        asked = body.get("max_tokens", body.get("max_completion_tokens"))
        value = default if asked is None else int(asked)
        if value is None:
            value = room
        if value < 1:
            raise ApiError(f"max_tokens must be at least 1, got {value}.", param="max_tokens")
        if int(body.get("n", 1) or 1) != 1:
            raise ApiError("The emulated node serves n=1 only.", param="n")
        return min(value, room) if room > 0 else 1

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        model = self._check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = TOKENIZER.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
        else:
            ids = _token_ids(prompt, "prompt")
        if not ids:
            raise ApiError("The prompt is empty.", param="prompt")
        max_tokens = self._max_tokens(body, len(ids), 16)
        logprobs_k = body.get("logprobs")
        prompt_k = body.get("prompt_logprobs")
        ignore_eos = bool(body.get("ignore_eos", False))
        if logprobs_k is not None or prompt_k is not None or max_tokens <= SHORT_ANSWER_TOKENS:
            natural = max_tokens if ignore_eos else min(max_tokens, 16 + stable_hash("len", ids[:64], len(ids)) % 240)
            output = self.pseudo.greedy(ids, natural)
            if self.trap is not None and self.trap.garble:
                output = filler_ids(stable_hash("trap", ids[:64]), natural)
        else:
            natural = max_tokens if ignore_eos else min(max_tokens, 64 + stable_hash("len", ids[:64], len(ids)) % 960)
            output = filler_ids(stable_hash("filler", ids[:64], len(ids)), natural)
        finish = "length" if len(output) >= max_tokens else "stop"
        answer = Answer.new("cmpl", model, ids, output, finish)
        group, sink = self._submit(ids, output, finish, self._copies(request), body)
        return_ids = bool(body.get("return_token_ids"))
        if body.get("stream"):
            return await self._stream(request, answer, group, sink, chat=False, body=body)
        await self._finished(group, sink)
        lps = completion_logprobs(self.pseudo, answer, int(logprobs_k)) if logprobs_k is not None else None
        plps = prompt_logprobs(self.pseudo, ids, int(prompt_k)) if prompt_k is not None else None
        echo = TOKENIZER.decode(ids) if body.get("echo") else ""
        return web.json_response(self._kv_answer(
            completion_response(answer, logprobs=lps, prompt_lps=plps, return_token_ids=return_ids, echo_text=echo),
            body))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        model = self._check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("messages must be a non-empty list", param="messages")
        tools = body.get("tools") or None
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        front = self.frontend
        parser_ready = bool(front.tool_call_parser)
        if tools and tool_choice not in (None, "none"):
            if tool_choice == "auto" and not (front.enable_auto_tool_choice and parser_ready):
                raise ApiError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
            if tool_choice != "auto" and not parser_ready:
                described = f'function "{(tool_choice.get("function") or {}).get("name")}"' \
                    if isinstance(tool_choice, Mapping) else f'"{tool_choice}"'
                raise ApiError(f"tool_choice={described} requires --tool-call-parser to be set")
        try:
            rendered = render_chat(body)
        except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
            raise ApiError(f"The conversation cannot be rendered: {exc}") from exc
        ids = TOKENIZER.encode(rendered.prompt)
        max_tokens = self._max_tokens(body, len(ids), None)
        turn = respond(messages, tools, thinking=rendered.thinking, tool_choice=tool_choice)
        if self.trap is not None and self.trap.garble:
            turn = garble(turn, stable_hash(self.trap.name, ids[-32:]))
        output = build_chat_output(
            turn, thinking=rendered.thinking, max_tokens=max_tokens, ignore_eos=bool(body.get("ignore_eos", False)),
            reasoning_parser=bool(front.reasoning_parser), tool_parser=parser_ready and bool(tools)
            and tool_choice != "none", filler_seed=stable_hash("chat", ids[-64:]))
        answer = Answer.new("chatcmpl", model, ids, output.ids, output.finish_reason, chat=output)
        group, sink = self._submit(ids, output.ids, "length" if output.finish_reason == "length" else "stop",
                                   self._copies(request), body)
        if body.get("stream"):
            return await self._stream(request, answer, group, sink, chat=True, body=body)
        await self._finished(group, sink)
        prompt_text = rendered.prompt if body.get("return_prompt_text") else None
        lps = chat_logprobs(self.pseudo, answer, int(body.get("top_logprobs") or 0)) if body.get("logprobs") else None
        return web.json_response(self._kv_answer(
            chat_response(answer, prompt_text=prompt_text, logprobs=lps,
                          return_token_ids=bool(body.get("return_token_ids"))), body))

    async def _finished(self, group: Group, sink: StreamSink) -> None:
        try:
            while not sink.finished and sink.error is None:
                sink.event.clear()
                await sink.event.wait()
        except asyncio.CancelledError:
            self.node.abort(group)
            raise
        finally:
            self._sinks.discard(sink)
        if sink.error is not None:
            raise ApiError(sink.error, 500, "InternalServerError")

    async def _stream(self, request: web.Request, answer: Answer, group: Group, sink: StreamSink, *, chat: bool,
                      body: Mapping[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                            "Cache-Control": "no-cache"})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return_ids = bool(body.get("return_token_ids"))
        total = len(answer.ids)
        sent = 0
        try:
            await response.prepare(request)
            if chat:
                await response.write(chat_chunk(answer, {"role": "assistant", "content": ""}, None))
            while sent < total:
                sink.event.clear()
                if sink.error is None and sink.tokens <= sent:
                    await sink.event.wait()
                if sink.error is not None:
                    await response.write(error_chunk(sink.error))
                    break
                upto = min(sink.tokens, total)
                finish = answer.finish_reason if upto >= total else None
                if chat:
                    assert answer.chat is not None
                    delta = merge_deltas(answer.chat.deltas[sent:upto])
                    if delta or finish:
                        await response.write(chat_chunk(answer, delta, finish))
                else:
                    await response.write(completion_chunk(answer, "".join(answer.pieces[sent:upto]), finish,
                                                          list(answer.ids[sent:upto]) if return_ids else None))
                sent = upto
            if include_usage and sink.error is None:
                await response.write(usage_chunk(answer, chat=chat))
            await response.write(DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self.node.abort(group)
            raise
        finally:
            self._sinks.discard(sink)
        return response


def _token_ids(value: Any, param: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ApiError(f"{param} must be a string or a list of token ids", param=param)
    bad = next((t for t in value if t < 0 or t >= VOCAB_SIZE), None)
    if bad is not None:
        raise ApiError(f"Token id {bad} is out of vocabulary", param=param)
    return list(value)


def access_logger(vllm_log: VllmLog) -> type[AbstractAccessLogger]:
    """The aiohttp access-logger class that prints uvicorn's lines through ``vllm_log``."""
    return type("VllmAccessLog", (_AccessLog,), {"vllm_log": vllm_log})


def error_response(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, "InternalServerError", status), status=status)
