"""Request parsing and response bodies of the OpenAI-compatible API, shaped as vLLM 0.32 shapes them.

Pure functions: what the model answers (:class:`Answer`) and how it is spelled in JSON. Bodies follow
``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``: non-streamed responses carry
every field (``None`` included), streamed chunks only the fields vLLM sets (``exclude_unset``), the
usage chunk comes last when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``.
Errors are ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.engines.emulated.dsv4_output import ChatOutput
from tuner.engines.emulated.pseudo_model import PseudoModel
from tuner.engines.emulated.tokenizer import TOKENIZER

__all__ = ["Answer", "ApiError", "chat_chunk", "chat_logprobs", "chat_response", "completion_chunk",
           "completion_response", "error_body", "prompt_logprobs", "usage"]


class ApiError(Exception):
    """A request vLLM would refuse: HTTP ``status`` with vLLM's error body."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.status, self.param)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


@dataclass(frozen=True)
class Answer:
    """What the server will stream for one request: its ids, text per token, and how it ends."""

    request_id: str
    model: str
    created: int
    prompt_ids: tuple[int, ...]
    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    finish_reason: str
    chat: ChatOutput | None = None

    @classmethod
    def new(cls, prefix: str, model: str, prompt_ids: Sequence[int], ids: Sequence[int], finish_reason: str,
            chat: ChatOutput | None = None) -> Answer:
        return cls(request_id=f"{prefix}-{secrets.token_hex(16)}", model=model, created=int(time.time()),
                   prompt_ids=tuple(prompt_ids), ids=tuple(ids), pieces=tuple(TOKENIZER.pieces(ids)),
                   finish_reason=finish_reason, chat=chat)


def usage(answer: Answer) -> dict[str, Any]:
    prompt = len(answer.prompt_ids)
    done = len(answer.ids)
    return {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done,
            "prompt_tokens_details": None}


def prompt_logprobs(model: PseudoModel, ids: Sequence[int], top_k: int) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: None for the first token, then the scored token and the top ``top_k``."""
    out: list[dict[str, Any] | None] = [None]
    for pos in range(1, len(ids)):
        context = ids[:pos]
        token = ids[pos]
        entry: dict[str, Any] = {}
        for rank, (candidate, lp) in enumerate(model.top(context)[:top_k], start=1):
            entry[str(candidate)] = {"logprob": lp, "rank": rank, "decoded_token": TOKENIZER.token_str(candidate)}
        if str(token) not in entry:
            entry[str(token)] = {"logprob": model.logprob(context, token), "rank": model.rank(context, token),
                                 "decoded_token": TOKENIZER.token_str(token)}
        out.append(entry)
    return out


def completion_logprobs(model: PseudoModel, answer: Answer, top_k: int) -> dict[str, Any]:
    """``choices[0].logprobs`` of a completion (``logprobs: k``)."""
    seq = list(answer.prompt_ids)
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = 0
    for token, piece in zip(answer.ids, answer.pieces, strict=True):
        tokens.append(TOKENIZER.token_str(token))
        token_logprobs.append(model.logprob(seq, token))
        top.append({TOKENIZER.token_str(c): lp for c, lp in model.top(seq)[:top_k]} if top_k else None)
        offsets.append(offset)
        offset += len(piece)
        seq.append(token)
    return {"text_offset": offsets, "token_logprobs": token_logprobs, "tokens": tokens, "top_logprobs": top}


def chat_logprobs(model: PseudoModel, answer: Answer, top_k: int) -> dict[str, Any]:
    """``choices[0].logprobs`` of a chat answer (``logprobs: true``, ``top_logprobs: k``)."""
    seq = list(answer.prompt_ids)
    content = []
    for token in answer.ids:
        text = TOKENIZER.token_str(token)
        top = [{"token": TOKENIZER.token_str(c), "logprob": lp, "bytes": list(TOKENIZER.token_str(c).encode())}
               for c, lp in model.top(seq)[:top_k]]
        content.append({"token": text, "logprob": model.logprob(seq, token), "bytes": list(text.encode()),
                        "top_logprobs": top})
        seq.append(token)
    return {"content": content}


def completion_response(answer: Answer, *, logprobs: dict[str, Any] | None, prompt_lps: list[Any] | None,
                        return_token_ids: bool, echo_text: str = "") -> dict[str, Any]:
    return {
        "id": answer.request_id, "object": "text_completion", "created": answer.created, "model": answer.model,
        "choices": [{"index": 0, "text": echo_text + "".join(answer.pieces), "logprobs": logprobs,
                     "finish_reason": answer.finish_reason, "stop_reason": None,
                     "token_ids": list(answer.ids) if return_token_ids else None,
                     "prompt_logprobs": prompt_lps,
                     "prompt_token_ids": list(answer.prompt_ids) if return_token_ids else None,
                     "routed_experts": None}],
        "service_tier": None, "system_fingerprint": None, "usage": usage(answer),
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }


def _data(body: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def completion_chunk(answer: Answer, text: str, finish_reason: str | None, token_ids: list[int] | None) -> bytes:
    return _data({"id": answer.request_id, "object": "text_completion", "created": answer.created,
                  "model": answer.model,
                  "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                               "stop_reason": None, "prompt_token_ids": None, "token_ids": token_ids}]})


def usage_chunk(answer: Answer, *, chat: bool) -> bytes:
    return _data({"id": answer.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                  "created": answer.created, "model": answer.model, "choices": [], "usage": usage(answer)})


def error_chunk(message: str) -> bytes:
    return _data(error_body(message, "InternalServerError", 500))


DONE = b"data: [DONE]\n\n"


def chat_message(output: ChatOutput) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": output.content, "refusal": None,
                               "annotations": None, "audio": None, "function_call": None}
    if output.tool_calls:
        message["tool_calls"] = [dict(c) for c in output.tool_calls]
    message["reasoning"] = output.reasoning
    return message


def chat_response(answer: Answer, *, prompt_text: str | None, return_token_ids: bool,
                  logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    assert answer.chat is not None
    return {
        "id": answer.request_id, "object": "chat.completion", "created": answer.created, "model": answer.model,
        "choices": [{"index": 0, "message": chat_message(answer.chat), "logprobs": logprobs,
                     "finish_reason": answer.finish_reason, "stop_reason": None,
                     "token_ids": list(answer.ids) if return_token_ids else None, "routed_experts": None}],
        "service_tier": None, "system_fingerprint": None, "usage": usage(answer), "prompt_logprobs": None,
        "prompt_token_ids": list(answer.prompt_ids) if return_token_ids else None, "prompt_text": prompt_text,
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }


def chat_chunk(answer: Answer, delta: Mapping[str, Any], finish_reason: str | None) -> bytes:
    return _data({"id": answer.request_id, "object": "chat.completion.chunk", "created": answer.created,
                  "model": answer.model,
                  "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}]})


def merge_deltas(deltas: Sequence[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The deltas of the tokens one engine step produced, as the one chunk vLLM sends for them."""
    out: dict[str, Any] = {}
    for delta in deltas:
        if not delta:
            continue
        for key in ("reasoning", "content"):
            if key in delta:
                out[key] = out.get(key, "") + delta[key]
        if "tool_calls" in delta:
            out.setdefault("tool_calls", []).extend(delta["tool_calls"])
    return out
