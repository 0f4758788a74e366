"""The `--budget 6m` study's figures (its README.md), from its own ``trials.csv``."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path


def _trial(folder: Path, number: int) -> dict[str, str]:
    with (folder / "trials.csv").open(encoding="utf-8") as fh:
        return next(row for row in csv.DictReader(fh) if int(row["number"]) == number)


def trial0(folder: Path) -> str:
    """How long the one screened launch took, and when it was ready."""
    row = _trial(folder, 0)
    duration, ready = float(row["duration_s"]), float(row["ready_s"])
    return f"{duration / 60:.1f} min ({duration:.0f} s, ready after {ready:.0f} s)"


def budget_left(folder: Path) -> str:
    """What the 6-minute budget had left after that launch, to the minute."""
    return f"{(360 - float(_trial(folder, 0)['duration_s'])) / 60:.0f} min"


TABLES: dict[str, Callable[[Path], str]] = {"trial0": trial0, "budget_left": budget_left}
