"""tuner/search/space.py public API: shipped profiles load, suggest stays in its domains, ServeConfig identity."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tuner import catalog
from tuner.errors import CatalogError
from tuner.search.profile import DRAFT_TOKENS_PARAM, SPECULATIVE_OPTION, HardwareProfile, load_profile
from tuner.search.space import FixedParams, ServeConfig, suggest

HEAD = """\
name: t
hardware: {accelerator: cpu, device_name: c, device_count: 1, memory_per_device_gb: 1}
"""

PROFILE = HEAD + """\
server:
  fixed: {max-model-len: 2048, enforce-eager: true}
  env: {BASE_ENV: "1"}
levers:
  max-num-seqs: {choices: [4, 8, 16]}
  max-num-batched-tokens: {int: [512, 4096], step: 512}
  gpu-memory-utilization: {float: [0.5, 0.9]}
  enable-prefix-caching: {choices: [true, false]}
  prefix-caching-hash-algo: {choices: [sha256, xxhash], when: {enable-prefix-caching: [true]}}
  compilation-config.cudagraph_mode: {choices: [NONE, FULL]}
  compilation-config.pass_config.fuse_norm_quant: {choices: [true, false]}
  omp-threads: {choices: [1, 2], env: VLLM_CPU_OMP_THREADS}
  use-thing: {choices: [true, false], env: VLLM_USE_THING}
speculative:
  method: ngram
  draft_tokens: {choices: [0, 2, 4]}
  config: {prompt_lookup_max: 3, prompt_lookup_min: 2}
"""


def _profile(tmp_path: Path, text: str = PROFILE, name: str = "t.yaml") -> HardwareProfile:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_profile(str(path))


def _check_in_domains(cfg: ServeConfig) -> None:
    args, env = cfg.args, cfg.env
    assert args["max-model-len"] == 2048 and args["enforce-eager"] is True
    assert env["BASE_ENV"] == "1"
    assert args["max-num-seqs"] in (4, 8, 16)
    mnbt = args["max-num-batched-tokens"]
    assert isinstance(mnbt, int) and 512 <= mnbt <= 4096 and mnbt % 512 == 0
    assert 0.5 <= args["gpu-memory-utilization"] <= 0.9
    assert args["enable-prefix-caching"] in (True, False)
    if args["enable-prefix-caching"]:
        assert args["prefix-caching-hash-algo"] in ("sha256", "xxhash")
    else:
        assert "prefix-caching-hash-algo" not in args
    assert args["compilation-config"]["cudagraph_mode"] in ("NONE", "FULL")
    assert args["compilation-config"]["pass_config"]["fuse_norm_quant"] in (True, False)
    assert env["VLLM_CPU_OMP_THREADS"] in ("1", "2")
    assert env["VLLM_USE_THING"] in ("true", "false")
    assert "omp-threads" not in args and "use-thing" not in args
    assert cfg.draft_tokens in (0, 2, 4)
    assert cfg.is_speculative == (cfg.draft_tokens > 0)


# -- shipped catalog ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", catalog.known_names("search_spaces"))
def test_every_shipped_profile_loads_and_suggests(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert profile.hardware.device_count >= 1
    cfg = suggest(profile, FixedParams({}))
    assert isinstance(cfg.args, dict)
    for base in profile.baselines:
        assert set(base.values) <= set(profile.param_names())


def test_shipped_catalog_has_cpu() -> None:
    assert "cpu" in catalog.known_names("search_spaces")


# -- suggest -----------------------------------------------------------------------------------

def test_fixed_params_default_to_first_choice_and_low_end(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({}))
    assert cfg.args == {
        "max-model-len": 2048, "enforce-eager": True, "max-num-seqs": 4, "max-num-batched-tokens": 512,
        "gpu-memory-utilization": 0.5, "enable-prefix-caching": True, "prefix-caching-hash-algo": "sha256",
        "compilation-config": {"cudagraph_mode": "NONE", "pass_config": {"fuse_norm_quant": True}},
    }
    assert cfg.env == {"BASE_ENV": "1", "VLLM_CPU_OMP_THREADS": "1", "VLLM_USE_THING": "true"}
    assert cfg.draft_tokens == 0 and not cfg.is_speculative


def test_fixed_params_values_are_used(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({"max-num-seqs": 16, "max-num-batched-tokens": 2048,
                                                  "use-thing": False, DRAFT_TOKENS_PARAM: 4}))
    assert cfg.args["max-num-seqs"] == 16
    assert cfg.args["max-num-batched-tokens"] == 2048
    assert cfg.env["VLLM_USE_THING"] == "false"
    assert cfg.params[DRAFT_TOKENS_PARAM] == 4


def test_optuna_fixed_trial(tmp_path: Path) -> None:
    params = {"max-num-seqs": 8, "max-num-batched-tokens": 1536, "gpu-memory-utilization": 0.75,
              "enable-prefix-caching": False, "compilation-config.cudagraph_mode": "FULL",
              "compilation-config.pass_config.fuse_norm_quant": False, "omp-threads": 2, "use-thing": True,
              DRAFT_TOKENS_PARAM: 2}
    cfg = suggest(_profile(tmp_path), optuna.trial.FixedTrial(params))
    _check_in_domains(cfg)
    assert cfg.args["max-num-batched-tokens"] == 1536
    assert cfg.args["gpu-memory-utilization"] == 0.75
    assert "prefix-caching-hash-algo" not in cfg.args  # FixedTrial would raise if it had been asked
    assert cfg.env["VLLM_CPU_OMP_THREADS"] == "2"
    assert cfg.args[SPECULATIVE_OPTION] == {"method": "ngram", "num_speculative_tokens": 2,
                                            "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    assert dict(cfg.params) == params


def test_optuna_study_ask_stays_in_domains(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_conditional = {True: 0, False: 0}
    drafts = set()
    for _ in range(40):
        trial = study.ask()
        cfg = suggest(profile, trial)
        _check_in_domains(cfg)
        assert set(trial.params) == set(cfg.params)
        seen_conditional["prefix-caching-hash-algo" in cfg.args] += 1
        drafts.add(cfg.draft_tokens)
        study.tell(trial, float(cfg.args["max-num-seqs"]))
    assert seen_conditional[True] > 0 and seen_conditional[False] > 0
    assert drafts == {0, 2, 4}


def test_when_condition_switches_lever_off(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    on = suggest(profile, FixedParams({"enable-prefix-caching": True, "prefix-caching-hash-algo": "xxhash"}))
    off = suggest(profile, FixedParams({"enable-prefix-caching": False, "prefix-caching-hash-algo": "xxhash"}))
    assert on.args["prefix-caching-hash-algo"] == "xxhash"
    assert "prefix-caching-hash-algo" not in off.args
    assert "prefix-caching-hash-algo" not in off.params


def test_when_condition_on_a_later_lever_is_honoured(tmp_path: Path) -> None:
    # A `when` may name a lever declared after it: the profile loads, and the conditional lever follows
    # the later lever's value both ways (drawn when the condition holds, absent when it does not).
    text = HEAD + """\
levers:
  hash-algo: {choices: [sha256, xxhash], when: {enable-prefix-caching: [true]}}
  enable-prefix-caching: {choices: [true, false]}
"""
    profile = _profile(tmp_path, text)
    on = suggest(profile, FixedParams({"enable-prefix-caching": True}))
    assert on.args.get("hash-algo") == "sha256" and on.params["hash-algo"] == "sha256"
    off = suggest(profile, FixedParams({"enable-prefix-caching": False}))
    assert "hash-algo" not in off.args and "hash-algo" not in off.params


def test_when_condition_on_draft_tokens_is_honoured(tmp_path: Path) -> None:
    text = HEAD + """\
levers:
  spec-extra: {choices: [a, b], when: {speculative.draft_tokens: [2]}}
speculative:
  method: ngram
  draft_tokens: {choices: [0, 2]}
"""
    profile = _profile(tmp_path, text)
    drafting = suggest(profile, FixedParams({DRAFT_TOKENS_PARAM: 2}))
    assert drafting.args.get("spec-extra") == "a" and drafting.params["spec-extra"] == "a"
    plain = suggest(profile, FixedParams({DRAFT_TOKENS_PARAM: 0}))
    assert "spec-extra" not in plain.args and "spec-extra" not in plain.params


def test_dotted_lever_names_nest_into_json_options(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({"compilation-config.cudagraph_mode": "FULL",
                                                   "compilation-config.pass_config.fuse_norm_quant": False}))
    assert cfg.args["compilation-config"] == {"cudagraph_mode": "FULL", "pass_config": {"fuse_norm_quant": False}}
    assert not any("." in key for key in cfg.args)


def test_dotted_lever_merges_with_fixed_json_option(tmp_path: Path) -> None:
    text = HEAD + """\
server:
  fixed: {compilation-config: {level: 3, pass_config: {fuse_x: true}}}
levers:
  compilation-config.pass_config.fuse_y: {choices: [false]}
"""
    cfg = suggest(_profile(tmp_path, text), FixedParams({}))
    assert cfg.args["compilation-config"] == {"level": 3, "pass_config": {"fuse_x": True, "fuse_y": False}}


def test_suggest_does_not_mutate_the_profile_fixed_flags(tmp_path: Path) -> None:
    text = HEAD + """\
server:
  fixed: {compilation-config: {level: 3}}
levers:
  compilation-config.mode: {choices: [a, b]}
"""
    profile = _profile(tmp_path, text)
    suggest(profile, FixedParams({"compilation-config.mode": "b"}))
    assert profile.server.fixed == {"compilation-config": {"level": 3}}
    assert suggest(profile, FixedParams({})).args["compilation-config"] == {"level": 3, "mode": "a"}


def test_env_levers_go_to_env_not_args(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({"omp-threads": 2, "use-thing": False}))
    assert cfg.env["VLLM_CPU_OMP_THREADS"] == "2"
    assert cfg.env["VLLM_USE_THING"] == "false"
    assert "omp-threads" not in cfg.args and "use-thing" not in cfg.args
    assert not any(k.startswith("VLLM_") for k in cfg.args)


def test_zero_draft_tokens_means_no_speculative_config(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({DRAFT_TOKENS_PARAM: 0}))
    assert SPECULATIVE_OPTION not in cfg.args
    assert not cfg.is_speculative and cfg.draft_tokens == 0


def test_positive_draft_tokens_build_speculative_config(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({DRAFT_TOKENS_PARAM: 4}))
    assert cfg.args[SPECULATIVE_OPTION] == {"method": "ngram", "num_speculative_tokens": 4,
                                            "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    assert cfg.is_speculative and cfg.draft_tokens == 4


def test_profile_without_speculation_never_speculates(tmp_path: Path) -> None:
    text = HEAD + "levers:\n  max-num-seqs: {choices: [4]}\n"
    cfg = suggest(_profile(tmp_path, text), FixedParams({DRAFT_TOKENS_PARAM: 3}))
    assert SPECULATIVE_OPTION not in cfg.args
    assert DRAFT_TOKENS_PARAM not in cfg.params


# -- ServeConfig -------------------------------------------------------------------------------

def test_key_is_stable_across_dict_orderings() -> None:
    a = ServeConfig(args={"max-num-seqs": 8, "compilation-config": {"x": 1, "y": 2}, "block-size": 16},
                    env={"A": "1", "B": "2"})
    b = ServeConfig(args={"block-size": 16, "compilation-config": {"y": 2, "x": 1}, "max-num-seqs": 8},
                    env={"B": "2", "A": "1"})
    assert a.key() == b.key()
    assert len(a.key()) == 16 and int(a.key(), 16) >= 0


def test_key_ignores_params_but_not_args_or_env() -> None:
    base = ServeConfig(args={"max-num-seqs": 8}, env={"A": "1"}, params={"max-num-seqs": 8})
    assert base.key() == ServeConfig(args={"max-num-seqs": 8}, env={"A": "1"}).key()
    assert base.key() != ServeConfig(args={"max-num-seqs": 16}, env={"A": "1"}).key()
    assert base.key() != ServeConfig(args={"max-num-seqs": 8}, env={"A": "2"}).key()
    assert base.key() != ServeConfig(args={"max-num-seqs": 8, "enforce-eager": True}, env={"A": "1"}).key()
    assert base.key() != ServeConfig(args={"max-num-seqs": "8"}, env={"A": "1"}).key()


def test_key_distinguishes_suggested_configs(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    keys = {suggest(profile, FixedParams({"max-num-seqs": n})).key() for n in (4, 8, 16)}
    assert len(keys) == 3


def test_control_removes_speculation_and_keeps_the_rest(tmp_path: Path) -> None:
    spec = suggest(_profile(tmp_path), FixedParams({DRAFT_TOKENS_PARAM: 4, "max-num-seqs": 16,
                                                    "omp-threads": 2}))
    ctrl = spec.control()
    assert SPECULATIVE_OPTION in spec.args  # the original is untouched
    assert SPECULATIVE_OPTION not in ctrl.args
    assert not ctrl.is_speculative and ctrl.draft_tokens == 0
    assert ctrl.params[DRAFT_TOKENS_PARAM] == 0
    assert {k: v for k, v in spec.args.items() if k != SPECULATIVE_OPTION} == dict(ctrl.args)
    assert ctrl.env == spec.env
    assert {k: v for k, v in spec.params.items() if k != DRAFT_TOKENS_PARAM} == \
        {k: v for k, v in ctrl.params.items() if k != DRAFT_TOKENS_PARAM}
    assert ctrl.key() != spec.key()
    no_spec = suggest(_profile(tmp_path), FixedParams({DRAFT_TOKENS_PARAM: 0, "max-num-seqs": 16,
                                                      "omp-threads": 2}))
    assert ctrl.key() == no_spec.key()


def test_control_of_non_speculative_config_is_identical() -> None:
    cfg = ServeConfig(args={"max-num-seqs": 8}, env={"A": "1"}, params={"max-num-seqs": 8})
    ctrl = cfg.control()
    assert dict(ctrl.args) == {"max-num-seqs": 8}
    assert dict(ctrl.params) == {"max-num-seqs": 8}  # no draft key invented
    assert ctrl.key() == cfg.key()


def test_serve_config_args_serialise_to_json(tmp_path: Path) -> None:
    cfg = suggest(_profile(tmp_path), FixedParams({DRAFT_TOKENS_PARAM: 2}))
    assert json.loads(json.dumps(cfg.args)) == cfg.args


# -- invalid levers and baselines ---------------------------------------------------------------

@pytest.mark.parametrize(("lever", "needle"), [
    ("{int: [5, 1]}", "empty range [5, 1]"),
    ("{float: [0.9, 0.1]}", "empty range [0.9, 0.1]"),
    ("{choices: []}", "'choices' is empty"),
    ("{choices: [1, 2], int: [1, 2]}", "give exactly one of"),
    ("{}", "give exactly one of"),
    ("{int: [0, 8], log: true}", "log-scale range must start above 0"),
])
def test_invalid_lever_is_catalog_error(tmp_path: Path, lever: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + f"levers:\n  max-num-seqs: {lever}\n", encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        catalog.load_model(path, HardwareProfile)
    assert info.value.file == str(path)
    assert info.value.key == "levers.max-num-seqs"
    assert needle in info.value.problem


BROKEN_RULES = {
    # case: (levers and baselines, the key named, what the problem says, what the fix says)
    "baseline with unknown lever": (
        "levers:\n  max-num-seqs: {choices: [4, 8]}\nbaselines:\n  - {name: b, values: {max-num-seq: 4}}\n",
        "baselines[0].values.max-num-seq", "unknown lever 'max-num-seq'", "max-num-seqs"),
    "baseline value outside domain": (
        "levers:\n  max-num-seqs: {choices: [4, 8]}\nbaselines:\n  - {name: b, values: {max-num-seqs: 5}}\n",
        "baselines[0].values.max-num-seqs", "", ""),
    "when naming unknown lever": (
        "levers:\n  max-num-seqs: {choices: [4], when: {nope: [1]}}\n", "levers.max-num-seqs.when", "'nope'", ""),
}


@pytest.mark.parametrize("case", list(BROKEN_RULES))
def test_a_profile_rule_broken_is_rejected_at_its_key(tmp_path: Path, case: str) -> None:
    rest, key, problem, fix = BROKEN_RULES[case]
    with pytest.raises(CatalogError) as info:
        _profile(tmp_path, HEAD + rest)
    assert info.value.key == key
    assert problem in info.value.problem
    assert fix in info.value.fix


def test_profile_name_must_match_catalog_file_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "search_spaces"
    folder.mkdir()
    (folder / "mynode.yaml").write_text(HEAD, encoding="utf-8")  # name: t
    monkeypatch.setattr(catalog, "catalog_dir", lambda kind: folder)
    with pytest.raises(CatalogError) as info:
        load_profile("mynode")
    assert info.value.key == "name"
