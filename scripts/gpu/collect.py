#!/usr/bin/env python3
"""Turn what comes back from the one-GPU device calls into ``docs/evidence/<run>/``.

    python scripts/gpu/collect.py --prepare OUT2 --start OUT3 --finish OUT4 [--capacity OUT5] \\
        [--calls calls.json] --out docs/evidence/h200x1     # or docs/evidence/h100x1 (an H100 was lent)

OUT2..OUT4 are the folders the device tool put each call's ``$OUT`` files in (prepare.sh, then
run_study.sh start and finish). ``calls.json`` is what the lead copies from the tool's replies, one
object per call: ``{"call": 3, "wall_s": 541.2, "held_s": 1250, "budget_left_s": 610, "what": "..."}``.

Written (small files only; machine paths shortened):

- the study's ``report.md``, ``trials.csv``, ``study.json``, its snapshots, and ``best/`` (launch files,
  identity, ``verify.json``, the winner's evidence without per-request records);
- ``launches.csv``: one row per launch (screening, confirmation, re-serve): flags, outcome, ready time
  and the start-up phases read off its server log (:func:`tuner.engines.vllm.startup.startup_phases`);
  ``ready_in_log`` says whether the server logged its start-up complete (a launch cut by its call's time
  box after that has a log but no ``ready_s``);
- ``ladder.csv``: one row per measured window (launch × repeat × ladder step): throughput, latency,
  the server's peak ``vllm:kv_cache_usage_perc``, waiting requests, preemptions, the client's CPU and
  saturation, and GPU power, energy, tokens per joule and $ per million tokens;
- ``reference_completions.json``: the equivalence gate's greedy reference answers (token ids per probe);
- ``verify.json``, ``capacity.json``, ``machine.txt``, ``model.json``, ``prevalidate.txt``, ``dmon.txt``;
- ``gpu_time.json``: the calls (``calls.json``) and the phases each script marked (``timeline.txt``).

``docs/evidence/h200x1/tables.py`` builds the write-up's tables from these, for any such folder
(``docs/evidence/h100x1/tables.py`` loads it); ``--out`` keeps a ``tables.py`` already there.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tuner.engines.vllm.startup import startup_phases  # noqa: E402

FLAGS = ("max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization", "kv-cache-dtype", "enforce-eager")
KV = "vllm:kv_cache_usage_perc"
# absolute paths of the machines (the stage, $OUT, a runs folder, a pytest tmp) → relative
_PATHS = re.compile(r"(/root/stage/|/tmp/gpu-out/|/tmp/[\w.-]+/stage/|/tmp/pytest-of-\w+/[\w.-]+/)")


def scrub(text: str) -> str:
    return _PATHS.sub("", text)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _copy_text(src: Path, dst: Path) -> None:
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(scrub(src.read_text(errors="replace")))


def _flags(args: dict[str, Any]) -> dict[str, Any]:
    cc = args.get("compilation-config") or {}
    spec = args.get("speculative-config") or {}
    out = {k: args.get(k) for k in FLAGS}
    out["cudagraph_mode"] = None if args.get("enforce-eager") else cc.get("cudagraph_mode")
    out["capture_size"] = None if args.get("enforce-eager") else cc.get("max_cudagraph_capture_size")
    out["draft_tokens"] = spec.get("num_speculative_tokens", 0)
    return out


def _launch_dirs(study: Path) -> list[tuple[str, str, Path]]:
    """(kind, name, folder) of every launch: screening trials, confirmations, the re-serve."""
    out = [("screen", d.name, d) for d in sorted((study / "trials").glob("*")) if d.is_dir()]
    out += [("confirm", d.name, d) for d in sorted((study / "confirm").glob("*")) if d.is_dir()]
    if (study / "verify" / "verify.json").is_file():
        out.append(("reserve", "best/serve.sh", study / "verify"))
    return out


def _windows(kind: str, name: str, folder: Path) -> list[dict[str, Any]]:
    """One row per measured window of a launch."""
    if kind == "reserve":
        record = _json(folder / "verify.json") or {}
        repeats = record.get("steps", [])
    else:
        repeats = (_json(folder / "load.json") or {}).get("repeats", [])
    rows = []
    for r_index, repeat in enumerate(repeats):
        chosen = repeat.get("chosen_step")
        for s_index, step in enumerate(repeat.get("steps", [])):
            s, server, client = step.get("summary", {}), step.get("server", {}), step.get("client", {})
            gauges = server.get("gauges", {})
            power = server.get("power") or {}
            spec = server.get("spec_decode") or {}
            counters = server.get("counters") or {}
            rows.append({
                "kind": kind, "launch": name, "repeat": r_index, "step": s_index,
                "concurrency": step.get("concurrency"), "chosen": s_index == chosen, "feasible": step.get("feasible"),
                "early_stop": step.get("early_stop_reason", ""),
                "output_throughput": s.get("output_throughput"), "p95_ttft_ms": s.get("p95_ttft_ms"),
                "p95_itl_ms": s.get("p95_itl_ms"), "median_itl_ms": s.get("median_itl_ms"),
                "completed": s.get("completed"), "failed": s.get("failed"), "duration_s": s.get("duration"),
                "kv_usage_max": (gauges.get(KV) or {}).get("max"), "kv_usage_mean": (gauges.get(KV) or {}).get("mean"),
                "running_max": (gauges.get("vllm:num_requests_running") or {}).get("max"),
                "waiting_max": (gauges.get("vllm:num_requests_waiting") or {}).get("max"),
                "preemptions": counters.get("vllm:num_preemptions"),
                "p95_queue_ms": s.get("p95_queue_ms"),
                "spec_acceptance": spec.get("acceptance_rate"),
                "client_processes": client.get("client_processes"), "client_cpu_share": client.get("client_cpu_share"),
                "client_events_per_s": client.get("client_events_per_s"),
                "client_saturated": client.get("client_saturated"),
                "client_starved": client.get("client_starved"),
                "client_loop_lag_p99_ms": client.get("client_loop_lag_p99_ms"),
                "gpu_power_mean_w": s.get("gpu_power_mean_w", power.get("mean_w")),
                "gpu_power_max_w": s.get("gpu_power_max_w", power.get("max_w")),
                "gpu_energy_j": s.get("gpu_energy_j", power.get("energy_j")),
                "energy_from": power.get("energy_from"),
                "tokens_per_joule": s.get("tokens_per_joule"), "usd_per_mtok": s.get("usd_per_mtok"),
            })
    return rows


def _launch_row(kind: str, name: str, folder: Path, trials: dict[str, dict[str, str]]) -> dict[str, Any]:
    outcome = _json(folder / "outcome.json") or {}
    config = _json(folder / "config.json") or {}
    log = folder / "server.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    phases = startup_phases(text) if text else {}
    row: dict[str, Any] = {"kind": kind, "launch": name}
    if kind == "reserve":
        record = _json(folder / "verify.json") or {}
        row.update({"ready_s": record.get("ready_s"), "value": record.get("median"), "ok": record.get("ok"),
                    "failure_class": record.get("failure_class"), "reason": record.get("verdict", "")})
    else:
        row.update({"ready_s": outcome.get("ready_s"), "value": outcome.get("value"), "ok": outcome.get("ok"),
                    "feasible": outcome.get("feasible"), "failure_class": outcome.get("failure_class"),
                    "reason": scrub(str(outcome.get("reason", "")))[:200], "duration_s": outcome.get("duration_s")})
        number = str(int(name.split("-")[0])) if name.split("-")[0].isdigit() else ""
        row["baseline"] = trials.get(number, {}).get("baseline", "")
        row.update(_flags(config.get("args", {})))
    row.update(phases)
    if text:
        row["ready_in_log"] = "Application startup complete" in text
    return row


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _slim_load(src: Path, dst: Path) -> None:
    data = _json(src)
    if data is None:
        return
    for repeat in data.get("repeats", []):
        for step in repeat.get("steps", []):
            step.pop("requests", None)
    dst.write_text(scrub(json.dumps(data, indent=1)))


def _timeline(folders: list[Path]) -> list[dict[str, Any]]:
    seen: dict[tuple[int, str], None] = {}
    for folder in folders:
        for name in ("timeline.txt", "timeline-prepare.txt"):
            path = folder / name
            if path.is_file():
                for line in path.read_text().splitlines():
                    stamp, _, what = line.partition(" ")
                    if stamp.isdigit():
                        seen[(int(stamp), what)] = None
    ordered = sorted(seen, key=lambda mark: mark[0])  # by second; marks of the same second keep their order
    t0 = ordered[0][0] if ordered else 0
    return [{"t_s": t - t0, "what": scrub(what)} for t, what in ordered]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", type=Path)
    parser.add_argument("--start", type=Path)
    parser.add_argument("--finish", type=Path)
    parser.add_argument("--capacity", type=Path, help="call 5: MODELS=0 prepare.sh, once FlashAttention is staged")
    parser.add_argument("--calls", type=Path, help="the device calls: wall_s, held_s, budget_left_s (JSON list)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: Path = args.out
    folders = [f for f in (args.prepare, args.start, args.finish, args.capacity) if f is not None and f.is_dir()]
    pack = next((f / "study.tar.gz" for f in (args.finish, args.start) if f and (f / "study.tar.gz").is_file()), None)
    if pack is None:
        print("no study.tar.gz in --finish or --start", file=sys.stderr)
        return 2
    if out.exists():
        keep = out / "tables.py"
        saved = keep.read_text() if keep.is_file() else None
        shutil.rmtree(out)
        out.mkdir(parents=True)
        if saved is not None:
            keep.write_text(saved)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(pack) as tar:
            tar.extractall(tmp, filter="data")
        study = next(p for p in Path(tmp).iterdir() if p.is_dir())
        for name in ("report.md", "trials.csv", "study.json", "objective.yaml", "hardware_profile.yaml", "PACKED.txt"):
            _copy_text(study / name, out / name)
        trials = {row.get("number", ""): row for row in csv.DictReader((study / "trials.csv").open())} \
            if (study / "trials.csv").is_file() else {}
        best = study / "best"
        for name in ("profile.yaml", "serve.sh", "identity.json", "verify.json"):
            _copy_text(best / name, out / "best" / name)
        for src in sorted((best / "evidence").glob("*.json")):
            if src.name == "load.json":
                (out / "best" / "evidence").mkdir(parents=True, exist_ok=True)
                _slim_load(src, out / "best" / "evidence" / "load.json")
            else:
                _copy_text(src, out / "best" / "evidence" / src.name)
        launches = _launch_dirs(study)
        _write_csv(out / "launches.csv", [_launch_row(k, n, f, trials) for k, n, f in launches])
        _write_csv(out / "ladder.csv", [w for k, n, f in launches for w in _windows(k, n, f)])
        probes = {}
        for ref in sorted((study / "reference").glob("equivalence-*.json")):
            for probe in (_json(ref) or {}).get("probes", []):
                probes[probe.get("name", "")] = probe.get("completion_ids", [])
        if probes:  # the gate's reference: what the model answers greedily (token ids), not its logprobs
            (out / "reference_completions.json").write_text(json.dumps(probes))
        verify = _json(study / "verify" / "verify.json")
        if verify is not None:
            verify.pop("steps", None)
            (out / "verify.json").write_text(scrub(json.dumps(verify, indent=1)))
    for folder in folders:
        for name in ("capacity.json", "machine.txt", "model.json", "dmon.txt"):
            _copy_text(folder / name, out / name)
        if (folder / "prevalidate.txt").is_file():
            lines = [ln for ln in (folder / "prevalidate.txt").read_text(errors="replace").splitlines()
                     if ln.startswith(("[", "vllm importable", "CUDA initialised", "verdict"))]
            (out / "prevalidate.txt").write_text(scrub("\n".join(lines) + "\n"))
    calls = _json(args.calls) if args.calls else None
    (out / "gpu_time.json").write_text(json.dumps({"calls": calls or [], "timeline": _timeline(folders)}, indent=1))
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
