"""Load generator against scripted SSE streams (httpx.MockTransport: no network, no server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from tuner.errors import LoadError, TunerError
from tuner.load.generator import LoadResult, run_load, run_load_sync
from tuner.load.metrics import summarize
from tuner.load.workload import Workload, make_prompts, make_warmup_prompts

BASE = "http://server.test:8000"
VOCAB = 4096

Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]


def _event(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _text_chunk(text: str, finish: str | None = None) -> bytes:
    return _event({"id": "cmpl-1", "object": "text_completion", "model": "tiny",
                   "choices": [{"index": 0, "text": text, "logprobs": None,
                                "finish_reason": finish, "stop_reason": None}]})


def _usage_chunk(prompt_tokens: int, completion_tokens: int) -> bytes:
    return _event({"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}})


DONE = b"data: [DONE]\n\n"


async def _paced(parts: list[bytes], gap_s: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if gap_s:
            await asyncio.sleep(gap_s)
        yield part


def _normal_parts(body: dict[str, Any], *, usage: bool = True) -> list[bytes]:
    n = body["max_tokens"]
    parts = [_text_chunk(f"t{i}", "length" if i == n - 1 else None) for i in range(n)]
    if usage:
        parts.append(_usage_chunk(len(body["prompt"]), n))
    return [*parts, DONE]


def _streaming(make_parts: Callable[[dict[str, Any]], list[bytes]], gap_s: float = 0.0) -> Handler:
    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=_paced(make_parts(body), gap_s))
    return handler


def _run(handler: Handler, workload: Workload, **kwargs: Any) -> LoadResult:
    return run_load_sync(BASE, "tiny", workload, vocab_size=VOCAB,
                         transport=httpx.MockTransport(handler), **kwargs)


# --- workload ------------------------------------------------------------------------------------


def test_workload_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Workload.model_validate({"input_len": 8, "inputlen": 8})
    for bad in ({"input_len": 0}, {"output_len": -1}, {"num_prompts": 0}, {"concurrency": 0},
                {"range_ratio": 1.0}, {"range_ratio": -0.1}, {"request_rate": 0.0},
                {"warmup_prompts": -1}):
        with pytest.raises(ValidationError):
            Workload.model_validate(bad)
    assert Workload(warmup_prompts=0).warmup_prompts == 0


def test_prompts_are_deterministic_exact_and_avoid_low_ids() -> None:
    w = Workload(input_len=50, output_len=20, range_ratio=0.2, num_prompts=40, seed=3)
    first, again = make_prompts(w, VOCAB), make_prompts(w, VOCAB)
    assert first == again
    assert first != make_prompts(w.model_copy(update={"seed": 4}), VOCAB)
    assert len(first) == 40
    in_lens = {len(p.token_ids) for p in first}
    out_lens = {p.output_len for p in first}
    assert min(in_lens) >= 40 and max(in_lens) <= 60 and len(in_lens) > 1
    assert min(out_lens) >= 16 and max(out_lens) <= 24 and len(out_lens) > 1
    assert all(100 <= t < VOCAB for p in first for t in p.token_ids)
    fixed = make_prompts(Workload(input_len=7, output_len=3, num_prompts=5), VOCAB)
    assert {len(p.token_ids) for p in fixed} == {7} and {p.output_len for p in fixed} == {3}
    # A tiny vocabulary still works: ids from vocab_size // 2 up.
    small = make_prompts(Workload(input_len=30, num_prompts=2), 10)
    assert all(5 <= t < 10 for p in small for t in p.token_ids)
    # Warm-up prompts are other prompts (no shared prefix cache with the measured ones).
    warm = make_warmup_prompts(Workload(warmup_prompts=3), VOCAB)
    assert len(warm) == 3 and not set(warm) & set(make_prompts(Workload(), VOCAB))
    with pytest.raises(LoadError):
        make_prompts(w, 1)
    assert issubclass(LoadError, TunerError)


# --- normal streams ------------------------------------------------------------------------------


def test_normal_stream_records_timings_tokens_and_request_body() -> None:
    seen: list[httpx.Request] = []
    inner = _streaming(_normal_parts, gap_s=0.02)

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return await inner(request)

    w = Workload(input_len=12, output_len=5, num_prompts=4, concurrency=2, warmup_prompts=2)
    result = _run(handler, w, api_key="sk-test")

    assert len(seen) == 6  # 2 warm-up + 4 measured
    assert len(result.records) == 4 and not result.stopped
    assert result.concurrency == 2 and result.request_rate is None
    body = json.loads(seen[-1].content)
    assert seen[-1].url == f"{BASE}/v1/completions"
    assert seen[-1].headers["authorization"] == "Bearer sk-test"
    assert body["model"] == "tiny" and body["stream"] is True and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True
    assert body["max_tokens"] == 5 and len(body["prompt"]) == 12
    assert all(isinstance(t, int) for t in body["prompt"])
    measured_prompts = [list(p.token_ids) for p in make_prompts(w, VOCAB)]
    assert sorted(json.loads(r.content)["prompt"] for r in seen[2:]) == sorted(measured_prompts)

    for rec in result.records:
        assert rec.ok and rec.error == ""
        assert rec.prompt_tokens == 12 and rec.output_tokens == 5
        assert rec.ttft_s is not None and rec.ttft_s >= 0.015
        assert len(rec.itl_s) == 4 and all(gap >= 0.015 for gap in rec.itl_s)
        assert rec.e2e_s == pytest.approx(rec.ttft_s + sum(rec.itl_s), abs=1e-6)
        assert 0.0 <= rec.start_s < result.duration_s
    # Two at a time, each ~5-6 gaps of 20 ms: the window cannot be shorter than two rounds.
    assert result.duration_s >= 2 * 5 * 0.015


def test_no_auth_header_without_key_and_trailing_slash_base_url() -> None:
    seen: list[httpx.Request] = []
    inner = _streaming(_normal_parts)

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return await inner(request)

    result = run_load_sync(BASE + "/", "tiny", Workload(num_prompts=1, warmup_prompts=0, output_len=2),
                           vocab_size=VOCAB, transport=httpx.MockTransport(handler))
    assert result.records[0].ok
    assert "authorization" not in seen[0].headers
    assert seen[0].url == f"{BASE}/v1/completions"


def test_ttft_waits_for_text_and_tokens_fall_back_to_chunk_count() -> None:
    def parts(body: dict[str, Any]) -> list[bytes]:
        # An empty-text chunk first (e.g. half a UTF-8 character), no usage chunk, a ping comment.
        return [_text_chunk(""), b": ping\n\n", _text_chunk("a"), _text_chunk("b"),
                _text_chunk("c", "length"), DONE]

    w = Workload(input_len=9, output_len=4, num_prompts=1, warmup_prompts=0)
    rec = _run(_streaming(parts, gap_s=0.03), w).records[0]
    assert rec.ok
    assert rec.output_tokens == 4  # four chunks with a choice
    assert rec.prompt_tokens == 9  # the prompt's own length
    assert len(rec.itl_s) == 2  # gaps a→b, b→c; the empty chunk is before the first token
    assert rec.ttft_s is not None and rec.ttft_s >= 2 * 0.025  # two paced parts before "a"


# --- failures ------------------------------------------------------------------------------------


def test_http_500_is_a_failed_record_and_counted() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls % 2 == 0:
            return httpx.Response(500, json={"object": "error", "message": "engine dead"})
        return await _streaming(_normal_parts)(request)

    w = Workload(input_len=4, output_len=3, num_prompts=6, concurrency=1, warmup_prompts=0)
    result = _run(handler, w)
    assert len(result.records) == 6
    failed = [r for r in result.records if not r.ok]
    assert len(failed) == 3
    assert all(r.error.startswith("HTTP 500") and "engine dead" in r.error for r in failed)
    assert all(r.ttft_s is None and r.itl_s == () for r in failed)
    summary = summarize(result)
    assert summary["completed"] == 3 and summary["failed"] == 3
    assert summary["total_output_tokens"] == 9


def test_stream_cut_before_done_is_a_failed_record() -> None:
    def parts(body: dict[str, Any]) -> list[bytes]:
        return [_text_chunk("a"), _text_chunk("b")]  # the connection closes cleanly, no [DONE]

    rec = _run(_streaming(parts), Workload(num_prompts=1, warmup_prompts=0)).records[0]
    assert not rec.ok
    assert "[DONE]" in rec.error
    assert rec.ttft_s is not None  # what did arrive is kept


def test_disconnect_mid_stream_is_a_failed_record() -> None:
    async def broken(request: httpx.Request) -> AsyncIterator[bytes]:
        yield _text_chunk("a")
        raise httpx.RemoteProtocolError("peer closed connection", request=request)

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=broken(request))

    rec = _run(handler, Workload(num_prompts=1, warmup_prompts=0)).records[0]
    assert not rec.ok and "RemoteProtocolError" in rec.error


def test_error_object_inside_stream_and_malformed_json_fail() -> None:
    def parts(body: dict[str, Any]) -> list[bytes]:
        if body["max_tokens"] == 1:
            return [_text_chunk("a"), _event({"error": {"message": "boom", "code": 500}}), DONE]
        return [_text_chunk("a"), b"data: {not json\n\n", DONE]

    errs = _run(_streaming(parts), Workload(num_prompts=1, warmup_prompts=0, output_len=1)).records
    assert not errs[0].ok and "boom" in errs[0].error
    bad = _run(_streaming(parts), Workload(num_prompts=1, warmup_prompts=0, output_len=2)).records
    assert not bad[0].ok and "malformed" in bad[0].error


def test_done_without_any_token_fails() -> None:
    rec = _run(_streaming(lambda body: [_usage_chunk(3, 0), DONE]),
               Workload(num_prompts=1, warmup_prompts=0)).records[0]
    assert not rec.ok and "without any generated token" in rec.error


def test_transport_timeout_is_a_failed_record() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out reading", request=request)

    result = _run(handler, Workload(num_prompts=3, warmup_prompts=1))
    assert len(result.records) == 3
    assert all(not r.ok and r.error.startswith("timeout") for r in result.records)
    assert summarize(result)["failed"] == 3


def test_slow_stream_hits_the_request_deadline() -> None:
    def parts(body: dict[str, Any]) -> list[bytes]:
        return [_text_chunk("a"), _text_chunk("b"), _text_chunk("c"), DONE]

    w = Workload(num_prompts=2, warmup_prompts=0, concurrency=2)
    result = _run(_streaming(parts, gap_s=0.2), w, request_timeout_s=0.3)
    assert [r.ok for r in result.records] == [False, False]
    assert all("within 0.3 s" in r.error for r in result.records)
    assert all(r.e2e_s >= 0.29 for r in result.records)


# --- concurrency, pacing, stopping ---------------------------------------------------------------


def test_concurrency_cap_is_respected() -> None:
    in_flight = peak = 0

    async def counted(body: dict[str, Any]) -> AsyncIterator[bytes]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            async for part in _paced(_normal_parts(body), 0.01):
                yield part
        finally:
            in_flight -= 1

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=counted(json.loads(request.content)))

    result = _run(handler, Workload(num_prompts=12, concurrency=3, output_len=3, warmup_prompts=0))
    assert all(r.ok for r in result.records)
    assert peak == 3


def test_poisson_arrivals_spread_the_sends() -> None:
    w = Workload(num_prompts=6, concurrency=6, output_len=2, warmup_prompts=0, request_rate=20.0)
    result = _run(_streaming(_normal_parts), w)
    starts = [r.start_s for r in result.records]
    assert all(r.ok for r in result.records) and result.request_rate == 20.0
    assert starts == sorted(starts)
    # Five exponential gaps at 20/s: mean 0.25 s in all; unpaced sends would all start at ~0.
    assert starts[-1] > 0.25  # seed 0 draws 0.49 s of gaps


def test_should_stop_ends_the_run_quickly_and_keeps_what_was_sent() -> None:
    finished = 0
    inner = _streaming(_normal_parts, gap_s=0.05)

    async def handler(request: httpx.Request) -> httpx.Response:
        return await inner(request)

    def should_stop() -> bool:
        return finished >= 1

    w = Workload(num_prompts=50, concurrency=2, output_len=4, warmup_prompts=0)

    async def main() -> LoadResult:
        nonlocal finished

        async def watcher() -> None:
            nonlocal finished
            await asyncio.sleep(0.12)
            finished = 1

        task = asyncio.create_task(watcher())
        result = await run_load(BASE, "tiny", w, vocab_size=VOCAB, should_stop=should_stop,
                                transport=httpx.MockTransport(handler))
        await task
        return result

    result = asyncio.run(main())
    assert result.stopped
    assert 1 <= len(result.records) < 50  # ended before its 50 prompts were sent (unstopped: 25 rounds of ~0.3 s)
    stopped = [r for r in result.records if not r.ok]
    assert all(r.error.startswith("stopped") for r in stopped)


def test_stop_before_start_sends_nothing() -> None:
    calls = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(500)

    result = _run(handler, Workload(num_prompts=5), should_stop=lambda: True)
    assert result.stopped and result.records == () and calls == 0


def test_bad_arguments_raise_load_error() -> None:
    with pytest.raises(LoadError):
        _run(_streaming(_normal_parts), Workload(), request_timeout_s=0)

    async def inside_loop() -> None:
        run_load_sync(BASE, "tiny", Workload(), vocab_size=VOCAB)

    with pytest.raises(LoadError, match="running event loop"):
        asyncio.run(inside_loop())


def test_a_client_kept_off_the_cpu_is_starved_not_saturated() -> None:
    """Loop lag with little CPU is the scheduler's doing (shared cores); with much CPU, the client's own."""
    from tuner.load.generator import combine_client_stats

    lagging = [0.001] * 90 + [0.7] * 10
    starved = combine_client_stats([{"lags_s": lagging, "cpu_s": 0.5, "wall_s": 10.0, "events": 100}], "aiohttp")
    assert starved.starved and not starved.saturated
    busy = combine_client_stats([{"lags_s": lagging, "cpu_s": 8.0, "wall_s": 10.0, "events": 100}], "aiohttp")
    assert busy.saturated and not busy.starved
    calm = combine_client_stats([{"lags_s": [0.001] * 100, "cpu_s": 0.5, "wall_s": 10.0, "events": 100}],
                                "aiohttp")
    assert not calm.starved and not calm.saturated
    assert starved.to_json()["client_starved"] is True
