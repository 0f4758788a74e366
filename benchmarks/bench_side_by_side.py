"""dsv4-tune vs ``vllm bench sweep serve`` vs random search, same wall-clock budget, real vLLM CPU build.

    .venv/bin/python benchmarks/bench_side_by_side.py --budget-s 360 --out runs/side-by-side --confirm --lock-once

Each method gets the same search space (``benchmarks/cpu_wide.yaml``), the same model (the generated
demo model), the same workload and SLOs (``benchmarks/throughput_bench.yaml``) and the same
wall-clock budget, measured from the moment it holds ``/tmp/dsv4-vllm.lock``:

- ``tpe``: ``python -m tuner.cli run --hw benchmarks/cpu_wide.yaml --budget ... --confirm-top-k 0``
  (the study's own sampler: constrained multivariate TPE, the profile's baseline first; the
  confirmation phase off by default, like the sweep's single run per point:
  ``--tuner-confirm-top-k`` turns it on).
- ``random``: the same study with ``tuner.study.study.make_sampler`` replaced by Optuna's RandomSampler
  (patched inside this script's child process; ``study.py`` is untouched).
- ``sweep``: ``vllm bench sweep serve`` over a Cartesian grid of max-num-seqs ×
  max-num-batched-tokens (the levers vLLM's auto_tune.sh sweeps), other flags at vLLM's defaults,
  ``--num-runs 1``; the grid is cut to what fits the budget and the sweep is stopped at the budget.

With ``--confirm`` each method's winner is launched once more through the tuner's own harness
(same client, same SLOs), so the three winners are compared on equal terms and a lucky single run
shows up. Every vLLM start holds ``flock /tmp/dsv4-vllm.lock``: the three methods, and the
confirmation, each take it in turn, or with ``--lock-once`` the whole script takes it once. Results
are written up in ``docs/search.md``. Results go to ``OUT/results.json`` and a markdown table on
stdout; ``--evidence DIR`` also writes the summary the docs' table is built from (``DIR/results.json``:
per method its launches, their values and failures, the winner and its re-run; no logs).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
LOCK = "/tmp/dsv4-vllm.lock"  # noqa: S108 - the lock every engineer's vLLM start shares
LOCK_HELD_ENV = "DSV4_BENCH_LOCK_HELD"
DEFAULT_PROFILE = HERE / "cpu_wide.yaml"
DEFAULT_OBJECTIVE = HERE / "throughput_bench.yaml"
SWEEP_GRID = {"max_num_seqs": [4, 8, 16, 32, 64], "max_num_batched_tokens": [512, 1024, 2048]}
"""The sweep's grid (vllm bench sweep serve keys); the first combos that fit the budget are run."""


def _python() -> str:
    return sys.executable


def _lever_defaults(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's first baseline (vLLM defaults): the values the sweep leaves alone."""
    return dict(profile["baselines"][0]["values"])


def _load_yaml(path: Path) -> Any:
    import yaml

    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _run_locked(argv: list[str], *, log_path: Path, budget_s: float | None, env: dict[str, str] | None = None,
                grace_s: float = 15.0) -> tuple[int, float]:
    """Run ``argv`` under ``flock LOCK``; stop its process group ``grace_s`` after the budget.

    Returns (exit code, seconds it ran while holding the lock). The lock wait is not counted: a
    child prints a marker when it holds the lock and the clock starts there. With ``--lock-once``
    the whole script already holds the lock and the child runs without taking it again.
    """
    marker = log_path.with_suffix(".started")
    marker.unlink(missing_ok=True)
    lock = [] if os.environ.get(LOCK_HELD_ENV) else ["flock", LOCK]
    wrapped = [*lock, "sh", "-c", f'date +%s.%N > "{marker}"; exec "$@"', "sh", *argv]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(wrapped, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        started: float | None = None
        while proc.poll() is None:
            if started is None and marker.exists():
                with contextlib.suppress(ValueError):
                    started = float(marker.read_text().strip() or "nan")
                    if math.isnan(started):
                        started = None
            if started is not None and budget_s is not None and time.time() > started + budget_s + grace_s:
                # Servers the child started in sessions of their own (vllm bench sweep does) are not in
                # its process group and survive a SIGTERM to it: note their groups first.
                groups = _descendant_groups(proc.pid) - {proc.pid}
                # SIGTERM first (the tuner stops its server and records the trial), then SIGKILL.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                for group in groups:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(group, signal.SIGKILL)
                break
            time.sleep(1.0)
        if started is None and marker.exists():
            started = float(marker.read_text().strip())
    elapsed = time.time() - (started if started is not None else time.time())
    return proc.returncode if proc.returncode is not None else -1, elapsed


def _descendant_groups(root: int) -> set[int]:
    """Process groups of ``root`` and all its descendants (read from /proc)."""
    parent: dict[int, int] = {}
    group: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            parent[pid], group[pid] = int(fields[1]), int(fields[2])
    found, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        if pid in group:
            found.add(group[pid])
        frontier.extend(child for child, ppid in parent.items() if ppid == pid)
    return found


# -- dsv4-tune and random search --------------------------------------------------------------------
def _study_result(runs_dir: Path, name: str) -> dict[str, Any]:
    import optuna

    from tuner.study import best_feasible_trial, launched_numbers

    storage = f"sqlite:///{runs_dir / name / 'study.db'}"
    study = optuna.load_study(study_name=name, storage=storage)
    best = best_feasible_trial(study)
    launched = launched_numbers(study)
    trials = []
    for t in study.get_trials(deepcopy=False):
        if "duplicate_of" in t.user_attrs:
            continue
        trials.append({"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                       "feasible": bool(t.user_attrs.get("feasible")),
                       "failure": t.user_attrs.get("failure_class"),
                       "launched": t.user_attrs.get("launched", True) is not False,
                       "control": "control_for" in t.user_attrs,
                       "p95_ttft_ms": t.user_attrs.get("p95_ttft_ms"), "p95_itl_ms": t.user_attrs.get("p95_itl_ms"),
                       "duration_s": t.user_attrs.get("duration_s")})
    return {"launches": len(launched), "feasible": sum(1 for t in trials if t["feasible"]),
            "best_value": best.value if best else None, "best_params": dict(best.params) if best else None,
            "best_trial": best.number if best else None, "trials": trials}


def run_study_method(method: str, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    runs_dir = args.out / "runs"
    argv = [_python(), str(Path(__file__).resolve()), "_study", "--sampler", method, "--",
            "run", "--hw", str(args.profile), "--objective", str(args.objective), "--budget", f"{args.budget_s:.0f}s",
            "--study", method, "--runs-dir", str(runs_dir), "--model", str(model), "--seed", str(args.seed),
            "--no-export", "--guards", "none", "--confirm-top-k", str(args.tuner_confirm_top_k)]
    if args.server_cmd:
        argv += ["--engine-cmd", args.server_cmd]
    code, wall = _run_locked(argv, log_path=args.out / f"{method}.log", budget_s=args.budget_s)
    result = _study_result(runs_dir, method)
    result.update({"method": method, "exit_code": code, "wall_s": round(wall, 1)})
    return result


def _study_child(argv: list[str]) -> int:
    """``_study --sampler tpe|random -- <tuner.cli args>``: the tuner CLI, optionally with random search."""
    sampler = argv[argv.index("--sampler") + 1]
    cli_args = argv[argv.index("--") + 1:]
    sys.path.insert(0, str(ROOT))
    import optuna

    import tuner.study.study
    from tuner.cli import main

    if sampler == "random":
        def random_sampler(seed: int, n_startup_trials: int = 4, kind: str = "tpe") -> optuna.samplers.BaseSampler:
            return optuna.samplers.RandomSampler(seed=seed)

        tuner.study.study.make_sampler = random_sampler  # type: ignore[assignment]
    return main(cli_args)


# -- vllm bench sweep serve -------------------------------------------------------------------------
def _sweep_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def sweep_commands(args: argparse.Namespace, model: Path, port: int) -> tuple[list[str], list[str], dict[str, str]]:
    profile = _load_yaml(args.profile)
    objective = _load_yaml(args.objective)
    fixed = dict(profile["server"].get("fixed", {}))
    defaults = _lever_defaults(profile)
    serve = [args.vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--served-model-name", model.name]
    for key, value in fixed.items():
        serve += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    for key, value in defaults.items():
        if key.startswith("speculative.") or key.replace("-", "_") in SWEEP_GRID:
            continue
        if isinstance(value, bool):
            serve.append(f"--{key}" if value else f"--no-{key}")
        else:
            serve += [f"--{key}", str(value)]
    w = objective["workload"]
    bench = [args.vllm, "bench", "serve", "--backend", "openai", "--host", "127.0.0.1", "--port", str(port),
             "--model", model.name, "--tokenizer", str(model), "--dataset-name", "random",
             "--random-input-len", str(w["input_len"]), "--random-output-len", str(w["output_len"]),
             "--random-range-ratio", str(w.get("range_ratio", 0.0)), "--num-prompts", str(w["num_prompts"]),
             "--max-concurrency", str(w["concurrency"]), "--ignore-eos", "--seed", str(w.get("seed", 0)),
             "--metric-percentiles", "50,95,99"]
    env = {k: str(v) for k, v in profile["server"].get("env", {}).items()}
    return serve, bench, env


def run_sweep(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    from tuner.engines.process import choose_port

    port = choose_port("127.0.0.1", None)
    serve, bench, env = sweep_commands(args, model, port)
    keys = list(SWEEP_GRID)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*SWEEP_GRID.values())]
    combos = combos[:args.sweep_max_combos]
    out = args.out / "sweep"
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_params.json").write_text(json.dumps(combos, indent=1))
    (out / "bench_params.json").write_text(json.dumps([{}]))
    argv = [args.vllm, "bench", "sweep", "serve", "--serve-cmd", " ".join(serve), "--bench-cmd", " ".join(bench),
            "--serve-params", str(out / "serve_params.json"), "--bench-params", str(out / "bench_params.json"),
            "--num-runs", "1", "--warmup-num-prompts", "2", "--continue-on-error", "-o", str(out),
            "-e", "grid", "--server-ready-timeout", "240"]
    (out / "command.json").write_text(json.dumps({"argv": argv, "env": env}, indent=1))
    code, wall = _run_locked(argv, log_path=args.out / "sweep.log", budget_s=args.budget_s, env=env)
    return {"method": "sweep", "exit_code": code, "wall_s": round(wall, 1), **_sweep_result(out / "grid", args),
            "grid": combos}


def _sweep_result(experiment: Path, args: argparse.Namespace) -> dict[str, Any]:
    slos = _load_yaml(args.objective).get("slos", {})
    trials = []
    for path in sorted(experiment.glob("**/run=*.json")):
        data = json.loads(path.read_text())
        serve_params = {k: data[k] for k in SWEEP_GRID if k in data}
        margins = {k: (float(data.get(k, math.inf)) - limit) / limit for k, limit in slos.items()}
        ok = all(m <= 0 for m in margins.values()) and not data.get("failed")
        trials.append({"params": serve_params, "value": data.get("output_throughput"), "feasible": ok,
                       "p95_ttft_ms": data.get("p95_ttft_ms"), "p95_itl_ms": data.get("p95_itl_ms"),
                       "failed": data.get("failed")})
    failures = [json.loads(p.read_text()) for p in experiment.glob("*failure.json")]
    launched = len({json.dumps(t["params"], sort_keys=True) for t in trials}) + len(failures)
    feasible = [t for t in trials if t["feasible"] and t["value"] is not None]
    best = max(feasible, key=lambda t: float(t["value"])) if feasible else None
    return {"launches": launched, "feasible": len(feasible), "best_value": best["value"] if best else None,
            "best_params": best["params"] if best else None, "trials": trials, "failures": failures}


# -- confirmation -------------------------------------------------------------------------------------
def _sweep_params_as_levers(params: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    values = _lever_defaults(profile)
    for key, value in params.items():
        values[key.replace("_", "-")] = value
    return values


def confirm(results: dict[str, dict[str, Any]], args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """Launch each method's winner once more through the tuner's harness (one study, one launch each)."""
    import yaml

    profile = _load_yaml(args.profile)
    baselines = []
    for method, res in results.items():
        if not res.get("best_params"):
            continue
        values = res["best_params"] if method != "sweep" else _sweep_params_as_levers(res["best_params"], profile)
        baselines.append({"name": f"winner-{method}", "values": values})
    if not baselines:
        return {}
    profile["name"] = "confirm"
    profile["baselines"] = baselines
    path = args.out / "confirm_profile.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    runs_dir = args.out / "runs"
    argv = [_python(), str(Path(__file__).resolve()), "_study", "--sampler", "tpe", "--",
            "run", "--hw", str(path), "--objective", str(args.objective), "--trials", str(len(baselines)),
            "--study", "confirm", "--runs-dir", str(runs_dir), "--model", str(model), "--no-export",
            "--guards", "none", "--confirm-top-k", "0"]
    if args.server_cmd:
        argv += ["--engine-cmd", args.server_cmd]
    _run_locked(argv, log_path=args.out / "confirm.log", budget_s=None)
    import optuna

    study = optuna.load_study(study_name="confirm", storage=f"sqlite:///{runs_dir / 'confirm' / 'study.db'}")
    out: dict[str, Any] = {}
    for t in study.get_trials(deepcopy=False):
        name = str(t.user_attrs.get("baseline", ""))
        if name.startswith("winner-"):
            out[name.removeprefix("winner-")] = {"value": t.value, "feasible": bool(t.user_attrs.get("feasible")),
                                                 "p95_ttft_ms": t.user_attrs.get("p95_ttft_ms"),
                                                 "p95_itl_ms": t.user_attrs.get("p95_itl_ms")}
    return out


# -- report -------------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{float(value):.{digits}f}"


def markdown(results: dict[str, dict[str, Any]], confirmed: dict[str, Any], budget_s: float) -> str:
    lines = [f"budget per method: {budget_s:.0f} s of wall time (lock held)", "",
             "| method | launches | feasible | best feasible output tok/s | confirmed re-run tok/s | wall s "
             "| best flags |",
             "|---|---|---|---|---|---|---|"]
    for method, res in results.items():
        conf = confirmed.get(method, {})
        conf_text = _fmt(conf.get("value")) + ("" if not conf or conf.get("feasible") else " (infeasible)")
        flags = ", ".join(f"{k}={v}" for k, v in (res.get("best_params") or {}).items())
        lines.append(f"| {method} | {res.get('launches')} | {res.get('feasible')} | {_fmt(res.get('best_value'))} | "
                     f"{conf_text if conf else '—'} | {_fmt(res.get('wall_s'), 0)} | {flags or '—'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] == "_study":
        return _study_child(words[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=480.0, help="wall seconds per method (default 480)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / f"side-by-side-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--objective", type=Path, default=DEFAULT_OBJECTIVE)
    parser.add_argument("--methods", default="tpe,sweep,random", help="comma-separated subset of tpe,sweep,random")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm", default=str(ROOT / ".venv" / "bin" / "vllm"), help="the vllm executable")
    parser.add_argument("--engine-cmd", "--vllm-cmd", dest="server_cmd", default=None,
                         help="passed to the tuner's --engine-cmd (default: its own; "
                         "--vllm-cmd: alias of --engine-cmd)")
    parser.add_argument("--sweep-max-combos", type=int, default=15, help="cut the sweep grid to this many combos")
    parser.add_argument("--confirm", action="store_true", help="re-launch each winner once through the tuner")
    parser.add_argument("--tuner-confirm-top-k", type=int, default=0,
                        help="the tuner's --confirm-top-k for the tpe and random runs (default 0: screening only, "
                             "like the sweep's --num-runs 1; the tuner's own default is 2)")
    parser.add_argument("--evidence", type=Path, default=None,
                        help="also write the small summary for docs/evidence (e.g. docs/evidence/search-cpu)")
    parser.add_argument("--lock-once", action="store_true",
                        help="take the vLLM lock once for the whole run instead of once per method")
    parser.add_argument("--rebuild-evidence", type=Path, default=None, metavar="OUT",
                        help="write --evidence from an earlier run's OUT folder (its studies, sweep and results.json)")
    args = parser.parse_args(words)
    if args.rebuild_evidence is not None:
        return rebuild_evidence(args)
    if args.lock_once and not os.environ.get(LOCK_HELD_ENV):
        print(f"waiting for {LOCK} ...", flush=True)
        os.execvpe("flock",  # noqa: S606 - re-run this script under the shared lock
                   ["flock", LOCK, _python(), str(Path(__file__).resolve()), *words],
                   {**os.environ, LOCK_HELD_ENV: "1"})
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    model = args.out / "model"
    if not (model / "config.json").exists():
        subprocess.run([_python(), "-m", "tuner.cli", "demo-model", str(model)], cwd=ROOT, check=True)
    results: dict[str, dict[str, Any]] = {}
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        started = time.time()
        print(f"[{time.strftime('%H:%M:%S')}] {method}: starting (budget {args.budget_s:.0f} s)", flush=True)
        results[method] = run_sweep(args, model) if method == "sweep" else run_study_method(method, args, model)
        print(f"[{time.strftime('%H:%M:%S')}] {method}: {results[method]['launches']} launches, best "
              f"{_fmt(results[method]['best_value'])} tok/s ({time.time() - started:.0f} s incl. lock wait)",
              flush=True)
        (args.out / "results.json").write_text(json.dumps({"results": results}, indent=1, default=str))
    confirmed = confirm(results, args, model) if args.confirm else {}
    (args.out / "results.json").write_text(json.dumps({"results": results, "confirmed": confirmed,
                                                       "budget_s": args.budget_s}, indent=1, default=str))
    print(markdown(results, confirmed, args.budget_s))
    if args.evidence is not None:
        write_evidence(args.evidence, results, confirmed, args)
    return 0


def rebuild_evidence(args: argparse.Namespace) -> int:
    """--evidence from a finished run's folder, without launching anything."""
    out = args.rebuild_evidence.resolve()
    sys.path.insert(0, str(ROOT))
    saved = json.loads((out / "results.json").read_text())
    results = saved["results"]
    for method in results:
        if method != "sweep":
            results[method].update(_study_result(out / "runs", method))
    args.budget_s = float(saved.get("budget_s", args.budget_s))
    write_evidence(args.evidence or (ROOT / "docs" / "evidence" / "search-cpu"), results, saved.get("confirmed", {}),
                   args)
    return 0


def write_evidence(folder: Path, results: dict[str, dict[str, Any]], confirmed: dict[str, Any],
                   args: argparse.Namespace) -> None:
    """The committed summary: what each method launched and found (no logs, no per-request records)."""
    keep = ("value", "feasible", "failure", "failed", "launched", "control", "p95_ttft_ms", "p95_itl_ms", "params",
            "duration_s")
    out: dict[str, Any] = {"budget_s": args.budget_s, "profile": args.profile.name, "objective": args.objective.name,
                           "measured": time.strftime("%Y-%m-%d"), "methods": {}}
    for method, res in results.items():
        out["methods"][method] = {
            "launches": res.get("launches"), "feasible": res.get("feasible"), "best_value": res.get("best_value"),
            "best_params": res.get("best_params"), "wall_s": res.get("wall_s"), "confirmed": confirmed.get(method),
            "trials": [{k: t.get(k) for k in keep if k in t} for t in res.get("trials", [])],
            "failures": len(res.get("failures", []))}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
