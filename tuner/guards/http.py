"""The guards' one HTTP client: every call has a timeout and carries the trial's API key.

A refused request (HTTP ≥ 400) is not an exception of the tool: it comes back as a
:class:`ProbeFailure` that a guard turns into a failed result with the server's own words.

Chat and completion requests are OpenAI's routes, which vLLM and llama-server both serve. What the gates
need beyond them is spoken in the server's dialect (``GuardTarget.dialect``):

=====================  ==============================================  =============================================
need                   ``vllm``                                        ``llamacpp`` (llama-server)
=====================  ==============================================  =============================================
a chat's prompt ids    ``POST /tokenize {messages, ...}``               ``POST /apply-template`` then ``/tokenize``
a text's ids           ``POST /tokenize {prompt}``                      ``POST /tokenize {content, add_special}``
ids → text             ``POST /detokenize {tokens}`` → ``prompt``       ``POST /detokenize {tokens}`` → ``content``
served context         ``/v1/models`` ``max_model_len``                 ``/props`` ``default_generation_settings.n_ctx``
greedy ids             ``/v1/completions`` ``return_token_ids``         ``POST /completion`` ``return_tokens``
teacher-forced         ``prompt_logprobs`` over prompt + completion     ``/completion`` ``n_probs`` over the completion
logprobs                                                                (llama-server scores no prompt tokens)
=====================  ==============================================  =============================================
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
        self.llamacpp = target.dialect == "llamacpp"
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
        limit: Any
        prompt: Any
        try:
            if self.llamacpp:
                limit, prompt = self.served_context(), len(self.tokenize_chat(count))
            else:
                body = self.post("/tokenize", {"model": self.target.model, **count, "add_generation_prompt": True})
                limit, prompt = body.get("max_model_len"), body.get("count")
        except ProbeFailure as exc:
            log.debug("max_tokens not fitted to the context: %s", exc)
            return dict(payload)
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
        """The prompt ids a chat request renders to (with the generation prompt)."""
        if self.llamacpp:
            chat = {k: payload[k] for k in ("messages", "tools", "chat_template_kwargs") if k in payload}
            prompt = self.post("/apply-template", chat).get("prompt")
            if not isinstance(prompt, str):
                raise ProbeFailure("POST /apply-template returned no prompt")
            # llama-server leaves the template's BOS out of this text and adds the token when it serves the chat
            body = self.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})
        else:
            body = self.post("/tokenize", {"model": self.target.model, **payload})
        return [int(t) for t in body.get("tokens", [])]

    def tokenize_text(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if self.llamacpp:
            body = self.post("/tokenize", {"content": text, "add_special": add_special_tokens})
        else:
            body = self.post("/tokenize", {"model": self.target.model, "prompt": text,
                                           "add_special_tokens": add_special_tokens})
        return [int(t) for t in body.get("tokens", [])]

    def detokenize(self, token_ids: list[int]) -> str:
        body = self.post("/detokenize", {"model": self.target.model, "tokens": token_ids})
        return str(body.get("content" if self.llamacpp else "prompt", ""))

    def rendered_prompt(self, payload: Mapping[str, Any], body: Mapping[str, Any]) -> str:
        """The prompt text the server rendered for chat ``payload`` (answered by ``body``): vLLM's
        ``prompt_text`` (or its prompt ids detokenized); llama-server's ``/apply-template`` of the same chat."""
        if self.llamacpp:
            chat = {k: payload[k] for k in ("messages", "tools", "chat_template_kwargs") if k in payload}
            return str(self.post("/apply-template", chat).get("prompt") or "")
        rendered = body.get("prompt_text")
        if isinstance(rendered, str) and rendered:
            return rendered
        ids = body.get("prompt_token_ids") or []
        return self.detokenize([int(t) for t in ids]) if ids else ""

    def served_context(self) -> int:
        """The longest prompt + answer one request may have: vLLM's ``max_model_len``, llama-server's per-slot
        ``n_ctx``."""
        if self.llamacpp:
            settings = self.get("/props").get("default_generation_settings") or {}
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            if not isinstance(n_ctx, int) or n_ctx <= 0:
                raise ProbeFailure("/props names no default_generation_settings.n_ctx")
            return n_ctx
        for entry in self.get("/v1/models").get("data") or []:
            if isinstance(entry, dict) and entry.get("id") == self.target.model and entry.get("max_model_len"):
                return int(entry["max_model_len"])
        raise ProbeFailure(f"/v1/models names no max_model_len for {self.target.model!r}")

    def greedy_ids(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """The greedy completion of ``prompt_ids`` as token ids (the server's own decoding path, drafts included)."""
        if self.llamacpp:
            body = self.post("/completion", {"prompt": prompt_ids, "n_predict": max_tokens, "temperature": 0.0,
                                             "return_tokens": True, "cache_prompt": False})
            tokens = body.get("tokens")
        else:
            choices = self.completion({"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
                                       "return_token_ids": True}).get("choices") or [{}]
            tokens = choices[0].get("token_ids") if isinstance(choices[0], dict) else None
        return [int(t) for t in tokens or []]

    def teacher_forced(self, sequence: list[int], top_k: int, scored_from: int = 0
                       ) -> tuple[list[float], list[dict[str, float]]]:
        """Logprob of each token of ``sequence`` given those before it, with the top-k alternatives by token id.

        The lists have one entry per token after the first; entries before ``scored_from`` are 0.0 and ``{}``
        where the dialect scores no prompt tokens (llama-server: ``scored_from`` is the prompt's last index).
        A speculating llama-server reports logprob 0.0 for every drafted token it accepts (measured on the
        pinned build: docs/decisions.md, issue 28), so there each position is scored by a request of its own,
        whose one token the target computes.
        """
        if self.llamacpp:
            return self._forced_llamacpp(sequence, top_k, scored_from, one_per_request=self.target.is_speculative)
        body = self.completion({"prompt": sequence, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": top_k})
        choices = body.get("choices") or [{}]
        entries = choices[0].get("prompt_logprobs") if isinstance(choices[0], dict) else None
        if not isinstance(entries, list) or len(entries) != len(sequence):
            raise ProbeFailure("the server returned no prompt_logprobs for the teacher-forced sequence")
        logprobs: list[float] = []
        top: list[dict[str, float]] = []
        for token, entry in zip(sequence[1:], entries[1:], strict=True):
            if not isinstance(entry, dict) or str(token) not in entry:
                raise ProbeFailure("prompt_logprobs lack the scored token")
            logprobs.append(float(entry[str(token)]["logprob"]))
            ranked = sorted(((k, float(v["logprob"])) for k, v in entry.items()), key=lambda kv: -kv[1])
            top.append(dict(ranked[:top_k]))
        return logprobs, top

    def _forced_llamacpp(self, sequence: list[int], top_k: int, scored_from: int, *, one_per_request: bool = False
                         ) -> tuple[list[float], list[dict[str, float]]]:
        """llama-server scores generated tokens only (``n_probs``): a greedy request from the prompt scores the
        completion while it follows ``sequence``; where ``sequence`` has a token the server would not have
        chosen, that token's logprob is read from the top-k (at most the k-th's when it is not among them), and
        a new greedy request goes on from the sequence after it."""
        start = max(1, scored_from + 1)
        logprobs: list[float] = [0.0] * (start - 1)
        top: list[dict[str, float]] = [{} for _ in range(start - 1)]
        rest = sequence[start:]
        def ask(i: int) -> list[tuple[int, float, dict[str, float]]]:
            return self._scored_steps(sequence[:start + i], 1 if one_per_request else len(rest) - i, top_k)

        steps, first = ask(0), 0  # first: the position steps[0] scores
        for i, token in enumerate(rest):
            if i - first >= len(steps):  # past what the last request followed: ask again from here
                steps, first = ask(i), i
            chosen, own, alternatives = steps[i - first]
            if token == chosen:
                logprobs.append(own)
            else:  # not the server's choice: its logprob from the top-k, else at most the k-th's
                logprobs.append(alternatives.get(str(token), min(alternatives.values(), default=own)))
                steps = steps[:i - first + 1]  # the request went on from its own token, not the sequence's
            top.append(alternatives)
        return logprobs, top

    def _scored_steps(self, prompt: list[int], n: int, top_k: int) -> list[tuple[int, float, dict[str, float]]]:
        body = self.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0, "n_probs": top_k,
                                         "post_sampling_probs": False, "return_tokens": True, "cache_prompt": False})
        steps: list[tuple[int, float, dict[str, float]]] = []
        for entry in body.get("completion_probabilities") or []:
            if not isinstance(entry, dict) or "id" not in entry or "logprob" not in entry:
                raise ProbeFailure("POST /completion returned completion_probabilities without id and logprob")
            ranked = sorted(((str(int(alt["id"])), float(alt["logprob"])) for alt in entry.get("top_logprobs") or []
                             if isinstance(alt, dict)), key=lambda kv: -kv[1])
            steps.append((int(entry["id"]), float(entry["logprob"]), dict(ranked[:top_k])))
        if not steps and n:
            raise ProbeFailure("POST /completion with n_probs returned no completion_probabilities")
        return steps


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
