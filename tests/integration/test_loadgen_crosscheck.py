"""Cross-check: our load generator and ``vllm bench serve`` agree on the same workload.

One real vLLM (CPU build) server serves the tiny demo model for the whole module. The same
workload (random token prompts of a fixed length, a fixed output length with ``ignore_eos``,
the same number of prompts and the same concurrency) goes through both tools, alternating,
``ROUNDS`` times each after one discarded round each. Each round pairs one run of ours with the
bench run after it; the statistic is the median over rounds of a paired ratio ours/theirs.

What is compared: **what each client reports, relative to what the server itself saw in the same
window.** Before and after every run the test reads the server's own histograms
(``vllm:e2e_request_latency_seconds``, ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``). On this 2-vCPU VM the machine's speed drifts by up to 2x
from one round to the next, for both tools; the server's histograms move with it, the client's
own contribution does not. So for each pair: throughput × the server's mean e2e latency, and
TTFT or ITL ÷ the server's mean TTFT or ITL, ours over bench. A client that sends late, reads
late, stalls or times its window differently moves that ratio; a slow round of the machine does
not. These normalized ratios must be within the issue's bounds (5 % throughput, 10 % median TTFT
and ITL). The raw paired ratios are reported and held to ``RAW_TOLERANCE``.

Two more conditions make the comparison fair:
- Client isolation: the server runs on every core but the last (its OpenMP threads bound
  there), and both clients on the last one (tuner/load/affinity.py). On shared cores the client was
  kept off the CPU for up to 2 s and read 0.43x bench's throughput (docs/loadgen.md).
- Same prompt sizes: ``vllm bench serve --dataset-name random`` decodes random ids to text that
  the server tokenizes again (a few tokens more or fewer); we send the ids. The input token
  totals must agree within 5 %. Text also costs the server ~2.5 ms before the first token (its
  own TTFT histogram shows it), which the normalization takes out of the TTFT comparison.

Run under ``flock /tmp/vllm-server.lock`` on a shared machine: it starts a server.
"""

from __future__ import annotations

import json
import logging
import statistics
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import vllm_cli
from tuner.engines.process import LaunchSpec, ServerProcess, free_port
from tuner.engines.vllm import omp_bind_env
from tuner.load.affinity import CpuSplit, pinned, plan_cpu_split
from tuner.load.generator import run_load_sync
from tuner.load.metrics import Samples, histogram_deltas, parse_prometheus, summarize
from tuner.load.workload import Workload

pytestmark = [pytest.mark.server, pytest.mark.slow]

log = logging.getLogger(__name__)

SERVED = "demo"
VOCAB = 4096
INPUT_LEN = 128
OUTPUT_LEN = 128
NUM_PROMPTS = 128   # windows of several seconds
CONCURRENCY = 8
ROUNDS = 7
THROUGHPUT_TOLERANCE = 0.05
LATENCY_TOLERANCE = 0.10
# Raw paired ratios moved 0.67-1.63 per round on a busy day (machine drift); their median is held
# to this sanity bound, the bounds apply to the normalized ratios.
RAW_TOLERANCE = 0.25
SPLIT: CpuSplit | None = plan_cpu_split(1, bind_omp=True)
# The server's own latency histograms: result key -> metric (seconds; the results hold ms).
SERVER_VIEW = {"server_mean_e2e_ms": "vllm:e2e_request_latency_seconds",
               "server_mean_ttft_ms": "vllm:time_to_first_token_seconds",
               "server_mean_itl_ms": "vllm:inter_token_latency_seconds"}
SERVER_FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--dtype", "bfloat16", "--max-num-seqs", "16",
                "--served-model-name", SERVED]
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[ServerProcess]:
    cli = vllm_cli()
    assert cli is not None
    workdir = tmp_path_factory.mktemp("crosscheck-server")
    port = free_port()
    spec = LaunchSpec(argv=[cli, "serve", str(demo_model), "--host", "127.0.0.1", "--port", str(port),
                            *SERVER_FLAGS],
                      env={**ENV, **(omp_bind_env(SPLIT) if SPLIT else {}), "VLLM_CACHE_ROOT": str(workdir / "cache"),
                           "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")},
                      host="127.0.0.1", port=port, workdir=workdir, ready_timeout_s=300,
                      cpus=SPLIT.server if SPLIT else None)
    with ServerProcess(spec) as proc:
        proc.wait_ready()
        yield proc


def _ours(base_url: str) -> dict[str, Any]:
    workload = Workload(input_len=INPUT_LEN, output_len=OUTPUT_LEN, num_prompts=NUM_PROMPTS,
                        concurrency=CONCURRENCY, warmup_prompts=1, seed=0)
    result = run_load_sync(base_url, SERVED, workload, vocab_size=VOCAB, request_timeout_s=300)
    return dict(summarize(result))


def _bench(base_url: str, tokenizer: Path, out: Path, seed: int) -> dict[str, Any]:
    cli = vllm_cli()
    assert cli is not None
    name = f"bench-{seed}.json"
    argv = [cli, "bench", "serve", "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", SERVED, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
            "--random-range-ratio", "0", "--num-prompts", str(NUM_PROMPTS), "--max-concurrency", str(CONCURRENCY),
            "--ignore-eos", "--temperature", "0", "--num-warmups", "1", "--seed", str(seed), "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
            "--save-result", "--result-dir", str(out), "--result-filename", name]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(out)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / name).read_text())
    return data


def _scrape(base_url: str) -> Samples:
    return parse_prometheus(httpx.get(base_url + "/metrics", timeout=10).text)


def _with_server_view(base_url: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one round and add the server's own mean e2e, TTFT and ITL over it (ms)."""
    before = _scrape(base_url)
    result = run()
    after = _scrape(base_url)
    for key, metric in SERVER_VIEW.items():
        _buckets, count, total = histogram_deltas(before, after, metric)
        assert count > 0, f"the server's {metric} did not move during the round"
        result[key] = 1000.0 * total / count
    return result


@pytest.fixture(scope="module")
def both(server: ServerProcess, demo_model: Path,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("bench")
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "bench": []}
    url = server.base_url
    # Both clients (ours in this thread, bench as a child process) run on the client core.
    with pinned(SPLIT.client if SPLIT else None):
        # One discarded round of each first: the first load after start-up is slower for whoever goes first.
        _ours(url)
        _bench(url, demo_model, out, seed=99)
        for round_ in range(ROUNDS):
            runs["ours"].append(_with_server_view(url, partial(_ours, url)))
            runs["bench"].append(_with_server_view(url, partial(_bench, url, demo_model, out, seed=round_)))
    keys = ("output_throughput", "median_ttft_ms", "median_itl_ms", "mean_itl_ms", *SERVER_VIEW,
            "total_input_tokens", "completed", "failed")
    report = {tool: [{k: r.get(k) for k in keys} for r in rs] for tool, rs in runs.items()}
    (out / "crosscheck.json").write_text(json.dumps(report, indent=1))
    log.warning("cross-check runs (cpu split %s): %s", SPLIT, json.dumps(report))
    return runs


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    """The median over rounds."""
    return statistics.median(float(r[key]) for r in runs)


def _pairs(both: dict[str, list[dict[str, Any]]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each of our rounds with the bench round that ran right after it."""
    return list(zip(both["ours"], both["bench"], strict=True))


def _raw_ratio(both: dict[str, list[dict[str, Any]]], key: str) -> float:
    return statistics.median(float(o[key]) / float(b[key]) for o, b in _pairs(both))


def _normalized_ratios(both: dict[str, list[dict[str, Any]]], key: str, server_key: str) -> list[float]:
    """Per pair: ours/bench of the client figure, over (or, for throughput, times) ours/bench of the server's."""
    out = []
    for o, b in _pairs(both):
        client, server_ = float(o[key]) / float(b[key]), float(o[server_key]) / float(b[server_key])
        out.append(client * server_ if key == "output_throughput" else client / server_)
    return out


def test_every_request_completes_in_both(both: dict[str, list[dict[str, Any]]]) -> None:
    for tool, runs in both.items():
        for r in runs:
            assert r["completed"] == NUM_PROMPTS and r["failed"] == 0, (tool, r)
            assert r["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN, (tool, r)


def test_prompts_are_the_same_size(both: dict[str, list[dict[str, Any]]]) -> None:
    ours, theirs = _mean(both["ours"], "total_input_tokens"), _mean(both["bench"], "total_input_tokens")
    assert abs(ours - theirs) / theirs <= 0.05, (ours, theirs)


needs_split = pytest.mark.skipif(SPLIT is None, reason="one core: client and server would share it")
AGREEMENT = [("output_throughput", "server_mean_e2e_ms", THROUGHPUT_TOLERANCE),
             ("median_ttft_ms", "server_mean_ttft_ms", LATENCY_TOLERANCE),
             ("median_itl_ms", "server_mean_itl_ms", LATENCY_TOLERANCE),
             ("mean_itl_ms", "server_mean_itl_ms", LATENCY_TOLERANCE)]


@needs_split
@pytest.mark.parametrize(("key", "server_key", "tolerance"), AGREEMENT)
def test_the_clients_agree_on_what_the_server_did(both: dict[str, list[dict[str, Any]]], key: str,
                                                  server_key: str, tolerance: float) -> None:
    ratios = _normalized_ratios(both, key, server_key)
    ratio = statistics.median(ratios)
    assert abs(ratio - 1.0) <= tolerance, (
        f"{key}: ours/bench normalized by the server's {server_key}: median {ratio:.3f}, "
        f"per round {[round(r, 3) for r in ratios]}")


@needs_split
@pytest.mark.parametrize("key", [key for key, _server_key, _tolerance in AGREEMENT])
def test_raw_figures_are_close(both: dict[str, list[dict[str, Any]]], key: str) -> None:
    ratio = _raw_ratio(both, key)
    assert abs(ratio - 1.0) <= RAW_TOLERANCE, (
        f"{key}: raw ours/bench {ratio:.3f} (medians: ours {_mean(both['ours'], key):.2f}, "
        f"bench {_mean(both['bench'], key):.2f})")
