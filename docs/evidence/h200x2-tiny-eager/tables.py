"""The 2× H200 study of issue 8 (docs/evidence/h200.md), from this folder's ``trials.csv`` and each trial's
``trials/<n>/outcome.json`` (its summary, its server's metrics and the client's own figures)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _trials(folder: Path) -> list[dict[str, Any]]:
    with (folder / "trials.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        row["outcome"] = json.loads((folder / row["trial_dir"] / "outcome.json").read_text(encoding="utf-8"))
    return rows


def _span(values: list[float], unit: str, fmt: str = ".0f") -> str:
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return f"{low} {unit}" if low == high else f"{low}–{high} {unit}"


def found(folder: Path) -> str:
    """What the tuner found: one row per trial."""
    rows = ["| trial | topology | varied flags | ready | out tok/s | p95 TTFT | p95 ITL | median ITL |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    for t in _trials(folder):
        s = t["outcome"]["summary"]
        name = t["number"] + (f" (baseline{', winner' if t['number'] == '0' else ''})" if t["baseline"] else "")
        value = f"{float(s['output_throughput']):.1f}"
        rows.append(f"| {name} | {t['param.topology']} | max-num-seqs {t['param.max-num-seqs']}, "
                    f"max-num-batched-tokens {t['param.max-num-batched-tokens']}, "
                    f"util {t['param.gpu-memory-utilization']} | "
                    f"{float(t['ready_s']):.1f} s | {'**' + value + '**' if t['number'] == '0' else value} | "
                    f"{float(s['p95_ttft_ms']):.0f} ms | {float(s['p95_itl_ms']):.1f} ms | "
                    f"{float(s['median_itl_ms']):.1f} ms |")
    return "\n".join(rows)


def window(folder: Path) -> str:
    """How long each trial's one measured window lasted."""
    return _span([float(t["outcome"]["summary"]["duration"]) for t in _trials(folder)], "s", ".1f")


def client(folder: Path) -> str:
    """The client's CPU share (its busiest process) and its rate of streamed events."""
    figures = [t["outcome"]["server_metrics"]["client"] for t in _trials(folder)]
    cpu = _span([100 * float(c["client_cpu_share"]) for c in figures], "%")
    rate = _span([float(c["client_events_per_s"]) / 1000 for c in figures], "k chunks/s", ".1f")
    return f"{cpu} of a core at {rate}"


def tie(folder: Path) -> str:
    """How far apart the two trials' throughputs are, over the higher one."""
    values = [float(t["outcome"]["summary"]["output_throughput"]) for t in _trials(folder)]
    return f"{100 * (max(values) - min(values)) / max(values):.2f} %"


def median_itl(folder: Path) -> str:
    return _span([float(t["outcome"]["summary"]["median_itl_ms"]) for t in _trials(folder)], "ms")


def kv_peak(folder: Path) -> str:
    """The server's own ``vllm:kv_cache_usage_perc`` gauge, its highest sample over both trials."""
    peak = max(float(t["outcome"]["server_metrics"]["gauges"]["vllm:kv_cache_usage_perc"]["max"])
               for t in _trials(folder))
    return f"{100 * peak:.2f} %"


def ttft(folder: Path) -> str:
    values = [f"{float(t['outcome']['summary']['p95_ttft_ms']):.0f}" for t in _trials(folder)]
    return f"{' vs '.join(values)} ms"


TABLES: dict[str, Callable[[Path], str]] = {"found": found, "window": window, "client": client, "tie": tie,
                                           "median_itl": median_itl, "kv_peak": kv_peak, "ttft": ttft}
