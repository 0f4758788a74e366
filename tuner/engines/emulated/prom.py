"""The emulated server's ``/metrics``: vLLM 0.32's metric names, labels and buckets, in node units.

Every series carries ``model_name`` and ``engine`` (one engine per DP rank), as vLLM's Prometheus
logger writes them (``vllm/v1/metrics/loggers.py``); histogram buckets are vLLM's defaults
(``vllm/v1/metrics/buckets.py``). Counters and histograms count virtual requests (a request of
multiplicity M counts M times) and virtual seconds. The registry is the scheduler's observer.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Registry"]

REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)


def _one_two_five(max_value: int) -> tuple[float, ...]:
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


COUNTERS: dict[str, str] = {
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:request_success": "Count of successfully processed requests.",
}
SPEC_COUNTERS: dict[str, str] = {
    "vllm:spec_decode_num_drafts": "Number of spec decoding drafts.",
    "vllm:spec_decode_num_draft_tokens": "Number of draft tokens.",
    "vllm:spec_decode_num_accepted_tokens": "Number of accepted tokens.",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "Accepted tokens per draft position.",
}
GAUGES: dict[str, str] = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}


def histogram_specs(max_model_len: int) -> dict[str, tuple[str, tuple[float, ...]]]:
    tokens = _one_two_five(max_model_len)
    return {
        "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT),
        "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL),
        "vllm:request_time_per_output_token_seconds": ("Histogram of time_per_output_token_seconds per request.", ITL),
        "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", REQUEST_LATENCY),
        "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY),
        "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.",
                                                REQUEST_LATENCY),
        "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY),
        "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY),
        "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", tokens),
        "vllm:request_generation_tokens": ("Number of generation tokens processed.", tokens),
        "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", tokens),
        "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", ITERATION_TOKENS),
        "vllm:request_num_preemptions": ("Number of preemptions per request.", PREEMPTIONS),
    }


@dataclass
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0
    n: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.n += weight


def _fmt(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


class Registry:
    """Counters, gauges and histograms per engine (implements the scheduler's ``Observer``)."""

    def __init__(self, model_name: str, engines: int, *, max_model_len: int, speculative: bool,
                 info: dict[str, str] | None = None) -> None:
        self.model_name = model_name
        self.engines = engines
        self.counter_help = {**COUNTERS, **(SPEC_COUNTERS if speculative else {})}
        self.hist_specs = histogram_specs(max_model_len)
        self.counters: dict[tuple[str, int, tuple[tuple[str, str], ...]], float] = {}
        self.gauges: dict[tuple[str, int], float] = {}
        self.hists: dict[tuple[str, int], _Histogram] = {}
        self.info = info or {}
        for e in range(engines):
            for name in self.counter_help:
                if name == "vllm:request_success":
                    for reason in ("stop", "length", "abort"):
                        self.counters[(name, e, (("finished_reason", reason),))] = 0.0
                elif name != "vllm:spec_decode_num_accepted_tokens_per_pos":
                    self.counters[(name, e, ())] = 0.0
            for name in GAUGES:
                self.gauges[(name, e)] = 0.0
            for name, (_, bounds) in self.hist_specs.items():
                self.hists[(name, e)] = _Histogram(bounds)

    def add_counter(self, name: str, help_text: str) -> None:
        """A counter beyond vLLM's defaults (a KV connector's), at 0 on every engine."""
        self.counter_help[name] = help_text
        for e in range(self.engines):
            self.counters.setdefault((name, e, ()), 0.0)

    def add_histogram(self, name: str, help_text: str, bounds: tuple[float, ...]) -> None:
        """A histogram beyond vLLM's defaults (a KV connector's), empty on every engine."""
        self.hist_specs[name] = (help_text, bounds)
        for e in range(self.engines):
            self.hists[(name, e)] = _Histogram(bounds)

    # -- the scheduler's Observer -------------------------------------------------------------------
    def count(self, engine: int, name: str, amount: float, labels: tuple[tuple[str, str], ...] = ()) -> None:
        key = (name, engine, labels)
        self.counters[key] = self.counters.get(key, 0.0) + amount

    def observe(self, engine: int, name: str, value: float, weight: int) -> None:
        hist = self.hists.get((name, engine))
        if hist is not None:
            hist.observe(value, weight)

    def gauge(self, engine: int, name: str, value: float) -> None:
        self.gauges[(name, engine)] = value

    # -- reading ------------------------------------------------------------------------------------
    def counter_total(self, name: str, engine: int | None = None) -> float:
        return sum(v for (n, e, _), v in self.counters.items() if n == name and (engine is None or e == engine))

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4), as prometheus_client writes vLLM's page."""
        lines: list[str] = []

        def labels(engine: int, extra: Sequence[tuple[str, str]] = ()) -> str:
            parts = [f'model_name="{self.model_name}"', f'engine="{engine}"', *(f'{k}="{v}"' for k, v in extra)]
            return "{" + ",".join(parts) + "}"

        if self.info:
            lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                      "# TYPE vllm:cache_config_info gauge"]
            info = ",".join(f'{k}="{v}"' for k, v in sorted(self.info.items()))
            lines += [f'vllm:cache_config_info{{engine="{e}",{info}}} 1.0' for e in range(self.engines)]
        for name, help_text in GAUGES.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f"{name}{labels(e)} {_fmt(self.gauges[(name, e)])}" for e in range(self.engines)]
        for name, help_text in self.counter_help.items():
            lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
            for (n, e, extra), value in sorted(self.counters.items(), key=lambda kv: (kv[0][1], kv[0][2])):
                if n == name:
                    lines.append(f"{name}_total{labels(e, extra)} {_fmt(value)}")
        for name, (help_text, bounds) in self.hist_specs.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
            for e in range(self.engines):
                hist = self.hists[(name, e)]
                cumulative = 0.0
                for bound, count in zip((*bounds, float("inf")), hist.counts, strict=True):
                    cumulative += count
                    le = "+Inf" if bound == float("inf") else _fmt(bound)
                    lines.append(f"{name}_bucket{labels(e, (('le', le),))} {_fmt(cumulative)}")
                lines.append(f"{name}_count{labels(e)} {_fmt(hist.n)}")
                lines.append(f"{name}_sum{labels(e)} {_fmt(hist.total)}")
        return "\n".join(lines) + "\n"
