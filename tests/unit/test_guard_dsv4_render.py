"""The DSV4 request shapes the gates and the trained fixture rely on, rendered by vLLM's own encoder.

No server here: these pin the exact prompt text for thinking off/on, tools, and a thinking-mode tool
round trip (reasoning carried), and check that the fixture's in-process rendering equals vLLM's
DeepseekV4Tokenizer.apply_chat_template.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.fixtures.trained_model import _encoding_module, render_prompt
from tuner.catalog import resolve
from tuner.guards import ReasoningSpec, load_spec
from tuner.guards.chat import assistant_echo, tool_result_message

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM not installed")

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def enc() -> ModuleType:
    return _encoding_module()


def test_thinking_off_renders_the_chat_layout(enc: ModuleType) -> None:
    text = render_prompt(enc, [{"role": "user", "content": "Say hello."}], [], thinking=False)
    assert text == f"{BOS}{USER}Say hello.{ASSISTANT}</think>"


def test_thinking_on_prepends_the_effort_block_and_opens_think(enc: ModuleType) -> None:
    text = render_prompt(enc, [{"role": "user", "content": "Say hello."}], [], thinking=True)
    assert text.startswith(f"{BOS}Reasoning Effort: Absolute maximum")
    assert text.endswith(f"{USER}Say hello.{ASSISTANT}<think>")


def test_tools_become_a_system_block_with_the_schema(enc: ModuleType) -> None:
    text = render_prompt(enc, [{"role": "user", "content": "Weather?"}], WEATHER, thinking=False)
    assert text.startswith(f"{BOS}\n\n## Tools")  # an empty system message carries them
    assert "### Available Tool Schemas" in text
    assert json.dumps({"name": "get_weather", "description": "Weather.",
                       "parameters": WEATHER[0]["function"]["parameters"]}) in text
    assert text.endswith(f"{USER}Weather?{ASSISTANT}</think>")


def test_thinking_tool_round_trip_keeps_the_reasoning(enc: ModuleType) -> None:
    parsed = {"content": None, "tool_calls": [{"id": "c1", "type": "function",
                                               "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    echo = assistant_echo(parsed, reasoning="Need the weather tool.")
    assert echo["reasoning_content"] == "Need the weather tool."
    messages = [{"role": "user", "content": "Weather?"}, echo, tool_result_message(echo, '{"sky": "grey"}')]
    text = render_prompt(enc, messages, WEATHER, thinking=True)
    dsml = ('Need the weather tool.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            f'</｜DSML｜tool_calls>{EOS}')
    assert f"{ASSISTANT}<think>{dsml}" in text or f"{ASSISTANT}</think>{dsml}" in text or dsml in text
    assert text.endswith(f'{USER}<tool_result>{{"sky": "grey"}}</tool_result>{ASSISTANT}<think>')


def test_dropping_the_reasoning_changes_the_prompt(enc: ModuleType) -> None:
    """What the reasoning gate detects: a client (or server) that loses reasoning renders differently."""
    parsed = {"tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": "{}"}}]}
    with_r = assistant_echo(parsed, reasoning="Secret plan.")
    without = assistant_echo(parsed, reasoning=None)
    kept = render_prompt(enc, [{"role": "user", "content": "x"}, with_r, tool_result_message(with_r, "1")], WEATHER,
                         thinking=True)
    lost = render_prompt(enc, [{"role": "user", "content": "x"}, without, tool_result_message(without, "1")], WEATHER,
                         thinking=True)
    assert "Secret plan." in kept and "Secret plan." not in lost


def _vllm_render(demo: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]], thinking: bool) -> str:
    from transformers import AutoTokenizer
    from vllm.tokenizers.deepseek_v4 import get_deepseek_v4_tokenizer

    tok = get_deepseek_v4_tokenizer(AutoTokenizer.from_pretrained(demo))
    conv = [{**m, "reasoning": m.pop("reasoning_content")} if "reasoning_content" in m else m
            for m in (dict(x) for x in messages)]
    tools_dumped = [{"type": "function", "function": {"name": t["function"]["name"],
                                                      "description": t["function"].get("description"),
                                                      "parameters": t["function"].get("parameters")}}
                    for t in tools]
    out = tok.apply_chat_template(conv, tools=tools_dumped or None, tokenize=False, thinking=thinking)
    assert isinstance(out, str)
    return out


def test_fixture_rendering_equals_vllm_tokenizer(enc: ModuleType) -> None:
    from tests.fixtures.trained_model import trained_fixture

    fixture = trained_fixture()
    spec = load_spec(resolve("guards", "reasoning"))
    assert isinstance(spec, ReasoningSpec)
    probe = spec.carry_probes[0]
    parsed = {"content": None, "tool_calls": [{"id": "c", "function": {"name": "lookup_population",
                                                                        "arguments": '{"city": "Lyon"}'}}]}
    echo = assistant_echo(parsed, reasoning="I need the lookup_population tool for Lyon.")
    for messages, thinking in (
        (list(probe.messages), True),
        ([*probe.messages, echo, tool_result_message(echo, "1")], True),
        (list(probe.messages), False),
    ):
        ours = render_prompt(enc, messages, probe.tools, thinking=thinking)
        assert ours == _vllm_render(fixture, messages, probe.tools, thinking)
