"""Tables of the search benchmark on the independent node (issue 24; ``bench_search.py --truth independent``).

Data: ``summary.json`` (``bench_search.py summarize --truth independent``: per node and search, the launches
each seed took to reach 90/95/98 % of the true optimum, the winner the study would export after 12
launches, the best baseline, and when the guide stopped trusting the model) and ``truth.json``
(``bench_search.py describe --truth independent``: the node seed by seed, and the blog's three launches).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

ORDER = ("model", "model-step4", "model-ties", "model-one-spread", "model-step3", "model-step2", "model-before",
         "model-classpicks", "model-trusting", "tpe", "gp", "random", "grid")
LABEL = {"model": "**`--prior model`** (this issue: second spread, cell GP, confirmed recipes, SLO misses "
                   "learned, ties in the profile's order, confirmation down the ranking, speculative twins at the "
                   "token budget their drafts need)",
         "model-step4": "`--prior model`, speculative twins at their control's token budget (confirmation down the "
                        "ranking; earlier run)",
         "model-ties": "`--prior model`, speculative twins at their control's token budget, their winners confirmed "
                       "as before (not down the ranking; earlier run)",
         "model-one-spread": "`--prior model` without the second spread or the confirmed recipes (ablation)",
         "model-step3": "`--prior model`, this issue's third step, the model's ties broken by the host's sort "
                        "(earlier run)",
         "model-step2": "`--prior model`, this issue's second step (earlier run)",
         "model-before": "`--prior model`, this issue's first step (earlier run)",
         "model-classpicks": "`--prior model`, first picks as before (ablation)",
         "model-trusting": "`--prior model` before this issue",
         "tpe": "TPE multivariate (`--prior none`)", "gp": "GPSampler", "random": "random search",
         "grid": "`vllm bench sweep serve` grid"}


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text(encoding="utf-8"))


def heldout(folder: Path) -> str:
    """The same table on seeds the search was never developed on (``heldout/summary.json``: seeds 200-229)."""
    return launches(folder / "heldout")


def heldout_goal(folder: Path) -> str:
    return goal(folder / "heldout")


def _truth(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "truth.json").read_text(encoding="utf-8"))


def _q(entry: dict[str, Any], cap: int) -> str:
    def f(x: float | None) -> str:
        return f"> {cap}" if x is None else f"{x:g}"

    return f"{f(entry['median'])} ({f(entry['q1'])}–{f(entry['q3'])})"


def _med(entry: dict[str, Any], key: str) -> float:
    value = entry[key]["median"]
    return math.inf if value is None else float(value)


def launches(folder: Path) -> str:
    data = _summary(folder)
    lines: list[str] = []
    for node, per in data["nodes"].items():
        seeds = max(e["seeds"] for k, e in per.items() if not k.startswith("_"))
        lines += [f"**{node}** ({per['_space']['points']:,} configurations; true optimum "
                  f"{per['_optimum_tok_s']['min']:,.0f}–{per['_optimum_tok_s']['max']:,.0f} output tok/s over "
                  f"{seeds} seeds)", "",
                  "| search | launches to 90 % | to 95 % | to 98 % | reached 98 % | best / optimum after 12 | "
                  "exported after 12: median, worst | exported ≥ 95 % | exported below the best baseline | "
                  "failed launches in the first 12 | launch cap |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in ORDER:
            e = per.get(name)
            if e is None:
                continue
            cap = e["cap"]
            x = e.get("exported_after_12") or {}
            exported = f"{x['median']:.3f}, {x['worst']:.3f}" if x else "—"
            at_least = f"{x['at_least_95']}/{e['seeds']}" if x else "—"
            below = f"{x['below_best_baseline']}/{e['seeds']}" if x else "—"
            lines.append(f"| {LABEL[name]} | {_q(e['to_90'], cap)} | {_q(e['to_95'], cap)} | {_q(e['to_98'], cap)} | "
                         f"{e['to_98']['reached']}/{e['seeds']} | {e['best_after_12']:.3f} | {exported} | "
                         f"{at_least} | {below} | {e['failed_in_first_12']:.1f} | {cap} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def goal(folder: Path) -> str:
    """The issue's goal for ``--prior model``, node by node: each part met or not, with its figure."""
    data = _summary(folder)
    lines = ["| node | 95 % within 8 launches (median) | 98 % within 16 (median) | exported winner after 12 ≥ 95 % "
             "(median; seeds below) | never below the best seeded baseline: exported after 12 (seeds below; by more "
             "than 2 %) | the best launch after 12 below it (seeds) |",
             "|---|---|---|---|---|---|"]
    for node, per in data["nodes"].items():
        m = per["model"]
        x = m["exported_after_12"]
        n95, n98 = _med(m, "to_95"), _med(m, "to_98")
        below_95 = m["seeds"] - x["at_least_95"]

        def yes(ok: bool) -> str:
            return "yes" if ok else "**no**"

        lines.append(f"| {node} | {yes(n95 <= 8)}: {n95:g} | {yes(n98 <= 16)}: "
                     f"{'> cap' if math.isinf(n98) else f'{n98:g}'} | {yes(x['median'] >= 0.95)}: {x['median']:.3f}; "
                     f"{below_95} of {m['seeds']} | {yes(x['below_best_baseline'] == 0)}: "
                     f"{x['below_best_baseline']} of {m['seeds']}; {x['below_best_baseline_by_2pct']} | "
                     f"{m['best_below_baseline_after_12']} of {m['seeds']} |")
    return "\n".join(lines) + "\n"


def optimum_cells(folder: Path) -> str:
    """Seeds grouped by where the node's optimum is (topology, speculative draft tokens): whether
    ``--prior model`` reached 98 % of it within its cap, and how many of its launches went there."""
    data, node_truth = _summary(folder), _truth(folder)
    lines = ["| node | the optimum's topology, draft tokens | seeds | `--prior model` reached 98 % | its launches in "
             "that topology: median (range) | with those draft tokens: median (range) | its launches in all: median |",
             "|---|---|---|---|---|---|---|"]
    for node, per in data["nodes"].items():
        m = per["model"]
        cells_launched = m.get("cells_launched")
        if not cells_launched:
            continue
        seeds = {s["seed"]: s for s in node_truth["nodes"][node]["seeds"]}
        groups: dict[tuple[str, int], list[int]] = {}
        for i in range(m["seeds"]):
            p = seeds[i]["optimum_params"]
            groups.setdefault((p["topology"], int(p.get("speculative.draft_tokens", 0))), []).append(i)
        for (topo, draft), idx in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            reached = sum(1 for i in idx if m["to_98"]["per_seed"][i] is not None)
            in_topo = [sum(n for c, n in cells_launched[i].items() if c.split("|")[0] == topo) for i in idx]
            in_cell = [cells_launched[i].get(f"{topo}|{draft}", 0) for i in idx]
            total = [sum(cells_launched[i].values()) for i in idx]
            lines.append(f"| {node} | {topo}, {draft} | {len(idx)} | {reached}/{len(idx)} | "
                         f"{statistics.median(in_topo):g} ({min(in_topo)}–{max(in_topo)}) | "
                         f"{statistics.median(in_cell):g} ({min(in_cell)}–{max(in_cell)}) | "
                         f"{statistics.median(total):g} |")
    return "\n".join(lines) + "\n"


def distrust(folder: Path) -> str:
    """After which launch the guide stopped trusting the model (``--prior model``)."""
    data = _summary(folder)
    lines = ["| node | seeds on which it stopped trusting the model | after launch: median (range) |", "|---|---|---|"]
    for node, per in data["nodes"].items():
        d = per["model"].get("distrust_at") or {}
        at = [a for a in d.get("per_seed", []) if a is not None]
        span = f"{statistics.median(at):g} ({min(at)}–{max(at)})" if at else "—"
        lines.append(f"| {node} | {len(at)}/{per['model']['seeds']} | {span} |")
    return "\n".join(lines) + "\n"


def truth(folder: Path) -> str:
    """The independent node, per profile: what fails, what the feasibility model refuses that runs, how narrow the
    top is, and what the prior's first pick and the baselines are worth there (over seeds)."""
    data = _truth(folder)
    lines = ["| node | configurations | refused by the feasibility model | of those, run on the node (median) | "
             "launchable that fail on the node (median) | configurations ≥ 95 % / ≥ 98 % of the optimum (median) | "
             "the prior's favourite / optimum: median (range) | best baseline / optimum: median (range) |",
             "|---|---|---|---|---|---|---|---|"]
    for node, block in data["nodes"].items():
        seeds = block["seeds"]
        prior = [s["prior_top"] for s in seeds]
        base = [max(s["baselines"]) for s in seeds]
        lines.append(
            f"| {node} | {block['points']:,} | {block['refused']:,} | "
            f"{statistics.median(s['refused_but_runs'] for s in seeds):,.0f} | "
            f"{statistics.median(s['fail'] / s['launchable'] for s in seeds):.1%} | "
            f"{statistics.median(s['within_95'] for s in seeds):g} / "
            f"{statistics.median(s['within_98'] for s in seeds):g} | "
            f"{statistics.median(prior):.3f} ({min(prior):.3f}–{max(prior):.3f}) | "
            f"{statistics.median(base):.3f} ({min(base):.3f}–{max(base):.3f}) |")
    return "\n".join(lines) + "\n"


def calibration(folder: Path) -> str:
    """The independent model at its nominal constants against the 4xGH200 blog's three launches."""
    data = _truth(folder)
    cal, blog = data["calibration"], data["blog"]
    gain = cal["DP4+EP+W4A8"]["output_tok_s"] / cal["DP4+EP"]["output_tok_s"]
    return "\n".join([
        "| launch (4×GH200, random 1024/1024) | concurrency | the blog | the independent model |", "|---|---|---|---|",
        f"| TP4 (+ EP) | {cal['TP4']['concurrency']} | {blog['TP4']:,} output tok/s | "
        f"{cal['TP4']['output_tok_s']:,.0f} output tok/s |",
        f"| DP4 + EP | {cal['DP4+EP']['concurrency']} | {blog['DP4+EP']:,} output tok/s | "
        f"{cal['DP4+EP']['output_tok_s']:,.0f} output tok/s |",
        f"| DP4 + EP + W4A8 (Humming) | {cal['DP4+EP+W4A8']['concurrency']} | about "
        f"{blog['DP4+EP+W4A8 / DP4+EP']:.2f}× DP4 + EP | {gain:.2f}× DP4 + EP |"]) + "\n"


def total(folder: Path) -> str:
    data = _summary(folder)
    return f"{data['runs']} runs in {data['runs_wall_s'] / 60:.0f} minutes"


def wall(folder: Path) -> str:
    """Mean seconds one run of each search took."""
    data = _summary(folder)
    first = next(iter(data["nodes"].values()))
    lines = ["| node | " + " | ".join(LABEL[m] for m in ORDER if m in first) + " |"]
    lines.append("|---|" + "---|" * (len(lines[0].split("|")) - 3))
    for node, per in data["nodes"].items():
        lines.append(f"| {node} | " + " | ".join(f"{per[m]['wall_s']:.1f}" for m in ORDER if m in per) + " |")
    return "\n".join(lines) + "\n"


def _below(e: dict[str, Any]) -> str:
    x = e["exported_after_12"]
    return f"{x['below_best_baseline']} ({x['below_best_baseline_by_2pct']})"


def _to_98(e: dict[str, Any]) -> str:
    n = _med(e, "to_98")
    return f"> {e['cap']}" if math.isinf(n) else f"{n:g}"


def _compare(folder: Path, before_name: str, after_name: str, label: str) -> str:
    """Two rows of ``--prior model`` side by side, on the table's seeds and the held-out seeds."""
    figures: tuple[Callable[[dict[str, Any]], str], ...] = (
        _to_98, lambda e: str(e["to_98"]["reached"]), lambda e: f"{e['exported_after_12']['median']:.3f}",
        lambda e: f"{e['exported_after_12']['worst']:.3f}", _below)
    lines = [f"| seeds | node | launches to 98 %: {label} (median) | reached 98 % | exported after 12: median | "
             "worst | exported below the best baseline (by more than 2 %) |", "|---|---|---|---|---|---|---|"]
    for seeds, data in (("0–29", _summary(folder)), ("200–229 (held out)", _summary(folder / "heldout"))):
        for node, per in data["nodes"].items():
            before, after = per[before_name], per[after_name]
            cells = [f"{f(before)} → {f(after)}" for f in figures]
            cells[1] += f" of {after['seeds']}"
            lines.append(f"| {seeds} | {node} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def third_step(folder: Path) -> str:
    """What issue 24's third step changed: its row (``model-step3``) against the second step's (``model-step2``),
    both kept from their runs on the earlier host."""
    return _compare(folder, "model-step2", "model-step3", "second step → third step")


def tie_break(folder: Path) -> str:
    """What breaking the model's ties by the profile's order changed: the third step as run on the earlier host,
    whose sort broke them otherwise (``model-step3``, kept), against the same code on this host with its winners
    confirmed as the third step did (``model-ties``)."""
    return _compare(folder, "model-step3", "model-ties", "earlier host → ties in the profile's order")


def next_in_line(folder: Path) -> str:
    """What confirming down the ranking changed: the same runs (``model-ties``, their exports as the third step
    confirmed them; ``model-step4``, re-exported by ``bench_search.py reexport``; both kept from their run).
    Only the export columns can move."""
    return _compare(folder, "model-ties", "model-step4", "the same launches")


def twin_budget(folder: Path) -> str:
    """What the speculative twin's token budget changed: twins at their control's budget (``model-step4``, kept
    from its run) against twins at the budget their drafts need (``model``)."""
    return _compare(folder, "model-step4", "model", "twins at the control's budget → at the budget their drafts need")


def noise(folder: Path) -> str:
    """How much of what ``--prior model`` misses is the node's noise: its runs (``summary.json``,
    ``heldout/summary.json``) against the same node measured without noise (``quiet/``, ``quiet-heldout/``:
    ``bench_search.py --truth independent-quiet``), and the noise its launches measured with."""
    lines = ["| seeds | node | the launches' noise, log sd: no drafts; drafts | launches to 98 % (median, quartiles): "
             "with the node's noise → without | reached 98 % | exported after 12: median, worst |",
             "|---|---|---|---|---|---|"]
    for seeds, noisy, quiet in (("0–29", folder, folder / "quiet"),
                                ("200–229 (held out)", folder / "heldout", folder / "quiet-heldout")):
        quiet_nodes = _summary(quiet)["nodes"]
        for node, per in _summary(noisy)["nodes"].items():
            before, after = per["model"], quiet_nodes[node]["model"]
            sd = before["measurement_noise"]
            x, y = before["exported_after_12"], after["exported_after_12"]
            lines.append(f"| {seeds} | {node} | {sd['no_drafts']['sd_pct']:g} %; {sd['drafts']['sd_pct']:g} % | "
                         f"{_q(before['to_98'], before['cap'])} → {_q(after['to_98'], after['cap'])} | "
                         f"{before['to_98']['reached']} → {after['to_98']['reached']} of {after['seeds']} | "
                         f"{x['median']:.3f}, {x['worst']:.3f} → {y['median']:.3f}, {y['worst']:.3f} |")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[Path], str]] = {
    "heldout": heldout, "heldout_goal": heldout_goal, "launches": launches, "goal": goal,
    "optimum_cells": optimum_cells, "distrust": distrust, "truth": truth, "calibration": calibration,
    "total": total, "wall": wall, "third_step": third_step, "tie_break": tie_break,
    "next_in_line": next_in_line, "twin_budget": twin_budget, "noise": noise}
