"""How long the tool takes to stop what it must stop (``benchmarks/bench_stop_times.py``), from ``stop_times.json``.

The tests assert that each of these happens, never how fast (a wall-clock bound fails on a loaded
machine); the figures are here instead, with the bound each test used to assert.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def _s(value: float) -> str:
    if value < 0.0001:  # the data's resolution (0.1 ms)
        return "< 0.1 ms"
    if value < 0.01:
        return f"{value * 1000:.1f} ms"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def stops(folder: Path) -> str:
    doc = json.loads((folder / "stop_times.json").read_text(encoding="utf-8"))
    lines = [f"Measured {doc['measured']} on {doc['machine']['cpus']} CPUs, {doc['repeats']} runs each "
             "(`benchmarks/bench_stop_times.py`).", "",
             "| what | setting | median | max | the test's former bound |", "|---|---|---:|---:|---:|"]
    for row in doc["rows"]:
        lines.append(f"| {row['name']} | {row['what']} | {_s(row['median_s'])} | {_s(row['max_s'])} | "
                     f"< {row['former_bound_s']:g} s |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[Path], str]] = {"stops": stops}
