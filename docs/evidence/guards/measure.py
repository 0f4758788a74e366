"""Calibrate the gates where they are used: good pairs and bad pairs, per model, measured by the shipped gates.

    python docs/evidence/guards/measure.py emulated      # the emulated DSV4-Flash gh200x4 node (no lock needed)
    flock /tmp/dsv4-vllm.lock python docs/evidence/guards/measure.py cpu      # real vLLM CPU, trained fixture
    flock /tmp/dsv4-vllm.lock python docs/evidence/guards/measure.py random   # real vLLM CPU, random weights

Each run launches a list of configurations one after the other and puts every one through the shipped
gates (``guards/*.yaml``) with the hardware profile's reference numerics, as a study would: the first
launch records the reference, every later one is compared with it (a speculative launch with its
no-speculation control too). A *good pair* differs from the reference in something that must not
change the answers (a relaunch, another topology, prefix caching, block size, a correct MoE backend);
a *bad pair* in something that does (an FP8 KV cache where the reference is auto; the emulator's trap
configurations). What each launch's gates said and its drift against the reference go to
``<model>.json`` here; ``tables.py`` turns them into the tables of ``docs/guards.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from tuner.engines.process import LaunchSpec, ServerProcess, free_port  # noqa: E402
from tuner.engines.vllm.argv import options_to_argv  # noqa: E402
from tuner.engines.vllm.logs import kv_tokens_from_log  # noqa: E402
from tuner.errors import LaunchError  # noqa: E402
from tuner.guards import GuardTarget, load_suite  # noqa: E402
from tuner.search.profile import load_profile, reference_requires  # noqa: E402
from tuner.search.space import build_config  # noqa: E402

DSV4 = {"tokenizer-mode": "deepseek_v4", "reasoning-parser": "deepseek_v4", "tool-call-parser": "deepseek_v4",
        "enable-auto-tool-choice": True}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


@dataclass(frozen=True)
class Launch:
    name: str
    role: str
    """``reference``, ``good`` (must pass) or ``bad`` (must fail)."""
    differs: str
    args: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    control_of: str | None = None


def _cpu_launches() -> list[Launch]:
    base = {"max-model-len": 2048, "enforce-eager": True, "dtype": "bfloat16", "max-num-seqs": 16,
            "block-size": 128, "kv-cache-dtype": "auto", **DSV4}
    return [
        Launch("reference", "reference", "the CPU profile's baseline numerics (auto KV, bf16)", base),
        Launch("relaunch", "good", "nothing: the same flags, a second launch", base),
        Launch("no-prefix-caching", "good", "prefix caching off", {**base, "enable-prefix-caching": False}),
        Launch("block-32", "good", "block size 32", {**base, "block-size": 32}),
        Launch("seqs-4-mbt-512", "good", "max-num-seqs 4, max-num-batched-tokens 512",
               {**base, "max-num-seqs": 4, "max-num-batched-tokens": 512}),
        Launch("ngram-3", "good", "ngram speculation, 3 tokens (also held to its control, the reference's flags)",
               {**base, "speculative-config": NGRAM}, control_of="reference"),
        Launch("fp8-kv", "bad", "FP8 KV cache (e4m3), where the reference is auto", {**base, "kv-cache-dtype": "fp8"}),
        Launch("fp8-e5m2-kv", "bad", "FP8 e5m2 KV cache", {**base, "kv-cache-dtype": "fp8_e5m2"}),
    ]


def _random_launches() -> list[Launch]:
    base = {"max-model-len": 2048, "enforce-eager": True, "dtype": "bfloat16", "max-num-seqs": 16,
            "block-size": 128, "kv-cache-dtype": "auto"}
    return [
        Launch("reference", "reference", "random weights, auto KV", base),
        Launch("relaunch", "good", "nothing: the same flags, a second launch", base),
        Launch("fp8-kv", "bad", "FP8 KV cache (e4m3), where the reference is auto", {**base, "kv-cache-dtype": "fp8"}),
    ]


def _emulated_launches() -> list[Launch]:
    profile = load_profile("gh200x4")
    values = {b.name: dict(b.values) for b in profile.baselines}

    def launch(name: str, role: str, differs: str, params: dict[str, Any], **override: Any) -> Launch:
        config = build_config(profile, params)
        return Launch(name, role, differs, {**config.args, **override}, dict(config.env))

    return [
        launch("reference", "reference", "recipe baseline blog-tp4: TP4 + EP, FP8 KV, MoE auto", values["blog-tp4"]),
        launch("relaunch", "good", "nothing: the same flags, a second launch", values["blog-tp4"]),
        launch("dp4-ep", "good", "DP4 + EP attention (blog-dp4-ep)", values["blog-dp4-ep"]),
        launch("humming", "good", "DP4 + EP + Humming W4A8 MoE (blog-dp4-ep-humming)", values["blog-dp4-ep-humming"]),
        launch("no-prefix-caching", "good", "TP4 + EP, prefix caching off",
               {**values["blog-tp4"], "enable-prefix-caching": False}),
        launch("trap-humming-deepep-ll", "bad", "Humming + DeepEP low-latency (emulator trap: wrong scales)",
               {**values["blog-dp4-ep-humming"], "all2all-backend": "deepep_low_latency"}),
        launch("trap-kv-fp8-e5m2", "bad", "FP8 e5m2 KV cache (emulator trap)", values["blog-dp4-ep"],
               **{"kv-cache-dtype": "fp8_e5m2"}),
    ]


def _spec(kind: str, launch: Launch, model: str, workdir: Path) -> LaunchSpec:
    port = free_port()
    key = secrets.token_urlsafe(16)
    options = {k: v for k, v in launch.args.items() if k not in ("host", "port")}
    if kind == "emulated":
        argv = [sys.executable, "-m", "tuner.engines.emulated", "serve", model, *options_to_argv(options)]
        env = {**launch.env, "DSV4_EMULATOR_HW": "gh200x4", "DSV4_EMULATOR_TIME_SCALE": "400",
               "DSV4_EMULATOR_STARTUP_TIME_SCALE": "50000", "VLLM_API_KEY": key, "PYTHONPATH": str(REPO)}
        served = model
    else:
        argv = [str(Path(sys.executable).with_name("vllm")), "serve", model, "--served-model-name", "fixture",
                *options_to_argv(options)]
        env = {**launch.env, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": key,
               "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120", "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
        served = "fixture"
    return LaunchSpec(argv=[*argv, "--host", "127.0.0.1", "--port", str(port)], env=env, host="127.0.0.1", port=port,
                      workdir=workdir, ready_timeout_s=300, api_key=key, model_name=served)


def measure(kind: str, launches: Sequence[Launch], model: str, profile: str, guards: list[str]) -> dict[str, Any]:
    suite = load_suite(guards, reference_requires=reference_requires(load_profile(profile)),
                       reference_source=f"hardware profile {profile}")
    rows: list[dict[str, Any]] = []
    keys: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="guard-calibration-") as tmp:
        study = Path(tmp) / "study"
        for i, launch in enumerate(launches):
            tdir = study / "trials" / f"{i:04d}"
            tdir.mkdir(parents=True)
            keys[launch.name] = f"key-{launch.name}"
            (tdir / "config.json").write_text(json.dumps({"key": keys[launch.name]}))
            spec = _spec(kind, launch, model, tdir)
            started = time.monotonic()
            print(f"{launch.name}: launching", flush=True)
            with ServerProcess(spec) as server:
                try:
                    server.wait_ready()
                except LaunchError as exc:
                    rows.append({"name": launch.name, "role": launch.role, "differs": launch.differs,
                                 "launched": False, "reason": str(exc)[:300]})
                    print(f"{launch.name}: did not start ({exc})", flush=True)
                    continue
                speculative = "speculative-config" in launch.args
                report = suite.run(GuardTarget(
                    base_url=server.base_url, headers=server.headers, model=spec.model_name, trial_dir=tdir,
                    study_dir=study, params={}, args=launch.args, is_speculative=speculative,
                    control_key=keys.get(launch.control_of or "") if speculative else None,
                    kv_cache_tokens=kv_tokens_from_log(server.log_path.read_text(errors="replace"))))
            row = {"name": launch.name, "role": launch.role, "differs": launch.differs, "launched": True,
                   "gates": {r.name: r.passed for r in report.results},
                   "failed": {r.name: r.detail[:240] for r in report.results if not r.passed},
                   "seconds": round(time.monotonic() - started, 1)}
            for result in report.results:
                if result.name == "equivalence":
                    for base in ("reference", "control"):
                        drift = result.evidence.get(f"vs_{base}")
                        if drift:
                            row[f"vs_{base}"] = {k: drift[k] for k in ("mean_drift_nats", "max_drift_nats",
                                                                       "scored_tokens", "worst_tie_gap_nats",
                                                                       "outside_top_k")}
                            row[f"vs_{base}"]["greedy_diverged"] = len(drift["greedy_diverged"])
                    row["recorded_reference"] = "recorded_reference" in result.evidence
                if result.name == "needle":
                    row["needle_prompt_tokens"] = [p.get("prompt_tokens") for p in result.evidence.get("probes", [])]
            rows.append(row)
            print(f"{launch.name}: {json.dumps({k: row.get(k) for k in ('gates', 'vs_reference')})}", flush=True)
        shutil.rmtree(study, ignore_errors=True)
    thresholds = suite.guards[-1].spec.thresholds.model_dump() if suite.guards else {}  # type: ignore[union-attr]
    return {"model": model if kind == "emulated" else kind, "profile": profile, "guards": guards,
            "thresholds": thresholds, "launches": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["emulated", "cpu", "random"])
    args = parser.parse_args(argv)
    if args.kind == "emulated":
        doc = measure("emulated", _emulated_launches(), "deepseek-ai/DeepSeek-V4-Flash-0731", "gh200x4",
                      ["tool_call", "reasoning", "needle", "equivalence"])
        doc["model"] = "emulated DeepSeek-V4-Flash-0731 on gh200x4 (tuner/engines/emulated)"
    elif args.kind == "cpu":
        from tuner.demo_model import SHIPPED_DIR, verify_model_dir

        verify_model_dir(SHIPPED_DIR)
        doc = measure("cpu", _cpu_launches(), str(SHIPPED_DIR), "cpu",
                      ["tool_call", "reasoning", "needle", "equivalence"])
        doc["model"] = "trained fixture (the shipped demo model, tuner/demo/) on vLLM-cpu"
    else:
        from tuner.demo_model import build_demo_model

        with tempfile.TemporaryDirectory() as tmp:
            model = build_demo_model(Path(tmp) / "random")
            doc = measure("random", _random_launches(), str(model), "cpu", ["equivalence"])
        doc["model"] = "random-weight base model (tuner.demo_model.build_demo_model) on vLLM-cpu"
    import vllm

    doc["vllm"] = "emulated 0.32" if args.kind == "emulated" else vllm.__version__
    out = HERE / f"{args.kind}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
