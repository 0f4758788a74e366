"""A window's server counters against its workload (tuner/load/freshness.py), and the facts vLLM's map reads.

The real server's behaviour (fresh windows show no hits, a re-sent window does) is in
tests/integration/test_freshness.py; these are the rules on counters as vLLM writes them.
"""

from __future__ import annotations

from typing import Any

from tuner.engines.vllm.metrics import VLLM_METRICS
from tuner.load.freshness import PREFIX_HIT_TOLERANCE, check_window
from tuner.load.metrics import parse_prometheus
from tuner.objective import Workload

RANDOM = Workload(input_len=128, output_len=16, num_prompts=32)
SHARED = Workload(kind="shared_prefix", input_len=64, output_len=16, num_prompts=32, prefix_len=256, num_prefixes=2)


def _page(hits: float, queries: float, preemptions: float = 0.0, *, prefix: bool = True) -> dict[Any, float]:
    lines = [f"vllm:num_preemptions_total{{engine=\"0\"}} {preemptions}",
             f"vllm:prompt_tokens_total{{engine=\"0\"}} {queries}",
             "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5"]
    if prefix:
        lines += [f"vllm:prefix_cache_hits_total{{engine=\"0\"}} {hits}",
                  f"vllm:prefix_cache_queries_total{{engine=\"0\"}} {queries}"]
    return dict(parse_prometheus("\n".join(lines) + "\n"))


def _window(before: dict[Any, float], after: dict[Any, float]) -> dict[str, Any]:
    return VLLM_METRICS.window(before, after, [after])


def test_a_random_window_that_hit_the_prefix_cache_is_refused_with_the_figures() -> None:
    server = _window(_page(0, 4096), _page(3968, 8192))  # what the README's demo showed on its 2nd repeat
    assert server["facts"]["prefix_cache_hits"] == 3968 and server["facts"]["prefix_cache_queries"] == 4096
    check = check_window(RANDOM, server)
    assert not check.ok
    assert "3968 of 4096 prompt tokens" in check.refused[0] and "'random'" in check.refused[0]


def test_a_fresh_random_window_passes_and_the_tolerance_is_tiny() -> None:
    assert check_window(RANDOM, _window(_page(0, 0), _page(0, 4096))).ok
    allowed = PREFIX_HIT_TOLERANCE * 100_000
    assert check_window(RANDOM, _window(_page(0, 0), _page(allowed, 100_000))).ok
    assert not check_window(RANDOM, _window(_page(0, 0), _page(allowed + 32, 100_000))).ok  # one block more


def test_a_workload_that_declares_shared_prefixes_expects_hits() -> None:
    assert check_window(SHARED, _window(_page(0, 0), _page(6000, 8192))).ok
    agent = Workload(kind="agent", input_len=64, output_len=16, num_prompts=8)
    assert check_window(agent, _window(_page(0, 0), _page(6000, 8192))).ok


def test_counters_not_reported_flag_the_window_instead_of_passing_it_silently() -> None:
    off = check_window(RANDOM, _window(_page(0, 0, prefix=False), _page(0, 4096, prefix=False)))
    assert off.ok and any("no prefix-cache counters" in f for f in off.flags)
    assert _window(_page(0, 0, prefix=False), _page(0, 4096, prefix=False))["facts"]["prefix_cache_hits"] is None
    none = check_window(RANDOM, {"counters": {}})
    assert none.ok and any("unverified" in f for f in none.flags)
    assert check_window(RANDOM, {}, stopped=True).flags == ()


def test_preemptions_are_flagged_with_the_peak_kv_use() -> None:
    check = check_window(RANDOM, _window(_page(0, 0), _page(0, 4096, preemptions=3)))
    assert check.ok and check.flags == ("3 preemptions: the KV cache ran out (peak use 50%), so the window "
                                        "includes recomputation",)


def test_hits_of_preempted_requests_reading_back_their_blocks_are_flagged_not_refused() -> None:
    # At the KV knee vLLM preempts; a preempted request admitted again finds the blocks it computed still in
    # the prefix cache (seen on the emulated gh200x4 node: 15,616 of 5.6 M prompt tokens after preemptions).
    after = _page(15_616, 5_603_216, preemptions=29)
    check = check_window(RANDOM, _window(_page(0, 0), after))
    assert check.ok, check
    assert any("after 29 preemptions" in f for f in check.flags)
    # Without a preemption the same hits are prompts sent twice: refused.
    assert not check_window(RANDOM, _window(_page(0, 0), _page(15_616, 5_603_216))).ok
