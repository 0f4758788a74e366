"""The demo model as GGUF files llama-server loads: converted here, checked against the safetensors copy.

llama-server reads GGUF, not a Hugging Face folder. :func:`gguf_for` turns a model folder that is the
shipped demo model (``tuner/demo/``, verified against its ``manifest.json`` first) into two files beside
it, ``<folder>-gguf/``:

- ``demo-bf16.gguf``: the target, every weight bit for bit as in ``model.safetensors`` (BF16 matrices,
  F32 norms), the Llama architecture with Q and K rows permuted to llama.cpp's rotary layout (what
  llama.cpp's own ``convert_hf_to_gguf.py`` does for Llama), the byte-level BPE tokenizer with the
  GPT-2 pre-tokenizer (the DSML markers other than ``｜DSML｜`` as ordinary tokens: :func:`_tokenizer_fields`
  says why), and the DeepSeek-V4 chat template of :data:`CHAT_TEMPLATE_FILE`;
- ``demo-q8_0.gguf``: the same model with its matrices in Q8_0, the draft of the CPU profile's
  speculative trials (the Strix Halo envelopes' drafts are Q8_0/Q2_K and Q4/F16 GGUFs too).

Each written file is read back with ``gguf``'s reader and every tensor compared with the source (exactly
for BF16 and F32, within Q8_0's rounding for the draft), and ``gguf.json`` records their sha256. A later
call reuses files whose sha256 still matches that record; anything else is converted again.

Any other folder is not converted: a ``.gguf`` file is served as it is, and a folder must hold one.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.demo_model import MANIFEST_NAME, file_sha256, verify_model_dir
from tuner.errors import UsageError

__all__ = ["CHAT_TEMPLATE_FILE", "DRAFT_NAME", "RECORD_NAME", "TARGET_NAME", "DemoGguf", "convert_demo", "gguf_for",
           "gguf_parts"]

log = logging.getLogger(__name__)

TARGET_NAME = "demo-bf16.gguf"
DRAFT_NAME = "demo-q8_0.gguf"
RECORD_NAME = "gguf.json"
CHAT_TEMPLATE_FILE = Path(__file__).resolve().parent / "dsv4_chat_template.jinja"
"""DeepSeek-V4's prompt layout as a Jinja template (llama.cpp has no Python encoder): it renders what vLLM's
``--tokenizer-mode deepseek_v4`` renders for the gates' messages, and names ``dsml_token``, so llama-server
parses tool calls with its DeepSeek V3.2/V4 parser."""
CONVERTER_VERSION = 2
"""Raised when the conversion changes: a record of another version is converted again."""


@dataclass(frozen=True)
class DemoGguf:
    """The demo model's GGUF files."""

    target: Path
    draft: Path
    record: dict[str, Any]


def gguf_parts(path: Path) -> list[Path]:
    """Every file of a GGUF model: the file, or all parts of a split one (``x-00001-of-00003.gguf``)."""
    name = path.name
    stem, sep, tail = name.rpartition("-of-")
    if not sep or not tail.endswith(".gguf") or "-" not in stem:
        return [path]
    prefix, _, _index = stem.rpartition("-")
    total = tail.removesuffix(".gguf")
    parts = [path.with_name(f"{prefix}-{i:0{len(total)}d}-of-{total}.gguf") for i in range(1, int(total) + 1)]
    return parts if all(p.is_file() for p in parts) else [path]


def gguf_for(model: str | Path) -> Path:
    """The GGUF file llama-server serves for ``model``: the file itself, the demo model converted, or the one
    ``.gguf`` of a folder (the first part of a split one). A :class:`UsageError` says what to give instead."""
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        if (path / MANIFEST_NAME).is_file() and (path / "model.safetensors").is_file():
            return convert_demo(path).target
        found = sorted(p for p in path.glob("*.gguf") if gguf_parts(p)[0] == p)
        if len(found) == 1:
            return found[0]
    raise UsageError(f"--model {model}: llama-server serves a GGUF file, and this is neither a .gguf file, the "
                     "demo model, nor a folder holding one .gguf. Fix: pass --model PATH/TO/model.gguf (the first "
                     "part of a split GGUF), or 'demo'")


def convert_demo(model_dir: Path, out_dir: Path | None = None) -> DemoGguf:
    """The demo model in ``model_dir`` as GGUF files in ``out_dir`` (default ``<model_dir>-gguf``), converted
    once and checked; reused while ``gguf.json`` matches the files and the source."""
    model_dir = Path(model_dir)
    manifest = verify_model_dir(model_dir)
    out = Path(out_dir) if out_dir is not None else model_dir.with_name(model_dir.name + "-gguf")
    source = {"model.safetensors": manifest["files"]["model.safetensors"]["sha256"],
              "tokenizer.json": manifest["files"]["tokenizer.json"]["sha256"],
              "chat_template": file_sha256(CHAT_TEMPLATE_FILE), "converter": CONVERTER_VERSION}
    record = _reusable(out, source)
    if record is not None:
        return DemoGguf(out / TARGET_NAME, out / DRAFT_NAME, record)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".writing", dir=out.parent))
    try:
        tensors = read_safetensors(model_dir / "model.safetensors")
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
        files: dict[str, Any] = {}
        for name, qtype in ((TARGET_NAME, "BF16"), (DRAFT_NAME, "Q8_0")):
            _write_gguf(tmp / name, config, tokenizer, tensors, qtype)
            checked = _check_gguf(tmp / name, config, tensors, qtype)
            files[name] = {"sha256": file_sha256(tmp / name), "bytes": (tmp / name).stat().st_size,
                           "matrices": qtype, "checked": checked}
        record = {"source": source, "files": files,
                  "what": "tuner/demo converted to GGUF for llama-server (tuner/engines/llamacpp/gguf_model.py)"}
        (tmp / RECORD_NAME).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted the demo model to GGUF in %s", out)
    return DemoGguf(out / TARGET_NAME, out / DRAFT_NAME, record)


def _reusable(out: Path, source: dict[str, Any]) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads((out / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("source") != source:
        return None
    for name, entry in (record.get("files") or {}).items():
        path = out / name
        if not path.is_file() or file_sha256(path) != entry.get("sha256"):
            return None
    return record if set(record.get("files") or {}) == {TARGET_NAME, DRAFT_NAME} else None


# ---------------------------------------------------------------- reading safetensors (no torch)

_DTYPES = {"BF16": ("<u2", 2), "F16": ("<f2", 2), "F32": ("<f4", 4)}


def read_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of a safetensors file as float32 numpy arrays (BF16 widened exactly)."""
    import numpy as np

    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    base = 8 + size
    out: dict[str, Any] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = meta["dtype"]
        if dtype not in _DTYPES:
            raise UsageError(f"{path}: tensor {name} is {dtype}; the demo converter reads BF16, F16 and F32")
        begin, end = meta["data_offsets"]
        array = np.frombuffer(raw[base + begin:base + end], dtype=_DTYPES[dtype][0]).reshape(meta["shape"])
        if dtype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array.astype(np.float32)
    return out


# ---------------------------------------------------------------- writing GGUF

def _permute(weights: Any, n_head: int) -> Any:
    """HF Llama's rotary halves → llama.cpp's interleaved pairs (``convert_hf_to_gguf.py``'s ``permute``)."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _gguf_tensors(config: dict[str, Any], tensors: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(GGUF name, float32 array) in llama.cpp's Llama layout."""
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    yield "token_embd.weight", tensors["model.embed_tokens.weight"]
    for i in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{i}."
        yield f"blk.{i}.attn_norm.weight", tensors[p + "input_layernorm.weight"]
        yield f"blk.{i}.attn_q.weight", _permute(tensors[p + "self_attn.q_proj.weight"], heads)
        yield f"blk.{i}.attn_k.weight", _permute(tensors[p + "self_attn.k_proj.weight"], kv_heads)
        yield f"blk.{i}.attn_v.weight", tensors[p + "self_attn.v_proj.weight"]
        yield f"blk.{i}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"]
        yield f"blk.{i}.ffn_norm.weight", tensors[p + "post_attention_layernorm.weight"]
        yield f"blk.{i}.ffn_gate.weight", tensors[p + "mlp.gate_proj.weight"]
        yield f"blk.{i}.ffn_up.weight", tensors[p + "mlp.up_proj.weight"]
        yield f"blk.{i}.ffn_down.weight", tensors[p + "mlp.down_proj.weight"]
    yield "output_norm.weight", tensors["model.norm.weight"]
    if not config.get("tie_word_embeddings", False):
        yield "output.weight", tensors["lm_head.weight"]


SPLIT_TEXT_TOKENS = frozenset({"<｜DSML｜tool_calls>"})
"""Added text tokens written as ordinary ones: llama-server's tool-call grammar trigger (:func:`_tokenizer_fields`)."""


def _byte_level(text: str) -> str:
    """``text`` in GPT-2's byte-level alphabet, as a byte-level BPE vocabulary stores an ordinary token."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode("utf-8"))


def _tokenizer_fields(tokenizer: dict[str, Any], vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, their types and the merges. The demo's added DSML markers other than ``｜DSML｜`` itself
    (``<｜DSML｜tool_calls>``, ``<｜DSML｜invoke``...) are whole tokens in its vocabulary, and llama-server refuses
    a tool request whose grammar trigger (``<｜DSML｜tool_calls>``) is one token it does not preserve ("Grammar
    trigger word should be marked as preserved token"). So they are written as ordinary tokens: the model may
    still emit them (they decode to their text, and the parser reads the text), but text is never tokenized
    into them: a prompt that holds a marker is tokenized into ``｜DSML｜`` and its pieces, as a vocabulary without
    such tokens does (the real DeepSeek V4 GGUFs llama.cpp serves). Prompts without a marker are unchanged."""
    import gguf

    vocab: dict[str, int] = dict(tokenizer["model"]["vocab"])
    types = {i: int(gguf.TokenType.NORMAL) for i in vocab.values()}
    for added in tokenizer.get("added_tokens", []):
        content, index = str(added["content"]), int(added["id"])
        if added.get("special"):
            vocab[content], types[index] = index, int(gguf.TokenType.CONTROL)
        elif content in SPLIT_TEXT_TOKENS:
            vocab[_byte_level(content)], types[index] = index, int(gguf.TokenType.NORMAL)
        else:
            vocab[content], types[index] = index, int(gguf.TokenType.USER_DEFINED)
    by_id = {i: t for t, i in vocab.items()}
    if sorted(by_id) != list(range(vocab_size)):
        raise UsageError(f"the demo tokenizer's ids are not 0..{vocab_size - 1}; the converter cannot lay them out")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"].get("merges", [])]
    return [by_id[i] for i in range(vocab_size)], [types[i] for i in range(vocab_size)], merges


def _write_gguf(path: Path, config: dict[str, Any], tokenizer: dict[str, Any], tensors: dict[str, Any],
                qtype: str) -> None:
    import gguf
    import numpy as np

    vocab_size = int(config["vocab_size"])
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("dsv4-tune demo")
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config["num_key_value_heads"]))
    writer.add_rope_dimension_count(int(config["head_dim"]))
    writer.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16 if qtype == "BF16" else gguf.LlamaFileType.MOSTLY_Q8_0))
    tokens, types, merges = _tokenizer_fields(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(int(config["bos_token_id"]))
    writer.add_eos_token_id(int(config["eos_token_id"]))
    writer.add_pad_token_id(int(config.get("pad_token_id", config["eos_token_id"])))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE_FILE.read_text(encoding="utf-8"))
    quant = gguf.GGMLQuantizationType.BF16 if qtype == "BF16" else gguf.GGMLQuantizationType.Q8_0
    for name, array in _gguf_tensors(config, tensors):
        data = np.ascontiguousarray(array, dtype=np.float32)
        if data.ndim == 1:
            writer.add_tensor(name, data)  # norms stay F32, as llama.cpp's converter writes them
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _check_gguf(path: Path, config: dict[str, Any], tensors: dict[str, Any], qtype: str) -> dict[str, Any]:
    """Read ``path`` back and compare every tensor with the source: exact for BF16/F32, Q8_0 within its step."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    found = {t.name: t for t in reader.tensors}
    expected = dict(_gguf_tensors(config, tensors))
    if set(found) != set(expected):
        raise UsageError(f"{path}: tensors {sorted(set(found) ^ set(expected))} differ from the source's layout")
    worst = 0.0
    for name, source in expected.items():
        tensor = found[name]
        back = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(source.shape)
        if tensor.tensor_type in (gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32):
            if not np.array_equal(back, source):
                raise UsageError(f"{path}: tensor {name} does not read back bit for bit")
        else:
            scale = float(np.abs(source).max()) or 1.0
            worst = max(worst, float(np.abs(back - source).max()) / scale)
            if worst > 1 / 127:  # Q8_0: one step of 1/127 of a block's largest value
                raise UsageError(f"{path}: tensor {name} reads back {worst:.4f} of its range away from the source")
    return {"tensors": len(expected), "exact": qtype == "BF16", "max_relative_error": round(worst, 6)}
