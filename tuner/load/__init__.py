"""Load: the requests a trial is measured with, and what they measured.

    workload.py    the exact prompts and arrival gaps of an objective's workload
    agent.py       multi-turn coding-agent sessions (workload kind ``agent``)
    generator.py   one measured window: streamed requests, each timed like ``vllm bench serve``
    stream.py      reading a server's SSE stream; the aiohttp and httpx transports
    pool.py        one window spread over several client processes
    ladder.py      a concurrency ladder inside one launch (``measure``: the trial's entry point)
    freshness.py   every window sends unseen prompts; the server's counters checked against the workload
    metrics.py     the window's summary (``vllm bench serve`` keys); reading a Prometheus page
    goodput.py     requests per second that met their own limits
    affinity.py    keeping the client off the server's cores
    poller.py      a background poll for the length of a ``with`` block

The YAML shape of a workload and of a ladder is the objective's (:mod:`tuner.objective`); what an
engine's ``/metrics`` names mean is the engine's (:class:`tuner.load.metrics.ServerMetrics`).
"""

from __future__ import annotations

from tuner.load.affinity import CpuSplit, pinned, plan_cpu_split
from tuner.load.generator import ClientStats, LoadResult, RequestRecord, WindowPlan, run_load, run_load_sync, run_window
from tuner.load.goodput import request_goodput
from tuner.load.ladder import Measurement, SloWatch, Step, ladder_concurrencies, measure
from tuner.load.metrics import MetricKey, Samples, ServerMetrics, parse_prometheus, summarize
from tuner.load.pool import ClientPool
from tuner.load.workload import PromptSpec, make_prompts, make_warmup_prompts

__all__ = [
    "ClientPool",
    "ClientStats",
    "CpuSplit",
    "LoadResult",
    "Measurement",
    "MetricKey",
    "PromptSpec",
    "RequestRecord",
    "Samples",
    "ServerMetrics",
    "SloWatch",
    "Step",
    "WindowPlan",
    "ladder_concurrencies",
    "make_prompts",
    "make_warmup_prompts",
    "measure",
    "parse_prometheus",
    "pinned",
    "plan_cpu_split",
    "request_goodput",
    "run_load",
    "run_load_sync",
    "run_window",
    "summarize",
]
