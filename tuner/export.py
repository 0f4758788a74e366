"""Export the best feasible trial as launch files: ``runs/<study>/best/``.

    profile.yaml    the winner's options (for vLLM: ``vllm serve --config profile.yaml``)
    serve.sh        starts it, with the environment the winner needs (no secrets); for llama-server, whose
                    program reads no config file, with the flags spelled out
    identity.json   the serving identity and the figures behind the choice (weight files by sha256 where the
                    engine names them: a GGUF target and its draft)
    evidence/       the winning trial's records (config, command, outcome, load summary, metrics)

A prefill/decode winner (issue 27) is several servers and a router: ``members/<member>.yaml`` holds each
member's options (its ``--kv-transfer-config`` included), ``members/<member>.sh`` starts it on its GPUs,
``router.sh`` starts the router in front of them, and ``serve.sh`` starts them all and stops them all
together; there is no single ``profile.yaml``.

A trial that failed a gate, crashed or missed an SLO is never exported. A winner that was not
confirmed is exported only with ``accept_unconfirmed`` (``--accept-unconfirmed``), or when the study
turned confirmation off; it is then labelled in every file, and a rejected confirmation's repeats are
written into ``identity.json``, ``serve.sh`` and ``profile.yaml``, never dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from tuner import store
from tuner.backends.node import runtime_identity
from tuner.errors import NoFeasibleTrialError, StudyError, UnconfirmedWinnerError
from tuner.objective import constraint_names
from tuner.study import Confirmation, Study, Winner, resolve_model
from tuner.study.reader import StudyReading, read_study

EXPORT_PORT = 8000
EVIDENCE_FILES = ("config.json", "command.json", "outcome.json", "load.json", "server_metrics.json",
                  "guards.json")


def model_identity(model: str) -> dict[str, Any]:
    """A local model folder is named by a hash of its config and weights index; a hub id by itself."""
    path = Path(model)
    if not path.exists():
        return {"id": model, "source": "hub", "revision": None}
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors.index.json"):
        with contextlib.suppress(OSError):
            digest.update((path / name).read_bytes())
    config: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((path / "config.json").read_text())
    return {"id": path.name, "source": "local", "config_sha256": digest.hexdigest()[:16],
            "architectures": config.get("architectures"), "model_type": config.get("model_type")}


def model_files(paths: list[str]) -> list[dict[str, Any]]:
    """Each weight file a launch reads (the engine's ``model_files``: GGUF target and draft), by sha256."""
    out: list[dict[str, Any]] = []
    for name in paths:
        path = Path(name)
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out.append({"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()})
    return out


def serve_script(study_name: str, trial_number: int, headline: str, env: dict[str, str], server_cmd: str, *,
                 command_env: str, serve_command: str) -> str:
    """``serve.sh``: the environment the winner needs (no secrets), the program from ``$command_env`` (the
    study's by default), and the engine's ``serve_command`` (``Engine.command_env``, ``Engine.serve_command``:
    no engine's names are this module's)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# dsv4-tune export: study {study_name}, trial {trial_number}",
        *(f"# {line}" for line in headline.splitlines()),
        "# Secrets (HF_TOKEN, VLLM_API_KEY, LLAMA_API_KEY, ...) are taken from your environment; none is written here.",
        "# Extra server flags may follow: ./serve.sh --port 9000",
        "set -euo pipefail",
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
    ]
    for key, value in sorted(env.items()):
        if store.SECRET_NAME.search(key):
            continue
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append(f"{command_env}=${{{command_env}:-{shlex.quote(server_cmd)}}}")
    lines.append(f'read -r -a server_argv <<< "${command_env}"')
    lines.append(serve_command)
    return "\n".join(lines) + "\n"


def headline(study_obj: Study, winner: Winner) -> str:
    """The lines every exported file starts with: the value, how far it is confirmed, and every rejection."""
    metric = study_obj.objective.metric
    lines = [f"{metric} = {winner.value:.2f} on workload {study_obj.objective.name!r}, "
             f"SLOs {study_obj.objective.slos}",
             winner.describe(metric)]
    units = study_obj.engine.units
    if study_obj.record.rehearsal or not units.identity:
        label = "REHEARSAL" if study_obj.record.rehearsal else "EMULATED"
        lines.insert(0, f"{label}: served by {study_obj.engine.title} ({study_obj.engine.name}), time scale "
                     f"{units.time_scale:g}, multiplicity {units.multiplicity}; every figure is the emulator's "
                     "prediction in node units, not a measurement of a node")
    for c in winner.rejected:
        if c is winner.confirmation:
            continue
        label = f"trial {c.trial}" + (f" (control of trial {c.control_of})" if c.control_of is not None else "")
        repeats = " / ".join(f"{v:.1f}" for v in c.values) or "none measured"
        lines.append(f"also REJECTED in confirmation: {label}: repeats {repeats} ({c.reason})")
    if not winner.confirmed and not winner.confirmation_off:
        lines.append("exported with --accept-unconfirmed: no candidate was confirmed")
    return "\n".join(lines)


def export_best(study_obj: Study, *, out_dir: Path | None = None, accept_unconfirmed: bool = False) -> Path:
    """Write the launch files of the winner; return the folder.

    The winner is the best confirmed candidate. When none was confirmed this raises
    :class:`UnconfirmedWinnerError`, unless ``accept_unconfirmed`` (or the study turned confirmation
    off): then the best screening trial is written, labelled, with every rejected confirmation's repeats.
    """
    reading = read_study(study_obj)
    winner = reading.winner
    if winner is None:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(reading.failure_counts().items())) or "no trials yet"
        raise NoFeasibleTrialError(
            f"study {study_obj.record.name!r} has no trial that passed its gates and met its SLOs "
            f"({counts}). Fix: look at trials.csv and the trials' outcome.json; relax --slo limits or "
            "run more trials")
    if not winner.exportable_without_consent and not accept_unconfirmed:
        raise UnconfirmedWinnerError(winner.refusal(study_obj.record.name, study_obj.objective.metric))
    tdir = winner.trial_dir
    config_path = tdir / "config.json"
    if not config_path.is_file():
        raise StudyError(f"trial {winner.trial} has no {config_path}; its folder was removed. Fix: re-run it")
    guards_path = tdir / "guards.json"
    if guards_path.is_file() and not store.read_json(guards_path).get("passed", False):
        raise StudyError(f"refusing to export {tdir}: it failed a correctness gate ({guards_path})")
    config = store.read_json(config_path)
    outcome = store.read_json(tdir / "outcome.json")
    command = store.read_json(tdir / "command.json")
    ctx_model = resolve_model(study_obj.record.model, study_obj.runs_dir)
    served = Path(ctx_model).name if Path(ctx_model).exists() else ctx_model
    options = study_obj.engine.serve_options(ctx_model, config["args"], host=study_obj.profile.server.host,
                                             port=EXPORT_PORT, served_model_name=served)
    final_dir = out_dir or study_obj.path / "best"
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    # Write into a staging folder and swap it in at the end: an interrupt (SIGINT/SIGTERM) or a full
    # disk mid-export leaves the previous export whole, never files of two different winners.
    best_dir = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.staging-"))
    try:
        head = headline(study_obj, winner)
        header = (f"# dsv4-tune export: study {study_obj.record.name}, trial {winner.trial}\n"
                  + "".join(f"# {line}\n" for line in head.splitlines()))
        env = {k: v for k, v in command.get("env", {}).items() if k != study_obj.engine.api_key_env}
        engine = study_obj.engine
        if config.get("disaggregation"):
            _write_pools(best_dir, study_obj, config["disaggregation"], header, head, env, ctx_model, served)
        else:
            store.write_text(best_dir / "profile.yaml", header + yaml.safe_dump(options, sort_keys=False))
            store.write_text(best_dir / "serve.sh",
                             serve_script(study_obj.record.name, winner.trial, head, env, study_obj.record.server_cmd,
                                          command_env=engine.command_env, serve_command=engine.serve_command(options)),
                             mode=0o755)
        identity = _identity(study_obj, reading, winner.trial, winner.value, options, outcome, ctx_model)
        if config.get("disaggregation"):
            identity["disaggregation"] = config["disaggregation"]
        identity["confirmed"] = winner.confirmed
        identity["confirmation_status"] = winner.status
        identity["confirmation"] = winner.confirmation.to_json() if winner.confirmation else None
        identity["rejected_confirmations"] = [c.to_json() for c in winner.rejected]
        identity["accepted_unconfirmed"] = not winner.confirmed and not winner.confirmation_off
        if winner.control_status is not None:
            identity["control_confirmation_status"] = winner.control_status
        store.write_json(best_dir / "identity.json", identity)
        evidence = best_dir / "evidence"
        evidence.mkdir(exist_ok=True)
        for name in EVIDENCE_FILES:
            if (tdir / name).is_file():
                shutil.copyfile(tdir / name, evidence / name)
        store.write_json(evidence / "confirmations.json", [c.to_json() for c in winner.all_confirmations])
        comparison = control_comparison(study_obj, winner.all_confirmations)
        if comparison:
            store.write_json(evidence / "control_comparison.json", comparison)
        _swap_in(best_dir, final_dir)
    except BaseException:
        shutil.rmtree(best_dir, ignore_errors=True)
        raise
    best_dir = final_dir
    study_obj.write_trials_table()
    return best_dir


MEMBER_PORT = {"prefill": 8100, "decode": 8200}
"""The exported members' ports: prefill-0 on 8100, decode-0 on 8200, ... (the router on :data:`EXPORT_PORT`)."""


def _write_pools(best_dir: Path, study_obj: Study, launch: dict[str, Any], header: str, head: str,
                 env: dict[str, str], model: str, served: str) -> None:
    """A prefill/decode winner's launch files: one per member, the router's, and ``serve.sh`` for them all."""
    from tuner.engines.group import router_argv
    from tuner.search.pools import Disaggregated, PoolMember, kv_transfer_config

    members = tuple(PoolMember(role=m["role"], index=m["index"], args=m["args"], gpus=tuple(m["gpus"]))
                    for m in launch["members"])
    pools = Disaggregated(layout=launch["layout"], connector=launch["connector"],
                          connector_config=launch.get("connector_config") or {}, router=launch["router"],
                          members=members, pool_topologies=launch.get("pools") or {})
    host = study_obj.profile.server.host
    folder = best_dir / "members"
    folder.mkdir(exist_ok=True)
    urls: dict[str, str] = {}
    scripts: list[str] = []
    for member in members:
        port = MEMBER_PORT[member.role] + member.index
        urls[member.name] = f"http://{host}:{port}"
        extra = {"shared_storage_path": "./kv-shared"} if pools.connector == "ExampleConnector" else {}
        args = {**member.args, "kv-transfer-config": kv_transfer_config(pools, member, extra)}
        options = study_obj.engine.serve_options(model, args, host=host, port=port, served_model_name=served)
        store.write_text(folder / f"{member.name}.yaml", header + f"# {member.name} of {pools.describe()}\n"
                         + yaml.safe_dump(options, sort_keys=False))
        member_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in member.gpus)}
        if pools.connector.startswith("Nixl"):
            member_env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(5600 + len(scripts))
        script = serve_script(study_obj.record.name, 0, head, member_env, study_obj.record.server_cmd,
                              command_env=study_obj.engine.command_env,
                              serve_command=study_obj.engine.serve_command(options))
        script = script.replace('"$here/profile.yaml"', f'"$here/{member.name}.yaml"')
        store.write_text(folder / f"{member.name}.sh", script, mode=0o755)
        scripts.append(f"members/{member.name}.sh")
    argv = router_argv(pools.router, pools, urls, host=host, port=EXPORT_PORT, metrics_port=EXPORT_PORT + 1000)
    argv[0] = shlex.split(pools.router)[0]  # the program by name, found on the serving host's PATH
    router = ["#!/usr/bin/env bash", f"# dsv4-tune export: the router in front of {pools.describe()}",
              *(f"# {line}" for line in head.splitlines()), "set -euo pipefail",
              "exec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"']
    store.write_text(best_dir / "router.sh", "\n".join(router) + "\n", mode=0o755)
    serve = ["#!/usr/bin/env bash", f"# dsv4-tune export: study {study_obj.record.name}, {pools.describe()}",
             *(f"# {line}" for line in head.splitlines()),
             "# Starts every member, then the router on port " + str(EXPORT_PORT) + "; Ctrl-C stops them all.",
             "set -euo pipefail", 'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"', "pids=()",
             'trap \'kill -TERM "${pids[@]}" 2>/dev/null; wait\' EXIT INT TERM']
    serve += [f'"$here/{script}" & pids+=($!)' for script in scripts]
    serve += ['"$here/router.sh" "$@" & pids+=($!)', "wait -n", ""]
    store.write_text(best_dir / "serve.sh", "\n".join(serve), mode=0o755)


def _swap_in(staging: Path, final: Path) -> None:
    """Replace ``final`` by ``staging`` with two renames (the old export is removed only afterwards)."""
    os.chmod(staging, 0o755)  # noqa: S103 - as mkdir would: an export is read by others
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def control_comparison(study_obj: Study, confirmations: tuple[Confirmation, ...]) -> list[dict[str, Any]]:
    """Each speculative candidate beside its no-speculation control, with acceptance from /metrics."""
    rows: list[dict[str, Any]] = []
    # A candidate confirmed again one step down (tuner.study.confirm) has two verdicts: the last one stands.
    latest = {(c.trial, c.control_of): c for c in confirmations}
    for control in (c for c in latest.values() if c.control_of is not None):
        spec = next((c for c in latest.values() if c.trial == control.control_of and c.speculative), None)
        if spec is None:
            continue
        metrics_path = study_obj.path / spec.trial_dir / "server_metrics.json"
        acceptance = store.read_json(metrics_path).get("spec_decode") if metrics_path.is_file() else None
        gain = spec.median / control.median if control.median and spec.accepted and control.accepted else None
        rows.append({"speculative": spec.to_json(), "control": control.to_json(), "speculative_gain": gain,
                     "acceptance": acceptance,
                     "winner": "speculative" if gain is not None and spec.robust > control.robust else "control"})
    return rows


def _identity(study_obj: Study, reading: StudyReading, trial: int, value: float, options: dict[str, Any],
              outcome: dict[str, Any], model: str) -> dict[str, Any]:
    args = options
    profile = study_obj.profile
    return {
        "study": study_obj.record.name,
        "trial": trial,
        "objective": {"name": study_obj.objective.name, "metric": study_obj.objective.metric,
                      "direction": study_obj.objective.direction, "value": value,
                      "slos": study_obj.objective.slos,
                      "max_failed_fraction": study_obj.objective.max_failed_fraction},
        "workload": json.loads(study_obj.objective.workload.model_dump_json()),
        "checkpoint": {**model_identity(model),
                       **({"catalog": study_obj.checkpoint.model_dump(mode="json")} if study_obj.checkpoint else {})},
        "draft": args.get("speculative-config"),
        "model_files": model_files(study_obj.engine.model_files(options)),
        "hardware_profile": {"name": profile.name, **profile.hardware.model_dump()},
        "topology": {"tensor_parallel_size": args.get("tensor-parallel-size", 1),
                     "data_parallel_size": args.get("data-parallel-size", 1),
                     "expert_parallel": bool(args.get("enable-expert-parallel", False))},
        # vLLM's option names, else llama-server's (K and V cache types apart, the context it allocates)
        "kv_cache_dtype": args.get("kv-cache-dtype") or (
            f"{args.get('cache-type-k', 'f16')}/{args.get('cache-type-v', 'f16')}" if "ctx-size" in args else "auto"),
        "context": args.get("max-model-len") or args.get("ctx-size"),
        "runtime": {**runtime_identity(), "server_version": outcome.get("server_metrics", {}).get("server_version")},
        "engine": {"name": study_obj.engine.name, "title": study_obj.engine.title,
                   "units": study_obj.engine.units.to_json(), "rehearsal": study_obj.record.rehearsal},
        "measured": {k: outcome.get("summary", {}).get(k) for k in (
            "output_throughput", "request_throughput", "p50_ttft_ms", "p95_ttft_ms", "p95_itl_ms",
            "p95_tpot_ms", "completed", "failed")},
        "constraints": dict(zip(constraint_names(study_obj.objective), outcome.get("constraints", []),
                                strict=False)),
        "guards": study_obj.guard_names(),
        "host": {"preflight_mismatches": list(study_obj.record.preflight_mismatches),
                 "learned_constraints": [asdict(c) for c in study_obj.learned_constraints()]},
        "search": {"trials": len(reading.trials), "sampler": reading.sampler,
                   "seed": study_obj.record.seed},
    }

