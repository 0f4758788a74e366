"""How long ``--prevalidate`` takes per launch on the CPU build (docs/decisions.md), from ``prevalidate.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def calls(folder: Path) -> str:
    data = json.loads((folder / "prevalidate.json").read_text(encoding="utf-8"))
    return (f"{min(data['calls_s']):.1f}–{max(data['calls_s']):.1f} s a launch (the first call of a tuner "
            f"process {data['first_call_s']:.0f} s: it imports vLLM), measured {data['date']} on "
            f"{data['cpus']} cores at a load average of {data['load_average_1m']:.0f}")


TABLES: dict[str, Callable[[Path], str]] = {"calls": calls}
