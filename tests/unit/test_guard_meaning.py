"""The shipped probes judge structure and meaning, not wording (issue 14, finding 3).

A scripted server answers the shipped probes (``guards/tool_call.yaml``, ``guards/reasoning.yaml``)
the way a competent chat model served correctly does, in several wordings, none of them the trained
fixture's: DeepSeek-V4-style reasoning, markdown, thousands separators, a different sentence. Every
wording must pass. Wrong meaning (a wrong sum, a call for the wrong city, the tool result ignored) and
broken serving (markup left in content, no reasoning split, an answer cut at max_tokens) must fail.

Before issue 14 the probes required the fixture's own sentences ("17 plus 25 makes 42.", "I need the
lookup_population tool for Lyon.") word for word, so every wording here failed them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tuner.guards import GuardTarget, load_suite

Answer = dict[str, Any]


class Competent:
    """Answers the shipped probes from what they ask (the user's words, the tool result), in one wording."""

    def __init__(self, wording: dict[str, Any]) -> None:
        self.w = wording

    def __call__(self, body: dict[str, Any]) -> Answer:
        messages = body["messages"]
        last = messages[-1]
        thinking = (body.get("chat_template_kwargs") or {}).get("thinking", True)
        if last["role"] == "tool":
            result = json.loads(last["content"])
            text = self.w["population_answer"] if "population" in result else self.w["weather_answer"]
            return {"content": text, "reasoning": self.w["after_tool_reasoning"] if thinking else None}
        user = last["content"]
        if body.get("tools"):
            name = body["tools"][0]["function"]["name"]
            args = {"city": "Paris", "days": 3} if "Paris" in user else {"city": self.w["lyon"]}
            call = {"id": "call_x1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            return {"content": self.w.get("beside_call"), "tool_calls": [call],
                    "reasoning": self.w["call_reasoning"] if thinking else None}
        return {"content": self.w["sum_answer"], "reasoning": self.w["sum_reasoning"]}


WORDINGS: dict[str, dict[str, Any]] = {
    "dsv4-markdown": {
        "sum_reasoning": "We need to compute 17 + 25. 17 + 25 = 42. So the answer is 42.",
        "sum_answer": "17 + 25 = **42**",
        "call_reasoning": "The user asks for Lyon's population and wants the tool used. lookup_population takes a "
                          "city, so call it with Lyon.",
        "lyon": "Lyon",
        "after_tool_reasoning": "The tool says 522250. Give that number.",
        "population_answer": "According to the tool, **Lyon** has a population of **522,250** people.",
        "weather_answer": "Here is the forecast for Paris over the next 3 days: ☀️ **Sunny**, highs around 21 °C.",
    },
    "terse": {
        "sum_reasoning": "Adding the units: 7 + 5 = 12, carry 1; tens 1 + 2 + 1 = 4. Result 42.",
        "sum_answer": "42",
        "call_reasoning": "Need current data: use lookup_population.",
        "lyon": "Lyon, France",
        "after_tool_reasoning": "Result received.",
        "population_answer": "About 522 250 people live in Lyon.",
        "weather_answer": "Sunny all three days.",
    },
    "words": {
        "sum_reasoning": "Seventeen and twenty-five: that is forty-two.",
        "sum_answer": "The sum is forty-two.",
        "call_reasoning": "I should not guess a population; the lookup tool will know.",
        "lyon": "lyon",
        "after_tool_reasoning": "Now I can answer.",
        "population_answer": "Lyon's population is 522250 according to the lookup.",
        "weather_answer": "Expect a high of 21°C in Paris, with clear skies.",
        "beside_call": "Let me check.",
    },
}
BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "wrong sum": ({"sum_answer": "17 + 25 = 41"}, "does not state 42"),
    "wrong city": ({"lyon": "Paris"}, "does not carry 'Lyon'"),
    "tool result ignored": ({"population_answer": "Lyon is a large city in France."}, "states none of the tool"),
    "think markup left": ({"sum_answer": "</think>42"}, "raw '</think>' markup left in content"),
    "DSML left beside the call": ({"beside_call": "<｜DSML｜tool_calls>"}, "raw '｜DSML｜' markup"),
    "empty answer": ({"sum_answer": ""}, "has no content"),
}


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[dict[str, Any]], Answer]], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(model: Callable[[dict[str, Any]], Answer]) -> str:
        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message = {"role": "assistant", **model(body)}
                finish = message.pop("finish_reason", None) or ("tool_calls" if message.get("tool_calls") else "stop")
                if body.get("stream"):
                    self._stream(message, finish)
                    return
                out: dict[str, Any] = {"choices": [{"message": message, "finish_reason": finish}]}
                if body.get("return_prompt_text"):  # the server renders the reasoning it was sent back
                    out["prompt_text"] = json.dumps(body["messages"], ensure_ascii=False)
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, message: dict[str, Any], finish: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                deltas: list[dict[str, Any]] = [{"role": "assistant"}]
                deltas += [{"reasoning": w + " "} for w in (message.get("reasoning") or "").split(" ")]
                deltas += [{"content": c} for c in (message.get("content") or "")]
                for i, call in enumerate(message.get("tool_calls") or []):
                    deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {
                        "name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]})
                for delta in deltas:
                    self.wfile.write(f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode())
                end = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 20}}
                self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _run(url: str, tmp_path: Path) -> dict[str, Any]:
    suite = load_suite(["tool_call", "reasoning"])
    target = GuardTarget(base_url=url, headers={}, model="m", trial_dir=tmp_path / "t", study_dir=tmp_path,
                         params={}, args={}, is_speculative=False)
    report = suite.run(target)
    return {r.name: r for r in report.results}


@pytest.mark.parametrize("wording", sorted(WORDINGS))
def test_a_competent_model_passes_the_shipped_probes_in_its_own_words(
        wording: str, serve: Callable[[Callable[[dict[str, Any]], Answer]], str], tmp_path: Path) -> None:
    results = _run(serve(Competent(WORDINGS[wording])), tmp_path)
    for result in results.values():
        assert result.passed, f"{wording}: {result.name}: {result.detail}"


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_wrong_meaning_or_broken_serving_fails(case: str, serve: Callable[[Callable[[dict[str, Any]], Answer]], str],
                                               tmp_path: Path) -> None:
    change, why = BROKEN[case]
    results = _run(serve(Competent({**WORDINGS["dsv4-markdown"], **change})), tmp_path)
    failed = [r for r in results.values() if not r.passed]
    assert failed, f"{case}: every gate passed"
    assert any(why in r.detail for r in failed), [r.detail for r in failed]


def test_an_answer_cut_at_max_tokens_says_so(serve: Callable[[Callable[[dict[str, Any]], Answer]], str],
                                             tmp_path: Path) -> None:
    def thinking_forever(body: dict[str, Any]) -> Answer:
        return {"content": None, "reasoning": "Let me think about this very carefully " * 50, "finish_reason": "length"}

    results = _run(serve(thinking_forever), tmp_path)
    assert "has no content (cut at max_tokens: raise the probe's max_tokens)" in results["reasoning"].detail


@pytest.mark.parametrize(("text", "value", "stated"), [
    ("17 + 25 = **42**", 42, True), ("It comes to forty-two.", 42, True), ("\\boxed{42}", 42, True),
    ("522,250 people", 522250, True), ("522 250 people", 522250, True), ("522250.", 522250, True),
    ("17 + 25 = 41", 42, False), ("420", 42, False), ("4.2", 42, False), ("about 522,000", 522250, False),
])
def test_numbers_are_read_whatever_their_format(text: str, value: float, stated: bool) -> None:
    from tuner.guards.chat import numbers_in, states_number

    assert states_number(text, value) is stated, sorted(numbers_in(text))
