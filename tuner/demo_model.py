"""The tiny models the demo and the tests serve (no model hub is reachable).

**The demo model** (``--model demo``, ``dsv4-tune demo-model DIR``) ships with the package, in
``tuner/demo/``: a 2-layer Llama (~2.2 M parameters, bf16, ~4.5 MB) whose tokenizer carries the
DeepSeek-V4 tokens, trained on the shipped guard probes (``scripts/make_fixture.py``). So the demo
runs the real DSV4 path, ``--tokenizer-mode deepseek_v4`` with vLLM's DSV4 reasoning and tool-call
parsers, its tool calls and reasoning pass the gates, and its numerics are confident enough that the
equivalence gate sees an FP8 KV cache drift (on random weights it cannot: every logprob is flat).
``manifest.json`` beside the weights holds every file's sha256 and what the model was trained on;
:func:`write_demo_model` copies the files out and checks them against it.

**The random base** (:func:`build_demo_model`): a byte-level BPE tokenizer trained on Python's own
stdlib sources, carrying the DeepSeek-V4 tokens, and the same 2-layer Llama with random weights.
The demo model's tokenizer came from it once; the GPU evidence scripts build their own from it.

Both writes are atomic: a temporary sibling folder, the marker (or manifest) checked or written
last, and a rename into place. A folder without a matching marker is never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

__all__ = ["DSV4_SPECIAL_TOKENS", "DSV4_TEXT_TOKENS", "MANIFEST_NAME", "MARKER_NAME", "RECIPE_VERSION", "SHIPPED_DIR",
           "build_demo_model", "file_sha256", "verify_model_dir", "write_demo_model"]

log = logging.getLogger(__name__)

RECIPE_VERSION = 1
MARKER_NAME = "dsv4-tune-demo.json"
MANIFEST_NAME = "manifest.json"
SHIPPED_DIR = Path(__file__).resolve().parent / "demo"
"""The demo model as it ships: weights, tokenizer, chat template and ``manifest.json``."""
BPE_VOCAB_SIZE = 4096
CORPUS_CAP_BYTES = 3 * 1024 * 1024

# Token strings as vLLM 0.32 spells them: vllm/tokenizers/deepseek_v4_encoding.py
# (bos_token, eos_token, USER_SP_TOKEN, ASSISTANT_SP_TOKEN, thinking_*_token, dsml_token) and
# vllm/parser/deepseek_v4.py (DSML_TOOL_START/END, DSML_INVOKE_*, DSML_PARAM_*).
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
DSV4_SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, USER, ASSISTANT)
# Atomic but not special: they must survive skip_special_tokens so that output stays readable
# when no parser runs. The parser matches <think>, </think> and the tool_calls pair by token id.
DSV4_TEXT_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜DSML｜tool_calls>",
    "</｜DSML｜tool_calls>",
    "<｜DSML｜invoke",
    "</｜DSML｜invoke>",
    "<｜DSML｜parameter",
    "</｜DSML｜parameter>",
)

# The default-mode chat template renders the DSV4 layout without thinking, so plain
# /v1/chat/completions works: <bos>{system}<｜User｜>{user}<｜Assistant｜>{reply}<eos>...
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}" + USER + "{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}" + ASSISTANT + "{{ message['content'] }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)

_MODEL_ARCH: dict[str, Any] = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
}
_SKIP_DIRS = frozenset({"test", "tests", "site-packages", "dist-packages", "idlelib", "__pycache__"})


def build_demo_model(out_dir: Path, *, seed: int = 0, overwrite: bool = False) -> Path:
    """Build the demo model into ``out_dir`` (or reuse it) and return ``out_dir``.

    Reuses a folder whose marker names this recipe version and ``seed`` unless ``overwrite``.
    Replaces a stale or half-built folder, but refuses to delete one holding files this
    recipe never writes (raise ``UsageError``) unless ``overwrite``.
    """
    out_dir = Path(out_dir)
    if not overwrite and _marker_matches(out_dir, seed):
        log.debug("demo model cached at %s (seed %d)", out_dir, seed)
        return out_dir
    if out_dir.exists() and not overwrite:
        _check_replaceable(out_dir)
    libs = _import_demo_deps()

    started_s = time.monotonic()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".building", dir=out_dir.parent))
    try:
        marker = _build_into(tmp_dir, seed, libs)
        swap_in(tmp_dir, out_dir, lambda: _marker_matches(out_dir, seed))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("built demo model at %s in %.1f s (vocab %d, %d parameters)", out_dir,
             time.monotonic() - started_s, marker["vocab_size"], marker["num_parameters"])
    return out_dir


def _marker_matches(out_dir: Path, seed: int) -> bool:
    try:
        marker = json.loads((out_dir / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(marker, dict) and marker.get("recipe_version") == RECIPE_VERSION
            and marker.get("seed") == seed)


_OWN_FILES = frozenset({
    MARKER_NAME, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
})


def _check_replaceable(out_dir: Path) -> None:
    if not out_dir.is_dir():
        raise UsageError(f"{out_dir} exists and is not a folder. Fix: pass another demo model folder.")
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in _OWN_FILES)
    if foreign:
        raise UsageError(
            f"{out_dir} is not a complete demo model and holds files the demo model never writes "
            f"({', '.join(foreign[:5])}). "
            "Fix: pick an empty or new folder, or pass overwrite=True to replace it."
        )


def _import_demo_deps() -> dict[str, Any]:
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as exc:
        raise UsageError(
            f"building the demo model needs transformers, tokenizers and torch ({exc}). "
            "Fix: pip install 'dsv4-tune[demo]'"
        ) from exc
    return {"tokenizers": tokenizers, "torch": torch, "transformers": transformers}


def _corpus() -> tuple[list[str], str]:
    """Python's stdlib sources, in sorted order, capped at CORPUS_CAP_BYTES; and their sha256."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (p for p in stdlib.rglob("*.py") if not _SKIP_DIRS.intersection(p.relative_to(stdlib).parts)),
        key=lambda p: p.relative_to(stdlib).as_posix(),
    )
    texts: list[str] = []
    total = 0
    digest = hashlib.sha256()
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        data = data[: CORPUS_CAP_BYTES - total]
        texts.append(data.decode("utf-8", errors="replace"))
        digest.update(data)
        total += len(data)
        if total >= CORPUS_CAP_BYTES:
            break
    if total == 0:
        raise UsageError(f"no Python sources found under {stdlib} to train the demo tokenizer on. "
                         "Fix: use a Python installation that ships its stdlib sources.")
    return texts, digest.hexdigest()


def _chunks(texts: list[str]) -> Iterator[str]:
    for text in texts:
        yield from text.splitlines(keepends=True)


def _build_into(tmp_dir: Path, seed: int, libs: dict[str, Any]) -> dict[str, Any]:
    tk, torch, tf = libs["tokenizers"], libs["torch"], libs["transformers"]

    texts, corpus_sha256 = _corpus()
    bpe = tk.Tokenizer(tk.models.BPE())
    bpe.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
        special_tokens=list(DSV4_SPECIAL_TOKENS), initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_chunks(texts), trainer=trainer)
    bpe.add_tokens([tk.AddedToken(t, special=False, normalized=False) for t in DSV4_TEXT_TOKENS])
    bos_id = bpe.token_to_id(BOS)
    bpe.post_processor = tk.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)],
    )
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=EOS,
        additional_special_tokens=[USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE, model_max_length=_MODEL_ARCH["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(tmp_dir)

    vocab_size = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = tf.LlamaConfig(
        vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        dtype="bfloat16", **_MODEL_ARCH,
    )
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).to(torch.bfloat16)
    bars_were_on = tf.utils.logging.is_progress_bar_enabled()
    tf.utils.logging.disable_progress_bar()  # no tqdm on stderr from a library call
    try:
        model.save_pretrained(tmp_dir)
    finally:
        if bars_were_on:
            tf.utils.logging.enable_progress_bar()

    marker = {
        "recipe_version": RECIPE_VERSION, "seed": seed, "vocab_size": vocab_size,
        "num_parameters": int(model.num_parameters()), "corpus_sha256": corpus_sha256,
    }
    for path in tmp_dir.iterdir():  # mkdtemp and safetensors make owner-only modes
        path.chmod(0o644)
    tmp_dir.chmod(0o755)
    # The marker goes last: its presence is what says "complete".
    (tmp_dir / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return marker


def swap_in(tmp_dir: Path, out_dir: Path, built_by_another: Callable[[], bool]) -> None:
    """Move a finished build into place; the old folder, if any, is removed first.

    If the rename loses a race, ``built_by_another()`` says whether a concurrent build finished first
    (then its result is kept); otherwise the error propagates.
    """
    if out_dir.exists():
        trash = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.old")
        out_dir.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
    try:
        tmp_dir.rename(out_dir)
    except OSError:
        if built_by_another():
            return
        raise


# ---------------------------------------------------------------- the shipped demo model


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_model_dir(model_dir: Path) -> dict[str, Any]:
    """Check every file ``manifest.json`` lists against its sha256; return the manifest.

    Raises :class:`UsageError` naming each missing or changed file: a model that does not match its
    manifest is not the model the manifest says was trained and checked.
    """
    model_dir = Path(model_dir)
    try:
        manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{model_dir / MANIFEST_NAME} is missing or unreadable ({exc}). Fix: regenerate the demo "
                         "model with `python scripts/make_fixture.py build`, or reinstall dsv4-tune") from exc
    problems = []
    for name, entry in sorted(files.items()):
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"{name} has sha256 {file_sha256(path)[:12]}…, the manifest says {entry['sha256'][:12]}…")
    if problems:
        raise UsageError(f"the model in {model_dir} does not match its manifest: {'; '.join(problems)}. Fix: "
                         "regenerate it with `python scripts/make_fixture.py build` (and commit the new manifest), "
                         "or restore the committed files")
    return dict(manifest)


def write_demo_model(out_dir: Path, *, source: Path = SHIPPED_DIR) -> Path:
    """Write the shipped demo model into ``out_dir`` (or reuse a verified copy there) and return ``out_dir``.

    The shipped files are checked against their manifest first, the copy after. A folder that holds
    other files is refused (:class:`UsageError`), never overwritten.
    """
    out_dir = Path(out_dir)
    manifest = verify_model_dir(source)
    if out_dir.exists():
        try:
            if verify_model_dir(out_dir) == manifest:
                log.debug("demo model already at %s", out_dir)
                return out_dir
        except UsageError:
            pass
        own = set(manifest["files"]) | {MANIFEST_NAME} | _OWN_FILES
        foreign = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else [out_dir.name]
        if not out_dir.is_dir() or set(foreign) - own:
            raise UsageError(f"{out_dir} exists and is not a copy of the demo model (it holds "
                             f"{', '.join(sorted(set(foreign) - own)[:5]) or 'a file'}). Fix: pick an empty or new "
                             "folder")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".writing", dir=out_dir.parent))
    try:
        for name in sorted(manifest["files"]):
            shutil.copyfile(source / name, tmp_dir / name)
            (tmp_dir / name).chmod(0o644)
        shutil.copyfile(source / MANIFEST_NAME, tmp_dir / MANIFEST_NAME)  # last: its presence says "complete"
        (tmp_dir / MANIFEST_NAME).chmod(0o644)
        tmp_dir.chmod(0o755)
        verify_model_dir(tmp_dir)
        swap_in(tmp_dir, out_dir, lambda: _is_copy(out_dir, manifest))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    log.info("wrote the demo model to %s", out_dir)
    return out_dir


def _is_copy(out_dir: Path, manifest: dict[str, Any]) -> bool:
    try:
        return verify_model_dir(out_dir) == manifest
    except UsageError:
        return False
