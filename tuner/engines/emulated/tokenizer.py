"""A deterministic, reversible tokenizer with DeepSeek-V4's special tokens and vocabulary size.

No hub is reachable, so the emulator cannot load DSV4's real tokenizer. This one keeps what the
tuner relies on: the vocabulary size (129,280), DSV4's special tokens as single ids (skipped on
decode, as vLLM's ``skip_special_tokens``), ``<think>``, ``</think>`` and ``｜DSML｜`` as atomic
tokens that stay visible, ``decode(encode(text)) == text`` for any text, and roughly 3 characters per
token on English text. Ids:

- ``0 … 63``: special and added tokens (:data:`SPECIAL_TOKENS`, :data:`ADDED_TOKENS`);
- ``64 … 319``: single bytes;
- ``320 … 65,855``: byte pairs;
- ``65,856 … 98,623``: three characters of ``a-z``, space and ``.,'-`` and newline;
- ``98,624 … 129,279``: opaque ids (random prompts use them): each decodes to a short made-up word.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

__all__ = [
    "ADDED_TOKENS",
    "BOS",
    "EOS",
    "SPECIAL_TOKENS",
    "TOKENIZER",
    "VOCAB_SIZE",
    "Tokenizer",
]

# DeepSeek-V4's token strings as vLLM 0.32 spells them (vllm/tokenizers/deepseek_v4_encoding.py).
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS, EOS, "<｜User｜>", "<｜Assistant｜>", "<｜latest_reminder｜>", "<｜deepseek_image｜>",
    "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>",
)
"""Skipped when decoding with ``skip_special_tokens`` (vLLM's default for responses)."""
ADDED_TOKENS: tuple[str, ...] = (
    "<think>", "</think>", "｜DSML｜", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", '<｜DSML｜invoke name="',
    "</｜DSML｜invoke>", '<｜DSML｜parameter name="', "</｜DSML｜parameter>", '" string="true">', '" string="false">',
    '">', "<tool_result>", "</tool_result>",
)
"""Atomic but not special: visible in text when no parser takes them out (the DSML tags are single
tokens, so a tool call costs about as many tokens as with a real BPE vocabulary)."""

VOCAB_SIZE = 129_280
_BYTE0 = 64
_PAIR0 = _BYTE0 + 256
_TRI0 = _PAIR0 + 65_536
_ALPHABET = b"abcdefghijklmnopqrstuvwxyz .,'-\n"
_OPAQUE0 = _TRI0 + len(_ALPHABET) ** 3
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "ta", "vo", "si", "de", "pa", "zu", "fe")


class Tokenizer:
    """See the module docstring."""

    def __init__(self) -> None:
        self.specials = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        self.added = {t: len(SPECIAL_TOKENS) + i for i, t in enumerate(ADDED_TOKENS)}
        self.atomic = {**self.specials, **self.added}
        self.by_id = {i: t for t, i in self.atomic.items()}
        self.bos_id = self.specials[BOS]
        self.eos_id = self.specials[EOS]
        self._split = re.compile("(" + "|".join(re.escape(t) for t in sorted(self.atomic, key=len,
                                                                                 reverse=True)) + ")")

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        out = [self.bos_id] if add_special_tokens else []
        for piece in self._split.split(text):
            if not piece:
                continue
            atomic = self.atomic.get(piece)
            if atomic is not None:
                out.append(atomic)
            else:
                out.extend(_encode_plain(piece))
        return out

    def is_special(self, token_id: int) -> bool:
        return 0 <= token_id < len(SPECIAL_TOKENS)

    def token_bytes(self, token_id: int) -> bytes:
        return _token_bytes(token_id)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        return b"".join(_token_bytes(i) for i in ids
                        if not (skip_special_tokens and 0 <= i < len(SPECIAL_TOKENS))).decode("utf-8", "replace")

    def token_str(self, token_id: int) -> str:
        """One token's text on its own (vLLM's ``decoded_token`` / ``token_strs``)."""
        return _token_bytes(token_id).decode("utf-8", "replace")

    def pieces(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> list[str]:
        """The text each token adds when decoding left to right (incomplete characters wait)."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        out = []
        for i in ids:
            if skip_special_tokens and 0 <= i < len(SPECIAL_TOKENS):
                out.append("")
            else:
                out.append(decoder.decode(_token_bytes(i)))
        if out:
            out[-1] += decoder.decode(b"", final=True)
        return out


def _encode_plain(text: str) -> list[int]:
    data = text.encode("utf-8")
    out: list[int] = []
    n = len(data)
    i = 0
    index = _INDEX
    while i < n:
        if i + 2 < n:
            a, b, c = index.get(data[i]), index.get(data[i + 1]), index.get(data[i + 2])
            if a is not None and b is not None and c is not None:
                out.append(_TRI0 + (a << 10) + (b << 5) + c)
                i += 3
                continue
        if i + 1 < n:
            out.append(_PAIR0 + (data[i] << 8) + data[i + 1])
            i += 2
        else:
            out.append(_BYTE0 + data[i])
            i += 1
    return out


@lru_cache(maxsize=65_536)
def _token_bytes(token_id: int) -> bytes:
    if token_id < 0 or token_id >= VOCAB_SIZE:
        raise ValueError(f"token id {token_id} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
    if token_id < _BYTE0:
        names = SPECIAL_TOKENS + ADDED_TOKENS
        return names[token_id].encode() if token_id < len(names) else b""
    if token_id < _PAIR0:
        return bytes([token_id - _BYTE0])
    if token_id < _TRI0:
        v = token_id - _PAIR0
        return bytes([v >> 8, v & 0xFF])
    if token_id < _OPAQUE0:
        v = token_id - _TRI0
        return bytes([_ALPHABET[v >> 10], _ALPHABET[(v >> 5) & 31], _ALPHABET[v & 31]])
    v = token_id - _OPAQUE0
    word = " " + _SYLLABLES[v % 12] + _SYLLABLES[(v // 12) % 12] + _SYLLABLES[(v // 144) % 12]
    return word.encode()


TOKENIZER = Tokenizer()
"""The emulator's one tokenizer."""
