"""The emulated node against the reference texts, and its uncalibrated profiles (docs/emulator.md).

Rebuilt from ``calibration.json``, which ``measure.py`` here writes from the model itself
(``tuner.engines.emulated``); ``tests/unit/test_evidence_data.py`` checks that the file is what the
model says now.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _data(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "calibration.json").read_text(encoding="utf-8")))


def _point(folder: Path, prefix: str) -> dict[str, Any]:
    return next(p for p in _data(folder)["blog"]["points"] if p["point"].startswith(prefix))


def _signed(pct: float) -> str:
    return f"{pct:+.1f} %".replace("-", "−")


def _figure(value: float | list[float], unit: str) -> str:
    if isinstance(value, list):
        return " / ".join(f"{v:g}" for v in value) + f" {unit}"
    return f"{value:,.0f}" if unit == "output tok/s" else f"{value:g} {unit}"


def calibration(folder: Path) -> str:
    rows = ["| config (gh200x4, 0731, fp8 KV, block 256, unless named) | reference | source | model | difference |",
            "|---|---|---|---|---|"]
    for p in _data(folder)["blog"]["points"]:
        if "model_output_tok_s" in p:  # a gain over another point
            reference = f"≈ +{p['reference']:g} % (≈ {p['reference_output_tok_s']:,.0f})"
            model = f"+{p['model']:g} % ({p['model_output_tok_s']:,} tok/s)"
            diff = f"{_signed(p['difference_pct'])[:-2]} points"
        else:
            reference, model = _figure(p["reference"], p["unit"]), _figure(p["model"], p["unit"])
            pcts = p["difference_pct"] if isinstance(p["difference_pct"], list) else [p["difference_pct"]]
            diff = " / ".join(_signed(x) for x in pcts)
        rows.append(f"| {p['point']} | {reference} | {p['source']} | {model} | {diff} |")
    return "\n".join(rows)


def comms_ms(folder: Path) -> str:
    return f"{_point(folder, 'decode step')['model']:g} ms"


def dp4_output(folder: Path) -> str:
    return f"{_data(folder)['blog']['dp4']['output_tok_s']:,}"


def blog_dp4(folder: Path) -> str:
    return f"{_point(folder, 'DP4 + EP, util')['reference']:,.0f}"


def tp4_loss(folder: Path) -> str:
    d = _data(folder)["blog"]
    tp4, dp4 = d["tp4"], d["dp4"]
    return "\n".join([
        f"- Replicated KV holds {tp4['max_concurrency']:,} requests of 1024 + 1024 at once instead of "
        f"{dp4['max_concurrency']:,}; about {tp4['running_mean']:,} run on average.",
        f"- Greedy admission at a full cache preempts, {tp4['preemptions']:,} times in the benchmark.",
        f"- {'One API server has' if tp4['api_servers'] == 1 else str(tp4['api_servers']) + ' API servers have'} "
        f"to stream every token. At {tp4['frontend_token_us']:g} µs a token, that caps it at "
        f"{tp4['api_server_cap_tok_s']:,} tok/s.",
        "",
        f"Without that cost TP4 predicts {tp4['output_tok_s_without_the_api_server_cost']:,} output tok/s.",
    ])


def routed_gflop(folder: Path) -> str:
    return f"{_data(folder)['architecture']['routed_gflop_per_token']:g}"


def dense_gflop(folder: Path) -> str:
    return f"{_data(folder)['architecture']['dense_gflop_per_token']:g}"


def routed_params(folder: Path) -> str:
    return f"{_data(folder)['architecture']['routed_active_params_b']:g}"


def multiplicity(folder: Path) -> str:
    m = _data(folder)["multiplicity"]
    ms = sorted(int(k) for k in m["output_tok_s"] if k != "1")
    return f"M = {ms[0]}…{ms[-1]} stays within {m['max_deviation_pct']:g} %"


def profiles(folder: Path) -> str:
    rows = ["| profile | launch (baseline) | c | output tok/s | per GPU |", "|---|---|---:|---:|---:|"]
    for r in _data(folder)["profiles"]:
        launch = [f"`{r['baseline']}`", r["topology"], f"{r['max_num_seqs']:,} seqs"]
        if r["moe_backend"] != "auto":
            launch.append(r["moe_backend"] + (" (changed)" if "moe-backend" in r["changed"] else ""))
        if r["speculative"]:
            launch.append(r["speculative"])
        rows.append(f"| {r['profile']} | {', '.join(launch)} | {r['concurrency']:,} | {r['output_tok_s']:,} | "
                    f"{r['per_gpu_tok_s']:,} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[Path], str]] = {
    "calibration": calibration, "comms_ms": comms_ms, "dp4_output": dp4_output, "blog_dp4": blog_dp4,
    "tp4_loss": tp4_loss, "routed_gflop": routed_gflop, "dense_gflop": dense_gflop,
    "routed_params": routed_params, "profiles": profiles, "multiplicity": multiplicity,
}
