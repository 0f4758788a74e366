"""The emulated node end to end on loopback: started like vLLM, answering like vLLM, failing like vLLM.

One server runs as a real subprocess (``python -m tuner.engines.emulated serve …``) for the module;
the failure cases and the other configurations are forked from this process after vLLM's parser has
been imported here once (a fresh interpreter spends ~8 s importing vLLM; a fork spends nothing), and
run the same ``main`` with the same argv. Every wait polls a condition under a generous deadline.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tuner.engines.emulated import cli as emulator_cli
from tuner.engines.emulated.vllm_cli import build_parser
from tuner.engines.process import free_port
from tuner.engines.vllm.logs import kv_tokens_from_log
from tuner.load.stream import Stream, take_line
from tuner.perfmodel import NOMINAL, EmulatedConfig, capacity
from tuner.search.checkpoints import load_checkpoint
from tuner.search.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"
KEY = "sk-emulated-test"
DEADLINE_S = 90.0
PARSERS = ["--tokenizer-mode", "deepseek_v4", "--reasoning-parser", "deepseek_v4", "--tool-call-parser",
           "deepseek_v4", "--enable-auto-tool-choice"]
BASE = ["--kv-cache-dtype", "fp8", "--block-size", "256", "--max-model-len", "32768", "--trust-remote-code"]
DP4_EP = ["--data-parallel-size", "4", "--enable-expert-parallel", "--gpu-memory-utilization", "0.95",
          "--max-num-seqs", "256", "--max-num-batched-tokens", "8192"]
FAST = {"DSV4_EMULATOR_HW": "gh200x4", "DSV4_EMULATOR_TIME_SCALE": "200", "DSV4_EMULATOR_STARTUP_TIME_SCALE": "20000"}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]


def poll(condition: Callable[[], Any], what: str, deadline_s: float = DEADLINE_S) -> Any:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what} after {deadline_s:.0f} s")


@dataclass
class Launched:
    """One emulated server: its port, log, and process (a subprocess or a forked child)."""

    port: int
    log: Path
    pid: int
    exitcode: Callable[[], int | None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self) -> None:
        def up() -> bool:
            if self.exitcode() is not None:
                raise AssertionError(f"server exited ({self.exitcode()}) before ready:\n{self.text()[-3000:]}")
            return self.ready()
        poll(up, f"/health on port {self.port}")

    def wait_exit(self) -> int:
        return int(poll(lambda: self.exitcode() is not None and [self.exitcode()], "the server to exit")[0])

    def stop(self) -> None:
        if self.exitcode() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                poll(lambda: self.exitcode() is not None, "SIGTERM to stop the server", 20.0)
            except AssertionError:
                os.killpg(self.pid, signal.SIGKILL)


def _child(argv: list[str], env: Mapping[str, str], log: str) -> None:
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(env)
    try:
        code = emulator_cli.main(["serve", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    os._exit(code)


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Launched]]:
    """Start an emulated server as a fork of this process (vLLM's parser already imported here)."""
    build_parser()  # import vLLM's parser once, before any fork
    ctx = multiprocessing.get_context("fork")
    started: list[Launched] = []

    def start(argv: list[str], env: Mapping[str, str] | None = None, *, port: bool = True) -> Launched:
        where = tmp_path_factory.mktemp("emulated")
        number = free_port() if port else 0
        full = [MODEL, *argv, *(["--port", str(number)] if port else [])]
        proc = ctx.Process(target=_child, args=(full, {**FAST, **(env or {})}, str(where / "server.log")))
        proc.start()
        assert proc.pid is not None
        launched = Launched(number, where / "server.log", proc.pid, lambda: proc.exitcode)
        started.append(launched)
        return launched

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """The module's main server: a real ``python -m tuner.engines.emulated serve`` subprocess, DP4 + EP."""
    where = tmp_path_factory.mktemp("emulated-main")
    port = free_port()
    log = where / "server.log"
    env = {**os.environ, **FAST, "DSV4_EMULATOR_MULTIPLICITY": "4", "VLLM_API_KEY": KEY}
    argv = [sys.executable, "-m", "tuner.engines.emulated", "serve", MODEL, *BASE, *DP4_EP, *PARSERS,
            "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                                env=env, start_new_session=True)
    server = Launched(port, log, proc.pid, proc.poll)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def scrape(server: Launched) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from tuner.load.metrics import parse_prometheus

    return parse_prometheus(httpx.get(server.url + "/metrics", timeout=10).text)


def total(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items() if n == name and all((k, v2) in lab for k, v2 in labels.items()))


# ----------------------------------------------------------------------------------------------- failures
def test_an_illegal_flag_ends_the_start_as_vllms_parser_does(fork_server: Callable[..., Launched]) -> None:
    bad_type = fork_server(["--max-num-seqs", "many"], port=False)
    assert bad_type.wait_exit() == 2
    assert "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'" in bad_type.text()
    no_parser = fork_server(["--enable-auto-tool-choice"], port=False)
    assert no_parser.wait_exit() == 1
    assert "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser" in no_parser.text()
    small_budget = fork_server(["--max-num-seqs", "1024", "--max-num-batched-tokens", "512"], port=False)
    assert small_budget.wait_exit() == 1
    assert "must be greater than or equal to max_num_seqs" in small_budget.text()


def test_weights_that_do_not_fit_end_the_start_out_of_memory(fork_server: Callable[..., Launched]) -> None:
    """DP4 without EP replicates the ~160 GB of weights on every 96 GB GH200."""
    server = fork_server([*BASE, "--data-parallel-size", "4"])
    assert server.wait_exit() == 1
    log = server.text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in log
    assert "RuntimeError: Engine core initialization failed" in log
    assert "Application startup complete" not in log and "GPU KV cache size" not in log


def test_a_kv_cache_smaller_than_max_model_len_ends_the_start(fork_server: Callable[..., Launched]) -> None:
    argv = ["--kv-cache-dtype", "fp8", "--block-size", "256", "--data-parallel-size", "4",
            "--enable-expert-parallel", "--gpu-memory-utilization", "0.80"]
    config = EmulatedConfig.from_options({"data-parallel-size": 4, "enable-expert-parallel": True,
                                          "gpu-memory-utilization": 0.8, "kv-cache-dtype": "fp8", "block-size": 256})
    cap = capacity(load_profile("gh200x4"), config, load_checkpoint("0731"), NOMINAL)
    assert 0 < cap.kv_tokens < config.max_model_len  # the model says so: the native 1M context does not fit
    server = fork_server(argv)
    assert server.wait_exit() == 1
    assert "ValueError: To serve at least one request with the model's max seq len (1048576)" in server.text()


def test_a_hang_in_graph_capture_never_becomes_ready(fork_server: Callable[..., Launched]) -> None:
    server = fork_server([*BASE, "--tensor-parallel-size", "2", "--data-parallel-size", "2",
                          "--enable-expert-parallel", "--compilation-config", '{"cudagraph_mode": "FULL"}'])
    poll(lambda: server.text().count("No available shared memory broadcast block") >= 2, "the hang's heartbeat")
    assert server.exitcode() is None and not server.ready()
    log = server.text()
    progress = [ln for ln in log.splitlines() if "Capturing CUDA graphs" in ln]
    assert progress and "100%" not in progress[-1]
    assert "Application startup complete" not in log
    server.stop()
    assert server.exitcode() == 0


def test_utilization_097_dies_out_of_memory_under_load(fork_server: Callable[..., Launched]) -> None:
    argv = [*BASE, "--data-parallel-size", "4", "--enable-expert-parallel", "--gpu-memory-utilization", "0.97"]
    server = fork_server(argv)
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        small = client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(200, 400)), "max_tokens": 4})
        assert small.status_code == 200  # a small batch fits
        try:
            big = client.post("/v1/completions", json={"model": MODEL, "prompt": list(range(200, 6200)),
                                                       "max_tokens": 4})
            assert big.status_code == 500
        except httpx.HTTPError:
            pass  # the server may be gone before it answers
    assert server.wait_exit() == 1
    log = server.text()
    assert "EngineCore encountered a fatal error." in log and "torch.OutOfMemoryError" in log


def _teacher_forced(url: str, ids: list[int], headers: dict[str, str] | None = None) -> list[float]:
    body = httpx.post(url + "/v1/completions", headers=headers or {}, timeout=30,
                      json={"model": MODEL, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 3}).json()
    entries = body["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    return [entries[i][str(t)]["logprob"] for i, t in enumerate(ids) if i]


def _chat(url: str, content: str, headers: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    response = httpx.post(url + "/v1/chat/completions", headers=headers or {}, timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": content}],
                                "max_tokens": 64, **extra})
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def test_numerics_drift_little_for_another_moe_backend_and_far_for_a_trap(
        node: Launched, fork_server: Callable[..., Launched]) -> None:
    humming = fork_server([*BASE, *DP4_EP, *PARSERS, "--moe-backend", "humming"])
    trap = fork_server([*BASE, *DP4_EP, *PARSERS, "--moe-backend", "humming", "--all2all-backend",
                        "deepep_low_latency"])
    humming.wait_ready()
    trap.wait_ready()
    ids = httpx.post(node.url + "/tokenize", json={"prompt": "The committee met on Tuesday to review the budget."},
                     timeout=10).json()["tokens"]
    reference = _teacher_forced(node.url, ids, auth())
    assert _teacher_forced(node.url, ids, auth()) == reference  # the same launch agrees with itself
    small = [abs(a - b) for a, b in zip(reference, _teacher_forced(humming.url, ids), strict=True)]
    large = [abs(a - b) for a, b in zip(reference, _teacher_forced(trap.url, ids), strict=True)]
    assert sum(small) / len(small) < 0.02 < sum(large) / len(large)
    assert "42" in (_chat(humming.url, "What is 17 + 25?")["content"] or "")
    assert "42" not in (_chat(trap.url, "What is 17 + 25?")["content"] or "")
    called = _chat(trap.url, "What is the weather in Paris for the next 3 days?", tools=WEATHER, tool_choice="auto")
    assert not called.get("tool_calls")


def test_without_parser_flags_tools_are_refused_and_output_stays_raw(fork_server: Callable[..., Launched]) -> None:
    server = fork_server([*BASE, "--tensor-parallel-size", "4", "--enable-expert-parallel",
                          "--tokenizer-mode", "deepseek_v4"])
    server.wait_ready()
    refused = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}],
        "tools": WEATHER, "tool_choice": "auto"})
    assert refused.status_code == 400
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser' in \
        refused.json()["error"]["message"]
    raw = _chat(server.url, "What is the weather in Paris for the next 3 days?", tools=WEATHER, tool_choice="none",
                chat_template_kwargs={"thinking": False})
    assert not raw.get("tool_calls") and "<｜DSML｜invoke name=\"get_weather\">" in raw["content"]
    thought = _chat(server.url, "What is 17 + 25?")
    assert thought["reasoning"] is None and "</think>" in thought["content"]


# ---------------------------------------------------------------------------------------- the main node
def test_the_start_up_log_states_the_kv_capacity_of_every_engine(node: Launched) -> None:
    config = EmulatedConfig.from_options({"data-parallel-size": 4, "enable-expert-parallel": True,
                                          "gpu-memory-utilization": 0.95, "max-num-seqs": 256,
                                          "kv-cache-dtype": "fp8", "block-size": 256, "max-model-len": 32768})
    tokens = capacity(load_profile("gh200x4"), config, load_checkpoint("0731"), NOMINAL).kv_tokens
    log = node.text()
    lines = [ln for ln in log.splitlines() if "GPU KV cache size:" in ln]
    assert len(lines) == 4 and all(f"EngineCore_DP{i}" in lines[i] for i in range(4))
    assert f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for 32,768 tokens per request: " \
           f"{tokens / 32768:.2f}x" in lines[0]
    assert kv_tokens_from_log(log) == tokens  # what the tuner's KV refit reads
    for stage in ("Loading weights took", "torch.compile took", "Graph capturing finished",
                  "Starting vLLM server on http://127.0.0.1", "Application startup complete."):
        assert stage in log
    assert KEY not in log  # non-default args are logged with the key redacted, as vLLM does


def test_routes_answer_as_vllms_do_and_v1_needs_the_key(node: Launched) -> None:
    assert httpx.get(node.url + "/health", timeout=10).status_code == 200
    refused = httpx.get(node.url + "/v1/models", timeout=10)
    assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"})
    models = httpx.get(node.url + "/v1/models", headers=auth(), timeout=10).json()["data"]
    assert [(m["id"], m["max_model_len"], m["owned_by"]) for m in models] == [(MODEL, 32768, "vllm")]
    assert httpx.get(node.url + "/version", timeout=10).json()["version"]
    units = httpx.get(node.url + "/emulator", timeout=10).json()["units"]
    assert units == {"time_scale": 200.0, "multiplicity": 4, "startup_time_scale": 20000.0}
    samples = scrape(node)
    assert {dict(lab)["engine"] for (n, lab) in samples if n == "vllm:kv_cache_usage_perc"} == {"0", "1", "2", "3"}
    missing = httpx.post(node.url + "/v1/completions", headers=auth(), timeout=10,
                         json={"model": "other", "prompt": "hi"})
    assert missing.status_code == 404 and "The model `other` does not exist." in missing.json()["error"]["message"]


def test_tokenize_and_detokenize(node: Launched) -> None:
    text = "Hello, DeepSeek-V4! 1 + 1 = 2."
    ids = httpx.post(node.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=10).json()
    assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] == 32768
    back = httpx.post(node.url + "/detokenize", json={"tokens": ids["tokens"]}, timeout=10).json()
    assert back["prompt"] == text
    chat = httpx.post(node.url + "/tokenize", timeout=10, json={
        "messages": [{"role": "user", "content": "Say hello."}], "chat_template_kwargs": {"thinking": False}}).json()
    rendered = httpx.post(node.url + "/detokenize", json={"tokens": chat["tokens"]}, timeout=10).json()["prompt"]
    assert rendered.endswith("Say hello.</think>")  # DSV4's chat rendering, specials skipped


async def _stream_three(url: str) -> list[Stream]:
    async def one(client: httpx.AsyncClient, offset: int) -> Stream:
        stream = Stream()
        body = {"model": MODEL, "prompt": list(range(1000 + offset, 1300 + offset)), "max_tokens": 20,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=body, headers=auth()) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                take_line(line, stream)
        return stream

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return list(await asyncio.gather(*(one(client, 1000 * i) for i in range(3))))


def test_streams_at_multiplicity_four_move_the_counters_four_times(node: Launched) -> None:
    before = scrape(node)
    streams = asyncio.run(_stream_three(node.url))
    after = scrape(node)
    assert all(s.done and s.usage_output_tokens == 20 and s.usage_prompt_tokens == 300 for s in streams)
    assert all(len(s.chunk_t) == 20 for s in streams)  # one chunk per step, one token per chunk

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("vllm:generation_tokens_total") == 3 * 4 * 20
    assert delta("vllm:prompt_tokens_total") == 3 * 4 * 300
    assert delta("vllm:request_success_total", finished_reason="length") == 12
    assert delta("vllm:time_to_first_token_seconds_count") == 12
    assert delta("vllm:inter_token_latency_seconds_count") == 12 * 19
    assert delta("vllm:prefix_cache_queries_total") == 3 * 4 * 300 and delta("vllm:prefix_cache_hits_total") == 0
    assert delta("vllm:e2e_request_latency_seconds_sum") > 0


def test_chat_answers_in_dsv4_parser_shapes(node: Launched) -> None:
    reply = _chat(node.url, "What is the weather in Paris for the next 3 days?", auth(), tools=WEATHER,
                  tool_choice="auto", chat_template_kwargs={"thinking": False})
    call = reply["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert reply["content"] is None
    thought = _chat(node.url, "What is 17 + 25?", auth())
    assert "42" in thought["content"] and thought["reasoning"] and "</think>" not in thought["content"]
    scored = httpx.post(node.url + "/v1/chat/completions", headers=auth(), timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "logprobs": True, "top_logprobs": 2}).json()["choices"][0]["logprobs"]["content"]
    assert scored and all(entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 2 for entry in scored)
    follow_up = httpx.post(node.url + "/v1/chat/completions", headers=auth(), timeout=30, json={
        "model": MODEL, "max_tokens": 64, "chat_template_kwargs": {"thinking": False}, "return_prompt_text": True,
        "tools": WEATHER, "tool_choice": "auto",
        "messages": [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"},
                     {"role": "assistant", "content": "", "reasoning_content": "I need the forecast.",
                      "tool_calls": [{"id": call["id"], "type": "function", "function": call["function"]}]},
                     {"role": "tool", "tool_call_id": call["id"], "content": '{"forecast": "sunny", "high_c": 21}'}]})
    body = follow_up.json()
    assert "sunny" in body["choices"][0]["message"]["content"]
    assert "<tool_result>" in body["prompt_text"]


def test_a_streamed_chat_carries_reasoning_and_tool_calls_in_deltas(node: Launched) -> None:
    for content, extra in (("What is 17 + 25?", {}),
                           ("What is the weather in Paris for the next 3 days?", {"tools": WEATHER,
                                                                                  "tool_choice": "auto"})):
        stream = Stream(chat=True, keep_text=True)
        with httpx.stream("POST", node.url + "/v1/chat/completions", headers=auth(), timeout=30, json={
                "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 96,
                "stream": True, **extra}) as response:
            for line in response.iter_lines():
                take_line(line, stream)
        assert stream.done and stream.reasoning
        if "tools" in extra:
            assert stream.tool_calls[0]["function"]["name"] == "get_weather" and not "".join(stream.content)
        else:
            assert "42" in "".join(stream.content)
