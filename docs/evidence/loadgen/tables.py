"""The load generator against ``vllm bench serve`` (docs/loadgen.md, README.md), from ``crosscheck.json``.

``crosscheck.json`` is written by ``benchmarks/bench_loadgen_crosscheck.py``: rounds of four cells (two
workloads at two concurrencies) on one real vLLM CPU server, each round running both clients once on
fresh prompts in alternating order, with the server's own means and counters over each run. Figures
are ours / bench per round; the tables give the median and the quartiles over rounds.

``capacity.json`` is written by ``scripts/bench_client_capacity.py`` (the clients against the stand-in
streaming server: their own ceilings, not a server's).

The ``sizing`` table is the CI bound's basis: the CI test (``tests/integration/test_loadgen_crosscheck.py``)
runs ``ROUNDS`` rounds of two of these cells and holds the median raw ratio in ``RAW_BOUND``; here the
measured per-round ratios are resampled (with replacement, a fixed seed) into medians of that many
rounds, to say how often an honest client would fail the bound on this machine, and how often one
that reads a fixed 20 % off would pass it.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]

KEYS = {"output_throughput": "output throughput", "median_ttft_ms": "median TTFT", "mean_itl_ms": "mean ITL",
        "median_itl_ms": "median ITL"}
NORMALIZER = {"output_throughput": "server_mean_e2e_ms", "median_ttft_ms": "server_mean_ttft_ms",
              "mean_itl_ms": "server_mean_itl_ms", "median_itl_ms": "server_mean_itl_ms"}
RESAMPLES = 20_000


def _data(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "crosscheck.json").read_text(encoding="utf-8")))


def _cells(data: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(str(r["cell"]) for r in data["rounds"]))


def _rounds(data: dict[str, Any], cell: str) -> list[dict[str, Any]]:
    return [r for r in data["rounds"] if r["cell"] == cell]


def _raw(rounds: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [float(r["ours"][key]) / float(r["bench"][key]) for r in rounds]


def _normalized(rounds: Sequence[dict[str, Any]], key: str) -> list[float]:
    out = []
    for client, r in zip(_raw(rounds, key), rounds, strict=True):
        server = float(r["ours"][NORMALIZER[key]]) / float(r["bench"][NORMALIZER[key]])
        out.append(client * server if key == "output_throughput" else client / server)
    return out


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _fmt(values: Sequence[float]) -> str:
    q1, q2, q3 = _quartiles(values)
    return f"**{q2:.3f}** ({q1:.3f}–{q3:.3f})"


def _ratio_table(folder: Path, ratios: Callable[[Sequence[dict[str, Any]], str], list[float]],
                 keys: Sequence[str]) -> str:
    data = _data(folder)
    head = "| cell (workload, concurrency, prompts) | rounds | " + " | ".join(KEYS[k] for k in keys) + " |"
    rows = [head, "|---|---:|" + "---:|" * len(keys)]
    for cell in _cells(data):
        rounds = _rounds(data, cell)
        spec = next(c for c in data["cells"] if f"{c['name']} c{c['concurrency']}" == cell)
        label = (f"{spec['name']} {spec['input_len']}/{spec['output_len']}, c{spec['concurrency']}, "
                 f"{spec['num_prompts']}")
        rows.append(f"| {label} | {len(rounds)} | " + " | ".join(_fmt(ratios(rounds, k)) for k in keys) + " |")
    return "\n".join(rows)


def raw(folder: Path) -> str:
    """The headline: ours / bench as each client reported it, median (quartiles) over rounds."""
    return _ratio_table(folder, _raw, ("output_throughput", "median_ttft_ms", "mean_itl_ms", "median_itl_ms"))


def normalized(folder: Path) -> str:
    """Second, as explanation: with the server's own ratio over the same two runs taken out."""
    return _ratio_table(folder, _normalized, ("output_throughput", "median_ttft_ms", "mean_itl_ms", "median_itl_ms"))


def headline(folder: Path) -> str:
    """One line for README.md: the range of the cells' median raw ratios, per figure."""
    data = _data(folder)
    parts = []
    for key in ("output_throughput", "median_ttft_ms", "mean_itl_ms"):
        medians = [statistics.median(_raw(_rounds(data, cell), key)) for cell in _cells(data)]
        parts.append(f"{KEYS[key]} {min(medians):.2f}–{max(medians):.2f}")
    return ", ".join(parts)


def absolute(folder: Path) -> str:
    data = _data(folder)
    rows = ["| cell | client | output tok/s | median TTFT (ms) | mean ITL (ms) | server's mean TTFT (ms) | "
            "server's mean ITL (ms) |", "|---|---|---:|---:|---:|---:|---:|"]
    for cell in _cells(data):
        rounds = _rounds(data, cell)
        for tool in ("ours", "bench"):
            def span(key: str, tool: str = tool, rounds: list[dict[str, Any]] = rounds) -> str:
                values = [float(r[tool][key]) for r in rounds]
                return f"{statistics.median(values):,.1f} ({min(values):,.1f}–{max(values):,.1f})"
            rows.append(f"| {cell} | {tool} | {span('output_throughput')} | {span('median_ttft_ms')} | "
                        f"{span('mean_itl_ms')} | {span('server_mean_ttft_ms')} | {span('server_mean_itl_ms')} |")
    return "\n".join(rows)


def freshness(folder: Path) -> str:
    """Prefix-cache hits per client; the earlier run without bench's per-run cache salt last, if on file."""
    rows = ["| run | client | runs | prefix-cache hits (tokens) | tokens queried | hit share | most in one run | "
            "prompt tokens the client reported |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    sources = [("crosscheck.json", "this one")]
    if (folder / "crosscheck-unsalted.json").is_file():
        sources.append(("crosscheck-unsalted.json", "earlier, bench without a cache salt"))
    for name, label in sources:
        data = json.loads((folder / name).read_text(encoding="utf-8"))
        for tool in ("ours", "bench"):
            runs = [r[tool] for r in data["rounds"]]
            hits = sum(float(r["prefix_cache_hits"]) for r in runs)
            queries = sum(float(r["prefix_cache_queries"]) for r in runs)
            worst = max(float(r["prefix_cache_hits"]) / float(r["prefix_cache_queries"]) for r in runs)
            rows.append(f"| {label} ({data['date']}) | {tool} | {len(runs)} | {hits:,.0f} | {queries:,.0f} | "
                        f"{hits / queries:.1%} | {worst:.1%} | "
                        f"{sum(float(r['total_input_tokens']) for r in runs):,.0f} |")
    return "\n".join(rows)


def setup(folder: Path) -> str:
    data = _data(folder)
    m = data["machine"]
    n = max(int(r["round"]) for r in data["rounds"]) + 1
    return (f"Measured {data['date']} on {m['cpus']} cores ({m['cpu_model']}), vLLM {m['vllm']}, "
            f"{n} rounds of each cell ({len(data['rounds']) * 2} runs, {data['wall_s'] / 60:.0f} min); "
            f"load average (1 min) {m['load_average_1m_at_start']} at the start and "
            f"{m['load_average_1m_at_end']} at the end: other work shared the machine.")


def _ci() -> tuple[Sequence[Any], int, dict[str, tuple[float, float]]]:
    """The CI test's cells, rounds and raw bound (``tests/loadcheck.py``)."""
    sys.path.insert(0, str(REPO))
    from tests.loadcheck import CI_CELLS, CI_RAW_BOUND, CI_ROUNDS

    return CI_CELLS, CI_ROUNDS, CI_RAW_BOUND


def _median_of(values: Sequence[float], k: int, rng: random.Random) -> float:
    return statistics.median(rng.choice(values) for _ in range(k))


def sizing(folder: Path) -> str:
    cells, rounds_ci, bound = _ci()
    data = _data(folder)
    rows = ["| cell | figure | bound | measured rounds | an honest client fails | a client 20 % high passes | "
            "20 % low passes |", "|---|---|---:|---:|---:|---:|---:|"]
    for c in cells:
        name = f"{c.name} c{c.concurrency}"
        rounds = _rounds(data, name)
        for key, (lo, hi) in bound.items():
            ratios = _raw(rounds, key)
            rng = random.Random(f"{name}:{key}")
            medians = [_median_of(ratios, rounds_ci, rng) for _ in range(RESAMPLES)]
            fails = sum(not lo <= m <= hi for m in medians) / RESAMPLES
            high = sum(lo <= m * 1.2 <= hi for m in medians) / RESAMPLES
            low = sum(lo <= m * 0.8 <= hi for m in medians) / RESAMPLES
            rows.append(f"| {name} | {KEYS[key]} | {lo:.2f}–{hi:.2f} | {len(ratios)} | {fails:.2%} | {high:.2%} | "
                        f"{low:.2%} |")
    return "\n".join(rows)


def ci_rounds(folder: Path) -> str:
    return str(_ci()[1])


def capacity(folder: Path) -> str:
    data = json.loads((folder / "capacity.json").read_text(encoding="utf-8"))
    names = {"ours-aiohttp": "aiohttp, 1 process (ours)", "ours-httpx": "httpx, 1 process",
             "ours-pool2": "aiohttp, 2 processes (`ClientPool`)",
             "vllm-bench": "`vllm bench serve` (its aiohttp client)"}
    conc = sorted({int(r["concurrency"]) for r in data["rows"]})
    rows = ["| client | " + " | ".join(f"concurrency {c}" for c in conc) + " |", "|---|" + "---:|" * len(conc)]
    for mode, label in names.items():
        cells = []
        for c in conc:
            values = [float(r["events_per_s"]) for r in data["rows"]
                      if r["client"] == mode and int(r["concurrency"]) == c and "events_per_s" in r]
            cells.append(f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})" if values else "–")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def capacity_setup(folder: Path) -> str:
    data = json.loads((folder / "capacity.json").read_text(encoding="utf-8"))
    loads = [float(r["load_average_1m"]) for r in data["rows"]]
    repeats = max(int(r["repeat"]) for r in data["rows"]) + 1
    return (f"Measured {data['date']} on {data['cpus']} cores ({data['cpu_model']}): {repeats} runs of each "
            f"client, each sending 4 × concurrency requests of {data['output_len']} tokens; median (min–max) "
            f"events/s; load average (1 min) {min(loads)}–{max(loads)} during the runs.")


TABLES: dict[str, Callable[[Path], str]] = {"raw": raw, "headline": headline, "normalized": normalized,
                                           "absolute": absolute,
                                           "freshness": freshness, "setup": setup, "sizing": sizing,
                                           "ci_rounds": ci_rounds, "capacity": capacity,
                                           "capacity_setup": capacity_setup}
