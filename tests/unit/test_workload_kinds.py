"""Workload kinds: lengths, shared prefixes, arrivals, agent sessions."""

from __future__ import annotations

import random
import statistics

import pytest
from pydantic import ValidationError

from tuner.load.agent import AgentSession, AgentTurnReply, make_tools, merge_tool_call_deltas, session_count
from tuner.load.workload import AgentSpec, Workload, arrival_gaps_s, make_prompts, make_warmup_prompts, prompt_at
from tuner.objective import load_objective

VOCAB = 4096


def test_prompt_stream_is_indexable_and_extends() -> None:
    w = Workload(input_len=20, output_len=5, range_ratio=0.5, num_prompts=10, seed=1)
    ten = make_prompts(w, VOCAB)
    assert make_prompts(w, VOCAB, count=20)[:10] == ten
    assert make_prompts(w, VOCAB, count=5, start=5) == ten[5:]
    assert prompt_at(w, VOCAB, 7) == ten[7]


def test_normal_lengths_center_on_the_mean_and_stay_in_bounds() -> None:
    w = Workload(input_len=100, output_len=50, range_ratio=0.3, length_distribution="normal", num_prompts=400)
    prompts = make_prompts(w, VOCAB)
    lens = [len(p.token_ids) for p in prompts]
    assert 90 < statistics.fmean(lens) < 110
    assert 20 < statistics.pstdev(lens) < 40
    assert all(1 <= n <= 200 for n in lens)


def test_shared_prefix_prompts_share_exactly_their_prefix() -> None:
    w = Workload(kind="shared_prefix", prefix_len=30, num_prefixes=3, input_len=10, num_prompts=9)
    prompts = make_prompts(w, VOCAB)
    assert all(len(p.token_ids) == 40 for p in prompts)
    heads = [p.token_ids[:30] for p in prompts]
    assert heads[0] == heads[3] == heads[6] and heads[1] == heads[4] and heads[0] != heads[1]
    assert len({p.token_ids[30:] for p in prompts}) == 9
    assert all(len(p.token_ids) == 10 for p in make_warmup_prompts(w.model_copy(update={"warmup_prompts": 2}),
                                                                      VOCAB))


def test_kind_and_fields_must_match() -> None:
    with pytest.raises(ValidationError, match="prefix_len > 0"):
        Workload(kind="shared_prefix")
    with pytest.raises(ValidationError, match="only used by kind shared_prefix"):
        Workload(prefix_len=5)
    with pytest.raises(ValidationError, match="only used by kind agent"):
        Workload(agent=AgentSpec())
    with pytest.raises(ValidationError):
        Workload.model_validate({"kind": "agent", "agent": {"turns": 2, "turnz": 3}})


def test_scaled_multiplies_every_length() -> None:
    w = load_objective("agent").workload
    small = w.scaled(1 / 32)
    assert small.output_len == 256 and small.agent is not None and w.agent is not None
    assert small.agent.context_len == round(w.agent.context_len / 32)
    assert small.agent.turns == w.agent.turns and small.concurrency == w.concurrency


def test_arrivals_poisson_bursts_and_unpaced() -> None:
    assert arrival_gaps_s(Workload(), 5, random.Random(0)) == [0.0] * 5
    poisson = arrival_gaps_s(Workload(request_rate=10.0), 4000, random.Random(0))
    assert poisson[0] == 0.0 and statistics.fmean(poisson[1:]) == pytest.approx(0.1, rel=0.1)
    burst = arrival_gaps_s(Workload(request_rate=10.0, burst_size=4), 4000, random.Random(0))
    assert all(g == 0.0 for i, g in enumerate(burst) if i % 4)  # four at each arrival
    assert statistics.fmean(burst[4::4]) == pytest.approx(0.4, rel=0.1)  # same mean rate
    bursty = arrival_gaps_s(Workload(request_rate=10.0, burstiness=0.25), 4000, random.Random(0))
    assert statistics.fmean(bursty[1:]) == pytest.approx(0.1, rel=0.15)
    assert statistics.pstdev(bursty[1:]) > 1.5 * statistics.pstdev(poisson[1:])
    half = arrival_gaps_s(Workload(request_rate=10.0), 4000, random.Random(0), rate_scale=0.5)
    assert statistics.fmean(half[1:]) == pytest.approx(0.2, rel=0.1)


def test_agent_session_grows_and_carries_reasoning_and_tool_calls() -> None:
    spec = AgentSpec(turns=3, system_len=40, tools=3, tool_schema_len=8, context_len=100, tool_result_len=20)
    w = Workload(kind="agent", output_len=16, agent=spec)
    a, b = AgentSession.create(w, 0, "m"), AgentSession.create(w, 1, "m")
    assert a.messages[0] == b.messages[0]  # the shared system prompt
    assert a.messages[1] != b.messages[1]  # each agent its own task
    body = a.body()
    assert body["tools"] == make_tools(spec, 0) and len(body["tools"]) == 3
    assert body["tool_choice"] == "auto" and body["chat_template_kwargs"] == {"thinking": True}
    assert body["reasoning_effort"] == "high" and body["max_tokens"] == 16 and body["stream"] is True
    a.add_reply(AgentTurnReply(content="ok", reasoning="hmm"), 0)
    assert [m["role"] for m in a.messages] == ["system", "user", "assistant", "user"]
    assert a.messages[2]["reasoning_content"] == "hmm"
    call = {"id": "call-1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    a.add_reply(AgentTurnReply(content="", reasoning="r", tool_calls=(call,)), 1)
    assert a.messages[-2]["tool_calls"] == [call] and a.messages[-1]["role"] == "tool"
    assert a.messages[-1]["tool_call_id"] == "call-1"
    assert len(str(a.body()["messages"])) > len(str(body["messages"]))
    omit = AgentSession.create(w.model_copy(update={"agent": spec.model_copy(update={"tool_choice": "omit",
                                                                                    "reasoning": False})}), 0, "m")
    assert "tools" not in omit.body() and "chat_template_kwargs" not in omit.body()
    assert session_count(w, 7) == 3


def test_tool_call_deltas_merge_by_index() -> None:
    calls: dict[int, dict[str, object]] = {}
    merge_tool_call_deltas(calls, [{"index": 0, "id": "c0", "function": {"name": "gr", "arguments": '{"pa'}}])
    merge_tool_call_deltas(calls, [{"index": 0, "function": {"name": "ep", "arguments": 'th": "a"}'}},
                                   {"index": 1, "id": "c1", "function": {"name": "ls"}}])
    merge_tool_call_deltas(calls, None)
    assert calls[0] == {"id": "c0", "type": "function", "function": {"name": "grep", "arguments": '{"path": "a"}'}}
    assert calls[1]["id"] == "c1"


def test_catalog_objectives_load() -> None:
    for name in ("agent", "agent-demo", "shared-prefix"):
        objective = load_objective(name)
        assert objective.workload.kind in ("agent", "shared_prefix")
