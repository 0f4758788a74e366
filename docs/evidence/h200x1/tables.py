"""Tables of a one-GPU study, rebuilt from the files scripts/gpu/collect.py writes into its folder.

This module serves two folders: ``docs/evidence/h200x1/`` (one H200, issue 16) and, loaded by its
``tables.py``, ``docs/evidence/h100x1/`` (one H100, issue 30). Each table reads only the folder it is
given: ``launches.csv`` (one row per launch), ``ladder.csv`` (one row per measured window),
``verify.json``, ``capacity.json``, ``gpu_time.json``. A table whose data is not here yet says so
instead of failing.
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
        elif not r.get("ready_s") and not r.get("ok") and r.get("ready_in_log") == "True":
            result = "ready, then cut by its call's time box (no result)"   # stopped from outside
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


# -- tables and figures of docs/evidence/h100.md (any one-GPU folder) ----------------------------------------
def _trials(folder: Path) -> dict[str, dict[str, str]]:
    return {r["number"].zfill(4): r for r in _rows(folder, "trials.csv")}


def _is_control(trial: dict[str, str]) -> bool:
    return bool(trial.get("control_for"))


def _cut(r: dict[str, str]) -> bool:
    return not r.get("ready_s") and r.get("ok") not in ("True", "False")


def counts(folder: Path) -> str:
    """Every launch, by phase: launched, finished with a result, cut by its call's time box."""
    trials, groups = _trials(folder), {}
    for r in _rows(folder, "launches.csv"):
        if r["kind"] == "screen":
            what = "screening: no-speculation controls" if _is_control(trials.get(r["launch"], {})) \
                else "screening: trials (what `--trials` counts)"
        elif r["kind"] == "confirm":
            what = "confirmation: its control" if r["launch"].endswith("-control") else "confirmation: the winner"
        else:
            what = "re-serve of best/serve.sh (`verify`)"
        group = groups.setdefault(what, [[], [], []])
        group[0].append(r["launch"])
        group[2 if _cut(r) else 1].append(r["launch"])
    rows = [[what, str(len(a)), str(len(b)), str(len(c)), ", ".join(x.split("/")[0] for x in c) or "–"]
            for what, (a, b, c) in groups.items()]
    if rows:
        total = [sum(len(g[i]) for g in groups.values()) for i in range(3)]
        rows.append(["**all launches**", *(f"**{t}**" for t in total), ""])
    return _table(["phase", "launched", "with a result", "cut by a time box", "cut"], rows, "lrrrl")


_PAIR_FLAGS = ("max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization", "kv-cache-dtype", "enforce-eager",
               "cudagraph_mode", "capture_size")


def _pairs(folder: Path) -> list[tuple[dict[str, str], dict[str, str] | None]]:
    """(speculative screening launch, its no-speculation control): the launch with the same flags but no drafts."""
    screen = [r for r in _rows(folder, "launches.csv") if r["kind"] == "screen"]
    out = []
    for r in screen:
        if r.get("draft_tokens") in ("", "0", None):
            continue
        twin = [c for c in screen
                if c.get("draft_tokens") in ("", "0") and all(c.get(k) == r.get(k) for k in _PAIR_FLAGS)]
        out.append((r, twin[0] if twin else None))
    return out


def pairs(folder: Path) -> str:
    """Each speculative screening trial beside its no-speculation control, in their reported windows."""
    chosen, trials, rows = _chosen(folder), _trials(folder), []
    for spec, ctl in _pairs(folder):
        s_w = chosen.get(("screen", spec["launch"]), {})
        c_w = chosen.get(("screen", ctl["launch"]), {}) if ctl else {}
        gain = _num(s_w.get("output_throughput")) / _num(c_w.get("output_throughput")) - 1 \
            if s_w and c_w else math.nan
        how = "control launched first" if ctl and _is_control(trials.get(ctl["launch"], {})) else "a baseline"
        flags = _flags({k: v for k, v in spec.items() if k != "draft_tokens"})
        rows.append([f"{spec['launch']} ({spec.get('baseline') or 'sampled'})",
                     f"{ctl['launch']} ({how})" if ctl else "–", flags, spec.get("draft_tokens", ""),
                     _f(s_w.get("output_throughput")) if s_w else "cut", _f(c_w.get("output_throughput")),
                     _f(100 * gain, "+.1f", " %"), _f(100 * _num(s_w.get("spec_acceptance")), ".0f", " %"),
                     _f(s_w.get("tokens_per_joule"), ".2f"), _f(c_w.get("tokens_per_joule"), ".2f")])
    return _table(["speculative trial", "its control", "shared flags", "draft tokens", "out tok/s", "control tok/s",
                   "gain", "draft acceptance", "tok/J", "control tok/J"], rows, "lllrrrrrrr")


def startup(folder: Path) -> str:
    """Start-up phases by kind of launch: compiled with a compile-cache miss or hit, eager (from the server logs)."""
    groups: dict[str, list[dict[str, str]]] = {}
    for r in _rows(folder, "launches.csv"):
        kind = "eager" if r.get("enforce-eager") == "True" else f"torch.compile, cache {r.get('compile_cache') or '?'}"
        groups.setdefault(kind, []).append(r)

    def span(rows: list[dict[str, str]], column: str) -> str:
        values = [_num(r[column]) for r in rows if r.get(column)]
        return _span(values, "s") if values else "–"

    rows = [[kind, str(len(g)), ", ".join(f"{r['kind']} {r['launch'].split('/')[0]}" for r in g),
             span(g, "ready_s"), span(g, "init_engine_s"), span(g, "torch_compile_s"), span(g, "graph_capture_s")]
            for kind, g in sorted(groups.items())]
    return _table(["launch kind", "launches", "which", "ready", "engine init", "torch.compile", "graph capture"],
                  rows, "lrlrrrr")


def timeline(folder: Path) -> str:
    """What the device scripts marked, with the seconds to the next mark (``gpu_time.json``)."""
    marks = (_json(folder, "gpu_time.json") or {}).get("timeline", [])
    rows = [[str(m["t_s"]), m["what"], str(marks[i + 1]["t_s"] - m["t_s"]) if i + 1 < len(marks) else "–"]
            for i, m in enumerate(marks)]
    return _table(["t (s)", "mark", "to the next (s)"], rows, "rlr")


def starved(folder: Path) -> str:
    """The windows whose client the OS kept off the CPU (its event loop lagged): launch, streams, loop lag p99."""
    hits = [f"{w['kind']} {w['launch']} at {_f(w['concurrency'], '.0f')} streams (loop lag p99 "
            f"{_f(w.get('client_loop_lag_p99_ms'), '.0f', ' ms')})"
            for w in _rows(folder, "ladder.csv") if w.get("client_starved") == "True"]
    return "; ".join(hits) or "none"


def _window(folder: Path, kind: str, launch: str) -> dict[str, str]:
    return _chosen(folder)[(kind, launch)]


def _top(folder: Path) -> tuple[dict[str, str], dict[str, str] | None]:
    """The best feasible screening launch and its control (if it speculates)."""
    chosen = _chosen(folder)
    best = max((r for r in _rows(folder, "launches.csv") if r["kind"] == "screen" and r.get("feasible") == "True"),
               key=lambda r: _num(r["value"]))
    twin = next((c for s, c in _pairs(folder) if s["launch"] == best["launch"]), None)
    return chosen[("screen", best["launch"])], chosen.get(("screen", twin["launch"])) if twin else None


def top_vs_control(folder: Path) -> str:
    best, ctl = _top(folder)
    if ctl is None:
        return f"{_num(best['output_throughput']):,.0f} tok/s"
    gain = _num(best["output_throughput"]) / _num(ctl["output_throughput"]) - 1
    return (f"{_num(best['output_throughput']):,.0f} tok/s against {_num(ctl['output_throughput']):,.0f} "
            f"({100 * gain:+.0f} %)")


def top_tpj(folder: Path) -> str:
    best, ctl = _top(folder)
    text = f"{_num(best['tokens_per_joule']):.1f} tok/J"
    return text if ctl is None else f"{text} against {_num(ctl['tokens_per_joule']):.1f}"


def tpj_span(folder: Path) -> str:
    """Tokens per joule over the screening windows that were reported."""
    return _span([_num(w["tokens_per_joule"]) for (k, _), w in _chosen(folder).items()
                  if k == "screen" and w.get("tokens_per_joule")], "tok/J", ".1f")


def power_span(folder: Path) -> str:
    return _span([_num(w["gpu_power_mean_w"]) for (k, _), w in _chosen(folder).items()
                  if k == "screen" and w.get("gpu_power_mean_w")], "W")


def acceptance(folder: Path) -> str:
    return _span([100 * _num(w["spec_acceptance"]) for w in _rows(folder, "ladder.csv") if w.get("spec_acceptance")],
                 "%")


def confirmation(folder: Path) -> str:
    """The winner's confirmation repeats and their spread (max − min over the lower one)."""
    values = _json(folder, "verify.json")["reported"]["confirmation_values"]
    spread = 100 * (max(values) - min(values)) / min(values)
    return f"{' and '.join(f'{v:,.0f}' for v in values)} tok/s (spread {spread:.0f} %)"


def allowed(folder: Path) -> str:
    return f"{_num(_json(folder, 'verify.json')['allowed']):,.1f} tok/s"


def ready_span(folder: Path, kind: str = "", cache: str = "") -> str:
    """Ready times (s) of the launches of a kind and compile-cache outcome that have one."""
    return _span([_num(r["ready_s"]) for r in _rows(folder, "launches.csv")
                  if r.get("ready_s") and (not kind or r["kind"] == kind)
                  and (not cache or r.get("compile_cache") == cache)], "s")


def capacity_row(folder: Path, processes: int) -> str:
    """The capacity run's row for this many client processes at its largest stream count."""
    rows = [r for r in (_json(folder, "capacity.json") or {})["rows"] if r.get("processes") == processes]
    r = max(rows, key=lambda r: r["concurrency"])
    return (f"{_num(r['chunks_per_s']):,.0f} chunks/s at {r['concurrency']:,} streams "
            f"({'saturated' if r.get('client_saturated') else 'not saturated'})")


def gate_drift(folder: Path) -> str:
    """The equivalence gate's refusal (a screening launch's reason)."""
    r = next(r for r in _rows(folder, "launches.csv") if r.get("failure_class") == "guard_failed")
    return r["reason"].split(": ", 2)[-1]


def completions(folder: Path) -> str:
    """The equivalence gate's greedy reference answers: each probe's token ids, and how many are its commonest one."""
    probes = _json(folder, "reference_completions.json") or {}
    rows = []
    for name, ids in probes.items():
        top = max(set(ids), key=ids.count) if ids else None
        rows.append([name, " ".join(str(i) for i in ids), f"{ids.count(top)} of {len(ids)} ({top})" if ids else "–"])
    return _table(["probe", "greedy completion (token ids)", "its commonest token"], rows, "llr")


def confirm_duration(folder: Path) -> str:
    """How long a finished confirmation launch took, start to stop (its ``duration_s``)."""
    return _span([_num(r["duration_s"]) for r in _rows(folder, "launches.csv")
                  if r["kind"] == "confirm" and r.get("duration_s")], "s")


def screen_duration(folder: Path) -> str:
    """How long a finished screening launch took, start to stop (its ``duration_s``)."""
    return _span([_num(r["duration_s"]) for r in _rows(folder, "launches.csv")
                  if r["kind"] == "screen" and r.get("duration_s")], "s")


def defaults_value(folder: Path) -> str:
    """The ``vllm-defaults`` baseline's screening figure."""
    r = next(r for r in _rows(folder, "launches.csv") if r["kind"] == "screen" and r.get("baseline") == "vllm-defaults")
    return f"{_num(r['value']):,.0f} tok/s"


def budget_end(folder: Path) -> str:
    return f"{_num((_json(folder, 'gpu_time.json') or {})['calls'][-1]['budget_left_s']):,.0f} s"


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
    "counts": counts, "pairs": pairs, "startup": startup, "timeline": timeline, "starved": starved,
    "top_vs_control": top_vs_control, "top_tpj": top_tpj, "tpj_span": tpj_span, "power_span": power_span,
    "acceptance": acceptance, "confirmation": confirmation, "allowed": allowed,
    "ready_all": ready_span,
    "ready_miss": lambda f: ready_span(f, cache="miss"),
    "ready_hit": lambda f: ready_span(f, cache="hit"),
    "capacity_one": lambda f: capacity_row(f, 1), "capacity_pool": lambda f: capacity_row(f, 4),
    "gate_drift": gate_drift, "completions": completions,
    "confirm_duration": confirm_duration, "defaults_value": defaults_value, "screen_duration": screen_duration,
    "budget_end": budget_end,
}
