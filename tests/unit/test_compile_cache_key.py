"""A relaunch with the same flags hashes to the same torch.compile cache folder (issue 31).

vLLM names the folder ``torch_compile_cache/<sha256(env, config, code, compiler)[:10]>``
(``vllm/compilation/backends.py``). The parts a launch can change are the engine config's hash
(``VllmConfig.compute_hash``) and the hash of the ``VLLM_*`` environment (``envs.compile_factors``).
This test builds both with vLLM's own code, from the argv dsv4-tune produces, for two launches that
differ in what differs between relaunches: the port and the API key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner import store
from tuner.engines.vllm.engine import VllmEngine
from tuner.engines.vllm.validate import cli_args_module, vllm_available

DEMO = str(Path(__file__).resolve().parents[2] / "tuner" / "demo")

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM does not import here")


def _compile_key(port: int, api_key: str, args: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    from vllm import envs
    from vllm.config.utils import hash_factors
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    engine = VllmEngine()
    options = engine.serve_options(DEMO, args, host="127.0.0.1", port=port, served_model_name="demo")
    argv = engine.build_argv(["vllm"], options, api_key=None)
    assert f"{port}" in argv
    parser = cli_args_module().make_arg_parser(FlexibleArgumentParser())
    ns = parser.parse_args(argv[3:])
    ns.model = argv[2]
    monkeypatch.setenv(engine.api_key_env, api_key)
    config = EngineArgs.from_cli_args(ns).create_engine_config()
    return config.compute_hash(), hash_factors(envs.compile_factors())


def test_port_and_api_key_leave_the_compile_key_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    args: dict[str, object] = {"max-num-seqs": 8, "dtype": "bfloat16"}
    first = _compile_key(18001, "key-one", args, monkeypatch)
    second = _compile_key(19002, "key-two", args, monkeypatch)
    assert first == second


def test_a_flag_that_shapes_the_graph_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: a flag the graph depends on moves the config hash."""
    a = _compile_key(18001, "k", {"max-num-seqs": 8, "dtype": "bfloat16"}, monkeypatch)
    b = _compile_key(18001, "k", {"max-num-seqs": 8, "dtype": "float32"}, monkeypatch)
    assert a[0] != b[0]


def test_the_operators_key_is_every_process_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.26 hashes VLLM_API_KEY: a key set once for the night keeps relaunches in new processes on one key."""
    monkeypatch.setenv(store.API_KEY_ENV, "night-key")
    assert store.study_api_key(tmp_path / "a") == "night-key"
    monkeypatch.delenv(store.API_KEY_ENV)
    drawn = store.study_api_key(tmp_path / "a")
    assert drawn != "night-key" and store.study_api_key(tmp_path / "a") == drawn
