"""What a benchmark of a workload on a launch would measure: :func:`predict`.

The predictor runs the benchmark the load generator (and ``vllm bench serve``) would run, in virtual
time and without a server: ``concurrency`` clients send ``num_prompts`` random prompts of the
workload's lengths (a closed loop: a client sends its next prompt when its last one finishes; or
paced at ``request_rate`` under the same concurrency cap), through the same scheduler and step-time
model the emulated server uses. So the server and the predictor cannot disagree by construction; the
server only adds the real clock. Numbers are those of ``vllm bench serve``: output throughput over
the benchmark's duration (first send to last token), TTFT per request, ITL per streamed chunk.

Clients are grouped (``multiplicity``: one simulated stream stands for that many identical requests,
as in the server) to keep a prediction near a second; the default picks about 48 streams per engine.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tuner.engines.emulated._deps import Checkpoint, HardwareProfile, load_checkpoint
from tuner.engines.emulated.scheduler import Group, Node
from tuner.perfmodel.capacity import Capacity, capacity, node_model
from tuner.perfmodel.coefficients import NOMINAL, Coefficients
from tuner.perfmodel.serve_config import EmulatedConfig
from tuner.perfmodel.step import EngineBatch, StepTime, step_time

__all__ = ["BenchmarkShape", "Prediction", "WorkloadLike", "predict", "shape_of"]


class WorkloadLike(Protocol):
    """The fields of a :class:`tuner.load.workload.Workload` the predictor reads."""

    input_len: int
    output_len: int
    range_ratio: float
    concurrency: int
    num_prompts: int
    request_rate: float | None


@dataclass(frozen=True)
class BenchmarkShape:
    """A random-length benchmark: lengths (mean, ± ratio), concurrency, prompts, optional pacing."""

    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    range_ratio: float = 0.0
    request_rate: float | None = None
    prefix_len: int = 0
    num_prefixes: int = 1


def shape_of(workload: WorkloadLike | BenchmarkShape) -> BenchmarkShape:
    if isinstance(workload, BenchmarkShape):
        return workload
    return BenchmarkShape(input_len=int(workload.input_len), output_len=int(workload.output_len),
                          concurrency=int(workload.concurrency), num_prompts=int(workload.num_prompts),
                          range_ratio=float(workload.range_ratio), request_rate=workload.request_rate,
                          prefix_len=int(getattr(workload, "prefix_len", 0) or 0),
                          num_prefixes=int(getattr(workload, "num_prefixes", 1) or 1))


@dataclass(frozen=True)
class Prediction:
    """One benchmark's figures, in node units (virtual seconds, virtual requests)."""

    output_tok_s: float
    total_tok_s: float
    request_per_s: float
    duration_s: float
    completed: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    itl_p99_ms: float
    tpot_mean_ms: float
    e2e_p50_ms: float
    kv_usage_mean: float
    kv_usage_max: float
    running_mean: float
    preemptions: int
    max_concurrency: int
    """Requests of the workload's longest ISL+OSL the KV caches hold at once, over all engines
    (capped by max-num-seqs per engine): where throughput should stop growing (the KV knee)."""
    kv_tokens_per_rank: int
    decode_step: StepTime
    """A full decode step at the predicted running batch (for the breakdown)."""
    multiplicity: int

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "decode_step"}
        out["decode_step_ms"] = self.decode_step.as_ms()
        return out


class _Collector:
    """The predictor's observer: counters summed, a few histograms kept as weighted samples."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = defaultdict(float)
        self.kv_usage: list[float] = []
        self.running: list[float] = []

    def count(self, engine: int, name: str, amount: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
        self.counters[name] += amount

    def observe(self, engine: int, name: str, value: float, weight: int) -> None:
        return None

    def gauge(self, engine: int, name: str, value: float) -> None:
        return None


class _Stream:
    """One client stream: what it sees of its request (the group carrying its sink)."""

    __slots__ = ("client", "first_v", "gaps", "last_v", "multiplicity", "sent_v", "tokens")

    def __init__(self, client: _Client, sent_v: float, multiplicity: int) -> None:
        self.client = client
        self.sent_v = sent_v
        self.multiplicity = multiplicity
        self.first_v = -1.0
        self.last_v = -1.0
        self.gaps: list[float] = []
        self.tokens = 0

    def emit(self, group: Group, tokens: int, t_v: float, finished: bool) -> None:
        self.tokens += tokens
        if self.first_v < 0:
            self.first_v = t_v
        else:
            self.gaps.append(t_v - self.last_v)
        self.last_v = t_v
        if finished:
            self.client.finished(self, t_v)


class _Client:
    """Closed-loop (or paced) clients of the benchmark, as the load generator runs them."""

    def __init__(self, node: Node, shape: BenchmarkShape, multiplicity: int, rng: random.Random,
                 block_size: int) -> None:
        self.node = node
        self.shape = shape
        self.m = multiplicity
        self.rng = rng
        self.block_size = block_size
        self.groups_total = max(1, math.ceil(shape.num_prompts / multiplicity))
        self.slots = max(1, math.ceil(shape.concurrency / multiplicity))
        self.sent = 0
        self.in_flight = 0
        self.done: list[_Stream] = []
        self.pending: list[float] = []  # paced arrivals not yet sent (virtual times)
        self.next_uid = 0
        if shape.request_rate:
            t = 0.0
            rate_groups = shape.request_rate / multiplicity
            for _ in range(self.groups_total):
                heapq.heappush(self.pending, t)
                t += rng.expovariate(rate_groups)
        else:
            self.pending = [0.0] * self.groups_total

    def _length(self, mean: int) -> int:
        r = self.shape.range_ratio
        if r <= 0:
            return max(1, mean)
        return max(1, self.rng.randint(math.floor(mean * (1 - r)), math.ceil(mean * (1 + r))))

    def release(self, now_v: float) -> None:
        """Send every due prompt a free slot allows."""
        while self.pending and self.pending[0] <= now_v and self.in_flight < self.slots:
            heapq.heappop(self.pending)
            self._send(now_v)

    def next_due_v(self) -> float | None:
        return self.pending[0] if self.pending and self.in_flight < self.slots else None

    def _send(self, now_v: float) -> None:
        shape = self.shape
        prompt_len = self._length(shape.input_len) + shape.prefix_len
        output_len = self._length(shape.output_len)
        m = self.m
        prefix: list[int] = []
        if shape.prefix_len:
            which = self.sent % max(1, shape.num_prefixes)
            parent = 0
            for i in range(shape.prefix_len // self.block_size):
                parent = hash((parent, "prefix", which, i))
                prefix.append(parent)
        stream = _Stream(self, now_v, m)
        group = Group(self.next_uid, m, prompt_len, output_len, now_v, prompt_hashes=prefix, sink=stream)
        self.next_uid += 1
        self.sent += 1
        self.in_flight += 1
        self.node.submit(group)

    def finished(self, stream: _Stream, t_v: float) -> None:
        self.in_flight -= 1
        self.done.append(stream)
        self.release(t_v)


def _percentiles(values: list[float] | np.ndarray, weights: list[int] | np.ndarray,
                 points: tuple[float, ...]) -> list[float]:
    """Weighted percentiles (nearest rank) of ``values``; NaN without samples."""
    vals = np.asarray(values, dtype=np.float64)
    if vals.size == 0:
        return [math.nan for _ in points]
    w = np.asarray(weights, dtype=np.float64)
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(w[order])
    out = []
    for p in points:
        i = int(np.searchsorted(cum, p / 100.0 * cum[-1], side="left"))
        out.append(float(vals[order[min(i, vals.size - 1)]]))
    return out


GROUPS_PER_ENGINE = 48
"""Default granularity: about this many client streams per DP engine (throughput within ~3% of
one stream per request on the calibration points; a prediction in about a second)."""


def _auto_multiplicity(shape: BenchmarkShape, dp: int) -> int:
    return max(1, math.ceil(shape.concurrency / (GROUPS_PER_ENGINE * dp)))


def predict(profile: HardwareProfile, config: EmulatedConfig | Mapping[str, Any],
            workload: WorkloadLike | BenchmarkShape, *, checkpoint: Checkpoint | None = None,
            coefficients: Coefficients = NOMINAL, multiplicity: int | None = None, seed: int = 0,
            max_steps: int = 200_000) -> Prediction:
    """Run the workload's benchmark against the launch on the profile's node, in virtual time."""
    cfg = config if isinstance(config, EmulatedConfig) else EmulatedConfig.from_options(config)
    ckpt = checkpoint or load_checkpoint(profile.server.checkpoint)
    shape = shape_of(workload)
    cap = capacity(profile, cfg, ckpt, coefficients)
    if cap.num_blocks <= 0:
        raise ValueError(f"{cfg.topology_name}: no KV blocks on this node ({cap.memory.as_gib()})")
    model = node_model(profile, cfg, ckpt, coefficients)
    collector = _Collector()
    node = Node(model, cap.num_blocks, collector, seed=seed)
    m = multiplicity or _auto_multiplicity(shape, cfg.dp)
    client = _Client(node, shape, m, random.Random(seed + 1), cfg.block_size)
    t = 0.0
    kv_samples: list[tuple[float, float]] = []
    running_samples: list[tuple[float, float]] = []
    steps = 0
    client.release(t)
    while node.busy or client.pending:
        step = node.plan(t)
        if step is None:
            due = client.next_due_v()
            if due is None:
                break
            t = max(t, due)
            client.release(t)
            continue
        node.apply(step)
        duration = step.end_v - step.start_v
        kv_samples.append((max(e.pool.usage for e in node.engines), duration))
        running_samples.append((sum(e.running_reqs for e in node.engines), duration))
        t = step.end_v
        client.release(t)
        steps += 1
        if steps >= max_steps:
            raise RuntimeError(f"prediction did not finish within {max_steps} steps ({shape})")
    return _summarize(shape, cfg, cap, model, client, collector, kv_samples, running_samples, m, node.now_v)


def _summarize(shape: BenchmarkShape, cfg: EmulatedConfig, cap: Capacity, model: Any, client: _Client,
               collector: _Collector, kv_samples: list[tuple[float, float]],
               running_samples: list[tuple[float, float]], m: int, node_end_v: float) -> Prediction:
    done = client.done
    duration = node_end_v
    out_tokens = collector.counters.get("vllm:generation_tokens", 0.0)
    in_tokens = collector.counters.get("vllm:prompt_tokens", 0.0)
    requests = int(collector.counters.get("vllm:request_success", 0.0))
    weights = [s.multiplicity for s in done]
    ttft = _percentiles([s.first_v - s.sent_v for s in done], weights, (50, 95, 99))
    e2e = _percentiles([s.last_v - s.sent_v for s in done], weights, (50,))
    gaps = np.concatenate([np.asarray(s.gaps) for s in done]) if done else np.zeros(0)
    gap_weights = np.repeat(np.asarray(weights, dtype=np.float64), [len(s.gaps) for s in done]) if done \
        else np.zeros(0)
    itl = _percentiles(gaps, gap_weights, (50, 95, 99))
    tpot_values = [((s.last_v - s.first_v) / (s.tokens - 1), s.multiplicity) for s in done if s.tokens > 1]
    total_time = sum(d for _, d in kv_samples) or 1.0
    kv_mean = sum(u * d for u, d in kv_samples) / total_time
    run_mean = sum(r * d for r, d in running_samples) / total_time
    per_request = shape.input_len * (1 + shape.range_ratio) + shape.output_len * (1 + shape.range_ratio)
    per_request_blocks = math.ceil((math.ceil(per_request) + cfg.spec_tokens) / cfg.block_size)
    per_engine = min(cfg.max_num_seqs, cap.num_blocks // max(1, per_request_blocks))
    running_per_engine = max(1, min(cfg.max_num_seqs, round(run_mean / cfg.dp)))
    context = shape.input_len + shape.output_len // 2
    decode = EngineBatch(decode_seqs=running_per_engine, decode_context_tokens=running_per_engine * context,
                         decode_attended_tokens=running_per_engine * min(context, 2048))
    tpot_mean = (sum(v * w for v, w in tpot_values) / sum(w for _, w in tpot_values)) if tpot_values else math.nan
    return Prediction(
        output_tok_s=out_tokens / duration if duration else 0.0,
        total_tok_s=(out_tokens + in_tokens) / duration if duration else 0.0,
        request_per_s=requests / duration if duration else 0.0, duration_s=duration, completed=requests,
        ttft_p50_ms=ttft[0] * 1e3, ttft_p95_ms=ttft[1] * 1e3, ttft_p99_ms=ttft[2] * 1e3,
        itl_p50_ms=itl[0] * 1e3, itl_p95_ms=itl[1] * 1e3, itl_p99_ms=itl[2] * 1e3,
        tpot_mean_ms=tpot_mean * 1e3, e2e_p50_ms=e2e[0] * 1e3,
        kv_usage_mean=kv_mean, kv_usage_max=max((u for u, _ in kv_samples), default=0.0),
        running_mean=run_mean, preemptions=int(collector.counters.get("vllm:num_preemptions", 0)),
        max_concurrency=per_engine * cfg.dp, kv_tokens_per_rank=cap.kv_tokens,
        decode_step=step_time(model, [decode] * cfg.dp), multiplicity=m)
