"""What the README's demo took on the 2-core machine (README.md), from ``demo.json`` (``run.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _data(folder: Path) -> dict[str, Any]:
    path = folder / "demo.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path.name} is not in docs/evidence/{folder.name}/ yet: run "
                                f"`flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/{folder.name}/run.py`")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def wall(folder: Path) -> str:
    return _clock(float(_data(folder)["wall_s"]))


def run(folder: Path) -> str:
    d = _data(folder)
    m = d["machine"]
    return (f"`{d['command']}` on {d['date']}: exit code {d['exit_code']} in {_clock(float(d['wall_s']))} on "
            f"{m['cpus']} cores ({m['cpu_model']}); load average (1 min) {m['load_average_1m_before']} before and "
            f"{m['load_average_1m_after']} after; exported: {'yes' if d['exported'] else 'no'} "
            f"(confirmation {d['confirmation_status']}).")


def launches(folder: Path) -> str:
    rows = ["| launch | ok | failure class | ready (s) | duration (s) | output tok/s |", "|---|---|---|---:|---:|---:|"]
    for r in _data(folder)["launches"]:
        def cell(value: Any) -> str:
            return "–" if value is None else f"{value:,}" if isinstance(value, float) else str(value)
        rows.append(f"| {r['launch']} | {'yes' if r['ok'] else 'no'} | {r['failure_class'] or '–'} | "
                    f"{cell(r['ready_s'])} | {cell(r['duration_s'])} | {cell(r['output_throughput'])} |")
    return "\n".join(rows)


def _range(values: list[float]) -> str:
    low, high = round(min(values)), round(max(values))
    return f"{low} s" if low == high else f"{low}–{high} s"


def ready(folder: Path) -> str:
    """From launch to ready, over the demo's launches."""
    return _range([float(r["ready_s"]) for r in _data(folder)["launches"] if r["ready_s"] is not None])


def per_launch(folder: Path) -> str:
    """A whole launch (start, gates, load, stop), over the demo's launches."""
    return _range([float(r["duration_s"]) for r in _data(folder)["launches"]])


def count(folder: Path) -> str:
    return str(len(_data(folder)["launches"]))


def machine(folder: Path) -> str:
    """The machine the figures are from, and how busy it was (other work shares it)."""
    m = _data(folder)["machine"]
    during = m.get("load_average_1m_during") or []
    load = (f"load average (1 min) {m['load_average_1m_before']} before, "
            + (f"{min(during)}–{max(during)} during, " if during else "") + f"{m['load_average_1m_after']} after")
    avx = {True: ", AVX-512", False: ", no AVX-512"}.get(m.get("avx512"), "")
    return f"{m['cpus']} cores ({m['cpu_model']}{avx}); {load}"


def _parts(launch: dict[str, Any]) -> tuple[float, float, float, float]:
    """A launch's seconds: to ready, in the gates, in measured windows, and the rest (warm-up, metrics, stop)."""
    ready_s = float(launch["ready_s"] or 0.0)
    gates_s, windows_s = float(launch.get("gates_s", 0.0)), float(launch.get("windows_s", 0.0))
    return ready_s, gates_s, windows_s, float(launch["duration_s"]) - ready_s - gates_s - windows_s


def breakdown(folder: Path) -> str:
    """Where the demo's wall time went: screening launches, confirmation launches, and the tuner around them."""
    d = _data(folder)
    wall_s = float(d["wall_s"])
    rows = ["| part | launches | to ready | gates | measured windows | rest of the launch | in all | share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    in_launches = 0.0
    for name, prefix in (("screening (trials and controls)", "trials/"), ("confirmation", "confirm/")):
        chosen = [launch for launch in d["launches"] if launch["launch"].startswith(prefix)]
        sums = [sum(part) for part in zip(*(_parts(launch) for launch in chosen), strict=True)] or [0.0] * 4
        total = sum(sums)
        in_launches += total
        rows.append(f"| {name} | {len(chosen)} | " + " | ".join(f"{v:.0f} s" for v in sums)
                    + f" | {total:.0f} s | {100 * total / wall_s:.0f} % |")
    outside = wall_s - in_launches
    rows.append(f"| outside the launches (imports, model copy, pre-launch checks, report, export) | – | – | – | – | – "
                f"| {outside:.0f} s | {100 * outside / wall_s:.0f} % |")
    return "\n".join(rows)


def ready_share(folder: Path) -> str:
    """The share of the wall time the launches spent getting to ready."""
    d = _data(folder)
    return f"{100 * sum(_parts(launch)[0] for launch in d['launches']) / float(d['wall_s']):.0f} %"


def client_lag(folder: Path) -> str:
    """The load generator's event-loop lag (p99) over the demo's measured windows, on its own core."""
    windows = [w for launch in _data(folder)["launches"] for w in launch.get("windows", [])]
    lags = sorted(float(w["client_loop_lag_p99_ms"]) for w in windows)
    starved = sum(1 for w in windows if w.get("client_starved"))
    median = lags[(len(lags) - 1) // 2]
    return (f"{median:.0f} ms at the median of {len(lags)} windows, {lags[0]:.0f}–{lags[-1]:.0f} ms in all, with "
            f"{starved} window{'s' if starved != 1 else ''} flagged `client_starved`")


def runs(folder: Path) -> str:
    """Every kept run of the demo (``demo*.json``), newest first: its machine, load, launches and verdict."""
    rows = ["| date | commit | machine | load average (1 min) | launches | wall | exit code | winner |",
            "|---|---|---|---|---:|---:|---:|---|"]
    kept = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("demo*.json"))]
    for d in sorted(kept, key=lambda d: (d["date"], d.get("commit", "")), reverse=True):
        m = d["machine"]
        during = m.get("load_average_1m_during") or []
        load = f"{m['load_average_1m_before']} → " + (f"{min(during)}–{max(during)} → " if during else "") \
            + f"{m['load_average_1m_after']}"
        avx = {True: ", AVX-512", False: ", no AVX-512"}.get(m.get("avx512"), "")
        winner = f"exported ({d['confirmation_status']})" if d["exported"] else "none confirmed"
        rows.append(f"| {d['date']} | {d.get('commit', '–')} | {m['cpus']} cores, {m['cpu_model']}{avx} | {load} | "
                    f"{len(d['launches'])} | {_clock(float(d['wall_s']))} | {d['exit_code']} | {winner} |")
    return "\n".join(rows)


def _kept(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("demo*.json"))]


def within_five(folder: Path) -> str:
    """How many kept runs ended within 5 minutes with a confirmed winner, of how many."""
    kept = _kept(folder)
    met = sum(1 for d in kept
              if float(d["wall_s"]) <= 300 and d["exported"] and d["confirmation_status"] == "confirmed")
    return f"{met} of {len(kept)}"


def over_five(folder: Path) -> str:
    """How far past 5 minutes the slowest kept run ended."""
    return _clock(max(float(d["wall_s"]) for d in _kept(folder)) - 300)


def launch_counts(folder: Path) -> str:
    counts = sorted(len(d["launches"]) for d in _kept(folder))
    return str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}–{counts[-1]}"


def ready_all(folder: Path) -> str:
    """From launch to ready, over every launch of every kept run."""
    return _range([float(r["ready_s"]) for d in _kept(folder) for r in d["launches"] if r["ready_s"] is not None])


def wall_range(folder: Path) -> str:
    """The demo's wall time over every kept run (machines differ)."""
    walls = sorted(float(json.loads(p.read_text(encoding="utf-8"))["wall_s"]) for p in folder.glob("demo*.json"))
    low, high = _clock(walls[0]), _clock(walls[-1])
    return low if low == high else f"{low} – {high}"


def _spread(values: list[float]) -> float:
    """(max − min) / median of a confirmation's repeats, as the confirmation judges them."""
    ordered = sorted(values)
    return (ordered[-1] - ordered[0]) / ordered[(len(ordered) - 1) // 2]


def shorter_windows(folder: Path) -> str:
    """The run with the demo's windows shortened (``shorter-windows.json``): its time and its confirmations."""
    d = json.loads((folder / "shorter-windows.json").read_text(encoding="utf-8"))
    spreads = [f"{100 * _spread(launch['repeat_values']):.0f} %" for launch in d["launches"]
               if launch["launch"].startswith("confirm/") and len(launch.get("repeat_values") or ()) > 1]
    return (f"{_clock(float(d['wall_s']))} (exit code {d['exit_code']}, load average "
            f"{d['machine']['load_average_1m_before']} before), its confirmations' repeats spread "
            f"{' and '.join(spreads)} of their median")


TABLES: dict[str, Callable[[Path], str]] = {
    "runs": runs, "wall_range": wall_range, "wall": wall, "run": run, "launches": launches, "ready": ready,
    "per_launch": per_launch, "count": count, "machine": machine, "breakdown": breakdown, "ready_share": ready_share,
    "client_lag": client_lag, "shorter_windows": shorter_windows, "within_five": within_five,
    "over_five": over_five, "launch_counts": launch_counts, "ready_all": ready_all,
}
