"""The morning report: ``runs/<study>/report.md`` and ``report.html``, with PNG plots.

    throughput against p95 TTFT and p95 ITL for every trial, Pareto front marked
    best value so far, by trial
    parameter importance (Optuna's evaluator, feasible trials)
    failure reasons counted
    the top trials with their flags; confirmations; speculative vs control
"""

from __future__ import annotations

import html
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner import store
from tuner.study import Confirmation, Study, Winner
from tuner.study.guided import STOP_BELOW, load_prediction, prediction_section
from tuner.study.reader import StudyReading, TrialRecord, read_study
from tuner.study.study import PREVALIDATION_ATTR

log = logging.getLogger(__name__)

TOP_K = 5


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when maximizing x (throughput) and minimizing y (latency)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for j, (x2, y2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front


def _plot_tradeoff(trials: list[TrialRecord], latency_key: str, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(float(t.user_attrs["output_throughput"]), float(t.user_attrs[latency_key]),
             bool(t.user_attrs.get("feasible")), t.number)
            for t in trials if latency_key in t.user_attrs and "output_throughput" in t.user_attrs]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for feasible, colour, label in ((True, "tab:green", "met SLOs"), (False, "tab:red", "missed an SLO")):
        pts = [(x, y) for x, y, f, _ in rows if f == feasible]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], c=colour, label=label, alpha=0.8)
    front = sorted((rows[i] for i in pareto_front([(r[0], r[1]) for r in rows])), key=lambda r: r[0])
    ax.plot([r[0] for r in front], [r[1] for r in front], "k--", lw=1, label="Pareto front")
    for x, y, _, number in rows:
        ax.annotate(str(number), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("output tok/s")
    ax.set_ylabel(latency_key.replace("_", " "))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_progress(reading: StudyReading, trials: list[TrialRecord], out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maximize = reading.maximize
    xs, best, current = [], [], None
    for t in sorted(trials, key=lambda t: t.number):
        if t.user_attrs.get("feasible") and t.value is not None:
            value = float(t.value)
            current = value if current is None else (max(current, value) if maximize else min(current, value))
        if current is not None:
            xs.append(t.number)
            best.append(current)
    if not xs:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.step(xs, best, where="post")
    ax.set_xlabel("trial")
    ax.set_ylabel("best feasible value so far")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_bars(data: dict[str, float], title: str, out: Path) -> Path | None:
    if not data:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data)[::-1]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(names) + 1.2))
    ax.barh(names, [data[n] for n in names])
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _energy_section(trials: list[TrialRecord]) -> list[str]:
    """Tokens per joule and $ per million output tokens of each launch's reported window (GPU nodes only)."""
    def fmt(t: TrialRecord, key: str, spec: str) -> str:
        value = t.user_attrs.get(key)
        return "" if value is None else format(float(value), spec)

    rows: list[list[Any]] = [[t.number, fmt(t, "output_throughput", ".1f"), fmt(t, "gpu_power_mean_w", ".0f"),
                              fmt(t, "tokens_per_joule", ".3f"), fmt(t, "usd_per_mtok", ".4f")]
                             for t in trials if "tokens_per_joule" in t.user_attrs]
    if not rows:
        return []
    return ["## Energy and cost", "",
            "The node's GPUs were read during each launch's reported window (NVML, idle GPUs included); "
            "$ per million output tokens is at the study's `--gpu-hour-usd`.", "",
            _table(["trial", "out tok/s", "mean GPU power W", "tokens per joule", "$ per Mtok"], rows), ""]


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _flags(study_obj: Study, trial: TrialRecord) -> str:
    path = study_obj.path / str(trial.user_attrs.get("trial_dir", "")) / "config.json"
    if not path.is_file():
        return ""
    args = store.read_json(path).get("args", {})
    fixed = set(study_obj.profile.server.fixed)
    return " ".join(study_obj.engine.flags({k: v for k, v in args.items() if k not in fixed}))


def build_markdown(study_obj: Study, reading: StudyReading, images: dict[str, Path]) -> str:
    obj = study_obj.objective
    trials = reading.told()
    ranked = reading.ranked()
    winner = reading.winner
    units = study_obj.engine.units
    lines = [f"# dsv4-tune report: {study_obj.record.name}", ""]
    if study_obj.record.rehearsal or not units.identity:
        lines += [f"**{'REHEARSAL' if study_obj.record.rehearsal else 'EMULATED'}: every figure below is the "
                  f"prediction of {study_obj.engine.title} (`--engine {study_obj.engine.name}`), in node units; "
                  "not a measurement of a node** (docs/emulator.md).", ""]
    lines += [f"- hardware profile: `{study_obj.profile.name}` ({study_obj.profile.hardware.device_count}× "
             f"{study_obj.profile.hardware.device_name})",
             f"- engine: `{study_obj.engine.name}`; units: time scale {units.time_scale:g} node s per real s, "
             f"multiplicity {units.multiplicity} requests per client stream",
             f"- objective: `{obj.name}`: {obj.direction} `{obj.metric}`; SLOs {json.dumps(obj.slos)}; "
             f"guards {study_obj.guard_names() or 'none'}",
             f"- workload ({obj.scale or 'node'} scale): {obj.workload.model_dump_json()}",
             f"- ladder: {obj.ladder.model_dump_json(exclude_defaults=True) if obj.ladder else 'none'}",
             f"- trials: {len(trials)} told ({sum(1 for t in trials if t.user_attrs.get('launched', True))} "
             f"launched), {len(ranked)} feasible",
             f"- pre-launch argument checks: {reading.user_attrs.get(PREVALIDATION_ATTR) or 'not recorded'}",
             ""]
    if winner is not None and winner.exportable_without_consent:
        lines += [f"**Winner: trial {winner.trial}, {obj.metric} = {winner.value:.2f}** "
                  f"({winner.describe(obj.metric)}). Launch files: `best/profile.yaml`, `best/serve.sh`.", ""]
    elif winner is not None:
        lines += [f"**No candidate was confirmed.** Best screening trial: trial {winner.trial}, {obj.metric} = "
                  f"{winner.value:.2f} ({winner.describe(obj.metric)}).", ""]
        lines += [f"- rejected: trial {c.trial}" + (f" (control of {c.control_of})" if c.control_of is not None
                                                    else "")
                  + f": repeats {', '.join(f'{v:.1f}' for v in c.values) or 'none'} ({c.reason})"
                  for c in winner.rejected]
        carry = "these repeats" if winner.rejected else "the label unconfirmed"
        lines += ["", "Launch files are written only by `dsv4-tune export "
                  f"{study_obj.record.name} --accept-unconfirmed`, and then carry {carry}.", ""]
    else:
        lines += ["**No trial passed its gates and met its SLOs.**", ""]
    for key, title in (("ttft", "Throughput against p95 TTFT"), ("itl", "Throughput against p95 ITL"),
                       ("progress", "Best feasible value so far"), ("importance", "Parameter importance"),
                       ("failures", "Failure reasons")):
        if key in images:
            lines += [f"## {title}", "", f"![{title}]({images[key].name})", ""]
    # the server's own prompt and decode speeds, measured apart, where it reports them (llama-server)
    speeds = [k for k in ("median_server_prompt_tok_s", "median_server_decode_tok_s")
              if any(k in t.user_attrs for t in ranked[:TOP_K])]
    lines += [f"## Top {TOP_K} feasible trials", "",
              _table(["trial", obj.metric, "p95 TTFT ms", "p95 ITL ms",
                      *(["prompt tok/s (server)", "decode tok/s (server)"] if speeds else []), "flags"],
                     [[t.number, f"{t.value:.2f}", f"{t.user_attrs.get('p95_ttft_ms', float('nan')):.1f}",
                       f"{t.user_attrs.get('p95_itl_ms', float('nan')):.1f}",
                       *[f"{t.user_attrs.get(k, float('nan')):.1f}" for k in (
                           ("median_server_prompt_tok_s", "median_server_decode_tok_s") if speeds else ())],
                       f"`{_flags(study_obj, t)}`"]
                      for t in ranked[:TOP_K]]), ""]
    confirmations = list(reading.confirmations)
    if confirmations:
        lines += ["## Confirmation runs (median − k·MAD over repeats)", "",
                  _table(["trial", "control of", "concurrency", "repeats", "median", "MAD", "robust", "accepted",
                          "why"],
                         [[c.trial, c.control_of if c.control_of is not None else "",
                           c.concurrency if c.concurrency is not None else "",
                           ", ".join(f"{v:.1f}" for v in c.values), f"{c.median:.2f}", f"{c.mad:.2f}",
                           f"{c.robust:.2f}", c.accepted, c.reason] for c in confirmations]), ""]
    client_flagged = [t for t in trials if t.user_attrs.get("client_saturated") or t.user_attrs.get("client_starved")]
    if client_flagged:
        lines += ["## Load generator warnings", "",
                  "These trials' figures are bounded by the client, not the server: *saturated* = the load "
                  "generator used its whole core; *starved* = the OS kept it off the CPU (shared cores: set "
                  "`server.client_cpus`). See `load.json` of each trial.", "",
                  _table(["trial", "value", "client"],
                         [[t.number, f"{t.value:.2f}" if t.value is not None else "",
                           ", ".join(f for f in ("saturated", "starved") if t.user_attrs.get(f"client_{f}"))]
                          for t in client_flagged]), ""]
    knees = _knee_rows(study_obj, trials)
    if knees:
        lines += ["## The ladder through each launch's knee", "",
                  "Each launch's ladder is sized from its own predicted KV knee; its top step must show "
                  "saturation in the server's own counters (KV near full, preemptions, or a full batch with a "
                  "queue: `tuner/load/knee.py`).", "",
                  _table(["trial", "ladder top", "predicted knee", "shown"], knees), ""]
    lines += prediction_section(study_obj.path, images.get("predicted"))
    lines += disaggregation_section(study_obj, trials, ranked, winner=winner, confirmations=confirmations)
    lines += _energy_section(trials)
    notes = study_obj.host_notes()
    lines += ["## The host: pre-flight and learned constraints", "",
              *([f"- {note}" for note in notes] or ["None: the pre-flight check passed and no lever value was ruled "
                                                     "out."]), ""]
    counts = reading.failure_counts()
    lines += ["## Failures", "", _table(["class", "trials"], [[k, v] for k, v in counts.items()]) if counts
              else "None.", ""]
    failed = [t for t in trials if not t.user_attrs.get("feasible")]
    if failed:
        lines += ["### Why each failed", "",
                  _table(["trial", "class", "reason"],
                         [[t.number, t.user_attrs.get("failure_class", ""),
                           str(t.user_attrs.get("reason", ""))[:200]] for t in failed]), ""]
    return "\n".join(lines) + "\n"


def _ms(value: Any) -> str:
    return f"{float(value):,.0f}" if isinstance(value, (int, float)) and value == value else "–"


def _share(value: Any) -> str:
    return f"{float(value):.0%}" if isinstance(value, (int, float)) and value == value else "–"


def _pool_rows(metrics: dict[str, Any]) -> list[list[str]]:
    """One launch's pools side by side: queue time, KV use, running and waiting requests, tokens."""
    pools = metrics.get("pools") or {}
    rows: list[list[str]] = []
    both = [pools.get(pool) or {} for pool in ("prefill", "decode")]
    rows.append(["p95 queue time ms", *(_ms((p.get("queue") or {}).get("p95_queue_ms")) for p in both)])
    for label, key in (("peak KV use", "kv_usage_max"), ("peak running requests", "running_max"),
                       ("peak waiting requests", "waiting_max"), ("prompt tokens", "prompt_tokens"),
                       ("tokens generated", "generation_tokens")):
        show = _share if key == "kv_usage_max" else _ms
        rows.append([label, *(show((p.get("facts") or {}).get(key)) for p in both)])
    return rows


def disaggregation_section(study_obj: Study, trials: list[TrialRecord], ranked: list[TrialRecord], *,
                           winner: Winner | None = None, confirmations: Sequence[Confirmation] = ()) -> list[str]:
    """Prefill/decode launches (issue 27): each one's pools side by side, and which kind won, by how much."""
    launches: list[tuple[TrialRecord, dict[str, Any], dict[str, Any], dict[str, Any]]] = []
    for t in trials:
        folder = study_obj.path / str(t.user_attrs.get("trial_dir", ""))
        if not t.user_attrs.get("trial_dir") or not (folder / "config.json").is_file():
            continue
        layout = store.read_json(folder / "config.json").get("disaggregation")
        if not layout:
            continue
        metrics = store.read_json(folder / "server_metrics.json") if (folder / "server_metrics.json").is_file() else {}
        outcome = store.read_json(folder / "outcome.json") if (folder / "outcome.json").is_file() else {}
        launches.append((t, layout, metrics, outcome.get("summary") or {}))
    if not launches:
        return []
    obj = study_obj.objective
    lines = ["## Prefill/decode layouts", ""]
    by_kind: dict[str, TrialRecord] = {}
    pd_trials = {t.number for t, *_ in launches}
    for t in ranked:
        by_kind.setdefault("disaggregated" if t.number in pd_trials else "aggregated", t)
    if len(by_kind) == 2:
        agg, pd = by_kind["aggregated"], by_kind["disaggregated"]
        first, second = (pd, agg) if float(pd.value or 0) >= float(agg.value or 0) else (agg, pd)
        kind = "disaggregated" if first is pd else "aggregated"
        ratio = float(first.value or 0) / float(second.value or 1) if second.value else float("inf")
        lines += [f"**{kind.capitalize()} won the screening**: the best {kind} launch, trial {first.number}, reached "
                  f"{obj.metric} {float(first.value or 0):.3g}, {ratio:.2f}× the best of the other kind (trial "
                  f"{second.number}, {float(second.value or 0):.3g}).", ""]
        verdicts = {c.trial: c for c in confirmations if c.control_of is None}
        for t in (first, second):
            c = verdicts.get(t.number)
            if c is not None:
                lines.append(f"- its confirmation, trial {t.number}: repeats "
                             f"{', '.join(f'{v:.3g}' for v in c.values) or 'none'}, "
                             + (f"confirmed at median {c.median:.3g}" if c.accepted else f"rejected: {c.reason}"))
        if winner is not None:
            won = "disaggregated" if winner.trial in pd_trials else "aggregated"
            state = "confirmed" if winner.confirmed else "not confirmed"
            lines.append(f"- **the night's winner** ({state}): trial {winner.trial}, {won}, {obj.metric} "
                         f"{winner.value:.3g}")
        lines.append("")
    elif by_kind:
        only = next(iter(by_kind))
        lines += [f"Only {only} launches met the SLOs; no comparison of the two kinds.", ""]
    else:
        lines += ["No launch of either kind met the SLOs.", ""]
    for t, layout, metrics, summary in launches:
        transfer = metrics.get("transfer") or {}
        pools = layout.get("pools") or {}
        value = f"{t.value:.3g}" if t.value is not None and t.user_attrs.get("feasible") else \
            str(t.user_attrs.get("failure_class") or "no value")
        lines += [f"### Trial {t.number}: {layout.get('layout')} (prefill {pools.get('prefill')}, decode "
                  f"{pools.get('decode')}; {layout.get('connector')}): {obj.metric} {value}", ""]
        if metrics.get("pools"):
            lines += [_table(["figure", "prefill pool", "decode pool"], _pool_rows(metrics)), ""]
        lines += [f"- KV transfer: {_ms(transfer.get('transfers'))} transfers, p50 "
                  f"{_ms(transfer.get('p50_transfer_ms'))} ms, p95 {_ms(transfer.get('p95_transfer_ms'))} ms, "
                  f"failed {_ms(transfer.get('failed_transfers'))}"
                  f", prompt tokens received {_ms(transfer.get('external_prefix_cache_hits'))} (where the connector "
                  "reports them)",
                  f"- p95 TTFT {_ms(summary.get('p95_ttft_ms'))} ms, p95 ITL {_ms(summary.get('p95_itl_ms'))} ms"]
        buckets = summary.get("ttft_by_context") or []
        if buckets:
            lines.append("- p95 TTFT by prompt length: " + ", ".join(
                f"{b['prompt_tokens_above']:,}–{b['prompt_tokens_upto'] or 'max'} tokens: "
                f"{_ms(b.get('p95_ttft_ms'))} ms ({b['requests']} requests)" for b in buckets))
        lines.append("")
    return lines


def _knee_rows(study_obj: Study, trials: list[TrialRecord]) -> list[list[object]]:
    rows: list[list[object]] = []
    for t in trials:
        path = study_obj.path / str(t.user_attrs.get("trial_dir", "")) / "outcome.json"
        if not t.user_attrs.get("trial_dir") or not path.is_file():
            continue
        summary = store.read_json(path).get("summary") or {}
        if summary.get("knee_shown") is None:
            continue
        rows.append([t.number, summary.get("knee_top_concurrency"), summary.get("knee_predicted"),
                     "yes" if summary["knee_shown"] else "**NO**: the ladder did not reach saturation"])
    return rows


def markdown_to_html(markdown: str, title: str) -> str:
    """A small converter for the report's own markdown (headings, bullets, tables, images)."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
           "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}code{font-size:12px}</style></head><body>"]
    in_table = False
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if set(line) <= set("|-"):
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
                out.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells) + "</tr>")
            else:
                out.append("<tr>" + "".join(f"<td>{html.escape(c.strip('`'))}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            out.append(f"<img alt='{html.escape(alt)}' src='{html.escape(src.rstrip(')'))}'>")
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<p>• {html.escape(line[2:])}</p>")
        elif line.strip():
            out.append(f"<p>{html.escape(line.replace('**', ''))}</p>")
    if in_table:
        out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out)


def _plot_predicted(folder: Path, out: Path) -> Path | None:
    """``--prior model``: each launch's prediction (before it ran) against its measurement, and the stop estimate."""
    data = load_prediction(folder)
    history = (data or {}).get("history") or []
    points = [(float(h["predicted_corrected"]), float(h["measured"] if h.get("feasible") else
                                                      h.get("measured_output_tok_s") or 0.0), bool(h.get("feasible")))
              for h in history if h.get("predicted_corrected")]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    top = max(max(p, m) for p, m, _ in points) * 1.05
    ax.plot([0, top], [0, top], color="grey", linewidth=1)
    for ok, marker, label in ((True, "o", "met the SLOs"), (False, "x", "missed an SLO or failed")):
        xs = [p for p, _, f in points if f == ok]
        ys = [m for _, m, f in points if f == ok]
        if xs:
            ax.scatter(xs, ys, marker=marker, label=label)
    ax.set_xlabel("predicted before launch (output tok/s)")
    ax.set_ylabel("measured (output tok/s)")
    ax.legend(fontsize=8)
    estimated = [h for h in history if h.get("chance_to_beat") is not None]  # none once the model is distrusted
    bx.plot([h["trial"] for h in estimated], [float(h["chance_to_beat"]) for h in estimated], marker="o")
    bx.axhline(STOP_BELOW, color="grey", linestyle="--", linewidth=1)
    bx.set_xlabel("trial")
    bx.set_ylabel("chance an untried configuration wins")
    bx.set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_report(study_obj: Study, reading: StudyReading | None = None) -> Path:
    """Write report.md, report.html and their plots into the study folder; return report.md.

    ``reading``: the study as read with its parameter importances (:func:`~tuner.study.reader.read_study`);
    read here when not given."""
    folder = study_obj.path
    reading = reading if reading is not None else read_study(study_obj, importances=True)
    trials = reading.told()
    images: dict[str, Path] = {}
    for key, latency in (("ttft", "p95_ttft_ms"), ("itl", "p95_itl_ms")):
        made = _plot_tradeoff(trials, latency, folder / f"plot_throughput_vs_{key}.png")
        if made:
            images[key] = made
    made = _plot_progress(reading, trials, folder / "plot_progress.png")
    if made:
        images["progress"] = made
    made = _plot_bars(reading.importances, "parameter importance", folder / "plot_importance.png")
    if made:
        images["importance"] = made
    made = _plot_bars({k: float(v) for k, v in reading.failure_counts().items()}, "failures by class",
                      folder / "plot_failures.png")
    if made:
        images["failures"] = made
    made = _plot_predicted(folder, folder / "plot_predicted_vs_measured.png")
    if made:
        images["predicted"] = made
    markdown = build_markdown(study_obj, reading, images)
    store.write_text(folder / "report.md", markdown)
    store.write_text(folder / "report.html", markdown_to_html(markdown, f"dsv4-tune {study_obj.record.name}"))
    study_obj.write_trials_table()
    return folder / "report.md"
