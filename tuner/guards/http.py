"""The guards' one HTTP client: every call has a timeout and carries the trial's API key.

A refused request (HTTP ≥ 400) is not an exception of the tool: it comes back as a
:class:`ProbeFailure` that a guard turns into a failed result with the server's own words.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from tuner.guards.api import GuardTarget, ProbeFailure
from tuner.load.stream import RequestFailed, Stream, take_line

__all__ = ["GuardClient", "ProbeFailure", "first_message", "message_reasoning"]

log = logging.getLogger(__name__)

_BODY_SNIPPET_CHARS = 400


class GuardClient:
    """``with GuardClient(target, timeout_s) as client: client.chat({...})``."""

    def __init__(self, target: GuardTarget, timeout_s: float) -> None:
        self.target = target
        self._client = httpx.Client(base_url=target.base_url, headers=dict(target.headers),
                                    timeout=httpx.Timeout(timeout_s, connect=10.0))

    def __enter__(self) -> GuardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def _json(self, method: str, path: str, payload: Mapping[str, Any] | None = None) -> Any:
        """Send one request; any transport error, HTTP error or non-JSON body is a ProbeFailure."""
        try:
            resp = self._client.request(method, path, json=dict(payload) if payload is not None else None)
        except httpx.HTTPError as exc:
            raise ProbeFailure(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise ProbeFailure(f"{method} {path} → HTTP {resp.status_code}: {_server_message(resp)}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ProbeFailure(f"{method} {path} → HTTP {resp.status_code} with a body that is not JSON") from exc

    def post(self, path: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        body = self._json("POST", path, payload)
        if not isinstance(body, dict):
            raise ProbeFailure(f"POST {path} → JSON {type(body).__name__}, expected an object")
        return body

    def get(self, path: str) -> dict[str, Any]:
        body = self._json("GET", path)
        return body if isinstance(body, dict) else {"data": body}

    def chat(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """One non-streamed chat completion; returns the whole response body."""
        return self.post("/v1/chat/completions", {"model": self.target.model, **self.fit_to_context(payload)})

    def fit_to_context(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """``payload`` with ``max_tokens`` cut to the room its prompt leaves in the served context.

        A probe's ``max_tokens`` is sized for a model that reasons at length (4,096 on thinking probes),
        and vLLM refuses a request whose ``max_tokens`` passes ``max_model_len`` less the prompt (HTTP 400)
        rather than stop at the context's end. So the prompt is counted with the server's own ``/tokenize``
        (which also names ``max_model_len``) and ``max_tokens`` is cut to what is left: on a 2,048-token
        CPU launch, or the 4,096 of ``mi325x1``, the answer then ends where the context ends, and one cut
        short says so ("cut at max_tokens"). A server whose ``/tokenize`` does not answer with both
        figures gets the payload as it is.
        """
        wanted = payload.get("max_tokens")
        if not isinstance(wanted, int):
            return dict(payload)
        count = {k: payload[k] for k in ("messages", "tools", "chat_template_kwargs") if k in payload}
        try:
            body = self.post("/tokenize", {"model": self.target.model, **count, "add_generation_prompt": True})
        except ProbeFailure as exc:
            log.debug("max_tokens not fitted to the context: %s", exc)
            return dict(payload)
        limit, prompt = body.get("max_model_len"), body.get("count")
        if not isinstance(limit, int) or not isinstance(prompt, int):
            return dict(payload)
        room = limit - prompt
        if room < 1:
            raise ProbeFailure(f"the prompt ({prompt} tokens) leaves no room in the served context "
                               f"(max_model_len {limit})")
        return {**payload, "max_tokens": min(wanted, room)}

    def chat_stream(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """One streamed chat completion, folded into the message a non-streamed call returns.

        The stream is read by the load generator's own reader (:func:`tuner.load.stream.take_line`):
        content and reasoning deltas joined, ``delta.tool_calls`` pieces merged by index, so a guard
        checks the streamed answer with the same code as the non-streamed one. vLLM parses tool calls
        and reasoning in streams with separate code (the parsers' ``*_streaming`` methods).
        """
        path = "/v1/chat/completions"
        payload = self.fit_to_context(payload)
        stream = Stream(chat=True, keep_text=True)
        body = {"model": self.target.model, **payload, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with self._client.stream("POST", path, json=body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ProbeFailure(f"POST {path} (stream) → HTTP {resp.status_code}: {_server_message(resp)}")
                for line in resp.iter_lines():
                    take_line(line, stream)
        except RequestFailed as exc:
            raise ProbeFailure(f"POST {path} (stream): {exc}") from exc
        except httpx.HTTPError as exc:
            raise ProbeFailure(f"POST {path} (stream) failed: {type(exc).__name__}: {exc}") from exc
        message: dict[str, Any] = {"role": "assistant", "content": "".join(stream.content) or None,
                                   "tool_calls": [stream.tool_calls[k] for k in sorted(stream.tool_calls)]}
        if stream.reasoning:
            message["reasoning"] = "".join(stream.reasoning)
        max_tokens = payload.get("max_tokens")
        if isinstance(max_tokens, int) and stream.usage_output_tokens is not None \
                and stream.usage_output_tokens >= max_tokens:
            message["finish_reason"] = "length"
        return message

    def completion(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        return self.post("/v1/completions", {"model": self.target.model, **payload})

    def tokenize_chat(self, payload: Mapping[str, Any]) -> list[int]:
        body = self.post("/tokenize", {"model": self.target.model, **payload})
        return [int(t) for t in body.get("tokens", [])]

    def tokenize_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        body = self.post("/tokenize", {"model": self.target.model, "prompt": text,
                                       "add_special_tokens": add_special_tokens})
        return [int(t) for t in body.get("tokens", [])]

    def detokenize(self, token_ids: list[int]) -> str:
        body = self.post("/detokenize", {"model": self.target.model, "tokens": token_ids})
        return str(body.get("prompt", ""))


def _server_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:_BODY_SNIPPET_CHARS]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:_BODY_SNIPPET_CHARS]
    return json.dumps(body)[:_BODY_SNIPPET_CHARS]


def message_reasoning(message: Mapping[str, Any]) -> str | None:
    """The reasoning of a response message under either name (vLLM 0.32 uses ``reasoning``)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def first_message(body: Mapping[str, Any]) -> dict[str, Any]:
    """``choices[0].message`` (a copy), with the choice's ``finish_reason`` beside its fields."""
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        raise ProbeFailure(f"response has no choices[0].message: {json.dumps(body)[:_BODY_SNIPPET_CHARS]}")
    message: dict[str, Any] = dict(choices[0]["message"])
    if choices[0].get("finish_reason") is not None:
        message["finish_reason"] = choices[0]["finish_reason"]
    return message
