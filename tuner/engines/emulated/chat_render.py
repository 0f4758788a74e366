"""Chat requests rendered into DeepSeek-V4's prompt, the way vLLM's ``--tokenizer-mode deepseek_v4`` does.

The rendering is vLLM's own code (``vllm.tokenizers.deepseek_v4_encoding.encode_messages``, pure
Python); the options around it follow ``vllm/tokenizers/deepseek_v4.py``: thinking is on unless
``chat_template_kwargs`` turns it off (``thinking`` / ``enable_thinking`` false) or
``reasoning_effort`` is ``"none"``; request tools attach to the first system message (one is made
when there is none); efforts low/minimal/medium → low, max → max, anything else → high. Assistant
turns carry their reasoning under ``reasoning`` or ``reasoning_content`` (vLLM accepts both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RenderedChat", "render_chat", "thinking_enabled"]


@dataclass(frozen=True)
class RenderedChat:
    prompt: str
    thinking: bool


def thinking_enabled(request: Mapping[str, Any]) -> bool:
    kwargs = request.get("chat_template_kwargs") or {}
    effort = request.get("reasoning_effort")
    if effort == "none":
        return False
    if "thinking" not in kwargs and "enable_thinking" not in kwargs:
        return True
    return bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking"))


def _normalise(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in messages:
        msg = dict(message)
        content = msg.get("content")
        if isinstance(content, list):
            msg["content"] = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        if msg.get("role") == "assistant":
            reasoning = msg.get("reasoning") or msg.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = str(reasoning)
            for call in msg.get("tool_calls") or []:
                arguments = (call.get("function") or {}).get("arguments")
                if isinstance(arguments, str) and arguments:
                    json.loads(arguments)  # vLLM refuses a turn whose arguments are not JSON
        out.append(msg)
    return out


def render_chat(request: Mapping[str, Any]) -> RenderedChat:
    """The prompt text vLLM renders for this ``/v1/chat/completions`` body (DSV4 tokenizer mode)."""
    from vllm.tokenizers.deepseek_v4_encoding import encode_messages

    thinking = thinking_enabled(request)
    messages = _normalise(request.get("messages") or [])
    tools = request.get("tools")
    if tools:
        index = next((i for i, m in enumerate(messages) if m.get("role") == "system"), None)
        if index is None:
            messages.insert(0, {"role": "system"})
            index = 0
        messages[index] = {**messages[index], "tools": list(tools)}
    effort = request.get("reasoning_effort")
    if not isinstance(effort, str):
        level = "high" if thinking else None
    elif effort == "none":
        level = None
    elif effort == "max":
        level = "max"
    elif effort in ("low", "minimal", "medium"):
        level = "low"
    else:
        level = "high"
    prompt = encode_messages(messages, thinking_mode="thinking" if thinking else "chat", drop_thinking=True,
                             reasoning_effort=level)
    return RenderedChat(prompt=str(prompt), thinking=thinking)
