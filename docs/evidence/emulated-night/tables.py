"""The night on the emulated node (issue #14), from the data beside this file (``collect.py`` wrote it).

- ``gh200x4-8h.json``: ``dsv4-tune rehearse --hw gh200x4 --objective throughput --budget 8h`` (default gates,
  the units the night picked); its baselines, the winner and its confirmed value, and the night's node and
  wall time.
- ``ci-nights.json``: one run of ``scripts/ci_night.py`` (the CI nights): each night's wall time and verdicts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load(folder: Path, name: str) -> dict[str, Any] | list[Any] | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _launch(p: dict[str, Any]) -> str:
    parts = [str(p.get("topology", "")), str(p.get("moe-backend", "")), str(p.get("all2all-backend", "") or "")]
    extra = f", {p['max-num-seqs']} seqs, {p['max-num-batched-tokens']} tokens" if "max-num-seqs" in p else ""
    extra += f", util {p['gpu-memory-utilization']}" if "gpu-memory-utilization" in p else ""
    extra += f", graphs {p['compilation-config.cudagraph_mode']}" if "compilation-config.cudagraph_mode" in p else ""
    extra += ", no prefix caching" if p.get("enable-prefix-caching") is False else ""
    draft = p.get("speculative.draft_tokens")
    return " ".join(x for x in parts if x) + extra + (f", draft {draft}" if draft else "")


def night(folder: Path) -> str:
    d = _load(folder, "gh200x4-8h.json")
    if not isinstance(d, dict):
        return "(no data: run `dsv4-tune rehearse --hw gh200x4 --budget 8h`, then collect.py)"
    lines = ["| launch | trial | output tok/s (node) | ladder top / predicted knee | |", "|---|---:|---:|---|---|"]
    for t in d["trials"]:
        if not t["launched"] or t["duplicate_of"] is not None:
            continue
        label = f"baseline {t['baseline']}" if t["baseline"] else _launch(t["params"])
        value = f"{t['value']:,.0f}" if t["value"] is not None else f"– ({t['failure_class']})"
        shown = "shown" if t["knee_shown"] else "NOT shown"
        knee = (f"{t['knee_top_concurrency']:,} / {t['knee_predicted']:,} ({shown})"
                if t["knee_shown"] is not None else "")
        mark = "**winner**" if d["winner"] and t["trial"] == d["winner"]["trial"] else ""
        lines.append(f"| {label} | {t['trial']} | {value} | {knee} | {mark} |")
    return "\n".join(lines)


def summary(folder: Path) -> str:
    d = _load(folder, "gh200x4-8h.json")
    if not isinstance(d, dict) or not d["winner"]:
        return "(no data)"
    w = d["winner"]
    best = max((t["value"] for t in d["trials"] if t["baseline"] and t["value"] is not None), default=0.0)
    repeats = " / ".join(f"{v:,.0f}" for v in (w["repeats"] or []))
    return (f"| figure | value |\n|---|---|\n"
            f"| winner | trial {w['trial']}: {_launch(w['params'])} |\n"
            f"| confirmed output tok/s (node, median of repeats) | {w['value']:,.0f} (repeats {repeats}) |\n"
            f"| best baseline | {best:,.0f} |\n"
            f"| launches / refused before launch | {d['launched']} / {d['refused_before_launch']} |\n"
            f"| node time / wall time | {d['node_s'] / 3600:.1f} h / {d['wall_s'] / 60:.1f} min |\n"
            f"| units | time scale {d['units']['time_scale']:g}, multiplicity {d['units']['multiplicity']} |")


def ci(folder: Path) -> str:
    d = _load(folder, "ci-nights.json")
    if not isinstance(d, list):
        return "(no data: run scripts/ci_night.py, then collect.py --ci)"
    names = list(d[0]["checks"])
    lines = ["| night | wall s | " + " | ".join(names) + " |", "|---|---:|" + "---|" * len(names)]
    for n in d:
        lines.append(f"| {n['night']} | {n['wall_s']} | " + " | ".join(n["checks"].get(k, "–") for k in names) + " |")
    return "\n".join(lines)


def wall(folder: Path) -> str:
    d = _load(folder, "gh200x4-8h.json")
    return f"{d['wall_s'] / 60:.0f} min" if isinstance(d, dict) and d.get("wall_s") else "(no data)"


def ci_wall(folder: Path) -> str:
    d = _load(folder, "ci-nights.json")
    return f"{max(n['wall_s'] for n in d) / 60:.0f} min" if isinstance(d, list) and d else "(no data)"


TABLES: dict[str, Callable[[Path], str]] = {"night": night, "summary": summary, "ci": ci, "wall": wall,
                                            "ci_wall": ci_wall}
