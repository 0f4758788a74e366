"""The gates against a scripted OpenAI-style HTTP server: exact request shapes, pass and fail paths.

The server is a real socket server in a thread (no mocks of httpx), so timeouts, the API key header
and error bodies travel as they do against vLLM.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tuner.guards import (
    EquivalenceGuard,
    EquivalenceProbe,
    EquivalenceSpec,
    EquivalenceThresholds,
    ExpectedCall,
    GuardResult,
    GuardTarget,
    ReasoningCarryProbe,
    ReasoningGuard,
    ReasoningSpec,
    ReasoningSplitProbe,
    Suite,
    ToolCallGuard,
    ToolCallProbe,
    ToolCallSpec,
    ToolRoundTrip,
)

Handler = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
KEY = "sk-test-key"


class _Server:
    def __init__(self) -> None:
        self.handler: Handler = lambda path, body: (404, {})
        self.requests: list[tuple[str, dict[str, Any], str | None]] = []


@pytest.fixture
def fake() -> Iterator[tuple[_Server, str]]:
    state = _Server()

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append((self.path, body, self.headers.get("Authorization")))
            code, out = state.handler(self.path, body)
            if body.get("stream") and code == 200:
                self._stream(out.get("sse") or _as_sse(out["choices"][0]["message"]))
                return
            data = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _as_sse(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A correct stream of ``message``: content in 3-character deltas, each call as name then argument pieces."""
    def event(delta: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta}]}

    events = [event({"role": "assistant"})]
    thought = message.get("reasoning") or ""
    events += [event({"reasoning": thought[i:i + 5]}) for i in range(0, len(thought), 5)]
    text = message.get("content") or ""
    events += [event({"content": text[i:i + 3]}) for i in range(0, len(text), 3)]
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        events.append(event({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": fn["name"], "arguments": ""}}]}))
        args = fn["arguments"]
        events += [event({"tool_calls": [{"index": index, "function": {"arguments": args[i:i + 4]}}]})
                   for i in range(0, len(args), 4)]
    return events


def _target(base_url: str, tmp_path: Path, *, speculative: bool = False, control: str | None = None,
            trial: str = "t0", args: dict[str, Any] | None = None) -> GuardTarget:
    return GuardTarget(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, model="m",
                       trial_dir=tmp_path / "trials" / trial, study_dir=tmp_path, params={},
                       args=args or {}, is_speculative=speculative, control_key=control)


def _chat(message: dict[str, Any], **extra: Any) -> tuple[int, dict[str, Any]]:
    return 200, {"choices": [{"message": {"role": "assistant", **message}}], **extra}


CALL = {"content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
TOOL_SPEC = ToolCallSpec(kind="tool_call", timeout_s=5, probes=[ToolCallProbe(
    name="w", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
    expect_call=ExpectedCall(name="get_weather", arguments={"city": "Oslo"}),
    round_trip=ToolRoundTrip(tool_result='{"sky": "grey"}', expect_content_contains="grey"))])


def test_tool_call_round_trip_passes_and_sends_the_dsv4_shapes(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake

    def handler(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["messages"][-1]["role"] == "tool":
            return _chat({"content": "It is grey in Oslo."})
        return _chat(CALL)

    state.handler = handler
    result = ToolCallGuard("tool_call", TOOL_SPEC).run(_target(url, tmp_path))
    assert result.passed, result.detail
    chats = [r for r in state.requests if r[0] != "/tokenize"]  # each turn's prompt is counted first
    (p1, first, auth), (_, second, _), (_, streamed, _) = chats
    # the same probe, streamed (with usage, to tell an answer cut at max_tokens), after the round trip
    assert streamed == {**first, "stream": True, "stream_options": {"include_usage": True}}
    assert result.evidence["probes"][0]["streamed_response"]["tool_calls"] == [
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert p1 == "/v1/chat/completions" and auth == f"Bearer {KEY}"
    assert first["tools"] == TOOLS and first["tool_choice"] == "auto" and first["temperature"] == 0.0
    assert first["chat_template_kwargs"] == {"thinking": False, "enable_thinking": False}
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "grey"}'}


def test_tool_call_fails_on_raw_dsml_and_on_a_refusal(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    state.handler = lambda p, b: _chat({"content": "<｜DSML｜tool_calls>…", "tool_calls": []})
    raw = ToolCallGuard("tool_call", TOOL_SPEC).run(_target(url, tmp_path))
    assert not raw.passed and "raw '｜DSML｜' markup left in content" in raw.detail
    msg = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    state.handler = lambda p, b: (400, {"error": {"message": msg}})
    refused = ToolCallGuard("tool_call", TOOL_SPEC).run(_target(url, tmp_path))
    assert not refused.passed and "HTTP 400" in refused.detail and "--tool-call-parser" in refused.detail


def test_a_tool_call_broken_only_when_streamed_fails(fake: tuple[_Server, str], tmp_path: Path) -> None:
    """The streaming parser's own failure: the non-streamed call parses, the streamed one leaks DSML."""
    state, url = fake
    leaked = [{"choices": [{"index": 0, "delta": {"content": piece}}]}
              for piece in ("<｜DSML｜invoke name=", '"get_weather">', "Oslo</｜DSML｜invoke>")]

    def handler(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("stream"):
            return 200, {"sse": leaked}
        if body["messages"][-1]["role"] == "tool":
            return _chat({"content": "It is grey in Oslo."})
        return _chat(CALL)

    state.handler = handler
    result = ToolCallGuard("tool_call", TOOL_SPEC).run(_target(url, tmp_path))
    assert not result.passed
    assert "streamed: raw '｜DSML｜' markup left in content" in result.detail
    # arguments that differ between the two paths fail too
    other = {**CALL, "tool_calls": [{**CALL["tool_calls"][0],  # type: ignore[index]
                                     "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}}]}

    def differing(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("stream"):
            return 200, {"sse": _as_sse(other)}
        return handler(path, body)

    state.handler = differing
    spec = TOOL_SPEC.model_copy(update={"probes": [TOOL_SPEC.probes[0].model_copy(
        update={"expect_call": ExpectedCall(name="get_weather")})]})
    result = ToolCallGuard("tool_call", spec).run(_target(url, tmp_path))
    assert not result.passed and "differs from the non-streamed call" in result.detail
    # and with stream: false the streamed path is not probed at all
    off = ToolCallGuard("tool_call", TOOL_SPEC.model_copy(update={"stream": False})).run(_target(url, tmp_path))
    assert off.passed, off.detail


REASONING_SPEC = ReasoningSpec(
    kind="reasoning", timeout_s=5,
    split_probes=[ReasoningSplitProbe(name="s", messages=[{"role": "user", "content": "2+2?"}],
                                      expect_reasoning_contains="two and two", expect_content_contains="4")],
    carry_probes=[ReasoningCarryProbe(
        name="c", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
        expect_reasoning_contains="call get_weather", expect_call=ExpectedCall(name="get_weather"),
        round_trip=ToolRoundTrip(tool_result="grey", expect_content_contains="grey"))])


def _reasoning_server(state: _Server, *, split_ok: bool = True, carry_renders: bool = True) -> None:
    def handler(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        last = body["messages"][-1]
        if last["role"] == "tool":
            carried = body["messages"][-2].get("reasoning_content", "")
            text = f"…<think>{carried}</think>…" if carry_renders else "…<think></think>…"
            return _chat({"content": "grey", "reasoning": None}, prompt_text=text)
        if body.get("tools"):
            return _chat({**CALL, "reasoning": "I should call get_weather."})
        if split_ok:
            return _chat({"content": "4", "reasoning": "two and two make four"})
        return _chat({"content": "two and two make four</think>4", "reasoning": None})

    state.handler = handler


def test_reasoning_split_and_carry_pass(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    _reasoning_server(state)
    result = ReasoningGuard("reasoning", REASONING_SPEC).run(_target(url, tmp_path))
    assert result.passed, result.detail
    follow = state.requests[-1][1]
    assert follow["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True}
    assert follow["return_prompt_text"] is True
    assert follow["messages"][-2]["reasoning_content"] == "I should call get_weather."
    assert result.evidence["probes"][0]["streamed_response"] == {"reasoning": "two and two make four",
                                                                 "content": "4"}


def test_reasoning_split_only_when_not_streamed_fails(fake: tuple[_Server, str], tmp_path: Path) -> None:
    """The streaming reasoning parser's own failure: all of the text arrives as content, markup and all."""
    state, url = fake
    _reasoning_server(state)
    split_ok = state.handler

    def handler(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("stream"):
            return 200, {"sse": _as_sse({"content": "two and two make four</think>4"})}
        return split_ok(path, body)

    state.handler = handler
    result = ReasoningGuard("reasoning", REASONING_SPEC).run(_target(url, tmp_path))
    assert not result.passed and "s: streamed: no reasoning field in the response" in result.detail
    assert result.evidence["probes"][0]["response"]["reasoning"] == "two and two make four"
    streamed_requests = [body for _, body, _ in state.requests if body.get("stream")]
    assert len(streamed_requests) == 1
    assert streamed_requests[0]["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True}


def test_reasoning_fails_when_unsplit_or_not_carried(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    _reasoning_server(state, split_ok=False)
    unsplit = ReasoningGuard("reasoning", REASONING_SPEC).run(_target(url, tmp_path))
    assert not unsplit.passed and "no reasoning field" in unsplit.detail and "'</think>'" in unsplit.detail
    _reasoning_server(state, carry_renders=False)
    dropped = ReasoningGuard("reasoning", REASONING_SPEC).run(_target(url, tmp_path))
    assert not dropped.passed and "missing from the next prompt" in dropped.detail


class _Model:
    """A scripted model for /tokenize and /v1/completions: logprob of token t is ``-t/10 + shift``."""

    def __init__(self, shift: float = 0.0, greedy: tuple[int, ...] = (5, 6)) -> None:
        self.shift = shift
        self.greedy = greedy

    def __call__(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/tokenize":
            return 200, {"tokens": [1, 2, 3]}
        if body.get("prompt_logprobs"):
            seq = body["prompt"]
            entries: list[Any] = [None] + [{str(t): {"logprob": -t / 10 + self.shift, "rank": 1},
                                            "9": {"logprob": -t / 10 - 0.01, "rank": 2}} for t in seq[1:]]
            return 200, {"choices": [{"text": "", "prompt_logprobs": entries}]}
        return 200, {"choices": [{"text": "x", "token_ids": list(self.greedy)}]}


EQ_SPEC = EquivalenceSpec(kind="equivalence", timeout_s=5, probes=[EquivalenceProbe(name="p", prompt="abc")],
                          thresholds=EquivalenceThresholds(max_mean_drift_nats=0.05, max_token_drift_nats=0.2,
                                                           max_tie_gap_nats=0.05),
                          reference_requires={"kv-cache-dtype": [None, "auto"]})


def test_equivalence_records_then_compares_then_flags_drift(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    guard = EquivalenceGuard("equivalence", EQ_SPEC)
    state.handler = _Model()
    untrusted = guard.run(_target(url, tmp_path, args={"kv-cache-dtype": "fp8"}))
    assert not untrusted.passed and "--kv-cache-dtype='fp8' is not the reference numerics" in untrusted.detail
    first = guard.run(_target(url, tmp_path, trial="t1"))
    assert first.passed and "recorded the study's reference" in first.detail
    assert guard.reference_path(tmp_path).is_file()
    same = guard.run(_target(url, tmp_path, trial="t2"))
    assert same.passed and same.evidence["vs_reference"]["max_drift_nats"] == 0
    state.handler = _Model(shift=0.3)
    drifted = guard.run(_target(url, tmp_path, trial="t3"))
    assert not drifted.passed and "mean drift 0.3000" in drifted.detail


def test_speculative_trial_is_also_held_to_its_control(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    guard = EquivalenceGuard("equivalence", EQ_SPEC)
    state.handler = _Model()
    assert guard.run(_target(url, tmp_path, trial="ref")).passed
    ctl_dir = tmp_path / "trials" / "ctl"
    ctl_dir.mkdir(parents=True)
    (ctl_dir / "config.json").write_text(json.dumps({"key": "ctlkey"}))
    state.handler = _Model(shift=0.03)  # the control drifted a little from the reference, within tolerance
    assert guard.run(_target(url, tmp_path, trial="ctl")).passed
    assert guard.config_path(tmp_path, "ctlkey").is_file()
    state.handler = _Model(shift=0.03, greedy=(5, 7))  # speculation changed the greedy output: no near-tie
    spec = guard.run(_target(url, tmp_path, trial="spec", speculative=True, control="ctlkey"))
    assert not spec.passed
    assert "vs control" in spec.detail and "greedy output left the baseline" in spec.detail
    assert spec.evidence["control"] == str(guard.config_path(tmp_path, "ctlkey"))


def test_suite_contains_a_crashing_guard_and_gates_the_reference(fake: tuple[_Server, str], tmp_path: Path) -> None:
    state, url = fake
    state.handler = _Model()

    class Boom:
        name, kind = "boom", "test"

        def run(self, target: GuardTarget) -> GuardResult:
            raise RuntimeError("kaput")

    eq = EquivalenceGuard("equivalence", EQ_SPEC)
    report = Suite([eq, Boom()]).run(_target(url, tmp_path))
    assert [r.name for r in report.results] == ["boom", "equivalence"]
    assert not report.passed and "boom: guard raised RuntimeError: kaput" in report.reason
    assert "an earlier gate of this trial failed" in report.results[1].detail
    assert not eq.reference_path(tmp_path).exists()
    assert "elapsed_s" in report.results[0].evidence
    json.dumps(report.to_json())  # guards.json must serialize


def test_the_reference_is_recorded_under_the_profiles_own_numerics(fake: tuple[_Server, str], tmp_path: Path) -> None:
    """Issue 14, finding 1: on gh200x4 (FP8 KV fixed) the recipe baseline records the reference; before, the
    shipped ``reference_requires: {kv-cache-dtype: [null, auto]}`` refused every trial of every DSV4 profile."""
    from tuner.guards import load_suite
    from tuner.search.profile import load_profile, reference_requires

    state, url = fake
    state.handler = _Model()
    policy = reference_requires(load_profile("gh200x4"))
    assert policy["kv-cache-dtype"] == ["fp8"] and policy["moe-backend"] == ["auto", None]
    suite = load_suite(["equivalence"], reference_requires=policy, reference_source="hardware profile gh200x4")
    guard = suite.guards[0]  # type: ignore[attr-defined]
    baseline = {"kv-cache-dtype": "fp8", "moe-backend": "auto", "all2all-backend": "allgather_reducescatter"}
    humming = {**baseline, "moe-backend": "humming"}
    early = guard.run(_target(url, tmp_path, trial="t0", args=humming))
    assert not early.passed
    assert "--moe-backend='humming' is not the reference numerics' 'auto' (or unset)" in early.detail
    assert "hardware profile gh200x4" in early.detail and "recipe baselines first" in early.detail
    assert "let a trusted baseline (no speculation) run first" not in early.detail  # the old, wrong hint
    recorded = guard.run(_target(url, tmp_path, trial="t1", args=baseline))
    assert recorded.passed and "recorded the study's reference" in recorded.detail
    compared = guard.run(_target(url, tmp_path, trial="t2", args=humming))  # another MoE backend: compared
    assert compared.passed and compared.evidence["vs_reference"]["mean_drift_nats"] == 0


def test_a_guard_file_that_sets_reference_requires_wins_over_the_profile(tmp_path: Path) -> None:
    from tuner.guards import load_suite

    path = tmp_path / "eq.yaml"
    path.write_text("kind: equivalence\nprobes: [{name: a, prompt: hi}]\n"
                    "reference_requires: {kv-cache-dtype: [fp8_e5m2]}\n"
                    "thresholds: {max_mean_drift_nats: 0.1, max_token_drift_nats: 1, max_tie_gap_nats: 0.1}\n")
    suite = load_suite([str(path)], reference_requires={"kv-cache-dtype": ["fp8"]})
    assert suite.guards[0].spec.reference_requires == {"kv-cache-dtype": ["fp8_e5m2"]}  # type: ignore[attr-defined]


def test_max_tokens_is_cut_to_the_room_the_prompt_leaves(fake: tuple[_Server, str], tmp_path: Path) -> None:
    """A thinking probe asks 4,096 tokens; on a 2,048-token launch vLLM refused it with HTTP 400 ("max_tokens=4096
    cannot be greater than max_model_len=2048"), so the gate failed on a correct server. Now the prompt is counted
    with the server's /tokenize and max_tokens cut to what the context has left."""
    from tuner.guards.http import GuardClient

    state, url = fake

    def handler(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/tokenize":
            return 200, {"count": 300, "max_model_len": 2048, "tokens": [1] * 300}
        return _chat({"content": "42"})

    state.handler = handler
    with GuardClient(_target(url, tmp_path), 10) as client:
        client.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4096,
                     "chat_template_kwargs": {"thinking": True}})
        client.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})
    (p0, counted, _), (_, sent, _), (_, _, _), (_, small, _) = state.requests
    assert p0 == "/tokenize" and counted["add_generation_prompt"] is True
    assert counted["chat_template_kwargs"] == {"thinking": True} and "max_tokens" not in counted
    assert sent["max_tokens"] == 2048 - 300 and small["max_tokens"] == 16
