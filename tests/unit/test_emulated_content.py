"""What the emulated node says: tokenizer, competent responder, DSV4 parser shapes, numerics, truth, settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.engines.emulated import EmulatorSettings, SettingsError, Truth, Units, nominal_truth
from tuner.engines.emulated.dsv4_output import build_chat_output
from tuner.engines.emulated.pseudo_model import Numerics, PseudoModel
from tuner.engines.emulated.responder import garble, respond
from tuner.engines.emulated.tokenizer import TOKENIZER, VOCAB_SIZE
from tuner.perfmodel import EmulatedConfig

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]
POPULATION = [{"type": "function", "function": {
    "name": "lookup_population", "description": "Population of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@given(st.text(max_size=200))
def test_the_tokenizer_round_trips_any_text(text: str) -> None:
    ids = TOKENIZER.encode(text)
    assert all(0 <= i < VOCAB_SIZE for i in ids)
    assert TOKENIZER.decode(ids) == text


def test_special_tokens_are_single_ids_skipped_on_decode_and_added_tokens_stay() -> None:
    ids = TOKENIZER.encode("<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>x</think>")
    assert ids[0] == TOKENIZER.bos_id and len(ids) < 9
    assert TOKENIZER.decode(ids) == "Hi<think>x</think>"
    assert TOKENIZER.decode(ids, skip_special_tokens=False).startswith("<｜begin▁of▁sentence｜>")
    text = "The river bends twice before it reaches the old mill."
    assert len(text) / len(TOKENIZER.encode(text)) > 2.5  # about a BPE's characters per token


def test_tools_are_called_with_schema_valid_arguments_from_the_users_words() -> None:
    turn = respond([{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}], WEATHER,
                   thinking=False)
    assert [(c.name, dict(c.arguments)) for c in turn.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    turn = respond([{"role": "user", "content": "How many people live in Lyon?"}], [*WEATHER, *POPULATION],
                   thinking=True)
    assert turn.tool_calls[0].name == "lookup_population" and turn.reasoning
    assert respond([{"role": "user", "content": "Tell me a joke."}], WEATHER, thinking=False).tool_calls == ()


def test_answers_arithmetic_needles_and_tool_results() -> None:
    assert "42" in respond([{"role": "user", "content": "What is 17 + 25?"}], None, thinking=False).content
    assert "63" in respond([{"role": "user", "content": "Compute 9 times 7."}], None, thinking=True).content
    haystack = "The river bends. " * 50 + "Remember this: the pass code is 9163. " + "Snow fell. " * 50
    needle = respond([{"role": "user", "content": haystack + "\n\nWhat is the pass code? Reply with the code only."}],
                     None, thinking=False)
    assert needle.content == "9163"
    messages = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"forecast": "sunny", "high_c": 21}'}]
    answer = respond(messages, WEATHER, thinking=False)
    assert "sunny" in answer.content and "21" in answer.content and not answer.tool_calls


def test_garbled_answers_lose_numbers_and_tool_calls() -> None:
    turn = respond([{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}], WEATHER,
                   thinking=True)
    broken = garble(turn, 1)
    assert broken.tool_calls == () and "Paris" not in broken.content
    assert "42" not in garble(respond([{"role": "user", "content": "What is 17 + 25?"}], None, thinking=False),
                              2).content


def _chat(reasoning_parser: bool, tool_parser: bool, *, thinking: bool = True, max_tokens: int = 200) -> object:
    turn = respond([{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}], WEATHER,
                   thinking=thinking)
    return build_chat_output(turn, thinking=thinking, max_tokens=max_tokens, ignore_eos=False,
                             reasoning_parser=reasoning_parser, tool_parser=tool_parser, filler_seed=0)


def test_with_both_parsers_reasoning_is_split_and_the_call_parsed() -> None:
    out = _chat(True, True)
    assert out.finish_reason == "tool_calls" and out.content is None  # type: ignore[attr-defined]
    assert "get_weather" in out.reasoning and "</think>" not in out.reasoning  # type: ignore[attr-defined]
    call = out.tool_calls[0]  # type: ignore[attr-defined]
    assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    streamed = [d for d in out.deltas if d]  # type: ignore[attr-defined]
    assert "".join(d.get("reasoning", "") for d in streamed) == out.reasoning  # type: ignore[attr-defined]
    assert sum(1 for d in streamed if "tool_calls" in d) == 1
    assert not any("content" in d for d in streamed)


def test_without_parsers_everything_stays_raw_in_content() -> None:
    raw = _chat(False, False)
    assert raw.reasoning is None and raw.tool_calls == ()  # type: ignore[attr-defined]
    assert "</think>" in raw.content and "｜DSML｜" in raw.content  # type: ignore[attr-defined]
    no_tools = _chat(True, False)
    assert no_tools.reasoning and "｜DSML｜" in no_tools.content  # type: ignore[attr-defined]
    truncated = _chat(True, True, max_tokens=5)
    assert truncated.finish_reason == "length" and truncated.content is None  # type: ignore[attr-defined]


def test_same_numerics_agree_exactly_and_small_changes_drift_a_little() -> None:
    ids = TOKENIZER.encode("def read_config(path):\n    with open(path) as handle:\n        return handle.read()")
    ref = PseudoModel(Numerics())
    same = PseudoModel(Numerics())
    fp8 = PseudoModel(Numerics((("kv", "fp8", 0.015), ("moe", "fp8", 0.012))))
    trap = PseudoModel(Numerics((("trap", "humming-deepep-ll-scales", 1.0),)))
    positions = range(1, len(ids))
    assert [ref.logprob(ids[:p], ids[p]) for p in positions] == [same.logprob(ids[:p], ids[p]) for p in positions]
    small = [abs(ref.logprob(ids[:p], ids[p]) - fp8.logprob(ids[:p], ids[p])) for p in positions]
    large = [abs(ref.logprob(ids[:p], ids[p]) - trap.logprob(ids[:p], ids[p])) for p in positions]
    assert 0.003 < sum(small) / len(small) < 0.03 and max(small) < 0.15
    assert sum(large) / len(large) > 0.4
    assert ref.greedy(ids, 16) == same.greedy(ids, 16) != trap.greedy(ids, 16)


def test_the_truth_table_finds_traps_and_failures() -> None:
    truth = nominal_truth()
    trap = EmulatedConfig.from_options({"moe-backend": "humming", "all2all-backend": "deepep_low_latency",
                                        "data-parallel-size": 4, "enable-expert-parallel": True})
    fine = EmulatedConfig.from_options({"moe-backend": "humming", "data-parallel-size": 4,
                                        "enable-expert-parallel": True})
    assert truth.trap(trap) is not None and truth.trap(fine) is None
    hang = EmulatedConfig.from_options({"data-parallel-size": 2, "compilation-config": {"cudagraph_mode": "FULL"}})
    assert truth.failure(hang, "hang") is not None
    single = EmulatedConfig.from_options({"compilation-config": {"cudagraph_mode": "FULL"}})
    assert truth.failure(single, "hang") is None
    assert truth.failure(EmulatedConfig.from_options({"gpu-memory-utilization": 0.97}), "oom_under_load") is not None
    assert truth.failure(EmulatedConfig.from_options({"gpu-memory-utilization": 0.95}), "oom_under_load") is None
    numerics = truth.numerics(fine, "hopper")
    assert {c for c, _, _ in numerics.components} == {"moe"}  # bf16 KV (auto), TP 1: only the MoE precision moves


def test_a_truth_round_trips_through_json_and_refuses_unknown_options(tmp_path: Path) -> None:
    truth = nominal_truth().with_faults(["hang"])
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(truth.to_json()))
    assert Truth.load(path) == truth
    bad = {"failures": [{"kind": "hang", "when": {"moe-backed": ["humming"]}}]}
    with pytest.raises(ValueError, match="unknown option 'moe-backed'"):
        Truth.from_json(bad)


def test_settings_come_from_the_environment_and_refuse_nonsense() -> None:
    settings = EmulatorSettings.from_env({"DSV4_EMULATOR_HW": "h200x8", "DSV4_EMULATOR_TIME_SCALE": "50",
                                          "DSV4_EMULATOR_MULTIPLICITY": "16", "DSV4_EMULATOR_FAULT": "hang, trap"})
    assert (settings.hardware, settings.multiplicity, settings.faults) == ("h200x8", 16, ("hang", "trap"))
    assert settings.units == Units(time_scale=50.0, multiplicity=16, startup_time_scale=50.0)
    with pytest.raises(SettingsError, match="TIME_SCALE"):
        EmulatorSettings.from_env({"DSV4_EMULATOR_TIME_SCALE": "fast"})
    with pytest.raises(SettingsError, match="MULTIPLICITY"):
        EmulatorSettings.from_env({"DSV4_EMULATOR_MULTIPLICITY": "0"})


def test_the_node_resolves_its_checkpoint_and_truth_from_the_model_and_settings() -> None:
    from tuner.engines.emulated.cli import resolve_checkpoint, resolve_truth
    from tuner.search.profile import load_profile

    profile = load_profile("gh200x4")
    plain = EmulatorSettings()
    assert resolve_checkpoint(plain, "deepseek-ai/DeepSeek-V4-Flash", profile).name == "preview"
    assert resolve_checkpoint(plain, "canada-quant/DeepSeek-V4-Flash-W4A16-FP8-MTP", profile).name == "w4a16-fp8-mtp"
    assert resolve_checkpoint(plain, "my-local-copy", profile).name == "0731"  # the profile's
    assert resolve_truth(plain) == nominal_truth()
    seeded = resolve_truth(EmulatorSettings(truth_seed=5, faults=("oom_under_load",)))
    assert seeded.coefficients != nominal_truth().coefficients and seeded.seed == 5
    assert seeded.failure(EmulatedConfig(), "oom_under_load") is not None


def test_units_convert_client_measurements_to_the_node() -> None:
    units = Units(time_scale=20.0, multiplicity=43)
    assert units.node_seconds(0.5) == 10.0
    assert units.node_rate(100.0) == pytest.approx(215.0)
    assert units.client_streams(2752) == 64 and units.node_requests(64) == 2752
