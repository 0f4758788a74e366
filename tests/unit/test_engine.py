"""tuner/engines/vllm/argv.py: argv must be what vLLM's own ``--config`` loader makes of the same mapping."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.engines.vllm import VllmEngine, options_to_argv, redact_argv, resolve_vllm_cmd
from tuner.errors import UsageError


@pytest.fixture(scope="module")
def vllm_parser() -> Any:
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="test"))


def _negatable(parser: Any) -> frozenset[str]:
    return frozenset(opt[len("--no-"):] for opt in parser._option_string_actions if opt.startswith("--no-"))


def _loader_argv(parser: Any, tmp_path: Path, options: dict[str, Any]) -> list[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
    return list(parser.load_config_file(str(path)))


def _normalise(argv: list[str]) -> list[Any]:
    """JSON values compared as parsed objects (key order may differ), everything else as text."""
    out: list[Any] = []
    for word in argv:
        if word.startswith("{"):
            out.append(("json", json.loads(word)))
        else:
            out.append(word)
    return out


CASES: dict[str, dict[str, Any]] = {
    "ints and strings": {"max-num-seqs": 64, "port": 8123, "dtype": "bfloat16", "kv-cache-dtype": "fp8",
                         "served-model-name": "my model"},
    "float": {"gpu-memory-utilization": 0.92},
    "bool true": {"enforce-eager": True, "enable-prefix-caching": True},
    "bool false with --no- form": {"enable-prefix-caching": False, "enable-chunked-prefill": False,
                                   "enforce-eager": False},
    "list": {"served-model-name": ["a", "b"], "allowed-origins": ["x"]},
    "empty list": {"served-model-name": []},
    "nested dict": {"compilation-config": {"pass_config": {"fuse_allreduce_rms": True}, "cudagraph_mode": "FULL",
                                           "cudagraph_capture_sizes": [1, 2, 4]},
                    "speculative-config": {"method": "ngram", "num_speculative_tokens": 3,
                                           "prompt_lookup_max": 3}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_options_to_argv_matches_vllm_config_loader(vllm_parser: Any, tmp_path: Path, case: str) -> None:
    options = CASES[case]
    ours = options_to_argv(options, negatable=_negatable(vllm_parser))
    theirs = _loader_argv(vllm_parser, tmp_path, options)
    assert _normalise(ours) == _normalise(theirs)


def test_mixed_mapping_matches_vllm_config_loader(vllm_parser: Any, tmp_path: Path) -> None:
    options: dict[str, Any] = {}
    for case in CASES.values():
        options.update(case)
    ours = options_to_argv(options, negatable=_negatable(vllm_parser))
    assert _normalise(ours) == _normalise(_loader_argv(vllm_parser, tmp_path, options))


def test_default_negatable_matches_loader_for_flags_with_no_form(vllm_parser: Any, tmp_path: Path) -> None:
    options = {"enable-prefix-caching": False, "enforce-eager": False, "trust-remote-code": False}
    assert options_to_argv(options) == _loader_argv(vllm_parser, tmp_path, options)
    assert options_to_argv(options) == ["--no-enable-prefix-caching", "--no-enforce-eager",
                                        "--no-trust-remote-code"]


def test_false_flag_without_no_form_matches_loader_by_default(vllm_parser: Any, tmp_path: Path) -> None:
    options = {"disable-log-stats": False, "max-num-seqs": 8}
    assert options_to_argv(options) == _loader_argv(vllm_parser, tmp_path, options)


def test_negatable_set_drops_false_flags_vllm_cannot_negate(vllm_parser: Any) -> None:
    assert options_to_argv({"disable-log-stats": False}, negatable=_negatable(vllm_parser)) == []


def test_argv_parses_with_vllm(vllm_parser: Any) -> None:
    options = {"max-num-seqs": 16, "enable-prefix-caching": False, "enforce-eager": True,
               "speculative-config": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}}
    argv = VllmEngine().build_argv([], {"model": "/models/tiny", **options}, api_key=None)
    assert argv[0] == "serve"
    ns = vllm_parser.parse_args(argv[1:])
    assert ns.model_tag == "/models/tiny"
    assert ns.max_num_seqs == 16
    assert ns.enable_prefix_caching is False
    assert ns.enforce_eager is True
    spec = ns.speculative_config
    spec = spec if isinstance(spec, dict) else json.loads(spec)
    assert spec == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}


# -- pure-Python rules (no vLLM needed) --------------------------------------------------------

def test_options_to_argv_hand_checked() -> None:
    argv = options_to_argv({"a": 1, "b": True, "c": False, "d": ["x", 2], "e": {"z": 1, "y": [1]}, "f": None,
                            "g": "text", "h": []})
    assert argv[:8] == ["--a", "1", "--b", "--no-c", "--d", "x", "2", "--e"]
    assert json.loads(argv[8]) == {"z": 1, "y": [1]}
    assert argv[9:] == ["--g", "text"]


def test_build_argv_puts_model_positional_after_serve() -> None:
    engine = VllmEngine()
    options = engine.serve_options("/models/tiny", {"max-num-seqs": 8, "enforce-eager": True}, host="127.0.0.1",
                                   port=8000, served_model_name="tiny")
    argv = engine.build_argv(["/venv/bin/vllm"], options, api_key=None)
    assert argv == ["/venv/bin/vllm", "serve", "/models/tiny", "--max-num-seqs", "8", "--enforce-eager",
                    "--host", "127.0.0.1", "--port", "8000", "--served-model-name", "tiny"]
    assert "--model" not in argv


def test_build_argv_with_module_prefix_and_api_key() -> None:
    argv = VllmEngine().build_argv(["python3", "-m", "vllm.entrypoints.cli.main"], {"model": "m", "port": 1},
                                   api_key="sk-secret")
    assert argv == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--port", "1",
                    "--api-key", "sk-secret"]


def test_redact_argv_masks_api_key_only() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "sk-secret", "--port", "8000"]
    red = redact_argv(argv)
    assert red == ["vllm", "serve", "m", "--api-key", "***", "--port", "8000"]
    assert argv[4] == "sk-secret"  # a copy, not in place
    assert "sk-secret" not in " ".join(red)


def test_redact_argv_trailing_flag_does_not_crash() -> None:
    assert redact_argv(["vllm", "--api-key"]) == ["vllm", "--api-key"]


def test_resolve_missing_program_names_it() -> None:
    with pytest.raises(UsageError) as info:
        resolve_vllm_cmd("/no/such/vllm serve")
    assert "'/no/such/vllm'" in str(info.value)


def test_resolve_empty_command() -> None:
    with pytest.raises(UsageError, match="empty"):
        resolve_vllm_cmd("   ")


def test_resolve_splits_module_command() -> None:
    python3 = shutil.which("python3")
    if python3 is None:
        pytest.skip("no python3 on PATH")
    assert resolve_vllm_cmd("python3 -m vllm.entrypoints.cli.main") == [python3, "-m",
                                                                          "vllm.entrypoints.cli.main"]


def test_resolve_absolute_path_and_quoted_args() -> None:
    assert resolve_vllm_cmd(f"{sys.executable} -c 'print(1)'") == [sys.executable, "-c", "print(1)"]


def test_shell_metacharacters_stay_one_argv_element() -> None:
    nasty = '"; rm -rf /"'
    argv = VllmEngine().build_argv(["vllm"], {"model": "m; ls", "served-model-name": nasty,
                                              "chat-template": "$(whoami) `id` | cat > /tmp/x"}, api_key=None)
    assert argv == ["vllm", "serve", "m; ls", "--served-model-name", nasty,
                    "--chat-template", "$(whoami) `id` | cat > /tmp/x"]
