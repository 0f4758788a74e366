"""The emulated node's scheduler: vLLM v1's continuous batching in virtual time, with request multiplicity."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tuner.engines.emulated.kv_pool import KvPool, chain_hashes
from tuner.engines.emulated.scheduler import Group, Node
from tuner.perfmodel import NOMINAL, EmulatedConfig, node_model
from tuner.search.checkpoints import load_checkpoint
from tuner.search.profile import load_profile

DP2 = {"data-parallel-size": 2, "tensor-parallel-size": 2, "enable-expert-parallel": True,
       "kv-cache-dtype": "fp8", "block-size": 16, "max-model-len": 4096, "max-num-seqs": 64,
       "max-num-batched-tokens": 2048, "gpu-memory-utilization": 0.9}


class Counts:
    """An observer that keeps totals (the scheduler's metrics, summed over engines)."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = defaultdict(float)
        self.histograms: dict[str, float] = defaultdict(float)
        self.gauges: dict[tuple[int, str], float] = {}

    def count(self, engine: int, name: str, amount: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
        self.counters[name + "".join(f"{{{k}={v}}}" for k, v in labels)] += amount

    def observe(self, engine: int, name: str, value: float, weight: int) -> None:
        self.histograms[name] += weight

    def gauge(self, engine: int, name: str, value: float) -> None:
        self.gauges[(engine, name)] = value


class Sink:
    def __init__(self) -> None:
        self.tokens = 0
        self.finished_v: float | None = None
        self.first_v: float | None = None

    def emit(self, group: Group, tokens: int, t_v: float, finished: bool) -> None:
        self.first_v = t_v if self.first_v is None else self.first_v
        self.tokens += tokens
        if finished:
            self.finished_v = t_v


def make_node(options: dict[str, Any] | None = None, blocks: int = 4096, seed: int = 0) -> tuple[Node, Counts]:
    profile = load_profile("h200x8")
    config = EmulatedConfig.from_options({**DP2, **(options or {})})
    model = node_model(profile, config, load_checkpoint("0731"), NOMINAL)
    counts = Counts()
    return Node(model, blocks, counts, seed=seed), counts


def run(node: Node, until_idle: int = 100_000) -> None:
    t = node.now_v
    for _ in range(until_idle):
        step = node.plan(t)
        if step is None:
            upcoming = node.next_arrival_v()
            if upcoming is None:
                return
            t = upcoming
            continue
        node.apply(step)
        t = step.end_v
    raise AssertionError("the node never went idle")


def test_every_token_is_generated_and_every_block_returned() -> None:
    node, counts = make_node()
    sinks = [Sink() for _ in range(6)]
    for i, sink in enumerate(sinks):
        node.submit(Group(i, 3, prompt_len=100 + 50 * i, max_output=40, arrival_v=0.0, sink=sink))
    run(node)
    assert [s.tokens for s in sinks] == [40] * 6
    assert counts.counters["vllm:generation_tokens"] == 6 * 3 * 40
    assert counts.counters["vllm:prompt_tokens"] == 3 * sum(100 + 50 * i for i in range(6))
    assert counts.counters["vllm:request_success{finished_reason=length}"] == 18
    assert all(e.pool.used == 0 and not e.running and not e.waiting for e in node.engines)
    assert counts.histograms["vllm:time_to_first_token_seconds"] == 18


def test_multiplicity_counts_like_that_many_single_requests() -> None:
    grouped, g_counts = make_node()
    single, s_counts = make_node()
    grouped.submit(Group(0, 8, 200, 30, 0.0, sink=Sink()))
    for i in range(8):
        single.submit(Group(i, 1, 200, 30, 0.0, sink=Sink()))
    run(grouped)
    run(single)
    for name in ("vllm:generation_tokens", "vllm:prompt_tokens", "vllm:prefix_cache_queries"):
        assert g_counts.counters[name] == s_counts.counters[name]
    # one lock-step engine batch per step: eight requests in a group take as long as eight apart
    assert grouped.now_v == pytest.approx(single.now_v, rel=0.25)


def test_a_full_kv_cache_preempts_the_newest_request_and_recomputes_it() -> None:
    node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1}, blocks=60)
    sinks = [Sink() for _ in range(4)]
    for i, sink in enumerate(sinks):
        node.submit(Group(i, 1, prompt_len=160, max_output=200, arrival_v=0.0, sink=sink))
    run(node)
    assert counts.counters["vllm:num_preemptions"] >= 1
    assert [s.tokens for s in sinks] == [200] * 4  # preempted requests still finish, after recomputing
    assert node.engines[0].pool.used == 0


def test_partial_preemption_splits_a_group_and_keeps_its_stream() -> None:
    node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1}, blocks=70)
    sink = Sink()
    node.submit(Group(0, 6, prompt_len=80, max_output=120, arrival_v=0.0, sink=sink))
    run(node)
    assert 1 <= counts.counters["vllm:num_preemptions"] < 6 * 3
    assert sink.tokens == 120
    assert counts.counters["vllm:generation_tokens"] == 6 * 120


def test_the_prefix_cache_serves_a_shared_prefix_and_counts_hits() -> None:
    node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1})
    prefix = list(range(1000, 1000 + 320))
    first = [*prefix, *range(5000, 5050)]
    second = [*prefix, *range(6000, 6050)]
    node.submit(Group(0, 1, len(first), 4, 0.0, token_ids=first, sink=Sink()))
    run(node)
    node.submit(Group(1, 1, len(second), 4, node.now_v, token_ids=second, sink=Sink()))
    run(node)
    assert counts.counters["vllm:prefix_cache_hits"] == 320  # 20 full blocks of 16
    assert counts.counters["vllm:prefix_cache_queries"] == len(first) + len(second)


def test_distinct_prompts_never_hit_and_caching_off_never_hits() -> None:
    for caching in (True, False):
        node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1,
                                  "enable-prefix-caching": caching})
        for i in range(3):
            ids = list(range(2000 + 400 * i, 2400 + 400 * i))
            node.submit(Group(i, 2, len(ids), 3, 0.0, token_ids=ids, sink=Sink()))
        run(node)
        assert counts.counters["vllm:prefix_cache_hits"] == 0


def test_copies_admitted_apart_never_hit_each_others_blocks() -> None:
    # One seat: a stream of three copies is admitted a copy at a time, so the first copy keeps the
    # stream's token ids and the other two leave as split-off groups (uids -1, then -2) with content
    # of their own. They stand for distinct requests: none may hit another's blocks. CPython hashes
    # -1 and -2 alike (-1 is its error value), so keying that content by the bare uid gave both the
    # same chain and the third copy read the second's blocks (issue 27: refused random windows).
    node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1, "max-num-seqs": 1})
    ids = list(range(3000, 3000 + 400))
    sink = Sink()
    node.submit(Group(1, 3, len(ids), 5, 0.0, token_ids=ids, sink=sink))
    run(node)
    assert counts.counters["vllm:num_preemptions"] == 0
    assert counts.counters["vllm:prefix_cache_queries"] == 3 * len(ids)
    assert counts.counters["vllm:prefix_cache_hits"] == 0
    assert sink.tokens == 5 and not node.busy


def test_content_of_its_own_never_shares_a_block_across_uids() -> None:
    # The blocks a request computes beyond its token ids (or a split-off group's, which has none)
    # are its own: for any two uids, clients' (from 0 up) and split-off groups' (from -1 down).
    uids = range(-64, 64)
    firsts = {Group(uid, 1, 64, 1, 0.0).hash_at(0, 16) for uid in uids}
    lasts = {Group(uid, 1, 64, 1, 0.0).hash_at(3, 16) for uid in uids}
    assert len(firsts) == len(lasts) == len(uids)


def test_chunked_prefill_keeps_every_step_within_the_token_budget() -> None:
    node, _ = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1, "max-num-batched-tokens": 512,
                         "max-num-seqs": 16})
    for i in range(5):
        node.submit(Group(i, 2, 1500, 10, 0.0, sink=Sink()))
    t = 0.0
    biggest = 0
    while True:
        step = node.plan(t)
        if step is None:
            break
        biggest = max(biggest, *step.batched_tokens)
        node.apply(step)
        t = step.end_v
    assert 256 < biggest <= 512


def test_max_num_seqs_caps_the_running_batch() -> None:
    node, _ = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1, "max-num-seqs": 8})
    for i in range(5):
        node.submit(Group(i, 3, 50, 20, 0.0, sink=Sink()))
    t = 0.0
    peak = 0
    while (step := node.plan(t)) is not None:
        peak = max(peak, node.engines[0].running_reqs)
        node.apply(step)
        t = step.end_v
    assert peak == 8


def test_an_abort_frees_the_blocks_of_the_whole_stream() -> None:
    node, counts = make_node({"data-parallel-size": 1, "tensor-parallel-size": 1})
    group = Group(0, 4, 300, 500, 0.0, sink=Sink())
    node.submit(group)
    for _ in range(5):
        step = node.plan(node.now_v)
        assert step is not None
        node.apply(step)
    assert node.engines[0].pool.used > 0
    node.abort(group)
    assert node.engines[0].pool.used == 0 and not node.busy
    assert counts.counters["vllm:request_success{finished_reason=abort}"] == 4


def test_speculative_decoding_counts_drafts_and_emits_several_tokens_a_step() -> None:
    node, counts = make_node({"speculative-config": {"method": "dspark", "num_speculative_tokens": 3}})
    sink = Sink()
    node.submit(Group(0, 2, 64, 300, 0.0, sink=sink))
    run(node)
    drafts = counts.counters["vllm:spec_decode_num_drafts"]
    accepted = counts.counters["vllm:spec_decode_num_accepted_tokens"]
    assert counts.counters["vllm:spec_decode_num_draft_tokens"] == 3 * drafts
    # per-position acceptance 0.6: 0.6 + 0.36 + 0.216 = 1.18 accepted of 3 drafted per step
    assert 1.0 < accepted / drafts < 1.35
    assert drafts < 2 * 300 * 0.7  # fewer verification steps than tokens
    assert sink.tokens == 300


def test_dp_engines_share_the_load() -> None:
    node, _ = make_node()
    for i in range(8):
        node.submit(Group(i, 1, 100, 10, 0.0, sink=Sink()))
    assert [e.waiting_reqs for e in node.engines] == [4, 4]


def test_kv_pool_evicts_the_least_recently_freed_cached_block() -> None:
    pool = KvPool(4, 16, caching=True)
    hashes = chain_hashes(list(range(64)), 16)
    assert pool.allocate(4)
    for h in hashes:
        assert pool.publish(h)
    pool.release(0, hashes)  # all four cached and evictable
    assert pool.free == 4 and pool.lookup(hashes) == 4
    assert pool.allocate(1)  # evicts the oldest freed one: the first block
    assert pool.lookup(hashes) == 0 and pool.lookup(hashes[1:]) == 3
    assert not pool.allocate(4)
