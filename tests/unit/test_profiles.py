"""Hardware profiles and the checkpoint catalog: every shipped file loads, bad files name their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import CatalogError, UnknownNameError
from tuner.search.checkpoints import load_catalog, load_checkpoint
from tuner.search.profile import CAPTURE_OPTION, DRAFT_TOKENS_PARAM, bind_checkpoint, load_profile, parse_topology
from tuner.search.space import FixedParams, RandomParams, capture_size_for, suggest

GPU_PROFILES = ["h100x8", "h200x8", "gh200x4", "b200x8", "gb300x4", "rtxpro6000x8", "mi325x1"]
ALL_PROFILES = ["cpu", *GPU_PROFILES]
CHECKPOINTS = ["0731", "preview", "w4a16-fp8-mtp", "nvfp4-fp8"]


@pytest.mark.parametrize("name", ALL_PROFILES)
def test_shipped_profile_loads(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    for shape in profile.topologies():
        assert profile.hardware.accelerator == "cpu" or shape.world == profile.hardware.device_count


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_gpu_profiles_have_baselines_and_timing(name: str) -> None:
    profile = load_profile(name)
    assert profile.baselines
    assert profile.server.expected_launch_s >= 600
    assert profile.server.checkpoint == "0731"


def test_checkpoint_catalog() -> None:
    cat = load_catalog()
    assert sorted(cat.checkpoints) == sorted(CHECKPOINTS)
    assert load_checkpoint("0731").draft_method == "dspark"
    assert load_checkpoint("preview").draft_method == "mtp"
    assert load_checkpoint("w4a16-fp8-mtp").size_gb == 159
    assert load_checkpoint("nvfp4-fp8").draft_method is None
    for ckpt in cat.checkpoints.values():
        assert 155 <= ckpt.size_gb <= 170
        assert 15 < ckpt.non_expert_gb < 25
    with pytest.raises(UnknownNameError):
        load_checkpoint("v5")


@pytest.mark.parametrize(("text", "tp", "dp", "ep"), [
    ("tp4", 4, 1, False), ("dp4-ep", 1, 4, True), ("tp2-dp2-ep", 2, 2, True), ("tp1", 1, 1, False)])
def test_parse_topology(text: str, tp: int, dp: int, ep: bool) -> None:
    shape = parse_topology(text)
    assert (shape.tp, shape.dp, shape.ep) == (tp, dp, ep)
    assert parse_topology(shape.name) == shape


@pytest.mark.parametrize("text", ["tp", "tp2-tp2", "ep-ep", "pp2", "tp0"])
def test_parse_topology_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_topology(text)


def test_topology_becomes_flags_and_drives_when() -> None:
    profile = load_profile("h200x8")
    dp = suggest(profile, FixedParams({"topology": "dp8-ep"}))
    assert dp.args["data-parallel-size"] == 8 and dp.args["enable-expert-parallel"] is True
    assert "all2all-backend" in dp.args
    tp = suggest(profile, FixedParams({"topology": "tp8"}))
    assert tp.args["tensor-parallel-size"] == 8 and "enable-expert-parallel" not in tp.args
    assert "all2all-backend" not in tp.args and "enable-eplb" not in tp.args


def test_checkpoint_picks_the_draft_method() -> None:
    raw = load_profile("gh200x4")
    dspark = bind_checkpoint(raw, load_checkpoint("0731"))
    mtp = bind_checkpoint(raw, load_checkpoint("preview"))
    none = bind_checkpoint(raw, load_checkpoint("nvfp4-fp8"))
    assert dspark.speculative is not None and dspark.speculative.method == "dspark"
    assert mtp.speculative is not None and mtp.speculative.method == "mtp"
    assert mtp.speculative.draft_tokens.choices == [0, 1]
    assert none.speculative is None and DRAFT_TOKENS_PARAM not in none.param_names()
    assert dspark.server.model == "deepseek-ai/DeepSeek-V4-Flash-0731"
    config = suggest(mtp, FixedParams({DRAFT_TOKENS_PARAM: 1}))
    assert config.args["speculative-config"]["method"] == "mtp"


def test_checkpoint_only_baselines_are_dropped() -> None:
    raw = load_profile("h200x8")
    names_0731 = {b.name for b in bind_checkpoint(raw, load_checkpoint("0731")).baselines}
    names_w4 = {b.name for b in bind_checkpoint(raw, load_checkpoint("w4a16-fp8-mtp")).baselines}
    assert "model-card-tp2x4" not in names_0731 and "model-card-tp2x4" in names_w4


def test_env_for_a_moe_backend() -> None:
    profile = load_profile("gh200x4")
    config = suggest(profile, FixedParams({"moe-backend": "humming"}))
    assert config.env["VLLM_HUMMING_MOE_GEMM_TYPE"] == "indexed"
    assert "VLLM_HUMMING_MOE_GEMM_TYPE" not in suggest(profile, FixedParams({"moe-backend": "auto"})).env


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_capture_sizes_follow_seqs_and_draft(name: str) -> None:
    for ckpt in CHECKPOINTS:
        profile = bind_checkpoint(load_profile(name), load_checkpoint(ckpt))
        source = RandomParams(7)
        for _ in range(50):
            config = suggest(profile, source)
            # a prefill/decode layout's servers each size their graphs by their own seats (issue 27)
            launches = [config.args] if config.disaggregation is None else \
                [m.args for m in config.disaggregation.members]
            for args in launches:
                compilation = args.get("compilation-config", {})
                size = compilation.get(CAPTURE_OPTION.split(".")[1])
                assert size is not None
                q = 1 + (config.draft_tokens if "speculative-config" in args else 0)
                assert size % q == 0
                assert size <= max(q, args["max-num-seqs"] * q)


def test_capture_size_for() -> None:
    assert capture_size_for(1024, 0, 1024) == 1024
    assert capture_size_for(1024, 7, 1024) == 1024
    assert capture_size_for(100, 2, 1024) == 300
    assert capture_size_for(512, 2, 1024) == 1023
    assert capture_size_for(1, 7, 4) == 8


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    return path


_GOOD = """
name: bad
hardware: {device_name: X, device_count: 4, memory_per_device_gb: 96, generation: hopper}
topology: {choices: [tp4, dp4-ep]}
levers:
  max-num-seqs: {choices: [256, 512]}
"""


def test_good_minimal_profile_loads(tmp_path: Path) -> None:
    assert load_profile(str(_write(tmp_path, _GOOD))).name == "bad"


@pytest.mark.parametrize(("patch", "key", "words"), [
    (_GOOD + "  max-num-seqs-typo: {choices: [1]}\nbogus: 1\n", "bogus", "unknown key"),
    (_GOOD.replace("{choices: [256, 512]}", "{int: [512, 256]}"), "levers.max-num-seqs", "empty range"),
    (_GOOD.replace("[tp4, dp4-ep]", "[tp4, tp2-dp4-ep]"), "topology.choices[1]", "the node has 4"),
    (_GOOD.replace("[tp4, dp4-ep]", "[tp4, tp2-xx]"), "topology.choices[1]", "cannot read"),
    (_GOOD + "  moe-backend: {choices: [auto, flashinfer_trtllm]}\n", "levers.moe-backend.choices",
     "runs only on"),
    (_GOOD + "speculative:\n  method: mtp\n  draft_tokens: {choices: [0, 1, 2]}\n",
     "speculative.draft_tokens", "at most 1"),
    (_GOOD + "baselines:\n  - {name: b, values: {max-num-seqs: 999}}\n", "baselines[0].values.max-num-seqs",
     "outside the lever's domain"),
    (_GOOD + "  all2all-backend: {choices: [naive], when: {topology.pp: [2]}}\n",
     "levers.all2all-backend.when", "unknown lever"),
])
def test_bad_profile_names_file_and_key(tmp_path: Path, patch: str, key: str, words: str) -> None:
    path = _write(tmp_path, patch)
    with pytest.raises(CatalogError) as info:
        load_profile(str(path))
    assert info.value.file == str(path)
    assert info.value.key == key
    assert words in str(info.value)


def test_bad_checkpoint_catalog_names_key(tmp_path: Path) -> None:
    path = tmp_path / "_checkpoints.yaml"
    path.write_text("default: a\ncheckpoints:\n  a: {repo: r, size_gb: 10, routed_experts_gb: 5, "
                    "weights: {routed_experts: fp4, attention: fp8}, sizee: 3}\n", encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert info.value.key == "checkpoints.a.sizee"


def test_a_cpu_profile_without_a_scale_runs_the_demo_scale_and_a_gpu_one_the_node_scale() -> None:
    # a user's own CPU profile (and the fault tests') once stopped with "steps its ladder by the KV knee ...
    # only for a catalogued checkpoint": the objectives' top level is a GPU node's workload
    from tuner.search.profile import HardwareProfile

    base = {"name": "mine", "levers": {"max-num-seqs": {"choices": [4, 8]}}}
    cpu = HardwareProfile.model_validate({**base, "hardware": {"accelerator": "cpu", "device_name": "x86",
                                                               "device_count": 1, "memory_per_device_gb": 1}})
    assert cpu.server.workload_scale == "demo"
    gpu = HardwareProfile.model_validate({**base, "hardware": {"accelerator": "nvidia", "device_name": "H200",
                                                               "device_count": 1, "memory_per_device_gb": 141}})
    assert gpu.server.workload_scale is None
