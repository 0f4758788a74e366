"""summarize() against hand-computed numbers (and vLLM's own calculate_metrics), /metrics parsing."""

from __future__ import annotations

import math

import pytest

from tuner.engines.vllm.metrics import SPEC_DECODE_COUNTERS, spec_decode_summary
from tuner.load.generator import LoadResult, RequestRecord
from tuner.load.metrics import counter_deltas, parse_prometheus, summarize


def _rec(prompt: int, out: int, ttft: float | None, itl: tuple[float, ...], e2e: float,
         ok: bool = True, start: float = 0.0) -> RequestRecord:
    return RequestRecord(ok=ok, error="" if ok else "HTTP 500: boom", prompt_tokens=prompt,
                         output_tokens=out, start_s=start, ttft_s=ttft, itl_s=itl, e2e_s=e2e)


RECORDS = (
    _rec(10, 5, 0.1, (0.1, 0.2, 0.1, 0.2), 0.7),  # TPOT (0.7 - 0.1) / 4 = 0.15
    _rec(20, 3, 0.2, (0.3, 0.1), 0.6, start=0.1),  # TPOT 0.4 / 2 = 0.2
    _rec(30, 1, 0.4, (), 0.4, start=0.2),  # one token: no TPOT, no ITL
    _rec(40, 0, None, (), 5.0, ok=False, start=0.3),  # failed: counted, in no latency
)
RESULT = LoadResult(records=RECORDS, duration_s=2.0, concurrency=4, request_rate=None)

# Hand-computed (ms). numpy default percentile: linear between order statistics at p/100*(n-1).
EXPECTED: dict[str, float] = {
    "duration": 2.0,
    "completed": 3,
    "failed": 1,
    "total_input_tokens": 60,
    "total_output_tokens": 9,
    "request_throughput": 1.5,
    "output_throughput": 4.5,
    "total_token_throughput": 34.5,
    "max_concurrency": 4,
    # TTFT [100, 200, 400]
    "mean_ttft_ms": 700 / 3,
    "median_ttft_ms": 200.0,
    "std_ttft_ms": math.sqrt(46666.666666 / 3),
    "p50_ttft_ms": 200.0,
    "p95_ttft_ms": 380.0,  # 200 + 0.9 * 200
    "p99_ttft_ms": 396.0,
    # TPOT [150, 200]
    "mean_tpot_ms": 175.0,
    "median_tpot_ms": 175.0,
    "std_tpot_ms": 25.0,
    "p50_tpot_ms": 175.0,
    "p95_tpot_ms": 197.5,
    "p99_tpot_ms": 199.5,
    # ITL pooled [100, 100, 100, 200, 200, 300]
    "mean_itl_ms": 1000 / 6,
    "median_itl_ms": 150.0,
    "std_itl_ms": math.sqrt(33333.333333 / 6),
    "p50_itl_ms": 150.0,
    "p95_itl_ms": 275.0,  # 200 + 0.75 * 100
    "p99_itl_ms": 295.0,
    # E2EL [400, 600, 700]
    "mean_e2el_ms": 1700 / 3,
    "median_e2el_ms": 600.0,
    "std_e2el_ms": math.sqrt(46666.666666 / 3),
    "p50_e2el_ms": 600.0,
    "p95_e2el_ms": 690.0,
    "p99_e2el_ms": 698.0,
}


def test_summarize_matches_hand_computed_values() -> None:
    summary = summarize(RESULT)
    assert set(summary) == set(EXPECTED)
    for key, value in EXPECTED.items():
        assert summary[key] == pytest.approx(value, rel=1e-6), key
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens", "max_concurrency"):
        assert isinstance(summary[key], int), key


def test_summarize_other_percentiles_use_vllm_key_spelling() -> None:
    summary = summarize(RESULT, percentiles=(90, 99.9))
    assert summary["p90_ttft_ms"] == pytest.approx(360.0)  # 200 + 0.8 * 200
    assert summary["p99.9_itl_ms"] == pytest.approx(299.5)
    assert "p95_ttft_ms" not in summary and "p90.0_ttft_ms" not in summary


def test_summarize_with_every_request_failed_reports_nan_not_zero() -> None:
    failed = LoadResult(records=(RECORDS[3], RECORDS[3]), duration_s=1.0, concurrency=2,
                        request_rate=None)
    summary = summarize(failed)
    assert summary["completed"] == 0 and summary["failed"] == 2
    assert summary["output_throughput"] == 0.0
    assert math.isnan(summary["p95_ttft_ms"]) and math.isnan(summary["mean_e2el_ms"])


def test_summarize_agrees_with_vllm_calculate_metrics() -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve")
    request_func = pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")
    outputs = [
        request_func.RequestFuncOutput(
            success=r.ok, latency=r.e2e_s, output_tokens=r.output_tokens, ttft=r.ttft_s or 0.0,
            itl=list(r.itl_s), prompt_len=r.prompt_tokens, start_time=r.start_s, error=r.error)
        for r in RECORDS
    ]
    metrics, _ = serve.calculate_metrics(input_requests=[], outputs=outputs, dur_s=RESULT.duration_s,
                                         tokenizer=None, selected_percentiles=[50.0, 95.0, 99.0],
                                         goodput_config_dict={})
    ours = summarize(RESULT)
    assert ours["completed"] == metrics.completed and ours["failed"] == metrics.failed
    assert ours["total_input_tokens"] == metrics.total_input
    assert ours["total_output_tokens"] == metrics.total_output
    for key in ("request_throughput", "output_throughput", "total_token_throughput"):
        assert ours[key] == pytest.approx(getattr(metrics, key))
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert ours[f"{stat}_{m}_ms"] == pytest.approx(getattr(metrics, f"{stat}_{m}_ms")), (stat, m)
        for p, value in getattr(metrics, f"percentiles_{m}_ms"):
            assert ours[f"p{int(p)}_{m}_ms"] == pytest.approx(value), (p, m)


# --- Prometheus ---------------------------------------------------------------------------------

MODEL = "/runs/study-1/model"


COUNTS = {  # counter: its (engine 0, engine 1) values on the page before the window, then after it
    "vllm:prompt_tokens_total": ((1000.0, 500.0), (1600.0, 1100.0)),
    "vllm:generation_tokens_total": ((64.0, 32.0), (164.0, 82.0)),
    "vllm:spec_decode_num_drafts_total": ((10.0, 0.0), (50.0, 30.0)),
    "vllm:spec_decode_num_draft_tokens_total": ((30.0, 0.0), (150.0, 90.0)),
    "vllm:spec_decode_num_accepted_tokens_total": ((12.0, 0.0), (72.0, 48.0)),
}


def _counters(page: int) -> str:
    """The COUNTS samples of one page (0: before, 1: after), one per engine, labelled as vLLM labels them."""
    return "\n".join(f'{name}{{engine="{engine}",model_name="{MODEL}"}} {value:.1f}'
                     for name, pages in COUNTS.items() for engine, value in enumerate(pages[page]))


# Shaped like vLLM 0.32's /metrics with --data-parallel-size 2 (two engines, one page).
BEFORE = f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} NaN
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
{_counters(0)}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="0"}} 8.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 4.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 4.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 0.8
"""

AFTER = f"""\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
{_counters(1)}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="0"}} 40.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 10.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 10.0
vllm:time_to_first_token_seconds_count{{engine="1",model_name="{MODEL}"}} 6.0
"""


def _labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def test_parse_prometheus_reads_names_labels_and_special_values() -> None:
    samples = parse_prometheus(BEFORE)
    assert samples[("vllm:prompt_tokens_total", _labels(engine="1", model_name=MODEL))] == 500.0
    assert samples[("vllm:num_requests_running", _labels(engine="1", model_name=MODEL))] == 2.0
    assert samples[("python_gc_objects_collected_total", _labels(generation="0"))] == 12345.0
    inf_bucket = ("vllm:time_to_first_token_seconds_bucket", _labels(engine="0", le="+Inf",
                                                                       model_name=MODEL))
    assert samples[inf_bucket] == 4.0
    assert math.isnan(samples[("vllm:kv_cache_usage_perc", _labels(engine="0", model_name=MODEL))])
    assert not any(name.startswith("#") for name, _ in samples)
    assert len(samples) == 19  # every sample line, no comment


def test_parse_prometheus_unescapes_labels_and_handles_odd_lines() -> None:
    text = (
        'odd{path="C:\\\\models\\\\x",quote="say \\"hi\\"",nl="a\\nb",comma="a,b}c"} 3\n'
        "plain_metric 7.5 1712345678000\n"
        "vllm:thing_bucket{le=\"+Inf\"} +Inf\n"
        "neg{} -Inf\n"
        'with_exemplar_total{a="1"} 4 # {trace_id="abc"} 1.0\n'
        "garbage line without number\n"
        "# EOF\n"
    )
    samples = parse_prometheus(text)
    key = ("odd", _labels(path="C:\\models\\x", quote='say "hi"', nl="a\nb", comma="a,b}c"))
    assert samples[key] == 3.0
    assert samples[("plain_metric", ())] == 7.5  # the timestamp is not the value
    assert samples[("vllm:thing_bucket", _labels(le="+Inf"))] == math.inf
    assert samples[("neg", ())] == -math.inf
    assert samples[("with_exemplar_total", _labels(a="1"))] == 4.0
    assert len(samples) == 5  # the garbage line is skipped, not fatal


def test_counter_deltas_sum_engines_and_accept_either_spelling() -> None:
    before, after = parse_prometheus(BEFORE), parse_prometheus(AFTER)
    deltas = counter_deltas(before, after, ["vllm:prompt_tokens_total", "vllm:generation_tokens",
                                            "vllm:time_to_first_token_seconds_count",
                                            "vllm:num_preemptions_total"])
    assert deltas == {
        "vllm:prompt_tokens_total": 600.0 + 600.0,
        "vllm:generation_tokens": 100.0 + 50.0,  # found under its _total spelling
        "vllm:time_to_first_token_seconds_count": 6.0 + 6.0,  # engine 1 is new: counts from 0
        "vllm:num_preemptions_total": 0.0,  # absent from both pages
    }


def test_counter_deltas_treat_a_reset_as_counting_from_zero() -> None:
    before = parse_prometheus('vllm:prompt_tokens_total{engine="0"} 900\n'
                              'vllm:prompt_tokens_total{engine="1"} 100\n')
    after = parse_prometheus('vllm:prompt_tokens_total{engine="0"} 50\n'
                             'vllm:prompt_tokens_total{engine="1"} 160\n')
    assert counter_deltas(before, after, ["vllm:prompt_tokens"]) == {"vllm:prompt_tokens": 50.0 + 60.0}


def test_spec_decode_summary_over_two_engines() -> None:
    deltas = counter_deltas(parse_prometheus(BEFORE), parse_prometheus(AFTER), SPEC_DECODE_COUNTERS)
    summary = spec_decode_summary(deltas)
    # drafts 40 + 30 = 70, draft tokens 120 + 90 = 210, accepted 60 + 48 = 108
    assert summary["num_drafts"] == 70.0
    assert summary["num_draft_tokens"] == 210.0
    assert summary["num_accepted_tokens"] == 108.0
    assert summary["acceptance_rate"] == pytest.approx(108 / 210)
    assert summary["mean_acceptance_length"] == pytest.approx(1 + 108 / 70)
    # The per-position counter is a different metric and must not leak into the accepted total.
    assert deltas["vllm:spec_decode_num_accepted_tokens_total"] == 108.0


def test_spec_decode_summary_without_drafts_is_none() -> None:
    page = parse_prometheus(AFTER)
    summary = spec_decode_summary(counter_deltas(page, page, SPEC_DECODE_COUNTERS))
    assert summary["acceptance_rate"] is None and summary["mean_acceptance_length"] is None
    assert summary["num_drafts"] == 0.0
    no_spec = spec_decode_summary({})
    assert no_spec["acceptance_rate"] is None and no_spec["mean_acceptance_length"] is None
    # Keys without _total are accepted too.
    plain = spec_decode_summary({"vllm:spec_decode_num_drafts": 4.0,
                                 "vllm:spec_decode_num_draft_tokens": 12.0,
                                 "vllm:spec_decode_num_accepted_tokens": 6.0})
    assert plain["acceptance_rate"] == pytest.approx(0.5)
    assert plain["mean_acceptance_length"] == pytest.approx(2.5)
