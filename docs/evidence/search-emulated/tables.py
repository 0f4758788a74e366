"""Tables of the search benchmark on the emulated DSV4-Flash node (``benchmarks/bench_search.py``).

Data: ``summary.json`` (``bench_search.py summarize``: per node and search, the launches each seed took
to reach 90/95/98 % of the true optimum, and the stop estimate of ``--prior model``) and
``agreement.json`` (``bench_search.py validate``: the wave model against the emulated node's scheduler).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

ORDER = ("model", "model-before", "model-trusting", "model-prior", "default", "tpe", "gp", "random", "grid")
LABEL = {"model": "**`--prior model`**",
         "model-before": "`--prior model`, issue 24's second step (SLO misses not learned, one recipe confirmed)",
         "model-trusting": "`--prior model` before issue 24",
         "model-prior": "`--prior model` before issue 24, never corrected (ablation)",
         "default": "TPE multivariate + group (`--prior none` before this change)",
         "tpe": "TPE multivariate, no group (`--prior none` now)",
         "gp": "GPSampler", "random": "random search", "grid": "`vllm bench sweep serve` grid"}


def _summary(folder: Path, name: str = "summary.json") -> dict[str, Any]:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def _q(entry: dict[str, Any], cap: int) -> str:
    med, q1, q3 = entry["median"], entry["q1"], entry["q3"]

    def f(x: float | None) -> str:
        return f"> {cap}" if x is None else f"{x:g}"

    return f"{f(med)} ({f(q1)}–{f(q3)})"


def launches(folder: Path) -> str:
    return _launches(_summary(folder))


def stress(folder: Path) -> str:
    """The same searches on a node twice as far from the model (constants off by up to ±50 %)."""
    return _launches(_summary(folder, "summary-spread0.5.json"))


def stress_stop(folder: Path) -> str:
    return _stop(_summary(folder, "summary-spread0.5.json"))


def _launches(data: dict[str, Any]) -> str:
    lines = []
    for node, per in data["nodes"].items():
        seeds = max(e["seeds"] for k, e in per.items() if not k.startswith("_"))
        lines += [f"**{node}** ({per['_space']['points']:,} configurations; true optimum "
                  f"{per['_optimum_tok_s']['min']:,.0f}–{per['_optimum_tok_s']['max']:,.0f} output tok/s over "
                  f"{seeds} seeds)", "",
                  "| search | launches to 90 % | to 95 % | to 98 % | reached 98 % | best / optimum after 12 | "
                  "failed launches in the first 12 | launch cap |",
                  "|---|---|---|---|---|---|---|---|"]
        for name in ORDER:
            e = per.get(name)
            if e is None:
                continue
            cap = e["cap"]
            label = LABEL[name] + (" ¹" if e.get("from_earlier_run") else "")
            lines.append(f"| {label} | {_q(e['to_90'], cap)} | {_q(e['to_95'], cap)} | {_q(e['to_98'], cap)} | "
                         f"{e['to_98']['reached']}/{e['seeds']} | {e['best_after_12']:.3f} | "
                         f"{e['failed_in_first_12']:.1f} | {cap} |")
        lines.append("")
    if any(e.get("from_earlier_run") for per in data["nodes"].values() for e in per.values() if isinstance(e, dict)):
        lines.append("¹ Kept from an earlier run of this table, with the code of that time: issue 24's second step "
                     "(its re-run), and from issue 18's run the guide before issue 24 and searches whose code has not "
                     "changed since.")
    return "\n".join(lines).rstrip() + "\n"


def goal(folder: Path) -> str:
    """The issue's goal on h200x8, and 'never worse than the default' on every node."""
    data = _summary(folder)
    lines = ["| node | `--prior model` to 95 % / 98 % (median) | the default before (TPE + group) | random | "
             "model ≤ ⅓ of random's launches | model never worse than that default |", "|---|---|---|---|---|---|"]
    for node, per in data["nodes"].items():
        m, d, r = per["model"], per["default"], per["random"]

        def med(e: dict[str, Any], k: str) -> float:
            v = e[k]["median"]
            return math.inf if v is None else float(v)

        third = all(med(m, k) <= med(r, k) / 3 for k in ("to_95", "to_98"))
        worse = any(med(m, k) > med(d, k) for k in ("to_90", "to_95", "to_98"))
        lines.append(f"| {node} | {med(m, 'to_95'):g} / {med(m, 'to_98'):g} | {med(d, 'to_95'):g} / "
                     f"{med(d, 'to_98'):g} | {med(r, 'to_95'):g} / {med(r, 'to_98'):g} | "
                     f"{'yes' if third else 'no'} | {'no' if worse else 'yes'} |")
    return "\n".join(lines) + "\n"


def stop(folder: Path) -> str:
    """Where ``--stop-when-done`` would have ended screening, and what it had found by then."""
    return _stop(_summary(folder))


def _stop(data: dict[str, Any]) -> str:
    lines = ["| node | seeds it stopped (≤ cap) | launch it stopped at, median (quartiles) | "
             "best / optimum at the stop: median, worst | stops with < 95 % | < 98 % |", "|---|---|---|---|---|---|"]
    for node, per in data["nodes"].items():
        s = per["model"].get("stop") or []
        stopped = [x for x in s if x["stop_at"] is not None]
        at = sorted(x["stop_at"] for x in stopped)
        best = [x["best_at_stop"] for x in stopped]
        if not at:
            lines.append(f"| {node} | 0/{len(s)} | — | — | — | — |")
            continue
        q = statistics.quantiles(at, n=4) if len(at) > 1 else [at[0]] * 3
        lines.append(f"| {node} | {len(stopped)}/{len(s)} | {statistics.median(at):g} ({q[0]:g}–{q[2]:g}) | "
                     f"{statistics.median(best):.3f}, {min(best):.3f} | {sum(b < 0.95 for b in best)} | "
                     f"{sum(b < 0.98 for b in best)} |")
    return "\n".join(lines) + "\n"


def chance(folder: Path) -> str:
    """The stop estimate's median over seeds, launch by launch."""
    data = _summary(folder)
    lines = ["| node | " + " | ".join(f"after {i}" for i in range(1, 11)) + " |", "|---|" + "---|" * 10]
    for node, per in data["nodes"].items():
        c = per["model"].get("chance_median_by_launch") or []
        cells = [f"{c[i]:.0%}" if i < len(c) and c[i] is not None else "" for i in range(10)]
        lines.append(f"| {node} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def agreement(folder: Path) -> str:
    """The wave model (the benchmark's truth and the prior's predictor) against the emulated node's scheduler."""
    data = json.loads((folder / "agreement.json").read_text(encoding="utf-8"))
    lines = ["| node | samples | figure | wave / scheduler: median (quartiles) | within 10 % | within 25 % |",
             "|---|---|---|---|---|---|"]
    for node, block in data["samples"].items():
        points = block["points"]
        for i, figure in enumerate(("output tok/s", "p95 TTFT", "p95 ITL")):
            ratios = sorted(p["wave"][i] / p["scheduler"][i] for p in points if p["scheduler"][i] > 0)
            q = statistics.quantiles(ratios, n=4)
            within10 = sum(abs(r - 1) <= 0.10 for r in ratios) / len(ratios)
            within25 = sum(abs(r - 1) <= 0.25 for r in ratios) / len(ratios)
            lines.append(f"| {node} | {len(points)} | {figure} | {statistics.median(ratios):.3f} "
                         f"({q[0]:.3f}–{q[2]:.3f}) | {within10:.0%} | {within25:.0%} |")
    return "\n".join(lines) + "\n"


def noise(folder: Path) -> str:
    data = _summary(folder)["noise"]
    return f"{data['throughput_sd']:.0%} on throughput, {data['latency_sd']:.0%} on p95 TTFT and ITL"


def wall(folder: Path) -> str:
    """Mean seconds one run of each search took (the wave-model truth is shared by a seed's runs)."""
    data = _summary(folder)
    lines = ["| node | " + " | ".join(LABEL[m] for m in ORDER if m in next(iter(data["nodes"].values()))) + " |"]
    lines.append("|---|" + "---|" * (len(lines[0].split("|")) - 3))
    for node, per in data["nodes"].items():
        lines.append(f"| {node} | " + " | ".join(f"{per[m]['wall_s']:.1f}" for m in ORDER if m in per) + " |")
    return "\n".join(lines) + "\n"


def total(folder: Path) -> str:
    data = _summary(folder)
    out = f"{data['runs']} runs in {data['runs_wall_s'] / 60:.0f} minutes"
    earlier = data.get("earlier_run")
    if earlier:
        out += " (the re-run of `--prior model`; the rows kept from earlier runs are not counted)"
    return out


def _per_seed(folder: Path, node: str, search: str, target: str) -> list[int | None]:
    return list(_summary(folder)["nodes"][node][search][target]["per_seed"])


def model_reached_98(folder: Path) -> str:
    """On how many seeds of each node ``--prior model`` reached 98 % within its cap (section 5)."""
    counts = {node: (per["model"]["to_98"]["reached"], per["model"]["seeds"])
              for node, per in _summary(folder)["nodes"].items()}
    if all(r == n for r, n in counts.values()) and len({n for _, n in counts.values()}) == 1:
        return f"on all {next(iter(counts.values()))[1]} seeds of both nodes"
    return "on " + " and ".join(f"{r}/{n} {node} seeds" for node, (r, n) in counts.items())


def model_gh200_98_worst(folder: Path) -> str:
    """The most launches ``--prior model`` took to 98 % on any gh200x4 seed (None: a seed never got there)."""
    seeds = _per_seed(folder, "gh200x4", "model", "to_98")
    return "never within its cap on some seed" if None in seeds else f"always within {max(s for s in seeds if s)}"


def model_h200_95_launches(folder: Path) -> str:
    """The launches at which ``--prior model`` reached 95 % on h200x8, over every seed."""
    seeds = [s for s in _per_seed(folder, "h200x8", "model", "to_95") if s is not None]
    return f"launch {seeds[0]}" if min(seeds) == max(seeds) else f"launches {min(seeds)}–{max(seeds)}"


def gp_missed_98_h200(folder: Path) -> str:
    e = _summary(folder)["nodes"]["h200x8"]["gp"]
    return f"{e['seeds'] - e['to_98']['reached']} of {e['seeds']}"


def tpe_vs_default_h200(folder: Path) -> str:
    """TPE without group against the grouped TPE that was the default, on h200x8 (medians over seeds)."""
    per = _summary(folder)["nodes"]["h200x8"]
    t, d = per["tpe"], per["default"]
    return (f"95 % in a median {t['to_95']['median']:g} launches against the grouped TPE's {d['to_95']['median']:g} "
            f"(the default before), and 98 % in {t['to_98']['median']:g} against {d['to_98']['median']:g}")


TABLES: dict[str, Callable[[Path], str]] = {
    "total": total, "launches": launches, "goal": goal, "stop": stop, "chance": chance, "agreement": agreement,
    "noise": noise, "stress": stress, "stress_stop": stress_stop, "wall": wall,
    "model_reached_98": model_reached_98, "model_gh200_98_worst": model_gh200_98_worst,
    "model_h200_95_launches": model_h200_95_launches, "gp_missed_98_h200": gp_missed_98_h200,
    "tpe_vs_default_h200": tpe_vs_default_h200}
