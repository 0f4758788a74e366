"""The generated demo model: files, tokenizer, DSV4 tokens, config, chat template, caching."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")

from transformers import AutoConfig, AutoTokenizer  # noqa: E402

from tuner import demo_model  # noqa: E402
from tuner.demo_model import (  # noqa: E402
    DSV4_SPECIAL_TOKENS,
    DSV4_TEXT_TOKENS,
    MARKER_NAME,
    RECIPE_VERSION,
    build_demo_model,
)
from tuner.errors import UsageError  # noqa: E402

BOS, EOS, USER, ASSISTANT = DSV4_SPECIAL_TOKENS


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "model")


@pytest.fixture(scope="module")
def tok(built: Path) -> Any:
    return AutoTokenizer.from_pretrained(built)


def _marker(path: Path) -> dict[str, Any]:
    return json.loads((path / MARKER_NAME).read_text(encoding="utf-8"))


def test_files_present_and_marker_complete(built: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER_NAME):
        assert (built / name).is_file(), name
    marker = _marker(built)
    assert marker["recipe_version"] == RECIPE_VERSION
    assert marker["seed"] == 0
    assert 4096 <= marker["vocab_size"] <= 4200
    # No temporary build folder left beside the model.
    assert [p.name for p in built.parent.iterdir()] == ["model"]


def test_weights_are_real_bf16_and_tied(built: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(built / "model.safetensors")
    n_params = sum(t.numel() for t in tensors.values())
    assert 2_000_000 <= n_params <= 2_500_000
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    embed = tensors["model.embed_tokens.weight"]
    assert tuple(embed.shape) == (_marker(built)["vocab_size"], 256)
    assert float(embed.float().abs().sum()) > 0
    assert "lm_head.weight" not in tensors  # tied to the embeddings


@pytest.mark.parametrize("text", [
    "def f(x):\n    return x + 1  # comment\n",
    "Héllo, wörld! 世界 🙂 \t tabs and  double  spaces",
    "<think>reasoning</think>answer",
    '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
])
def test_tokenizer_round_trips(tok: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids[0] == tok.convert_tokens_to_ids(BOS)  # BOS added by default, as DeepSeek does
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len(tok.encode(text, add_special_tokens=False)) < len(text.encode())  # BPE merges something


def test_dsv4_tokens_are_atomic_and_split_special_vs_text(tok: Any) -> None:
    ids = {}
    for token in (*DSV4_SPECIAL_TOKENS, *DSV4_TEXT_TOKENS):
        encoded = tok.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, (token, encoded)
        ids[token] = encoded[0]
    assert len(set(ids.values())) == len(ids)
    assert set(DSV4_SPECIAL_TOKENS) <= set(tok.all_special_tokens)
    assert not set(DSV4_TEXT_TOKENS) & set(tok.all_special_tokens)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (BOS, EOS, EOS)
    # Special tokens vanish with skip_special_tokens; <think> and DSML markers stay visible.
    seq = [ids[BOS], ids[USER], ids["<think>"], ids[ASSISTANT], ids["</｜DSML｜tool_calls>"], ids[EOS]]
    assert tok.decode(seq, skip_special_tokens=True) == "<think></｜DSML｜tool_calls>"


def test_token_strings_match_vllm_source() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizers" / "deepseek_v4_encoding.py"
    if not path.is_file():
        pytest.skip(f"{path} not in this vLLM")
    enc_spec = importlib.util.spec_from_file_location("_dsv4_encoding_under_test", path)
    assert enc_spec is not None and enc_spec.loader is not None
    enc = importlib.util.module_from_spec(enc_spec)
    enc_spec.loader.exec_module(enc)  # self-contained: imports only the stdlib
    assert (enc.bos_token, enc.eos_token, enc.USER_SP_TOKEN, enc.ASSISTANT_SP_TOKEN) == DSV4_SPECIAL_TOKENS
    dsml = enc.dsml_token
    assert {enc.thinking_start_token, enc.thinking_end_token, dsml, f"<{dsml}tool_calls>",
            f"</{dsml}tool_calls>", f"</{dsml}invoke>", f"</{dsml}parameter>"} <= set(DSV4_TEXT_TOKENS)


def test_config_loads_and_matches_tokenizer(built: Path, tok: Any) -> None:
    config = AutoConfig.from_pretrained(built)
    assert config.model_type == "llama"
    assert config.vocab_size == len(tok) == _marker(built)["vocab_size"]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == (256, 2, 4, 2, 512)
    assert config.tie_word_embeddings is True
    assert config.max_position_embeddings == 4096
    assert config.bos_token_id == tok.convert_tokens_to_ids(BOS)
    assert config.eos_token_id == tok.convert_tokens_to_ids(EOS)


def test_chat_template_renders_two_turns(tok: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again."},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (f"{BOS}Be brief.{USER}Say hello.{ASSISTANT}Hello.{EOS}{USER}Again.{ASSISTANT}")
    no_prompt = tok.apply_chat_template(messages[:3], tokenize=False, add_generation_prompt=False)
    assert no_prompt == f"{BOS}Be brief.{USER}Say hello.{ASSISTANT}Hello.{EOS}"
    ids = tok.encode(rendered, add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids(BOS)
    assert ids.count(tok.convert_tokens_to_ids(USER)) == 2
    assert ids[-1] == tok.convert_tokens_to_ids(ASSISTANT)


def test_second_call_is_cached(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mtime_ns = (built / MARKER_NAME).stat().st_mtime_ns

    def no_rebuild(*args: object) -> None:
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(demo_model, "_build_into", no_rebuild)
    assert build_demo_model(built) == built  # no rebuild (how long the cached call takes: bench_stop_times.py)
    assert (built / MARKER_NAME).stat().st_mtime_ns == mtime_ns


def test_half_built_dir_is_rebuilt_identically(built: Path, tmp_path: Path) -> None:
    half = tmp_path / "model"
    shutil.copytree(built, half)
    (half / MARKER_NAME).unlink()
    (half / "model.safetensors").write_bytes(b"\0" * 10)  # a build killed mid-write
    assert build_demo_model(half) == half
    assert _marker(half) == _marker(built)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):  # same seed, same bytes
        assert (half / name).read_bytes() == (built / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def _fake_build(calls: list[int]) -> Any:
    def fake(tmp_dir: Path, seed: int, libs: dict[str, Any]) -> dict[str, Any]:
        calls.append(seed)
        marker = {"recipe_version": RECIPE_VERSION, "seed": seed, "vocab_size": 1, "num_parameters": 1}
        (tmp_dir / MARKER_NAME).write_text(json.dumps(marker), encoding="utf-8")
        return marker

    return fake


def test_other_seed_or_overwrite_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(demo_model, "_build_into", _fake_build(calls))
    out = tmp_path / "model"
    build_demo_model(out, seed=1)
    build_demo_model(out, seed=1)
    assert calls == [1]
    build_demo_model(out, seed=2)
    assert calls == [1, 2] and _marker(out)["seed"] == 2
    build_demo_model(out, seed=2, overwrite=True)
    assert calls == [1, 2, 2]


def test_failed_build_leaves_previous_model_and_no_debris(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo_model, "_build_into", _fake_build([]))
    out = tmp_path / "model"
    build_demo_model(out, seed=1)

    def dies(tmp_dir: Path, seed: int, libs: dict[str, Any]) -> dict[str, Any]:
        (tmp_dir / "config.json").write_text("{}", encoding="utf-8")
        raise KeyboardInterrupt

    monkeypatch.setattr(demo_model, "_build_into", dies)
    with pytest.raises(KeyboardInterrupt):
        build_demo_model(out, seed=2)
    assert _marker(out)["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_refuses_to_delete_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(UsageError, match=r"notes\.txt"):
        build_demo_model(out)
    assert (out / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_missing_optional_deps_say_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(UsageError, match=r"pip install 'dsv4-tune\[demo\]'"):
        build_demo_model(tmp_path / "model")
    assert not (tmp_path / "model").exists()
