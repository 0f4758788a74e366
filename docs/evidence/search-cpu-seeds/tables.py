"""The CPU side-by-side over several seeds (issue 24): dsv4-tune, ``vllm bench sweep serve`` and random search on
the real vLLM CPU build, at equal wall time, one run per seed.

Data: ``seed-<n>/results.json``, each written by ``benchmarks/bench_side_by_side.py --seed <n> --confirm
--evidence docs/evidence/search-cpu-seeds/seed-<n>`` (the format of ``docs/evidence/search-cpu``). A method's
*re-run* is its winner launched once more through the tuner's harness after the three searches; a re-run that
missed an SLO is worth nothing under the objective (max throughput under the SLOs) and counts as 0.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

ORDER = ("tpe", "sweep", "random")
LABEL = {"tpe": "dsv4-tune (`--prior none`: TPE)", "sweep": "`vllm bench sweep serve`",
         "random": "random search (the study with a random sampler)"}


def _seeds(folder: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for path in sorted(folder.glob("seed-*/results.json")):
        out[int(path.parent.name.removeprefix("seed-"))] = json.loads(path.read_text(encoding="utf-8"))
    return out


def _rerun(method: dict[str, Any]) -> float:
    conf = method.get("confirmed") or {}
    return float(conf["value"]) if conf.get("feasible") and conf.get("value") is not None else 0.0


def _launched(method: dict[str, Any]) -> int:
    trials = method.get("trials", [])
    return sum(1 for t in trials if t.get("launched", True) and t.get("failure") != "interrupted") + int(
        method.get("failures") or 0)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def seeds(folder: Path) -> str:
    """Seed by seed: each method's launches, its best screening value under the SLOs, and its re-run."""
    data = _seeds(folder)
    budget = {d["budget_s"] for d in data.values()}
    measured = sorted({d["measured"] for d in data.values()})
    lines = [f"Budget {', '.join(f'{b:.0f}' for b in sorted(budget))} s of wall time per method and seed, measured "
             f"{' to '.join(dict.fromkeys([measured[0], measured[-1]]))}; output tok/s.", "",
             "| seed | " + " | ".join(f"{LABEL[m]}: launches, best, re-run" for m in ORDER) + " | best re-run |",
             "|---|" + "---|" * (len(ORDER) + 1)]
    for seed, d in data.items():
        cells, reruns = [], {}
        for name in ORDER:
            m = d["methods"].get(name)
            if m is None:
                cells.append("—")
                continue
            reruns[name] = _rerun(m)
            if m.get("best_value") is None:
                cells.append(f"{_launched(m)}, none met the SLOs, —")
                continue
            missed = "" if (m.get("confirmed") or {}).get("feasible") else " (missed an SLO)"
            cells.append(f"{_launched(m)}, {_num(m.get('best_value'))}, "
                         f"{_num((m.get('confirmed') or {}).get('value'))}{missed}")
        winner = max(reruns, key=lambda k: reruns[k]) if reruns else None
        lines.append(f"| {seed} | " + " | ".join(cells) + f" | {winner or '—'} |")
    return "\n".join(lines) + "\n"


def summary(folder: Path) -> str:
    """Per method over the seeds: median launches, median best screening value, median re-run (0 when it missed
    an SLO), and on how many seeds its re-run was the best of the three."""
    data = _seeds(folder)
    wins = {name: 0 for name in ORDER}
    for d in data.values():
        reruns = {name: _rerun(m) for name, m in d["methods"].items() if name in wins}
        if reruns and max(reruns.values()) > 0:
            wins[max(reruns, key=lambda k: reruns[k])] += 1
    lines = ["| method | seeds | launches (median) | best under the SLOs in screening, median (range; 0: none met "
             "them) | its re-run, median (range) | re-runs that missed an SLO | seeds its re-run was the best |",
             "|---|---|---|---|---|---|---|"]
    for name in ORDER:
        runs = [d["methods"][name] for d in data.values() if name in d["methods"]]
        if not runs:
            continue
        best = [float(m.get("best_value") or 0.0) for m in runs]
        rerun = [_rerun(m) for m in runs]
        missed = sum(1 for m in runs if m.get("best_value") is not None
                     and not (m.get("confirmed") or {}).get("feasible"))
        none = sum(1 for m in runs if m.get("best_value") is None)
        lines.append(f"| {LABEL[name]} | {len(runs)} | {statistics.median(_launched(m) for m in runs):g} | "
                     f"{_num(statistics.median(best))} ({_num(min(best))}–{_num(max(best))}) | "
                     f"{_num(statistics.median(rerun))} ({_num(min(rerun))}–{_num(max(rerun))}) | "
                     f"{missed} of {len(runs)}{f' ({none} found none)' if none else ''} | "
                     f"{wins[name]} of {len(data)} |")
    return "\n".join(lines) + "\n"


def count(folder: Path) -> str:
    return str(len(_seeds(folder)))





def sweep_ttft(folder: Path) -> str:
    """The p95 TTFT the sweep's winners measured when re-run, over the seeds that had one."""
    ttft = [m["confirmed"]["p95_ttft_ms"] / 1000 for d in _seeds(folder).values()
            if (m := d["methods"].get("sweep")) and m.get("confirmed")]
    return f"{min(ttft):.1f}–{max(ttft):.1f} s"


def sweep_seqs(folder: Path) -> str:
    """The max-num-seqs values the sweep reached within its budget, over every seed."""
    seqs = sorted({t["params"]["max_num_seqs"] for d in _seeds(folder).values()
                   for t in d["methods"].get("sweep", {}).get("trials", [])})
    return " and ".join(str(x) for x in seqs)


TABLES: dict[str, Callable[[Path], str]] = {"seeds": seeds, "summary": summary, "count": count,
                                           "sweep_ttft": sweep_ttft, "sweep_seqs": sweep_seqs}
