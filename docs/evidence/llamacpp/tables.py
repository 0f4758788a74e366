"""llama.cpp on this host, as data: the pinned llama-server's build (``build.json``) and a night (``night.json``,
written by ``run.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _read(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not in docs/evidence/{folder.name}/ yet: run "
                                f"`flock /tmp/dsv4-vllm.lock .venv/bin/python docs/evidence/{folder.name}/run.py`")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _cell(value: Any, fmt: str = ",.1f") -> str:
    return "–" if value is None else format(value, fmt) if isinstance(value, float) else str(value)


def build(folder: Path) -> str:
    d = _read(folder, "build.json")
    return (f"`{d['command']}` built llama-server from source in {_clock(float(d['wall_s']))} "
            f"({d['machine']['cpus']} cores, {d['machine']['cpu']}); wheel {d['wheel_size_bytes'] / 1e6:.1f} MB")


def build_setup(folder: Path) -> str:
    d = _read(folder, "build-setup.json")
    return (f"with `scripts/setup.sh`'s settings (one job per core, no tests or examples) and an empty cache: "
            f"{_clock(float(d['wall_s']))} ({d['machine']['cpus']} cores, {d['machine']['cpu']}); wheel "
            f"{d['wheel_size_bytes'] / 1e6:.1f} MB, llama-server in it")


def night(folder: Path) -> str:
    d = _read(folder, "night.json")
    m = d["machine"]
    launched = [x for x in d["launches"] if x["ready_s"] is not None]
    return (f"`{d['command']}` on {d['date']} ({d['commit']}): exit code {d['exit_code']} in "
            f"{_clock(float(d['wall_s']))}, {len(d['launches'])} launches ({len(launched)} became ready) on "
            f"{m['cpus']} cores ({m['cpu_model']}), load average (1 min) {m['load_average_1m_before']} before and "
            f"{m['load_average_1m_after']} after (other work on the machine).")


def launches(folder: Path) -> str:
    rows = ["| launch | baseline | draft tokens | class | ready (s) | gates passed / ran | gates (s) | output tok/s "
            "| prompt tok/s (responses) | decode tok/s (responses) | decode tok/s (/metrics) | draft acceptance |",
            "|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for x in _read(folder, "night.json")["launches"]:
        gates = x["gates"]
        ran = [g for g in gates if not g["not_run"]]
        rows.append(
            f"| {x['launch']} | {x['baseline'] or '–'} | {x['draft_tokens']} | {x['failure_class'] or 'ok'} | "
            f"{_cell(x['ready_s'], '.2f')} | "
            + (f"{sum(g['passed'] for g in ran)} / {len(ran)}" if gates else "–")
            + f" | {_cell(sum(g['elapsed_s'] or 0.0 for g in gates) if gates else None, '.1f')} | "
            f"{_cell(x['output_throughput'])} | {_cell(x['server_prompt_tok_s'])} | "
            f"{_cell(x['server_decode_tok_s'])} | "
            f"{_cell(x['metrics_decode_tok_s'])} | {_cell(x['draft_acceptance'], '.3f')} |")
    return "\n".join(rows)


def failures(folder: Path) -> str:
    rows = ["| launch | class | the deciding line |", "|---|---|---|"]
    for x in _read(folder, "night.json")["launches"]:
        if x["failure_class"]:
            rows.append(f"| {x['launch']} | {x['failure_class']} | {x['reason'].replace('|', '/')} |")
    return "\n".join(rows)


def verify(folder: Path) -> str:
    v = _read(folder, "night.json")["verify"]
    return (f"`dsv4-tune verify` re-served `best/serve.sh` in {_clock(float(v['wall_s']))} (ready in "
            f"{float(v['ready_s']):.2f} s): repeats {' / '.join(f'{x:,.1f}' for x in v['values'])} output tok/s "
            f"against the reported {float(v['reported']):,.1f}, "
            + ("within the confirmation's spread" if v["within"] else "outside the confirmation's spread (exit 1)")
            + ".")


def draft_gain(folder: Path) -> str:
    """The Q8_0 draft against its no-draft control, on this CPU."""
    by_base = {x["baseline"]: x for x in _read(folder, "night.json")["launches"] if x["baseline"]}
    draft, control = by_base["q8_0-draft"], by_base["llama-server-defaults"]
    return f"{float(draft['output_throughput']) / float(control['output_throughput']):.2f}x"


def gguf(folder: Path) -> str:
    rows = ["| file | matrices | bytes | checked against the safetensors source |", "|---|---|---:|---|"]
    for name, f in _read(folder, "night.json")["gguf"].items():
        checked = f["checked"]
        how = ("every tensor bit for bit" if checked["exact"] else
               f"every tensor within {checked['max_relative_error']:.4f} of its range")
        rows.append(f"| {name} | {f['matrices']} | {f['bytes']:,} | {checked['tensors']} tensors, {how} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[Path], str]] = {"build": build, "build_setup": build_setup, "night": night,
                                            "launches": launches,
                                            "failures": failures, "verify": verify, "draft_gain": draft_gain,
                                            "gguf": gguf}
