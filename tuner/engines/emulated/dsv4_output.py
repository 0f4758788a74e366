"""DeepSeek-V4's raw output for an assistant turn, and what vLLM's parsers make of it.

The model writes ``{reasoning}</think>{content}`` (the prompt already ends in ``<think>`` when
thinking is on, in ``</think>`` when it is off), and a tool call as a DSML block after the content::

    \\n\\n<｜DSML｜tool_calls>\\n<｜DSML｜invoke name="get_weather">\\n
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\\n
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\\n
    </｜DSML｜invoke>\\n</｜DSML｜tool_calls>

then end-of-sentence. What the client gets depends on the server's flags, as with vLLM 0.32:

- ``--reasoning-parser deepseek_v4`` (thinking on): ``message.reasoning`` = the text before
  ``</think>``, ``content`` = the rest; without the parser everything stays in ``content``;
- ``--tool-call-parser deepseek_v4`` (with tools in the request): the DSML block becomes
  ``message.tool_calls`` (arguments as a JSON string; ``string="false"`` values read as JSON),
  ``content`` is the text before the block (``None`` when empty), text after it is dropped, and
  ``finish_reason`` is ``tool_calls``; without the parser the block stays in ``content``.

Streamed, the same split arrives as deltas: ``reasoning`` pieces, ``content`` pieces, and the tool
call in one delta once its block is complete (the tokens inside the block send nothing).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from tuner.engines.emulated.pseudo_model import filler_ids
from tuner.engines.emulated.responder import ModelTurn
from tuner.engines.emulated.tokenizer import TOKENIZER

__all__ = ["ChatOutput", "build_chat_output", "dsml_block", "raw_text"]

_DSML = "｜DSML｜"
_BLOCK_START = f"\n\n<{_DSML}tool_calls>"
_BLOCK_END = f"</{_DSML}tool_calls>"
_INVOKE = re.compile(rf"<{_DSML}invoke name=\"([^\"]+)\">\n(.*?)\n</{_DSML}invoke>", re.S)
_PARAM = re.compile(rf"<{_DSML}parameter name=\"([^\"]+)\" string=\"(true|false)\">(.*?)</{_DSML}parameter>", re.S)


def dsml_block(turn: ModelTurn) -> str:
    """The DSML tool-call block, formatted as vLLM's DSV4 encoder writes one (encode_arguments_to_dsml)."""
    invokes = []
    for call in turn.tool_calls:
        params = "\n".join(
            f'<{_DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}</{_DSML}parameter>"
            for key, value in call.arguments.items())
        invokes.append(f'<{_DSML}invoke name="{call.name}">\n{params}\n</{_DSML}invoke>')
    return f"{_BLOCK_START}\n" + "\n".join(invokes) + f"\n{_BLOCK_END}"


def raw_text(turn: ModelTurn, *, thinking: bool) -> str:
    """What the model writes for this turn (before end-of-sentence)."""
    text = (turn.reasoning or "") + "</think>" if thinking else ""
    text += turn.content
    if turn.tool_calls:
        text += dsml_block(turn)
    return text


def _parse_calls(block: str) -> list[dict[str, Any]]:
    calls = []
    for name, body in _INVOKE.findall(block):
        args: dict[str, Any] = {}
        for key, is_str, value in _PARAM.findall(body):
            if is_str == "true":
                args[key] = value
            else:
                try:
                    args[key] = json.loads(value)
                except json.JSONDecodeError:
                    args[key] = value
        calls.append({"id": f"chatcmpl-tool-{secrets.token_hex(16)}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    return calls


@dataclass(frozen=True)
class ChatOutput:
    """One chat answer: its tokens, the parsed message, and the delta each token streams."""

    ids: tuple[int, ...]
    finish_reason: str
    content: str | None
    reasoning: str | None
    tool_calls: tuple[dict[str, Any], ...]
    deltas: tuple[dict[str, Any] | None, ...]
    """Per generated token: the delta it streams (``None``: nothing yet, vLLM sends no chunk)."""


def build_chat_output(turn: ModelTurn, *, thinking: bool, max_tokens: int, ignore_eos: bool, reasoning_parser: bool,
                      tool_parser: bool, filler_seed: int) -> ChatOutput:
    """Tokenise the turn, cut it at ``max_tokens`` (or pad past end-of-sentence with ``ignore_eos``), parse it."""
    ids = [*TOKENIZER.encode(raw_text(turn, thinking=thinking)), TOKENIZER.eos_id]
    finish = "stop"
    if ignore_eos and len(ids) < max_tokens:
        ids += filler_ids(filler_seed, max_tokens - len(ids))
        finish = "length"
    if len(ids) > max_tokens:
        ids = ids[:max_tokens]
        finish = "length"
    pieces = TOKENIZER.pieces(ids)
    text = "".join(pieces)
    # Segment boundaries in the decoded text.
    split_reasoning = reasoning_parser and thinking
    think_end = text.find("</think>") if split_reasoning else -1
    if split_reasoning:
        reasoning_end = think_end if think_end >= 0 else len(text)
        content_start = think_end + len("</think>") if think_end >= 0 else len(text)
    else:
        reasoning_end = content_start = 0
    block_start = text.find(_BLOCK_START, content_start) if tool_parser else -1
    closing = text.find(_BLOCK_END, block_start) if block_start >= 0 else -1
    block_end = closing + len(_BLOCK_END) if closing >= 0 else -1
    calls = _parse_calls(text[block_start:block_end]) if block_end > 0 else []
    if calls:
        content_end = block_start
        finish = "tool_calls"  # vLLM reports tool_calls whenever the parser found calls
    else:
        content_end = len(text)
    reasoning = text[:reasoning_end] if split_reasoning else None
    content_text = text[content_start:content_end]
    content = (content_text.strip() or None) if calls else (content_text or None)
    deltas: list[dict[str, Any] | None] = []
    pos = 0
    sent_calls = False
    for piece in pieces:
        start, pos = pos, pos + len(piece)
        delta: dict[str, Any] = {}
        r = text[max(start, 0):min(pos, reasoning_end)] if split_reasoning and start < reasoning_end else ""
        if r:
            delta["reasoning"] = r
        lo, hi = max(start, content_start), min(pos, content_end)
        c = text[lo:hi] if hi > lo else ""
        if calls and c:
            c = c if content else ""
        if c:
            delta["content"] = c
        if calls and not sent_calls and pos >= block_end:
            delta["tool_calls"] = [{"index": i, "id": call["id"], "type": "function",
                                    "function": {"name": call["function"]["name"],
                                                 "arguments": call["function"]["arguments"]}}
                                   for i, call in enumerate(calls)]
            sent_calls = True
        deltas.append(delta or None)
    return ChatOutput(ids=tuple(ids), finish_reason=finish, content=content, reasoning=reasoning,
                      tool_calls=tuple(calls), deltas=tuple(deltas))
