"""The CPU side-by-side (``benchmarks/bench_side_by_side.py --evidence docs/evidence/search-cpu``): dsv4-tune,
``vllm bench sweep serve`` and random search on the real vLLM CPU build, at equal wall time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

LABEL = {"tpe": "dsv4-tune (`--prior none`: TPE; the model has no CPU node)", "sweep": "`vllm bench sweep serve`",
         "random": "random search (the study with a random sampler)"}


def _data(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def _num(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{float(value):,.{digits}f}"


def methods(folder: Path) -> str:
    data = _data(folder)
    lines = [f"Budget {data['budget_s']:.0f} s of wall time per method, measured {data['measured']}.", "",
             "| method | launches (controls) | refused before launch | met the SLOs | missed an SLO | failed | "
             "best feasible output tok/s | its re-run | best flags |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in data["methods"].items():
        conf = m.get("confirmed") or {}
        rerun = _num(conf.get("value")) + ("" if not conf or conf.get("feasible") else " (missed an SLO)")
        trials = m["trials"]
        launched = [t for t in trials if t.get("launched", True) and t.get("failure") != "interrupted"]
        controls = sum(1 for t in launched if t.get("control"))
        refused = sum(1 for t in trials if not t.get("launched", True))
        met = sum(1 for t in launched if t.get("feasible"))
        missed = sum(1 for t in launched if t.get("failure") == "slo_violated" or
                     (name == "sweep" and not t.get("feasible") and not t.get("failed")))
        failed = len(launched) - met - missed + int(m.get("failures") or 0)
        flags = ", ".join(f"{k}={v}" for k, v in (m.get("best_params") or {}).items()) or "—"
        lines.append(f"| {LABEL.get(name, name)} | {len(launched) + int(m.get('failures') or 0)} ({controls}) | "
                     f"{refused} | {met} | {missed} | {failed} | {_num(m['best_value'])} | {rerun if conf else '—'} | "
                     f"{flags} |")
    return "\n".join(lines) + "\n"


def launches(folder: Path) -> str:
    """Every launch of every method, in order: its value and whether it met the SLOs."""
    data = _data(folder)
    lines = ["| method | trial | output tok/s | p95 TTFT ms | p95 ITL ms | outcome |", "|---|---|---|---|---|---|"]
    for name, m in data["methods"].items():
        for i, t in enumerate(m["trials"], start=1):
            outcome = "met the SLOs" if t.get("feasible") else (t.get("failure") or
                                                                ("failed" if t.get("failed") else "missed an SLO"))
            if not t.get("launched", True):
                outcome = f"refused before launch ({outcome}: vLLM's own argument checks)"
            if t.get("control"):
                outcome += " (no-speculation control)"
            lines.append(f"| {name} | {i} | {_num(t.get('value'))} | {_num(t.get('p95_ttft_ms'), 0)} | "
                         f"{_num(t.get('p95_itl_ms'), 1)} | {outcome} |")
    return "\n".join(lines) + "\n"


def sweep_seqs(folder: Path) -> str:
    """The max-num-seqs values ``vllm bench sweep serve`` reached within its budget (its grid's first rows)."""
    seqs = sorted({t["params"]["max_num_seqs"] for t in _data(folder)["methods"]["sweep"]["trials"]})
    return " and ".join(str(s) for s in seqs)


def trial_seconds(folder: Path) -> str:
    """The wall time of the study's launched trials (start-up and load), shortest to longest."""
    durations = [t["duration_s"] for name, m in _data(folder)["methods"].items() if name != "sweep"
                 for t in m["trials"] if t.get("duration_s") is not None]
    return f"{min(durations):.0f}–{max(durations):.0f} s"


TABLES: dict[str, Callable[[Path], str]] = {"methods": methods, "launches": launches, "sweep_seqs": sweep_seqs,
                                           "trial_seconds": trial_seconds}
