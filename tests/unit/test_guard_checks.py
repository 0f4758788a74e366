"""Pure checks behind the gates: tool-call parsing and schema, needle sizing, drift comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuner.guards.chat import call_problem, schema_problems
from tuner.guards.equivalence import ProbeRecording, _write, compare
from tuner.guards.http import ProbeFailure, message_reasoning
from tuner.guards.needle import Needle, NeedleSpec, fit_sentences, needle_messages
from tuner.guards.specs import ExpectedCall

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "unit": {"enum": ["C", "F"]}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
DSML = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'


def _msg(name: str = "get_weather", args: object = None, content: str | None = None) -> dict[str, object]:
    arguments = json.dumps({"city": "Paris", "days": 3} if args is None else args)
    return {"content": content, "tool_calls": [{"id": "c", "type": "function",
                                                "function": {"name": name, "arguments": arguments}}]}


@pytest.mark.parametrize(("value", "problem"), [
    ({"city": "Paris", "days": 3}, None),
    ({"city": "Paris"}, "$.days is required"),
    ({"city": "Paris", "days": "3"}, "$.days is str"),
    ({"city": "Paris", "days": True}, "$.days is bool"),
    ({"city": "Paris", "days": 3, "unit": "K"}, "not in enum"),
    ({"city": "Paris", "days": 3, "extra": 1}, "$.extra is not allowed"),
    ([1], "schema wants object"),
])
def test_schema_subset(value: object, problem: str | None) -> None:
    problems = schema_problems(value, SCHEMA)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_parsed_call_with_expected_arguments_passes() -> None:
    assert call_problem(_msg(), ExpectedCall(name="get_weather", arguments={"city": "Paris", "days": 3}),
                        TOOLS) is None


@pytest.mark.parametrize(("message", "needle"), [
    ({"content": DSML, "tool_calls": []}, "raw '｜DSML｜' markup left in content"),
    ({"content": "I cannot", "tool_calls": None}, "no tool call in the response"),
    (_msg(name="get_time"), "names 'get_time'"),
    ({"content": None, "tool_calls": [{"function": {"name": "get_weather", "arguments": "{city"}}]}, "not JSON"),
    (_msg(args={"city": "Paris"}), "break its schema"),
    (_msg(args={"city": "Lyon", "days": 3}), "expected {'city': 'Paris'"),
    (_msg(content="<｜DSML｜tool_calls>"), "beside the parsed call"),
])
def test_call_problems_say_what_is_wrong(message: dict[str, object], needle: str) -> None:
    problem = call_problem(message, ExpectedCall(name="get_weather", arguments={"city": "Paris", "days": 3}), TOOLS)
    assert problem is not None and needle in problem


def test_reasoning_is_read_under_either_name() -> None:
    assert message_reasoning({"reasoning": "r"}) == "r"
    assert message_reasoning({"reasoning_content": "rc", "reasoning": None}) == "rc"
    assert message_reasoning({"reasoning": "", "content": "x"}) is None


def _needle_spec() -> NeedleSpec:
    return NeedleSpec(kind="needle", context_tokens=100, needles=[Needle(depth=0.5, code="77")],
                      filler=["a b c.", "d e."], needle_template="code is {code}.", question="code?")


def test_needle_goes_in_at_its_depth() -> None:
    spec = _needle_spec()
    for depth, index in ((0.0, 0), (0.5, 5), (1.0, 10)):
        text = needle_messages(spec, Needle(depth=depth, code="9"), 10)[0]["content"]
        sentences = text.split("\n\n")[0].split(". ")
        assert sentences[index].startswith("code is 9"), (depth, sentences)


def test_fit_sentences_finds_the_largest_prompt_within_budget() -> None:
    spec = _needle_spec()

    def words(messages: list[dict[str, object]]) -> int:
        return len(str(messages[0]["content"]).split())

    for budget in (5, 40, 101, 1000):
        n, used = fit_sentences(spec, spec.needles[0], budget, words)
        assert used <= budget
        assert words(needle_messages(spec, spec.needles[0], n + 1)) > budget
    assert fit_sentences(spec, spec.needles[0], 2, words)[0] == 0  # even the bare question is too long


def _rec(name: str, completion: list[int], logprobs: list[float], top: list[dict[str, float]] | None = None,
         prompt: tuple[int, ...] = (1, 2, 3)) -> ProbeRecording:
    top = top if top is not None else [{} for _ in logprobs]
    return ProbeRecording(name, list(prompt), completion, logprobs, top)


def test_identical_recordings_have_zero_drift() -> None:
    base = [_rec("a", [7, 8], [-1.0, -2.0, -0.5, -0.1])]
    comp = compare(base, base, [base[0].logprobs])
    assert (comp.mean_drift_nats, comp.max_drift_nats, comp.scored_tokens, comp.greedy_diverged) == (0, 0, 4, [])


def test_drift_is_mean_and_max_of_absolute_differences() -> None:
    base = [_rec("a", [7], [-1.0, -2.0, -0.5])]
    comp = compare(base, base, [[-1.3, -2.0, -0.4]])
    assert comp.mean_drift_nats == pytest.approx(0.4 / 3, abs=1e-6)
    assert comp.max_drift_nats == pytest.approx(0.3)


def test_greedy_may_diverge_only_at_a_near_tie() -> None:
    # prompt (1,2,3), completion (7, 8): the completion's 2nd token is scored at logprobs index 3.
    top = [{}, {}, {"7": -0.1}, {"8": -0.70, "9": -0.72, "5": -3.0}]
    base = [_rec("a", [7, 8], [-1.0, -1.0, -0.1, -0.70], top)]
    near = compare([_rec("a", [7, 9], base[0].logprobs)], base, [base[0].logprobs])
    assert near.worst_tie_gap_nats == pytest.approx(0.02)
    far = compare([_rec("a", [7, 5], base[0].logprobs)], base, [base[0].logprobs])
    assert far.worst_tie_gap_nats == pytest.approx(2.3)
    unseen = compare([_rec("a", [7, 4], base[0].logprobs)], base, [base[0].logprobs])
    assert unseen.greedy_diverged[0]["gap_is_lower_bound"] is True
    assert unseen.worst_tie_gap_nats == pytest.approx(2.3) and unseen.outside_top_k == 1


def test_a_different_tokenization_is_refused() -> None:
    base = [_rec("a", [7], [-1.0, -1.0, -1.0])]
    with pytest.raises(ProbeFailure, match="tokenized the prompt differently"):
        compare([_rec("a", [7], [-1.0, -1.0, -1.0], prompt=(1, 2, 4))], base, [base[0].logprobs])


def test_exclusive_write_lets_the_first_writer_win(tmp_path: Path) -> None:
    path = tmp_path / "ref" / "r.json"
    assert _write(path, {"n": 1}, exclusive=True) is True
    assert _write(path, {"n": 2}, exclusive=True) is False
    assert json.loads(path.read_text()) == {"n": 1}
    assert _write(path, {"n": 3}) is True
    assert json.loads(path.read_text()) == {"n": 3}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp files left
    assert not any(name.startswith(".") for name in os.listdir(path.parent))
