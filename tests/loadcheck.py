"""Our load generator against ``vllm bench serve``, on one real vLLM CPU server: the rounds and the figures.

Shared by the CI test (``tests/integration/test_loadgen_crosscheck.py``) and the benchmark that writes
the committed data (``benchmarks/bench_loadgen_crosscheck.py`` -> ``docs/evidence/loadgen/``).

A **cell** is a workload (fixed prompt and output lengths, ``ignore_eos``) at one concurrency. A
**round** of a cell runs both clients once on the same server, one after the other, in alternating
order (ours first in even rounds, bench first in odd ones, so a machine that speeds up or slows down
through the run favours neither). Both clients run in this process, on the client core
(:func:`tuner.load.affinity.pinned`): ours is :func:`tuner.load.generator.run_load_sync`, bench's is
``vllm.benchmarks.serve.main``, the function the ``vllm bench serve`` command calls, imported once
(the command's own start-up took 28 s of import on the loaded 2-core machine, per round).

**Fresh prompts.** Each run draws its prompts from a seed of its own: ours a new ``Workload.seed``,
bench a new ``--seed`` for its random dataset. Neither warms up (``warmup_prompts: 0``;
``--num-warmups 0 --ready-check-timeout-sec 0``: bench's ready check and warm-ups re-send its first
measured prompt, which the measured window would then read from the prefix cache). The server's
``vllm:prefix_cache_hits`` over each run is recorded: ours is 0.

A new seed is not enough for bench: its random dataset makes each prompt a run of consecutive token
ids from a random start, ``(offset + index + arange(input_len)) % vocab_size``, so two prompts with the
same start are the same prompt. On the demo model's 4,096-token vocabulary the starts of later runs
fall more and more often on starts the server has cached (measured without a salt, bench's share of
prompt tokens read from the cache grew round by round: ``docs/evidence/loadgen/crosscheck-unsalted.json``,
the ``freshness`` table of docs/loadgen.md). So each bench run also sends a ``cache_salt``
of its own (``--extra-body``; vLLM keys cached blocks by it): no bench run reads another run's
blocks. Prompts that repeat *inside* one bench run (two of 128 starts coincide about twice per run)
still hit; :data:`BENCH_SELF_HIT_SHARE` bounds them.

**Around each run** the server's own histograms are read (mean e2e latency, mean TTFT, mean ITL), so
the comparison can be explained by what the server itself saw in the same window (the normalized
figures, second to the raw ones).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.load.affinity import pinned
from tuner.load.generator import run_load_sync
from tuner.load.metrics import MetricKey, counter_deltas, histogram_deltas, parse_prometheus, summarize
from tuner.objective import Workload

# Figures compared, as ``vllm bench serve --save-result`` names them.
RAW = ("output_throughput", "median_ttft_ms", "mean_itl_ms", "median_itl_ms")
# The server's own view of the same window: result key -> histogram (seconds).
SERVER_VIEW = {"server_mean_e2e_ms": "vllm:e2e_request_latency_seconds",
               "server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
               "server_mean_itl_ms": "vllm:inter_token_latency_seconds"}
# Which server figure explains which client figure (throughput x mean e2e; latencies / the server's).
NORMALIZER = {"output_throughput": "server_mean_e2e_ms", "median_ttft_ms": "server_mean_ttft_ms",
              "mean_itl_ms": "server_mean_itl_ms", "median_itl_ms": "server_mean_itl_ms"}
KEPT = (*RAW, "total_input_tokens", "total_output_tokens", "completed", "failed", "duration")
COUNTERS = {"prefix_cache_hits": "vllm:prefix_cache_hits", "prefix_cache_queries": "vllm:prefix_cache_queries",
            "prompt_tokens": "vllm:prompt_tokens"}


@dataclass(frozen=True)
class Cell:
    name: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# The CI test (tests/integration/test_loadgen_crosscheck.py): two of the committed data's four cells, the rounds
# it runs of each, and the bound on |median over rounds of raw ours/bench - 1|. Sized from the committed data
# (docs/evidence/loadgen/crosscheck.json; the "sizing" table of docs/loadgen.md shows how often an honest client
# would fail and how often a client 20 % off would pass at these settings on this machine).
CI_CELLS = (Cell("decode", 128, 128, 16, 128), Cell("prefill", 512, 32, 4, 32))
# The range the median of ours/bench must lie in. TTFT's is one-sided: the tools do not send the same request
# (bench sends text that the server tokenizes on its one core, we send ids), so bench's TTFT reads higher by a
# margin that moves with the machine; ours may read lower, never higher than bench's by more than 5 %.
CI_ROUNDS = 7
CI_RAW_BOUND = {"output_throughput": (0.90, 1.10), "median_ttft_ms": (0.50, 1.05), "mean_itl_ms": (0.90, 1.10)}
# Bench's prompts that repeat inside one of its runs (its random dataset; see above): at most this share of
# the prompt tokens it sent may hit the prefix cache. Ours may hit none.
BENCH_SELF_HIT_SHARE = 0.10


def _scrape(base_url: str) -> dict[MetricKey, float]:
    return dict(parse_prometheus(httpx.get(base_url + "/metrics", timeout=30).text))


def with_server_view(base_url: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one client once; add the server's own means and counters over that run."""
    before = _scrape(base_url)
    result = run()
    after = _scrape(base_url)
    for key, metric in SERVER_VIEW.items():
        _buckets, count, total = histogram_deltas(before, after, metric)
        if count <= 0:
            raise AssertionError(f"the server's {metric} did not move during the run")
        result[key] = 1000.0 * total / count
    grown = counter_deltas(before, after, COUNTERS.values())
    for key, metric in COUNTERS.items():
        result[key] = grown[metric]
    return result


def ours(base_url: str, model: str, cell: Cell, *, seed: int, vocab_size: int) -> dict[str, Any]:
    workload = Workload(input_len=cell.input_len, output_len=cell.output_len, num_prompts=cell.num_prompts,
                        concurrency=cell.concurrency, warmup_prompts=0, seed=seed, ignore_eos=True)
    result = run_load_sync(base_url, model, workload, vocab_size=vocab_size, request_timeout_s=600)
    summary = dict(summarize(result))
    return {k: summary.get(k) for k in KEPT}


class Bench:
    """``vllm bench serve``'s own code (``vllm.benchmarks.serve``), imported once, run in this process."""

    def __init__(self, tokenizer: Path) -> None:
        from vllm.benchmarks import serve  # the import alone takes ~10 s of CPU: once per session
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self._serve = serve
        self._parser: argparse.ArgumentParser = FlexibleArgumentParser()
        serve.add_cli_args(self._parser)
        self.tokenizer = tokenizer

    def argv(self, base_url: str, model: str, cell: Cell, seed: int) -> list[str]:
        return ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
                "--tokenizer", str(self.tokenizer), "--dataset-name", "random",
                "--random-input-len", str(cell.input_len), "--random-output-len", str(cell.output_len),
                "--random-range-ratio", "0", "--num-prompts", str(cell.num_prompts),
                "--max-concurrency", str(cell.concurrency), "--ignore-eos", "--temperature", "0",
                "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--seed", str(seed), "--disable-tqdm",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
                "--extra-body", json.dumps({"cache_salt": f"bench-{seed}"})]

    def __call__(self, base_url: str, model: str, cell: Cell, *, seed: int) -> dict[str, Any]:
        args = self._parser.parse_args(self.argv(base_url, model, cell, seed))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result: dict[str, Any] = self._serve.main(args)
        return {k: result.get(k) for k in KEPT}


@dataclass
class Crosscheck:
    """Rounds of cells on one server; ``seed`` hands out a new prompt seed per run."""

    base_url: str
    model: str
    vocab_size: int
    bench: Bench
    seed: Callable[[], int]
    client_cpus: Sequence[int] | None

    def round(self, cell: Cell, index: int) -> dict[str, Any]:
        def run_ours() -> dict[str, Any]:
            return ours(self.base_url, self.model, cell, seed=self.seed(), vocab_size=self.vocab_size)

        def run_bench() -> dict[str, Any]:
            return self.bench(self.base_url, self.model, cell, seed=self.seed())

        order = [("ours", run_ours), ("bench", run_bench)]
        if index % 2:
            order.reverse()
        out: dict[str, Any] = {"round": index, "first": order[0][0]}
        with pinned(self.client_cpus):
            for tool, run in order:
                out[tool] = with_server_view(self.base_url, run)
        return out

    def warm_up(self, cell: Cell) -> None:
        """One short run of each client, discarded: the first load after a pause is slower for whoever goes first."""
        small = Cell(cell.name, cell.input_len, cell.output_len, cell.concurrency, cell.concurrency)
        with pinned(self.client_cpus):
            ours(self.base_url, self.model, small, seed=self.seed(), vocab_size=self.vocab_size)
            self.bench(self.base_url, self.model, small, seed=self.seed())

    def rounds(self, cell: Cell, count: int) -> list[dict[str, Any]]:
        self.warm_up(cell)
        return [self.round(cell, i) for i in range(count)]


# ---- figures ------------------------------------------------------------------------------------------------


def raw_ratios(rounds: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """Per round: ours / bench of a client figure, as each client reported it."""
    return [float(r["ours"][key]) / float(r["bench"][key]) for r in rounds]


def normalized_ratios(rounds: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """Per round: the raw ratio with the server's own ratio over the same two runs taken out.

    Throughput is multiplied by ours/bench of the server's mean e2e latency (a slower machine in one run
    lowers throughput and raises latency alike); TTFT and ITL are divided by ours/bench of the server's
    mean TTFT or ITL.
    """
    server_key = NORMALIZER[key]
    out = []
    for client, r in zip(raw_ratios(rounds, key), rounds, strict=True):
        server = float(r["ours"][server_key]) / float(r["bench"][server_key])
        out.append(client * server if key == "output_throughput" else client / server)
    return out


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); the inclusive method, as numpy's default percentile."""
    if len(values) == 1:
        return (values[0], values[0], values[0])
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q1, q2, q3)
