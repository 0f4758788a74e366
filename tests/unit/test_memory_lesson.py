"""What an out-of-memory teaches: its neighbours that need as much with no more room, and nothing else.

The fault night (tests/faults/test_vllm_night.py) makes its OOM with the CPU build's KV space
(``VLLM_CPU_KVCACHE_SPACE=99999``, an env lever). The lesson once read the flags only, so it pruned the
night's next three baselines, each with a 1 GiB KV space and more max-num-seqs, as "needs at least as much".
"""

from __future__ import annotations

from tuner.search.feasibility import lesson_from_oom, memory_args
from tuner.search.space import ServeConfig

ARGS = {"max-num-seqs": 4, "kv-cache-dtype": "auto"}


def _config(seqs: int, kv_space: str | None) -> ServeConfig:
    env = {"VLLM_CPU_KVCACHE_SPACE": kv_space} if kv_space is not None else {}
    return ServeConfig(args={**ARGS, "max-num-seqs": seqs}, env=env)


def test_a_kv_space_that_failed_teaches_nothing_about_another() -> None:
    lesson = lesson_from_oom(memory_args(_config(4, "99999")), during="start", trial=1)
    assert not lesson.covers(memory_args(_config(8, "1")))
    assert lesson.covers(memory_args(_config(8, "99999")))   # the same pool, hungrier: pruned
    assert not lesson.covers(memory_args(_config(8, None)))  # the engine's default pool is another pool


def test_without_pool_variables_the_flags_decide_as_before() -> None:
    lesson = lesson_from_oom(memory_args(_config(8, None)), during="start", trial=0)
    assert lesson.covers(memory_args(_config(16, None))) and not lesson.covers(memory_args(_config(4, None)))
