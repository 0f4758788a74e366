"""Numbers a trial is ranked by: client-side latency/throughput, and server counters.

:func:`summarize` turns a :class:`~tuner.load.generator.LoadResult` into the same keys, computed the same
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

The rest reads a server's Prometheus ``/metrics`` page, whatever the engine: :func:`parse_prometheus`,
:func:`counter_deltas` (summed over label sets, so the engines of a DP deployment add up), and
histogram deltas and their quantiles (:func:`histogram_deltas`, :func:`histogram_quantile`). Which
names an engine exposes, and what they mean for a window (speculative-decoding acceptance, queue
time, KV use), is the engine's: :class:`ServerMetrics`, e.g. :mod:`tuner.engines.vllm.metrics`.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tuner.load.generator import LoadResult

__all__ = [
    "LATENCY_METRICS",
    "MetricKey",
    "Samples",
    "ServerMetrics",
    "counter_delta",
    "counter_deltas",
    "histogram_deltas",
    "histogram_quantile",
    "parse_prometheus",
    "percentile_word",
    "summarize",
]

logger = logging.getLogger(__name__)

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")

MetricKey = tuple[str, tuple[tuple[str, str], ...]]
Samples = dict[MetricKey, float]


class ServerMetrics(Protocol):
    """What an engine's ``/metrics`` page says about one measured window (the engine's metric-name map).

    :func:`tuner.load.ladder.measure` scrapes the page before and after each window (and samples it
    during the window); this turns those scrapes into the step's ``server`` block: ``counters`` (the
    deltas, keyed by the engine's own names), ``spec_decode``, ``queue`` (``*_queue_ms`` keys, also
    copied into the step's summary), ``gauges`` and ``facts`` (engine-neutral figures the window
    check reads, :mod:`tuner.load.freshness`: ``prefix_cache_hits``, ``prefix_cache_queries``,
    ``preemptions``, ``prompt_tokens``, ``generation_tokens``, ``kv_usage_max``, ``queue_p95_ms``; and the knee check,
    :mod:`tuner.load.knee`: ``running_max``, ``waiting_max``; None = not reported).
    ``after`` is empty when the window was stopped.
    """

    def window(self, before: Mapping[MetricKey, float], after: Mapping[MetricKey, float],
               gauges: Sequence[Mapping[MetricKey, float]]) -> dict[str, Any]: ...


# --- client-side summary ------------------------------------------------------------------------


def percentile_word(p: float) -> str:
    """``95.0`` → ``"95"``, ``99.9`` → ``"99.9"``: the percentile as ``vllm bench serve`` names its keys."""
    # vllm: p_word = str(int(p)) if int(p) == p else str(p)
    return str(int(p)) if int(p) == p else str(p)


def _stats_ms(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    if not values_s:
        nan = math.nan
        out = {f"mean_{name}_ms": nan, f"median_{name}_ms": nan, f"std_{name}_ms": nan}
        out.update({f"p{percentile_word(p)}_{name}_ms": nan for p in percentiles})
        return out
    values_ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(values_ms)),
        f"median_{name}_ms": float(np.median(values_ms)),
        f"std_{name}_ms": float(np.std(values_ms)),
    }
    for p in percentiles:
        out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(values_ms, p))
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
    # The server's own per-request speeds, prompt and decode apart (llama-server's ``timings``), where sent.
    for key in ("server_prompt_tok_s", "server_decode_tok_s"):
        speeds = sorted(v for v in (getattr(r, key, None) for r in ok) if v is not None)
        if speeds:
            summary[f"median_{key}"] = round(statistics.median(speeds), 3)
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


def counter_delta(deltas: Mapping[str, float], name: str) -> float:
    """One counter's growth from :func:`counter_deltas` output, under either spelling (0.0 when absent)."""
    base = _base_name(name)
    for spelling in (base + "_total", base):
        if spelling in deltas:
            return deltas[spelling]
    return 0.0


# --- histograms -----------------------------------------------------------------------------------


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
