"""A closed-loop benchmark (``vllm bench serve``, random ISL/OSL, ``2 × c`` prompts at concurrency ``c``) on
the independent truth, for many launches at once.

Per DP engine, in steady state:

- **admission**: ``max-num-seqs`` caps the running batch; the KV pool holds ``kv_tokens / (ISL + OSL/2 +
  block/2)`` sequences; past that vLLM preempts and recomputes, so the batch that runs is smaller than
  the pool (thrashing) and each preempted request prefills its context again;
- **the token budget**: decoding sequences take ``1 + drafts`` tokens each of ``max-num-batched-tokens``;
  what is left is the prefill chunk; a step carries a chunk as often as the prompts (and recomputes)
  need, and when they need more than every step can carry, prefill holds the batch down;
- **the run**: the steady rate over both waves (the second wave's prompts interleaved with decode), plus
  the first wave's prefill ramp (decode runs beside part of it) and the last wave's drain;
- **p95 TTFT**: the first wave's prefill ramp, plus, when requests queue for a slot, their wait
  (Little's law over the slots); **p95 ITL**: a step with a prefill chunk when more than one step in
  twenty carries one, else a decode step.

Noise grows with the running batch, with DP (engines out of step) and with speculation (acceptance
varies), and a few launches run slow (expert placement, clocks under the power cap): see :func:`noise`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.engines.emulated.independent.constants import Constants
from tuner.engines.emulated.independent.hardware import Node
from tuner.engines.emulated.independent.launch import Launches
from tuner.engines.emulated.independent.memory import Memory
from tuner.engines.emulated.independent.step import step_s, tokens_per_step

__all__ = ["Figures", "figures", "noise"]

_BLOCK = 256


@dataclass(frozen=True)
class Figures:
    output_tok_s: np.ndarray
    ttft_p95_ms: np.ndarray
    itl_p95_ms: np.ndarray
    running: np.ndarray
    """Sequences one engine runs at once."""
    preempting: np.ndarray


def figures(x: Launches, node: Node, k: Constants, mem: Memory, concurrency: np.ndarray, input_len: int,
            output_len: int) -> Figures:
    """What the benchmark at node ``concurrency`` (one value per launch) measures on each launch."""
    dp = x.dp.astype(np.float64)
    c = np.maximum(np.asarray(concurrency, dtype=np.float64) / dp, 1.0)
    context = input_len + output_len / 2.0 + _BLOCK / 2.0
    pool = np.maximum(mem.kv_tokens / context, 1.0)
    admitted = np.minimum(c, x.seqs)
    over = admitted / pool
    preempting = over > 1.0
    running = np.where(preempting, pool * (1.0 - k.preempt_thrash * np.minimum(over - 1.0, 1.0)), admitted)
    recompute = np.where(preempting, np.minimum(0.5 * (over - 1.0), 1.0), 0.0)
    tps = tokens_per_step(x, k)
    q = 1.0 + x.spec_k
    decoding = np.minimum(running, x.budget / q)
    chunk = np.maximum(x.budget - decoding * q, 0.05 * x.budget)
    # the first wave's prompts are the ramp; the second wave's, and every recompute, interleave with decode
    need = decoding * tps * (input_len / 2.0 + recompute * context) / output_len
    share = need / chunk
    bound = share > 1.0
    decoding = np.where(bound, decoding / share, decoding)
    share = np.minimum(share, 1.0)
    t_decode = step_s(x, node, k, decoding, np.zeros(len(x)), context)
    t_mixed = step_s(x, node, k, decoding, chunk, context)
    t_step = (1.0 - share) * t_decode + share * t_mixed
    per_engine = decoding * tps / t_step
    # the run: two waves, the first wave's prefill ramp, the drain of the last
    t_ramp = admitted * input_len / x.budget * step_s(x, node, k, decoding / 2.0, x.budget.astype(np.float64),
                                                      context)
    lifetime = output_len * t_step / tps
    t_run = 2.0 * c * output_len / per_engine + 0.7 * t_ramp + 0.15 * lifetime
    output = dp * 2.0 * c * output_len / t_run
    queued = np.maximum(c - running, 0.0)
    wait = np.where(queued / c > 0.05, 1.3 * lifetime * queued / np.maximum(running, 1.0), 0.0)
    ttft = 0.95 * t_ramp + wait
    itl = np.where(share > 0.05, t_mixed, t_decode)
    return Figures(output_tok_s=output, ttft_p95_ms=ttft * 1e3, itl_p95_ms=itl * 1e3, running=running,
                   preempting=preempting)


def noise(x: Launches, k: Constants, running: np.ndarray) -> np.ndarray:
    """Relative sd of a launch's measured throughput: it grows with load, DP and speculation."""
    dp = x.dp.astype(np.float64)
    return np.asarray(k.noise_floor + k.noise_load * np.sqrt(np.minimum(running * dp / 2048.0, 1.0))
                      + k.noise_dp * np.log2(dp) + np.where(x.spec_k > 0, k.noise_spec, 0.0))
