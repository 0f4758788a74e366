"""Copy a rehearsed prefill/decode night's figures here, trimmed to what the tables show (issue 27).

    python docs/evidence/pd/collect.py RUNS/STUDY NAME

Reads the study's ``night.json`` and, per launched trial, its ``config.json`` (the layout), ``outcome.json``
(the chosen step's figures, TTFT per context bucket), ``server_metrics.json`` (each pool's figures, the KV
transfer) and ``load.json`` (every measured window's prefix-cache counters, preemptions and whether the window
check refused it; confirmation launches' windows too); writes ``<NAME>.json`` beside this file. ``tables.py``
renders it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARAMS = ("disaggregation", "topology", "moe-backend", "max-num-seqs", "max-num-batched-tokens",
          "gpu-memory-utilization", "compilation-config.cudagraph_mode", "speculative.draft_tokens")
POOL_FACTS = ("kv_usage_max", "running_max", "waiting_max", "prompt_tokens", "generation_tokens", "queue_p95_ms")
TRANSFER = ("transfers", "p50_transfer_ms", "p95_transfer_ms", "failed_transfers", "mean_transfer_bytes")


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _round(value: Any, digits: int = 3) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def _windows(folder: Path) -> list[dict[str, Any]]:
    """Every measured window of a launch: its server's prefix-cache counters and the window check's verdict."""
    out = []
    for repeat in _read(folder / "load.json").get("repeats") or []:
        for step in repeat.get("steps") or []:
            facts = (step.get("server") or {}).get("facts") or {}
            out.append({"concurrency": step.get("concurrency"),
                        **{k: facts.get(k) for k in ("prefix_cache_hits", "prefix_cache_queries", "preemptions")},
                        "refused": list((step.get("window_check") or {}).get("refused") or [])})
    return out


def _trial(study: Path, t: dict[str, Any]) -> dict[str, Any]:
    folder = study / "trials" / f"{t['trial']:04d}"
    config, outcome, metrics = (_read(folder / n) for n in ("config.json", "outcome.json", "server_metrics.json"))
    layout = config.get("disaggregation") or {}
    summary = outcome.get("summary") or {}
    pools = metrics.get("pools") or {}
    return {
        "trial": t["trial"], "baseline": t["baseline"], "launched": t["launched"], "feasible": t["feasible"],
        "value": _round(t["value"]), "failure_class": t["failure_class"],
        "kind": "disaggregated" if layout else "aggregated", "layout": layout.get("layout"),
        "pools": layout.get("pools"), "connector": layout.get("connector"),
        "params": {k: t["params"][k] for k in PARAMS if k in t["params"]},
        "concurrency": summary.get("max_concurrency"),
        "figures": {k: _round(summary.get(k), 1) for k in ("p95_ttft_ms", "p95_itl_ms", "p95_queue_ms",
                                                           "p95_prefill_queue_ms")},
        "ttft_by_context": [{k: _round(v, 1) for k, v in b.items()} for b in summary.get("ttft_by_context") or []],
        "pool_facts": {pool: {k: _round(((pools.get(pool) or {}).get("facts") or {}).get(k))
                              for k in POOL_FACTS} for pool in ("prefill", "decode")} if layout else None,
        "transfer": {k: _round((metrics.get("transfer") or {}).get(k), 2) for k in TRANSFER} if layout else None,
        "windows": _windows(folder),
    }


def main(study: Path, name: str) -> None:
    d = _read(study / "night.json")
    out = {k: d.get(k) for k in ("study", "hw", "objective", "metric", "direction", "slos", "engine", "units",
                                 "rehearsal", "wall_s", "node_s", "guards", "launched", "refused_before_launch")}
    out["workload"] = {k: d["workload"].get(k) for k in ("kind", "input_len", "output_len", "range_ratio")}
    out["trials"] = [_trial(study, t) for t in d["trials"] if t["launched"] and t.get("duplicate_of") is None]
    confirm = study / "confirm"
    out["confirm_windows"] = {c.name: _windows(c) for c in sorted(confirm.iterdir()) if (c / "load.json").is_file()} \
        if confirm.is_dir() else {}
    winner = d.get("winner")
    out["winner"] = None if winner is None else {"trial": winner["trial"], "value": _round(winner["value"]),
                                                 "confirmed": winner["confirmed"]}
    (HERE / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {HERE / (name + '.json')}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
