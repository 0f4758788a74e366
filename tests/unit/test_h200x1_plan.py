"""The 1x H200 study's plan, checked here: its profile and objective, the budget planner's cold first
launch, and screening now / confirming later with ``resume --confirm-top-k``.

The GPU run (scripts/gpu/, issue 16) has 19 minutes for 8 launches, a confirmation and a re-serve, so
what decides how many trials fit is tested on this machine: every configuration the profile can draw
passes vLLM's own parser (the CPU build's, 0.32; the machine's 0.26 is probed there), the speculative
baseline's control is the defaults baseline (no extra launch), the ladder's top step needs more KV
than one H200 holds at the profile's utilizations, and the planner does not hold a cold first launch's
margin before every later trial.
"""

from __future__ import annotations

import importlib
import time
import zlib
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.engines.vllm import VllmEngine
from tuner.objective import load_objective
from tuner.search.profile import load_profile
from tuner.search.space import RandomParams, build_config, suggest
from tuner.study.ranking import time_for_another

REPO = Path(__file__).resolve().parents[2]
OBJECTIVE = REPO / "scripts" / "gpu" / "throughput-h200x1.yaml"
H200_GIB = 143_771 / 1024          # nvidia-smi's memory.total on the machine, MiB → GiB
KV_BYTES_PER_TOKEN = 12 * 2 * 16 * 128 * 2   # make_tiny_moe.py --preset h200x1: layers × K,V × heads × dim × bf16


def test_profile_baselines_start_from_vllm_defaults_and_share_a_control() -> None:
    profile = load_profile("h200x1-tiny")
    names = [b.name for b in profile.baselines]
    assert names[0] == "vllm-defaults"
    configs = {b.name: build_config(profile, b.values) for b in profile.baselines}
    assert configs["ngram-3"].is_speculative
    # the speculative baseline's control IS the defaults baseline: no extra launch for it
    assert configs["ngram-3"].control().key() == configs["vllm-defaults"].key()
    assert configs["eager"].args["enforce-eager"] is True and "cudagraph_mode" not in configs["eager"].args.get(
        "compilation-config", {})
    assert configs["fp8-kv"].args["kv-cache-dtype"] == "fp8"
    for config in configs.values():  # multicast stays off in every server's own environment
        assert config.env["NCCL_NVLS_ENABLE"] == "0" and config.env["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"


def test_every_drawn_configuration_passes_vllms_parser() -> None:
    pytest.importorskip("vllm", reason="vLLM is not importable here")
    from tuner.engines.vllm.validate import validate_options

    profile = load_profile("h200x1-tiny")
    engine = VllmEngine()
    source = RandomParams(zlib.crc32(b"h200x1-tiny"))
    seen = 0
    for _ in range(30):
        config = suggest(profile, source)
        for args in (config.args, config.control().args):
            options = engine.serve_options("some/hub-model", args, host="127.0.0.1", port=8000)
            assert validate_options(options) == [], args
            seen += 1
    assert seen == 60


def test_the_ladders_top_step_needs_more_kv_than_the_gpu_holds() -> None:
    objective = load_objective(str(OBJECTIVE))
    profile = load_profile("h200x1-tiny")
    assert objective.ladder is not None and objective.ladder.steps is not None
    top = max(objective.ladder.steps)
    tokens_per_request = objective.workload.input_len + objective.workload.output_len
    needed = top * tokens_per_request * KV_BYTES_PER_TOKEN / 2**30
    weights_gib = 1.4
    for util in profile.levers["gpu-memory-utilization"].choices or []:
        kv_gib = float(util) * H200_GIB - weights_gib   # an upper bound on the KV cache vLLM can allocate
        assert needed > kv_gib, f"the top step never fills util {util}: {needed:.0f} GiB <= {kv_gib:.0f} GiB"
    lowest = min(float(u) for u in profile.levers["gpu-memory-utilization"].choices or [])
    middle = sorted(objective.ladder.steps)[-2]
    assert middle * tokens_per_request * KV_BYTES_PER_TOKEN / 2**30 > lowest * H200_GIB - weights_gib


def _study_with_durations(durations: list[float]) -> optuna.Study:
    study = optuna.create_study(direction="maximize")
    for number, seconds in enumerate(durations):
        trial = study.ask()
        trial.set_user_attr("duration_s", seconds)
        trial.set_user_attr("trial_dir", f"trials/{number:04d}")
        study.tell(trial, 1.0)
    return study


def test_the_budget_planner_does_not_count_the_cold_first_launch() -> None:
    # measured shape: the first launch fills the caches (130 s), later ones take about 90 s
    study = _study_with_durations([130.0, 88.0, 92.0])
    deadline = time.time() + 110.0
    assert time_for_another(study, deadline, first_estimate_s=75.0)
    assert not time_for_another(_study_with_durations([130.0]), deadline, first_estimate_s=75.0)
    # a later slow trial still counts in full: a trial that overruns is worse than one fewer
    assert not time_for_another(_study_with_durations([130.0, 88.0, 125.0]), deadline, first_estimate_s=75.0)


def test_resume_can_turn_confirmation_on_after_screening(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.study import ConfirmSpec, Study, StudyRecord

    cli = importlib.import_module("tuner.cli.main")  # the module: the package's ``main`` is the function

    record = StudyRecord(name="screen-then-confirm", hw="cpu", objective="throughput", model="demo", trials=2,
                         confirm=ConfirmSpec(top_k=0, repeats=3, workload_scale=1.5))
    Study.create(record, tmp_path)
    seen: list[Any] = []
    monkeypatch.setattr(cli, "_run_study", lambda study, args: seen.append(study.record) or 0)
    assert cli.main(["resume", record.name, "--runs-dir", str(tmp_path), "--confirm-top-k", "1",
                     "--confirm-repeats", "2"]) == 0
    assert seen[0].confirm == ConfirmSpec(top_k=1, repeats=2, workload_scale=1.5)
    assert cli.main(["resume", record.name, "--runs-dir", str(tmp_path)]) == 0
    assert seen[1].confirm == record.confirm  # nothing asked: the record's own settings


def test_a_speculative_trial_with_a_new_control_needs_time_for_two_launches() -> None:
    # the one-H100 study (docs/evidence/h100.md): about 80 s a warm launch, 100 s left before the reserve
    study = _study_with_durations([100.0, 80.0, 78.0])
    deadline = time.time() + 100.0
    assert time_for_another(study, deadline, first_estimate_s=75.0)
    assert not time_for_another(study, deadline, first_estimate_s=75.0, launches=2)
    assert time_for_another(study, time.time() + 170.0, first_estimate_s=75.0, launches=2)


def test_a_round_puts_back_a_speculative_trial_whose_pair_does_not_fit(tmp_path: Path) -> None:
    from tests.conftest import synthetic_record
    from tuner.study import Study

    study = Study.create(synthetic_record(tmp_path, name="pair", trials=2), tmp_path / "runs")
    ostudy = study.optuna_study()
    rnd = study.round(ostudy, study.context())
    ostudy.enqueue_trial({"speculative.draft_tokens": 2})
    opening = rnd.open(rnd.propose(), room=lambda launches: launches < 2)  # one launch fits, not two
    assert opening.status == "no_room" and opening.control is None
    held = ostudy.trials[opening.proposal.number]
    assert held.state == optuna.trial.TrialState.FAIL and held.user_attrs["interrupted"]  # resume asks it again
    assert len(ostudy.trials) == 1  # its control was never asked
    ostudy.enqueue_trial({"speculative.draft_tokens": 2})
    opening = rnd.open(rnd.propose(), room=lambda launches: True)
    assert opening.status == "go" and opening.control is not None
    assert opening.control.config.params["speculative.draft_tokens"] == 0
    assert opening.control.trial.user_attrs["control_for"] == opening.proposal.key
