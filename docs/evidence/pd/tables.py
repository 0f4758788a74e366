"""Prefill/decode disaggregation (issue 27), from the data beside this file.

- ``h200x8-long-context.json``: ``dsv4-tune rehearse --hw h200x8 --objective long-context --trials 8`` (default
  gates, the units the night picked), collected by ``collect.py``: every launch of both kinds, each layout's
  pools and KV transfer, TTFT per context bucket.
- ``h200x8-long-context-first.json``: the same command before a baseline without a layout said ``aggregated``
  (the sampler drew the lever for the one-server recipes: recipe-tp8 and recipe-tep were launched as layouts;
  every row is a valid launch of what it says, so no row is named as a baseline).
- ``h200x8-long-context-second.json``: the second run of that command (baselines fixed), whose one-server launches
  had windows refused for prefix-cache hits: the emulated scheduler's own-content hash collided for its first
  two split-off groups (uids -1 and -2, which CPython hashes alike). ``h200x8-long-context.json`` is the same
  command again after the fix.
- ``cpu-connectors.json``: ``benchmarks/bench_pd_cpu.py``: the KV connectors the vLLM CPU build runs between
  two servers behind vllm-router.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

NIGHT = "h200x8-long-context.json"


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _num(value: Any, spec: str = ",.0f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "–"


def _launch(t: dict[str, Any]) -> str:
    p = t["params"]
    if t["kind"] == "disaggregated":
        pools = t.get("pools") or {}
        head = f"{t['layout']} (prefill {pools.get('prefill')}, decode {pools.get('decode')})"
    else:
        head = f"{p.get('topology')}, {p.get('max-num-batched-tokens')} batched tokens"
    extra = [str(p.get("moe-backend", ""))]
    if p.get("speculative.draft_tokens"):
        extra.append(f"draft {p['speculative.draft_tokens']}")
    return f"{head}, {', '.join(x for x in extra if x)}"


def _best(d: dict[str, Any], kind: str) -> dict[str, Any] | None:
    ranked = [t for t in d["trials"] if t["kind"] == kind and t["feasible"] and t["value"] is not None]
    return max(ranked, key=lambda t: t["value"]) if ranked else None


def night(folder: Path, name: str = NIGHT) -> str:
    d = _load(folder, name)
    if d is None:
        return "(no data: rehearse the night, then collect.py)"
    lines = ["| launch | kind | trial | goodput req/s (node) | at concurrency | p95 TTFT s | p95 ITL ms | |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for t in d["trials"]:
        label = (f"baseline {t['baseline']}: " if t["baseline"] and name != FIRST else "") + _launch(t)
        value = _num(t["value"], ".2f") if t["feasible"] else f"– ({t['failure_class']})"
        ttft = t["figures"].get("p95_ttft_ms")
        mark = "**winner**" if d["winner"] and t["trial"] == d["winner"]["trial"] else ""
        lines.append(f"| {label} | {t['kind']} | {t['trial']} | {value} | {_num(t['concurrency'])} | "
                     f"{_num(ttft / 1000 if isinstance(ttft, (int, float)) else None, ',.1f')} | "
                     f"{_num(t['figures'].get('p95_itl_ms'))} | {mark} |")
    return "\n".join(lines)


def kinds(folder: Path, name: str = NIGHT) -> str:
    d = _load(folder, name)
    if d is None:
        return "(no data)"
    pd, agg = _best(d, "disaggregated"), _best(d, "aggregated")
    if pd is None or agg is None:
        only = "disaggregated" if pd else "aggregated" if agg else "neither kind"
        return f"only {only} met the SLOs"
    first, second = (pd, agg) if pd["value"] >= agg["value"] else (agg, pd)
    return (f"{first['kind']} won the screening: trial {first['trial']} ({_launch(first)}) at "
            f"{first['value']:.2f} req/s, "
            f"{first['value'] / second['value']:.2f}× the best {second['kind']} launch, trial {second['trial']} "
            f"({_launch(second)}) at {second['value']:.2f} req/s")


def pools(folder: Path) -> str:
    d = _load(folder, NIGHT)
    best = _best(d, "disaggregated") if d else None
    if best is None:
        return "(no data)"
    facts = best["pool_facts"]
    rows = [("p95 queue time ms", "queue_p95_ms", ",.0f"), ("peak KV use", "kv_usage_max", ".0%"),
            ("peak running requests", "running_max", ",.0f"), ("peak waiting requests", "waiting_max", ",.0f"),
            ("prompt tokens", "prompt_tokens", ",.0f"), ("tokens generated", "generation_tokens", ",.0f")]
    lines = [f"| trial {best['trial']}, {best['layout']} | prefill pool ({best['pools']['prefill']}) | decode pool "
             f"({best['pools']['decode']}) |", "|---|---:|---:|"]
    lines += [f"| {label} | {_num(facts['prefill'].get(key), spec)} | {_num(facts['decode'].get(key), spec)} |"
              for label, key, spec in rows]
    x = best["transfer"]
    lines.append(f"| KV transfers ({best['connector']}) | | {_num(x.get('transfers'))}: p50 "
                 f"{_num(x.get('p50_transfer_ms'), ',.1f')} ms, p95 {_num(x.get('p95_transfer_ms'), ',.1f')} ms, "
                 f"{_num(x.get('failed_transfers'))} failed |")
    return "\n".join(lines)


def buckets(folder: Path) -> str:
    d = _load(folder, NIGHT)
    if d is None:
        return "(no data)"
    chosen = [t for t in (_best(d, "disaggregated"), _best(d, "aggregated")) if t is not None]
    if not chosen or not chosen[0]["ttft_by_context"]:
        return "(no data)"
    edges = [f"{b['prompt_tokens_above']:,}–{b['prompt_tokens_upto']:,}" if b["prompt_tokens_upto"] else
             f"over {b['prompt_tokens_above']:,}" for b in chosen[0]["ttft_by_context"]]
    lines = ["| launch | " + " | ".join(f"p95 TTFT s, prompts {e} tokens" for e in edges) + " |",
             "|---|" + "---:|" * len(edges)]
    for t in chosen:
        cells = [f"{_num((b.get('p95_ttft_ms') or 0) / 1000, ',.1f')} ({b['requests']})" if b.get("p95_ttft_ms")
                 else "–" for b in t["ttft_by_context"]]
        lines.append(f"| trial {t['trial']}: {_launch(t)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu(folder: Path) -> str:
    d = _load(folder, "cpu-connectors.json")
    if d is None:
        return "(no data: run benchmarks/bench_pd_cpu.py)"
    lines = ["| connector | prefix caching | served through the router | gates | goodput req/s | p95 TTFT ms | "
             "p95 ITL ms | KV transfers (p50 ms) | prompt tokens received | trial wall s | |",
             "|---|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for row in d["connectors"]:
        s, x = row.get("summary") or {}, row.get("transfer") or {}
        transfers = (f"{_num(x.get('transfers'))} ({_num(x.get('p50_transfer_ms'), ',.0f')})"
                     if x.get("transfers") is not None else "not exported")
        why = "" if not row.get("failure_class") else f"{row['failure_class']}: {row['reason'][:160]}"
        lines.append(f"| {row['connector']} | {'on' if row.get('prefix_caching') else 'off'} | "
                     f"{'yes' if row['served'] else 'no'} | "
                     f"{'passed' if row.get('gates_passed') else 'failed' if row.get('gates_passed') is False else '–'}"
                     f" | {_num(s.get('request_goodput'), '.2f')} | {_num(s.get('p95_ttft_ms'))} | "
                     f"{_num(s.get('p95_itl_ms'))} | {transfers} | {_num(x.get('external_prefix_cache_hits'))} | "
                     f"{_num(row.get('wall_s'))} | {why} |")
    return "\n".join(lines)


def machine(folder: Path) -> str:
    d = _load(folder, "cpu-connectors.json")
    return "(no data)" if d is None else f"{d['vllm']}, {d['router']}, {d['nixl'] or 'no NIXL'}, {d['machine']}"


FIRST = "h200x8-long-context-first.json"
SECOND = "h200x8-long-context-second.json"
NIGHTS = ((FIRST, "first rehearsal", "before the fix"), (SECOND, "second rehearsal", "before the fix"),
          (NIGHT, "re-run", "after the fix"))
BLOCK_TOKENS = 256
"""The h200x8 profile's KV block size (``block-size``): a prefix-cache hit is whole blocks."""


def _all_windows(d: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(launch, trial or None, window) for every measured window of a night, confirmations included."""
    out = [(f"trial {t['trial']}: {_launch(t)}", t, w) for t in d["trials"] for w in t.get("windows") or []]
    for name, windows in (d.get("confirm_windows") or {}).items():
        out += [(f"confirmation {name}", {}, w) for w in windows]
    return out


def windows(folder: Path) -> str:
    lines = ["| night | scheduler | launches | windows measured | windows with prefix-cache hits | refused windows | "
             "preemptions in windows with hits |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, label, code in NIGHTS:
        d = _load(folder, name)
        if d is None or not any(t.get("windows") for t in d["trials"]):
            lines.append(f"| {label} | {code} | (no data: collect.py) | | | | |")
            continue
        every = [w for _, _, w in _all_windows(d)]
        hit = [w for w in every if w.get("prefix_cache_hits")]
        lines.append(f"| {label} | {code} | {_num(d['launched'])} | {len(every)} | {len(hit)} | "
                     f"{sum(1 for w in every if w['refused'])} | {_num(sum(w.get('preemptions') or 0 for w in hit))} |")
    return "\n".join(lines)


def hits(folder: Path) -> str:
    lines = ["| night | launch | concurrency | prefix-cache hit tokens | of prompt tokens queried | "
             f"blocks of {BLOCK_TOKENS} | preemptions | refused |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, label, _ in NIGHTS:
        d = _load(folder, name)
        for launch, _, w in _all_windows(d) if d else []:
            if w.get("prefix_cache_hits"):
                lines.append(f"| {label} | {launch} | {_num(w['concurrency'])} | {_num(w['prefix_cache_hits'])} | "
                             f"{_num(w.get('prefix_cache_queries'))} | {_num(w['prefix_cache_hits'] / BLOCK_TOKENS)} | "
                             f"{_num(w.get('preemptions'))} | {'yes' if w['refused'] else 'no'} |")
    return "\n".join(lines) if len(lines) > 2 else "(no window of these nights had a prefix-cache hit)"


TABLES: dict[str, Callable[[Path], str]] = {"night": night, "kinds": kinds, "pools": pools, "buckets": buckets,
                                            "cpu": cpu, "machine": machine, "windows": windows, "hits": hits,
                                            "first_night": functools.partial(night, name=FIRST),
                                            "first_kinds": functools.partial(kinds, name=FIRST),
                                            "second_night": functools.partial(night, name=SECOND),
                                            "second_kinds": functools.partial(kinds, name=SECOND)}
