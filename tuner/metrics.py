"""Numbers a trial is ranked by: client-side latency/throughput, and server counters.

:func:`summarize` turns a :class:`~tuner.loadgen.LoadResult` into the same keys, computed the same
way, as ``vllm bench serve --save-result --percentile-metrics ttft,tpot,itl,e2el
--metric-percentiles 50,95,99`` (``calculate_metrics`` in ``vllm/benchmarks/serve.py``):

- failed requests are counted in ``failed`` and left out of every other number;
- TPOT per request is ``(e2e - ttft) / (output_tokens - 1)``, only for requests with more than one
  output token; ITL is pooled over every gap of every successful request;
- throughputs are over the measured window's duration; std is the population std (numpy's
  default); percentiles use numpy's default linear interpolation.

One deliberate difference: with no sample at all (every request failed; or no request produced a
second token, for TPOT/ITL) vLLM reports 0.0, which would read as a perfect latency; here it is NaN,
so an SLO check on it fails rather than passes.

The rest reads vLLM's Prometheus ``/metrics`` page: :func:`parse_prometheus`,
:func:`counter_deltas` (summed over label sets, so the engines of a DP deployment add up),
:func:`spec_decode_summary`, histogram deltas and their quantiles (:func:`queue_time_summary`: the
client cannot see how long a request waited for a batch slot, vLLM's
``vllm:request_queue_time_seconds`` histogram can), and gauges sampled during a window
(:func:`gauge_total` sums the engines, :func:`gauge_summary` reduces the samples).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tuner.loadgen import LoadResult

__all__ = [
    "GAUGES",
    "LATENCY_METRICS",
    "SPEC_DECODE_COUNTERS",
    "MetricKey",
    "Samples",
    "counter_deltas",
    "gauge_summary",
    "gauge_total",
    "histogram_deltas",
    "histogram_quantile",
    "parse_prometheus",
    "queue_time_summary",
    "spec_decode_summary",
    "summarize",
]

logger = logging.getLogger(__name__)

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")

SPEC_DECODE_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)

MetricKey = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[MetricKey, float]


# --- client-side summary ------------------------------------------------------------------------


def _percentile_word(p: float) -> str:
    # vllm: p_word = str(int(p)) if int(p) == p else str(p)
    return str(int(p)) if int(p) == p else str(p)


def _stats_ms(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    if not values_s:
        nan = math.nan
        out = {f"mean_{name}_ms": nan, f"median_{name}_ms": nan, f"std_{name}_ms": nan}
        out.update({f"p{_percentile_word(p)}_{name}_ms": nan for p in percentiles})
        return out
    values_ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(values_ms)),
        f"median_{name}_ms": float(np.median(values_ms)),
        f"std_{name}_ms": float(np.std(values_ms)),
    }
    for p in percentiles:
        out[f"p{_percentile_word(p)}_{name}_ms"] = float(np.percentile(values_ms, p))
    return out


def _per_second(amount: float, duration_s: float) -> float:
    return amount / duration_s if duration_s > 0 else math.nan


def summarize(result: LoadResult,
              percentiles: tuple[float, ...] = (50, 95, 99)) -> dict[str, float | int]:
    """The ``vllm bench serve --save-result`` numbers of one measured window.

    Keys: ``duration, completed, failed, total_input_tokens, total_output_tokens,
    request_throughput, output_throughput, total_token_throughput, max_concurrency``, and for each
    of ttft, tpot, itl, e2el: ``mean_/median_/std_{m}_ms`` and ``p{P}_{m}_ms`` per percentile.
    """
    ok = [r for r in result.records if r.ok]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
             for r in ok if r.output_tokens > 1 and r.ttft_s is not None]
    itls = [gap for r in ok for gap in r.itl_s]
    e2els = [r.e2e_s for r in ok]

    summary: dict[str, float | int] = {
        "duration": result.duration_s,
        "completed": len(ok),
        "failed": len(result.records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": _per_second(len(ok), result.duration_s),
        "output_throughput": _per_second(total_output, result.duration_s),
        "total_token_throughput": _per_second(total_input + total_output, result.duration_s),
        "max_concurrency": result.concurrency,
    }
    for name, values in zip(LATENCY_METRICS, (ttfts, tpots, itls, e2els), strict=True):
        summary.update(_stats_ms(name, values, percentiles))
    return summary


# --- Prometheus /metrics --------------------------------------------------------------------------

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class _BadLine(ValueError):
    pass


def _parse_labels(text: str, start: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="x",b="y"}`` starting at ``text[start] == "{"``; return labels and the index after."""
    labels: dict[str, str] = {}
    i = start + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            raise _BadLine("unterminated label set")
        if text[i] == "}":
            return tuple(sorted(labels.items())), i + 1
        eq = text.find("=", i)
        if eq < 0:
            raise _BadLine("label without '='")
        name = text[i:eq].strip()
        i = eq + 1
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != '"':
            raise _BadLine("label value not quoted")
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise _BadLine("unterminated label value")
            c = text[i]
            if c == "\\" and i + 1 < n:
                nxt = text[i + 1]
                chars.append(_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                chars.append(c)
                i += 1
        labels[name] = "".join(chars)


def _parse_line(line: str) -> tuple[MetricKey, float]:
    brace = line.find("{")
    space = min((k for k in (line.find(" "), line.find("\t")) if k >= 0), default=-1)
    if brace >= 0 and (space < 0 or brace < space):
        name = line[:brace].strip()
        labels, after = _parse_labels(line, brace)
        rest = line[after:]
    else:
        if space < 0:
            raise _BadLine("no value")
        name, labels, rest = line[:space], (), line[space:]
    rest = rest.split("#", 1)[0]  # an OpenMetrics exemplar follows " # "
    fields = rest.split()
    if not name or not fields:
        raise _BadLine("no name or no value")
    try:
        value = float(fields[0])  # also "+Inf", "-Inf", "NaN"
    except ValueError as exc:
        raise _BadLine(f"value {fields[0]!r} is not a number") from exc
    return (name, labels), value


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition → ``{(name, sorted((label, value), ...)): value}``.

    Comments (``# HELP``/``# TYPE``/``# EOF``) and blank lines are skipped; label values are
    unescaped (``\\\\``, ``\\"``, ``\\n``); ``+Inf``/``-Inf``/``NaN`` become floats; a trailing
    timestamp or exemplar is ignored. Lines that cannot be read are skipped and logged.
    """
    samples: Samples = {}
    bad = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key, value = _parse_line(line)
        except _BadLine as exc:
            bad += 1
            logger.debug("metrics page: skipped line %r: %s", line[:200], exc)
            continue
        samples[key] = value
    if bad:
        logger.warning("metrics page: skipped %d unreadable line(s)", bad)
    return samples


def _base_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def _counter_by_labels(samples: Mapping[MetricKey, float],
                       base: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One counter's value per label set, whichever spelling (with or without ``_total``) is used.

    Where both spellings exist for one label set, the ``_total`` sample wins.
    """
    plain: dict[tuple[tuple[str, str], ...], float] = {}
    total: dict[tuple[tuple[str, str], ...], float] = {}
    for (name, labels), value in samples.items():
        if name == base:
            plain[labels] = value
        elif name == base + "_total":
            total[labels] = value
    return {**plain, **total}


def counter_deltas(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
                   names: Iterable[str]) -> dict[str, float]:
    """How much each named counter grew between two scrapes, summed over all label sets.

    A name matches with or without its ``_total`` suffix; the result is keyed by the name as given.
    A label set that is new in ``after`` counts from 0; one whose value went down (the server
    restarted) counts from 0 as well, as Prometheus' ``increase`` does. NaN samples are ignored.
    A counter absent from both scrapes gives 0.0.
    """
    deltas: dict[str, float] = {}
    for name in names:
        base = _base_name(name)
        old = _counter_by_labels(before, base)
        new = _counter_by_labels(after, base)
        growth = 0.0
        for labels, now in new.items():
            if math.isnan(now):
                continue
            then = old.get(labels, 0.0)
            if math.isnan(then):
                then = 0.0
            growth += now - then if now >= then else now
        deltas[name] = growth
    return deltas


def _lookup(deltas: Mapping[str, float], name: str) -> float:
    base = _base_name(name)
    for spelling in (base + "_total", base):
        if spelling in deltas:
            return deltas[spelling]
    return 0.0


def spec_decode_summary(deltas: Mapping[str, float]) -> dict[str, float | None]:
    """Speculative-decoding acceptance over a window, from :func:`counter_deltas` output.

    Pass deltas of :data:`SPEC_DECODE_COUNTERS` (either spelling). ``acceptance_rate`` is
    accepted / drafted tokens, a fraction in [0, 1] (``vllm bench serve`` reports it in percent);
    ``mean_acceptance_length`` is ``1 + accepted / drafts`` (tokens per verification step).
    Both are None when nothing was drafted.
    """
    drafts = _lookup(deltas, "vllm:spec_decode_num_drafts")
    draft_tokens = _lookup(deltas, "vllm:spec_decode_num_draft_tokens")
    accepted = _lookup(deltas, "vllm:spec_decode_num_accepted_tokens")
    return {
        "num_drafts": drafts,
        "num_draft_tokens": draft_tokens,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None,
    }


# --- histograms and gauges ------------------------------------------------------------------------

GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")


def histogram_deltas(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
                     name: str) -> tuple[list[tuple[float, float]], float, float]:
    """Growth of histogram ``name`` between two scrapes, engines (label sets) added up.

    Returns ``(buckets, count, sum)``: ``buckets`` are ``(upper bound, cumulative count)`` sorted by
    bound, ``+Inf`` last. A series that went down (a restart) counts from 0, as in
    :func:`counter_deltas`.
    """
    bucket_name = name + "_bucket"
    by_le: dict[float, float] = {}
    for (sample, labels), now in after.items():
        if sample != bucket_name or math.isnan(now):
            continue
        le_text = dict(labels).get("le")
        if le_text is None:
            continue
        try:
            le = float(le_text)
        except ValueError:
            continue
        then = before.get((sample, labels), 0.0)
        then = 0.0 if math.isnan(then) else then
        by_le[le] = by_le.get(le, 0.0) + (now - then if now >= then else now)
    count = counter_deltas(before, after, [name + "_count"])[name + "_count"]
    total = counter_deltas(before, after, [name + "_sum"])[name + "_sum"]
    return sorted(by_le.items()), count, total


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: linear inside the bucket that holds rank ``q * count``.

    NaN when the histogram is empty. A rank in the ``+Inf`` bucket gives the highest finite bound.
    """
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower_bound
            if cumulative == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (cumulative - lower_count)
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def queue_time_summary(before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
                       percentiles: Sequence[float] = (50, 95, 99)) -> dict[str, float]:
    """Queue time of the requests vLLM finished in the window (``vllm:request_queue_time_seconds``).

    Keys ``mean_queue_ms``, ``median_queue_ms``, ``p{P}_queue_ms`` (bucket-interpolated, so only as
    fine as vLLM's buckets) and ``queue_requests``; NaN when no request was recorded.
    """
    buckets, count, total = histogram_deltas(before, after, "vllm:request_queue_time_seconds")
    out = {"queue_requests": count, "mean_queue_ms": total / count * 1000.0 if count > 0 else math.nan,
           "median_queue_ms": histogram_quantile(buckets, 0.5) * 1000.0}
    for p in percentiles:
        out[f"p{_percentile_word(p)}_queue_ms"] = histogram_quantile(buckets, p / 100.0) * 1000.0
    return out


def gauge_total(samples: Mapping[MetricKey, float], name: str) -> float | None:
    """One gauge summed over its label sets (the engines under DP); None when absent.

    ``vllm:kv_cache_usage_perc`` is a per-engine fraction, so for it this is the mean over engines.
    """
    values = [v for (sample, _labels), v in samples.items() if sample == name and not math.isnan(v)]
    if not values:
        return None
    if name == "vllm:kv_cache_usage_perc":
        return sum(values) / len(values)
    return sum(values)


def gauge_summary(series: Sequence[Mapping[MetricKey, float]],
                  names: Iterable[str] = GAUGES) -> dict[str, dict[str, float | int | None]]:
    """Mean and max of each gauge over scrapes taken during a window, engines combined."""
    out: dict[str, dict[str, float | int | None]] = {}
    for name in names:
        values = [v for v in (gauge_total(s, name) for s in series) if v is not None]
        out[name] = {"samples": len(values),
                     "mean": sum(values) / len(values) if values else None,
                     "max": max(values) if values else None}
    return out
