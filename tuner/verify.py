"""Serve the exported launch file again and measure it: does ``best/serve.sh`` give what the report says?

``dsv4-tune verify NAME`` starts ``runs/NAME/best/serve.sh`` as it is (only ``--port`` is added, which
the script passes on to the server; the API key travels in the engine's variable as for every trial,
and ``VLLM_CMD`` (``LLAMA_SERVER_CMD`` for llama-server) names the program the study ran, which the script
reads), through the process helper on
the study's server cores. It then measures it with the confirmation's workload: the objective's
workload with ``workload_scale`` × the prompts, at the concurrency the winner's screening ladder chose,
``repeats`` times, each repeat on prompts of its own.

Both numbers are recorded in ``runs/NAME/verify/verify.json`` (and ``best/verify.json``): the figure the
study reported (the confirmed median, or the screening value of an unconfirmed winner), the
confirmation's repeats, and the re-served repeats with their median. The re-served median must come
within the confirmation's spread (max − min of its repeats) of the reported figure, and only an
accepted confirmation lends its spread: a rejected one fails verify outright; an unconfirmed
winner has no spread, and is held to the confirmation's ``max_spread`` share of its value instead.
"""

from __future__ import annotations

import logging
import secrets
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tuner import store
from tuner.engines import LaunchSpec, ServerProcess, choose_port, stop_orphans, tail
from tuner.errors import LaunchError, StudyError
from tuner.load.affinity import pinned
from tuner.load.ladder import Measurement, measure
from tuner.load.power import detect_power_reader
from tuner.objective import Objective
from tuner.study import Study
from tuner.trial import scrape_metrics

__all__ = ["VERIFY_DIR", "reserve_objective", "verify_export"]

log = logging.getLogger(__name__)

VERIFY_DIR = "verify"
SEED_STRIDE = 7_777
"""Each re-served repeat draws its prompts from ``seed + (repeat + 1) × SEED_STRIDE``: never the same twice."""


def reserve_objective(study: Study, screened_concurrency: int | None, repeat: int) -> Objective:
    """The confirmation's workload (scaled prompts, the winner's chosen concurrency), on fresh prompts."""
    objective = study.objective
    spec = study.record.confirm
    workload = objective.workload
    update: dict[str, Any] = {"num_prompts": max(1, round(workload.num_prompts * spec.workload_scale)),
                              "seed": workload.seed + (repeat + 1) * SEED_STRIDE}
    changes: dict[str, Any] = {}
    if screened_concurrency and objective.ladder is not None:
        changes["ladder"] = objective.ladder.model_copy(update={"steps": (int(screened_concurrency),)})
        update["concurrency"] = int(screened_concurrency)
    changes["workload"] = workload.model_copy(update=update)
    return objective.model_copy(update=changes)


def _served_name(best: Path) -> str | None:
    """``served-model-name`` (llama-server: ``alias``) of the exported ``profile.yaml`` (the name requests use)."""
    data = yaml.safe_load((best / "profile.yaml").read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        return None
    name = data.get("served-model-name") or data.get("alias") or data.get("model")
    return str(name) if name else None


def verify_export(study: Study, *, repeats: int | None = None,
                  should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Serve ``best/serve.sh`` once, measure it ``repeats`` times (default: the confirmation's), record both numbers."""
    best = study.path / "best"
    serve_sh = best / "serve.sh"
    identity_path = best / "identity.json"
    if not serve_sh.is_file() or not identity_path.is_file():
        raise StudyError(f"{best} has no serve.sh/identity.json. Fix: `dsv4-tune export {study.record.name}` first")
    identity = store.read_json(identity_path)
    if identity.get("disaggregation"):
        raise StudyError(f"{best} is a prefill/decode layout ({identity['disaggregation'].get('layout')}): verify "
                         "serves one server's launch file and cannot serve a layout yet (issue 27). Fix: start "
                         "best/serve.sh (every member and the router) and measure it with the study's objective")
    ostudy = study.optuna_study()
    winner = study.winner(ostudy)
    if winner is None or winner.trial != identity.get("trial"):
        raise StudyError(f"{identity_path} is for trial {identity.get('trial')}, but the study's winner is "
                         f"{None if winner is None else winner.trial}. Fix: `dsv4-tune export {study.record.name}` "
                         "again, then verify")
    screened = ostudy.trials[winner.trial]
    chosen_c = (winner.confirmation.concurrency if winner.confirmation and winner.confirmation.concurrency
                else screened.user_attrs.get("max_concurrency"))  # where the winner was confirmed
    repeats = repeats or study.record.confirm.repeats
    out_dir = study.path / VERIFY_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    stopped = stop_orphans(out_dir, markers=(study.engine.name,))
    if stopped:
        log.warning("stopped %d server(s) an earlier verify left running", len(stopped))

    ctx = study.context()
    port = choose_port(ctx.host, study.record.port)
    api_key = ctx.api_key or secrets.token_urlsafe(24)
    served = _served_name(best) or ctx.served_model_name
    server_cmd = " ".join(ctx.server_cmd)  # serve.sh splits it on blanks (read -a), as export writes it
    argv = [str(serve_sh), "--port", str(port)]
    env = {study.engine.api_key_env: api_key, study.engine.command_env: server_cmd}
    split = ctx.cpu_split
    spec = LaunchSpec(argv=argv, env=env, host=ctx.host, port=port, workdir=out_dir,
                      ready_timeout_s=ctx.ready_timeout_s, api_key=api_key, model_name=served,
                      cpus=split.server if split else None, engine=study.engine)
    power = detect_power_reader()
    record: dict[str, Any] = {
        "study": study.record.name, "trial": winner.trial, "serve_sh": str(serve_sh.relative_to(study.path)),
        "argv": [str(Path(argv[0]).relative_to(study.path)), *argv[1:]], "server_cmd": server_cmd,
        "metric": study.objective.metric, "direction": study.objective.direction,
        "concurrency": chosen_c, "repeats_asked": repeats,
        "reported": {"value": winner.value, "confirmed": winner.confirmed,
                     "confirmation_values": list(winner.confirmation.values) if winner.confirmation else [],
                     "confirmation_accepted": winner.confirmation.accepted if winner.confirmation else None,
                     "screening_value": screened.value},
        "power": power.name if power is not None else None,
    }
    started = time.monotonic()
    runs: list[Measurement] = []
    with pinned(split.client if split else None), ServerProcess(spec) as server:
        try:
            record["ready_s"] = round(server.wait_ready(should_stop=should_stop), 2)
        except LaunchError as exc:
            record.update({"ok": False, "failure_class": exc.failure_class, "reason": str(exc),
                           "log_tail": (exc.log_tail or tail(server.log_path))[-4000:]})
            return _finish(study, record, out_dir)
        for index in range(repeats):
            run = measure(server.base_url, served, reserve_objective(study, chosen_c, index), vocab_size=ctx.vocab_size,
                          api_key=api_key, should_stop=should_stop or (lambda: False),
                          scrape=lambda: scrape_metrics(server, study.engine.metrics_path),
                          server_metrics=study.engine.metrics, power=power)
            runs.append(run)
            log.info("verify: repeat %d/%d: %s = %s", index + 1, repeats, study.objective.metric,
                     run.summary.get(study.objective.metric))
            if run.stopped:
                break
    record["duration_s"] = round(time.monotonic() - started, 2)
    record["repeats"] = [{k: r.summary.get(k) for k in _KEEP if k in r.summary} for r in runs]
    record["steps"] = [r.to_json() | {"steps": [s.to_json(with_requests=False) for s in r.steps]} for r in runs]
    values = [float(r.summary.get(study.objective.metric, float("nan"))) for r in runs if not r.stopped]
    record["ok"] = bool(values) and len(values) == repeats
    record.update(judge_reserve(values, record["reported"], study.record.confirm.max_spread))
    return _finish(study, record, out_dir)


_KEEP = ("output_throughput", "request_throughput", "p95_ttft_ms", "p95_itl_ms", "median_itl_ms", "completed",
         "failed", "duration", "max_concurrency", "total_output_tokens", "tokens_per_joule", "usd_per_mtok",
         "gpu_power_mean_w", "gpu_energy_j")


def judge_reserve(values: list[float], reported: dict[str, Any], max_spread: float) -> dict[str, Any]:
    """Is the re-served median within the confirmation's spread of the reported figure?"""
    if not values:
        return {"values": [], "median": None, "within": False, "allowed": None, "delta": None,
                "verdict": "no measurement of the re-served launch"}
    median = statistics.median(values)
    reported_value = float(reported["value"])
    conf = [float(v) for v in reported.get("confirmation_values") or []]
    if reported.get("confirmation_accepted") is False:  # its spread is why it was rejected: no tolerance to lend
        return {"values": values, "median": median, "within": False, "allowed": None,
                "delta": median - reported_value, "allowed_basis": "none (the confirmation was rejected)",
                "verdict": f"re-served median {median:.2f} vs reported {reported_value:.2f}: the confirmation "
                           f"was rejected (repeats {conf}), so the reported figure cannot be verified: FAILED"}
    if len(conf) >= 2:
        allowed, basis = max(conf) - min(conf), "the confirmation's spread (max - min of its repeats)"
    else:
        allowed = max_spread * abs(reported_value)
        basis = f"{max_spread:.0%} of the reported value (no confirmation spread)"
    delta = median - reported_value
    within = abs(delta) <= allowed
    verdict = (f"re-served median {median:.2f} vs reported {reported_value:.2f}: off by {delta:+.2f} "
               f"({delta / reported_value:+.1%}); allowed {allowed:.2f}, {basis}: "
               + ("within" if within else "OUTSIDE"))
    return {"values": values, "median": median, "within": within, "allowed": allowed, "delta": delta,
            "delta_rel": delta / reported_value if reported_value else None, "allowed_basis": basis,
            "verdict": verdict}


def _finish(study: Study, record: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    store.write_json(out_dir / "verify.json", record)
    best = study.path / "best"
    if best.is_dir():
        store.write_json(best / "verify.json", {k: v for k, v in record.items() if k != "steps"})
    return record
