"""Tables of the 1x H200 study (issue 16), rebuilt from the files scripts/gpu/collect.py writes here.

Each table reads only this folder: ``launches.csv`` (one row per launch), ``ladder.csv`` (one row per
measured window), ``verify.json``, ``capacity.json``, ``gpu_time.json``. A table whose data is not
here yet says so instead of failing.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _rows(folder: Path, name: str) -> list[dict[str, str]]:
    path = folder / name
    return list(csv.DictReader(path.open())) if path.is_file() else []


def _json(folder: Path, name: str) -> Any:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _num(text: Any) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return math.nan
    return value


def _f(text: Any, fmt: str = ",.0f", unit: str = "") -> str:
    value = _num(text)
    return "–" if math.isnan(value) else f"{value:{fmt}}{unit}"


def _table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    if not rows:
        return "(no data yet: scripts/gpu/collect.py has not been run on the device calls' files)"
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _flags(row: dict[str, str]) -> str:
    if row.get("kind") == "reserve":
        return "best/serve.sh, as exported"
    parts = [f"seqs {row.get('max-num-seqs', '')}", f"mbt {row.get('max-num-batched-tokens', '')}",
             f"util {row.get('gpu-memory-utilization', '')}"]
    if row.get("kv-cache-dtype") not in ("", "auto", None):
        parts.append(f"KV {row['kv-cache-dtype']}")
    if row.get("enforce-eager") == "True":
        parts.append("eager")
    else:
        parts.append(f"{row.get('cudagraph_mode', '')} ≤{row.get('capture_size', '')}")
    if row.get("draft_tokens") not in ("", "0", None):
        parts.append(f"ngram {row['draft_tokens']}")
    return ", ".join(parts)


def _chosen(folder: Path) -> dict[tuple[str, str], dict[str, str]]:
    """The window each launch is scored by (its chosen step, first repeat)."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for w in _rows(folder, "ladder.csv"):
        key = (w["kind"], w["launch"])
        if w.get("chosen") == "True" and key not in out:
            out[key] = w
    return out


def launches(folder: Path) -> str:
    """Every launch: its flags, how it started, what it scored."""
    chosen = _chosen(folder)
    peak: dict[tuple[str, str], float] = {}
    for w in _rows(folder, "ladder.csv"):
        key = (w["kind"], w["launch"])
        peak[key] = max(peak.get(key, 0.0), _num(w.get("kv_usage_max")) if w.get("kv_usage_max") else 0.0)
    rows = []
    for r in _rows(folder, "launches.csv"):
        key = (r["kind"], r["launch"])
        w = chosen.get(key, {})
        if r.get("feasible") == "True" or (r["kind"] == "reserve" and r.get("ok") == "True"):
            result = "ok"
        elif r.get("failure_class"):
            result = r["failure_class"]
        elif not r.get("ready_s") and not r.get("ok"):
            result = "not ready when its call's time box ended"   # stopped from outside: nothing recorded
        else:
            result = "infeasible"
        cache = r.get("compile_cache") or ("eager" if r.get("enforce-eager") == "True" else "–")
        if r.get("compile_key"):
            cache += f" (key {r['compile_key']})"
        rows.append([f"{r['kind']} {r['launch']}" + (f" ({r['baseline']})" if r.get("baseline") else ""), _flags(r),
                     _f(r.get("ready_s"), ".0f", " s"), cache, _f(r.get("graph_capture_s"), ".0f", " s"),
                     _f(w.get("concurrency"), ".0f"), _f(w.get("output_throughput")), _f(w.get("p95_ttft_ms")),
                     _f(w.get("p95_itl_ms"), ".1f"), _f(100 * peak.get(key, math.nan), ".0f", " %"), result])
    return _table(["launch", "flags", "ready", "compile cache", "capture", "streams", "out tok/s", "p95 TTFT ms",
                   "p95 ITL ms", "KV peak", "result"], rows, "llrlrrrrrrl")


def knee(folder: Path) -> str:
    """Every ladder step of every screening launch: where the KV cache filled and what it cost."""
    rows = []
    for w in _rows(folder, "ladder.csv"):
        if w["kind"] != "screen" or w.get("repeat") not in ("0", ""):
            continue
        rows.append([w["launch"], _f(w.get("concurrency"), ".0f"), _f(w.get("output_throughput")),
                     _f(w.get("p95_ttft_ms")), _f(w.get("p95_itl_ms"), ".1f"),
                     _f(100 * _num(w.get("kv_usage_max")), ".1f", " %"), _f(w.get("running_max"), ".0f"),
                     _f(w.get("waiting_max"), ".0f"), _f(w.get("preemptions"), ".0f"),
                     _f(100 * _num(w.get("client_cpu_share")), ".0f", " %"),
                     "yes" if w.get("client_saturated") == "True" else "no",
                     "✓" if w.get("chosen") == "True" else ""])
    return _table(["trial", "streams", "out tok/s", "p95 TTFT ms", "p95 ITL ms", "KV peak", "running max",
                   "waiting max", "preemptions", "client CPU", "client saturated", "reported"], rows)


def power(folder: Path) -> str:
    """GPU power of each launch's reported window: joules, tokens per joule, $ per million tokens."""
    rows = []
    for (kind, launch), w in _chosen(folder).items():
        rows.append([f"{kind} {launch}", _f(w.get("concurrency"), ".0f"), _f(w.get("output_throughput")),
                     _f(w.get("gpu_power_mean_w"), ".0f", " W"), _f(w.get("gpu_power_max_w"), ".0f", " W"),
                     _f(w.get("gpu_energy_j"), ",.0f", " J"), _f(w.get("tokens_per_joule"), ".2f"),
                     _f(w.get("usd_per_mtok"), ".3f"), w.get("energy_from") or "–"])
    return _table(["launch", "streams", "out tok/s", "mean power", "max power", "energy", "tok/J", "$/Mtok",
                   "energy from"], rows, "lrrrrrrrl")


def verify(folder: Path) -> str:
    """The exported launch file served again, beside the figure the study reported."""
    v = _json(folder, "verify.json")
    if not v:
        return _table([], [])
    rep = v.get("reported", {})
    conf = ", ".join(_f(x, ",.1f") for x in rep.get("confirmation_values") or []) or "–"
    again = ", ".join(_f(x, ",.1f") for x in v.get("values") or []) or "–"
    reported = _f(rep.get("value"), ",.1f") + ("" if rep.get("confirmed") else " (unconfirmed)")
    return _table(["metric", "reported", "confirmation repeats", "allowed", "re-served repeats", "re-served median",
                   "difference", "within"],
                  [[v.get("metric", ""), reported, conf, _f(v.get("allowed"), ",.1f"), again,
                    _f(v.get("median"), ",.1f"), _f(100 * _num(v.get("delta_rel")), "+.1f", " %"),
                    "yes" if v.get("within") else "**no**"]])


def capacity(folder: Path) -> str:
    """The load generator against a real CUDA vLLM: one process, and the pool."""
    c = _json(folder, "capacity.json") or {}
    rows = [[str(r.get("processes")), str(r.get("concurrency")), _f(r.get("chunks_per_s")),
             _f(100 * _num(r.get("client_cpu_share")), ".0f", " %"), str(r.get("client_saturated", r.get("error", "")))]
            for r in c.get("rows", [])]
    return _table(["client processes", "streams", "chunks/s", "client CPU (busiest process)", "saturated"], rows)


def gpu_time(folder: Path) -> str:
    """Device time, per call, as the device tool reported it."""
    g = _json(folder, "gpu_time.json") or {}
    rows = [[str(c.get("call")), c.get("what", ""), _f(c.get("wall_s"), ".0f", " s"), _f(c.get("held_s"), ".0f", " s"),
             _f(c.get("budget_left_s"), ".0f", " s")] for c in g.get("calls", [])]
    return _table(["call", "what", "command wall", "held so far", "budget left"], rows, "llrrr")


# -- single figures in docs/evidence/h200.md's prose -------------------------------------------------------
def _span(values: list[float], unit: str, fmt: str = ".0f") -> str:
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return f"{low} {unit}" if low == high else f"{low}–{high} {unit}"


def _launch(folder: Path, kind: str) -> dict[str, str]:
    return next(r for r in _rows(folder, "launches.csv") if r["kind"] == kind)


def _launch_figure(folder: Path, column: str) -> str:
    """One start-up phase over every launch that logged it (seconds, from the servers' logs)."""
    return _span([_num(r[column]) for r in _rows(folder, "launches.csv") if r.get(column)], "s")


def device_at_start(folder: Path) -> str:
    """Device time the session had when the first call began: that call's budget left plus its held time."""
    first = (_json(folder, "gpu_time.json") or {})["calls"][0]
    return f"{_num(first['budget_left_s']) + _num(first['held_s']):,.0f} s"


def reserved(folder: Path) -> str:
    v = _json(folder, "verify.json")
    values = [_f(r["output_throughput"], ",.0f") for r in v["repeats"]]
    return f"{' and '.join(values)} tok/s, median {_num(v['median']):,.0f}"


def reserved_delta(folder: Path) -> str:
    return _f(100 * _num(_json(folder, "verify.json")["delta_rel"]), "+.1f", " %")


def reserved_spread(folder: Path) -> str:
    """How far apart the re-served windows are, over the lower one."""
    values = [_num(r["output_throughput"]) for r in _json(folder, "verify.json")["repeats"]]
    return f"{100 * (max(values) - min(values)) / min(values):.0f} %"


def reserved_window(folder: Path) -> str:
    return _span([_num(r["duration"]) for r in _json(folder, "verify.json")["repeats"]], "s")


def kv_peak(folder: Path) -> str:
    return f"{100 * max(_num(w['kv_usage_max']) for w in _rows(folder, 'ladder.csv') if w['kind'] == 'screen'):.0f} %"


def top_ttft(folder: Path) -> str:
    """p95 TTFT at the screening ladder's top step."""
    top = max((w for w in _rows(folder, "ladder.csv") if w["kind"] == "screen"), key=lambda w: _num(w["concurrency"]))
    return f"{_num(top['p95_ttft_ms']) / 1000:.1f} s"


def client_cpu_max(folder: Path) -> str:
    return f"{100 * max(_num(w['client_cpu_share']) for w in _rows(folder, 'ladder.csv')):.0f} %"


def ready_screen(folder: Path) -> str:
    return _f(_launch(folder, "screen")["ready_s"], ".0f", " s")


def ready_reserve(folder: Path) -> str:
    return _f(_launch(folder, "reserve")["ready_s"], ".0f", " s")


def prevalidate_probe(folder: Path) -> str:
    """What the pre-launch check's probe in call 2 took (``prevalidate.txt``: "(25.9 s; ran in the child ...")."""
    import re

    text = (folder / "prevalidate.txt").read_text(encoding="utf-8")
    match = re.search(r"\((\d+(?:\.\d+)?) s; ran in the child", text)
    if match is None:
        raise ValueError("prevalidate.txt names no check that ran in the child")
    return f"{float(match.group(1)):.1f} s"


TABLES: dict[str, Callable[[Path], str]] = {
    "launches": launches, "knee": knee, "power": power, "verify": verify, "capacity": capacity,
    "gpu_time": gpu_time,
    "device_at_start": device_at_start, "reserved": reserved, "reserved_delta": reserved_delta,
    "reserved_spread": reserved_spread, "reserved_window": reserved_window, "kv_peak": kv_peak, "top_ttft": top_ttft,
    "client_cpu_max": client_cpu_max, "ready_screen": ready_screen, "ready_reserve": ready_reserve,
    "init_engine": lambda f: _launch_figure(f, "init_engine_s"),
    "torch_compile": lambda f: _launch_figure(f, "torch_compile_s"),
    "inductor": lambda f: _launch_figure(f, "inductor_compile_s"),
    "capture": lambda f: _launch_figure(f, "graph_capture_s"),
    "prevalidate_probe": prevalidate_probe,
}
