"""How many proposals in a row a normal night tells without a launch (docs/feasibility.md, "A study never spins").

``streaks.json`` is written by ``measure.py`` here: the real local loop on every GPU hardware profile, three
seeds, launches replaced by the feasibility model's verdict. A run is the proposals told between two
launches (refused before launch, or duplicates of a configuration told before).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def _nights(folder: Path) -> list[dict[str, object]]:
    return list(json.loads((folder / "streaks.json").read_text(encoding="utf-8"))["nights"])


def streaks(folder: Path) -> str:
    rows = ["| profile | nights | launches | proposals told | refused before launch | duplicates "
            "| longest run without a launch |", "|---|---:|---:|---:|---:|---:|---:|"]
    nights = _nights(folder)
    for profile in dict.fromkeys(str(n["profile"]) for n in nights):
        mine = [n for n in nights if n["profile"] == profile]
        total = {key: sum(int(n[key]) for n in mine) for key in ("launches", "proposals", "refused", "duplicates")}  # type: ignore[call-overload]
        rows.append(f"| {profile} | {len(mine)} | {total['launches']} | {total['proposals']} | {total['refused']} | "
                    f"{total['duplicates']} | {max(int(n['longest_streak']) for n in mine)} |")  # type: ignore[call-overload]
    return "\n".join(rows)


def longest(folder: Path) -> str:
    return str(max(int(n["longest_streak"]) for n in _nights(folder)))  # type: ignore[call-overload]


def nights(folder: Path) -> str:
    return str(len(_nights(folder)))


TABLES: dict[str, Callable[[Path], str]] = {"streaks": streaks, "longest": longest, "nights": nights}
