"""What the README's demo took on the 2-core machine (README.md), from ``demo.json`` (``run.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _data(folder: Path) -> dict[str, Any]:
    path = folder / "demo.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path.name} is not in docs/evidence/{folder.name}/ yet: run "
                                f"`flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/{folder.name}/run.py`")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def wall(folder: Path) -> str:
    return _clock(float(_data(folder)["wall_s"]))


def run(folder: Path) -> str:
    d = _data(folder)
    m = d["machine"]
    return (f"`{d['command']}` on {d['date']}: exit code {d['exit_code']} in {_clock(float(d['wall_s']))} on "
            f"{m['cpus']} cores ({m['cpu_model']}); load average (1 min) {m['load_average_1m_before']} before and "
            f"{m['load_average_1m_after']} after; exported: {'yes' if d['exported'] else 'no'} "
            f"(confirmation {d['confirmation_status']}).")


def launches(folder: Path) -> str:
    rows = ["| launch | ok | failure class | ready (s) | duration (s) | output tok/s |", "|---|---|---|---:|---:|---:|"]
    for r in _data(folder)["launches"]:
        def cell(value: Any) -> str:
            return "–" if value is None else f"{value:,}" if isinstance(value, float) else str(value)
        rows.append(f"| {r['launch']} | {'yes' if r['ok'] else 'no'} | {r['failure_class'] or '–'} | "
                    f"{cell(r['ready_s'])} | {cell(r['duration_s'])} | {cell(r['output_throughput'])} |")
    return "\n".join(rows)


def _range(values: list[float]) -> str:
    low, high = round(min(values)), round(max(values))
    return f"{low} s" if low == high else f"{low}–{high} s"


def ready(folder: Path) -> str:
    """From launch to ready, over the demo's launches."""
    return _range([float(r["ready_s"]) for r in _data(folder)["launches"] if r["ready_s"] is not None])


def per_launch(folder: Path) -> str:
    """A whole launch (start, gates, load, stop), over the demo's launches."""
    return _range([float(r["duration_s"]) for r in _data(folder)["launches"]])


def count(folder: Path) -> str:
    return str(len(_data(folder)["launches"]))


TABLES: dict[str, Callable[[Path], str]] = {"wall": wall, "run": run, "launches": launches, "ready": ready,
                                           "per_launch": per_launch, "count": count}
