"""Pre-launch refusals: vLLM's own parser and the feasibility model stop a launch before it costs time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.engines.vllm.validate import vllm_available
from tuner.objective import load_objective
from tuner.search.checkpoints import load_checkpoint
from tuner.search.prelaunch import PreLaunch
from tuner.search.profile import bind_checkpoint, load_profile
from tuner.search.space import RandomParams, build_config, suggest
from tuner.trial import TrialContext


def _ctx(model: str) -> TrialContext:
    return TrialContext(server_cmd=["vllm"], model=model, objective=load_objective("throughput"))


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not importable here")
def test_vllm_parser_refuses_a_bad_flag_before_launch(demo_model: Path) -> None:
    profile = load_profile("cpu")
    pre = PreLaunch(profile, None, load_objective("throughput"), "on")
    good = build_config(profile, {"max-num-seqs": 8, "kv-cache-dtype": "auto", "max-num-batched-tokens": 2048})
    assert pre.check(good, _ctx(str(demo_model))) is None
    bad = build_config(profile, {"max-num-seqs": 8, "kv-cache-dtype": "fp9_not_a_dtype"})
    refusal = pre.check(bad, _ctx(str(demo_model)))
    assert refusal is not None and refusal.failure_class == "bad_flag"
    assert "fp9_not_a_dtype" in refusal.reason and "before launch" in refusal.reason


def test_feasibility_model_refuses_what_cannot_fit() -> None:
    checkpoint = load_checkpoint("0731")
    profile = bind_checkpoint(load_profile("gh200x4"), checkpoint)
    objective = load_objective("throughput")
    pre = PreLaunch(profile, checkpoint, objective, "off")
    verdicts = [pre.check(suggest(profile, RandomParams(seed)), _ctx(checkpoint.repo)) for seed in range(100)]
    refused = [v for v in verdicts if v is not None]
    assert refused, "no sampled gh200x4 configuration was refused; the model prunes nothing"
    assert len(refused) < len(verdicts), "every configuration was refused"
    assert all(v.failure_class == "infeasible" and "feasibility model" in v.reason for v in refused)


def test_prevalidate_on_without_vllm_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.engines.vllm.validate as validate
    from tuner.errors import UsageError

    monkeypatch.setattr(validate, "vllm_available", lambda: False)
    with pytest.raises(UsageError, match="--prevalidate"):
        PreLaunch(load_profile("cpu"), None, load_objective("throughput"), "on")
    assert PreLaunch(load_profile("cpu"), None, load_objective("throughput"), "auto").validate is False
