"""PromQL for one CosyVoiceService, built from the server's metric names, and a reader that tells
"no traffic" (series present, rate 0) from "no data" (query failed, empty result, targets down).

Scoping. Every query selects the service's series with a label matcher, by default::

    namespace="<namespace>",cosyvoice_service="<name>"

Prometheus must attach these labels to the pods' samples. With the Prometheus Operator, add to the
ServiceMonitor's endpoint (``namespace`` is already set by it)::

    relabelings:
      - sourceLabels: [__meta_kubernetes_service_label_app_kubernetes_io_instance]
        targetLabel: cosyvoice_service

and with annotation-based scraping (``prometheus.io/scrape`` on the pods), in the scrape job::

    - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_instance]
      target_label: cosyvoice_service
    - source_labels: [__meta_kubernetes_namespace]
      target_label: namespace

A query override in ``spec.autoscaling.queries`` may use ``$selector``: it is replaced by the matcher
(without braces), e.g. ``sum(rate(cosyvoice_requests_total{$selector,code="200"}[2m]))``.
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .policy import RATE_WINDOW_S, SHORT_WINDOW_S, TREND_WINDOW_S, Metrics

SELECTOR_TOKEN = "$selector"


def duration(seconds: float) -> str:
    """A PromQL duration: 60 → 1m, 30 → 30s."""
    return f"{seconds / 60:.0f}m" if seconds % 60 == 0 else f"{seconds:.0f}s"


RATE_WINDOW = duration(RATE_WINDOW_S)
SHORT_WINDOW = duration(SHORT_WINDOW_S)  # at least two scrapes at the usual 15 s: the burst detector's window
TREND_WINDOW = duration(TREND_WINDOW_S)
HISTORY_POINTS = 240  # the forecast's history: at most this many samples, one a minute or coarser

TEMPLATES = {
    # answered requests of every code: 429s are demand the replicas could not take
    "qps": f"sum(rate(cosyvoice_requests_total{{$selector}}[{RATE_WINDOW}]))",
    "qps_short": f"sum(rate(cosyvoice_requests_total{{$selector}}[{SHORT_WINDOW}]))",
    # the trend of the rate over five minutes (req/s per s): a ramp's slope, for the cold-start forecast
    "qps_slope": f"deriv(sum(rate(cosyvoice_requests_total{{$selector}}[{RATE_WINDOW}]))[{TREND_WINDOW}:15s])",
    "inflight": "sum(cosyvoice_inflight_requests{$selector})",
    # open WebSocket speech sessions (each also counts in inflight): targetSessionsPerReplica
    "sessions": "sum(cosyvoice_stream_sessions_open{$selector})",
    "inflight_growth": f"sum(deriv(cosyvoice_inflight_requests{{$selector}}[{RATE_WINDOW}]))",
    # the same over the burst window: with qps_short, the arrival rate of the last scrapes (a step that
    # saturates the replicas shows here first, as a queue filling up)
    "inflight_growth_short": f"sum(deriv(cosyvoice_inflight_requests{{$selector}}[{SHORT_WINDOW}]))",
    # successful requests only: fast 429s would pull the p95 down exactly when it matters
    "p95_ms": "histogram_quantile(0.95, sum by (le) (rate(cosyvoice_request_duration_seconds_bucket"
              f"{{$selector,code=\"200\"}}[{RATE_WINDOW}]))) * 1000",
    "ttfa_p95_ms": "histogram_quantile(0.95, sum by (le) (rate(cosyvoice_time_to_first_audio_seconds_bucket"
                   f"{{$selector}}[{RATE_WINDOW}]))) * 1000",
    "targets_up": "sum(up{$selector})",
    # the mean request length (seconds of audio per successful request): what a replica's capacity depends on
    # the work (seconds of audio per second): with the rate, the forecast's history (range queries only)
    "audio_rate": f"sum(rate(cosyvoice_audio_seconds_total{{$selector}}[{RATE_WINDOW}]))",
    "audio_s": f"sum(rate(cosyvoice_audio_seconds_total{{$selector}}[{RATE_WINDOW}])) / "
               f"sum(rate(cosyvoice_requests_total{{$selector,code=\"200\"}}[{RATE_WINDOW}]))",
}
OVERRIDE_FIELDS = {"qps": "qps", "inflight": "inflight", "sessions": "sessions", "p95_ms": "p95_latency_ms",
                   "ttfa_p95_ms": "time_to_first_audio_ms"}


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(namespace: str, name: str) -> str:
    """The label matcher (without braces) that selects one CosyVoiceService's series."""
    return f'namespace="{escape(namespace)}",cosyvoice_service="{escape(name)}"'


def build_queries(namespace: str, name: str, overrides: Any = None) -> dict[str, str]:
    """PromQL per signal for one service; ``overrides`` is ``spec.autoscaling.queries`` (or None)."""
    sel = selector(namespace, name)
    out = {}
    for key, template in TEMPLATES.items():
        field = OVERRIDE_FIELDS.get(key)
        custom = getattr(overrides, field, None) if overrides is not None and field else None
        out[key] = (custom or template).replace(SELECTOR_TOKEN, sel)
    return out


class QueryFailed(Exception):
    """Prometheus could not answer (unreachable, error status, bad query)."""


Query = Callable[[str], list[dict[str, Any]]]


def connect(url: str, *, token: str | None = None, insecure_skip_verify: bool = False,
            ca_file: str | None = None, timeout: float = 5.0) -> Query:
    """A ``custom_query`` function of prometheus-api-client, failing fast (one retry, short timeout).

    ``url``, ``token`` and ``ca_file`` come from a metrics source the cluster administrator defined
    (``admin.MetricsSource``), never from a CosyVoiceService."""
    import requests
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    session = requests.Session()
    if ca_file:
        session.verify = ca_file
    headers = {"Authorization": f"Bearer {token}"} if token else None
    client = PrometheusConnect(url=url, headers=headers, disable_ssl=insecure_skip_verify, session=session,
                               retry=Retry(total=1, backoff_factor=0.2, status_forcelist=(502, 503, 504)),
                               timeout=timeout)
    if insecure_skip_verify:
        session.verify = False

    def query(promql: str) -> list[dict[str, Any]]:
        try:
            return list(client.custom_query(promql))
        except Exception as exc:  # requests' connection errors, PrometheusApiClientException, bad JSON
            raise QueryFailed(f"{type(exc).__name__}: {exc}"[:300]) from None

    def query_range(promql: str, start: datetime, end: datetime, step_s: float) -> dict[float, float]:
        """Sum of the result's series per timestamp, fetched in chunks under Prometheus' 11,000 points."""
        out: dict[float, float] = {}
        chunk = timedelta(seconds=step_s * 10_000)
        t = start
        while t < end:
            stop = min(end, t + chunk)
            try:
                series = client.custom_query_range(promql, start_time=t, end_time=stop, step=f"{step_s:g}s")
            except Exception as exc:
                raise QueryFailed(f"{type(exc).__name__}: {exc}"[:300]) from None
            for one in series:
                for ts, value in one.get("values", []):
                    v = float(value)
                    if math.isfinite(v):
                        out[float(ts)] = out.get(float(ts), 0.0) + v
            t = stop + timedelta(seconds=step_s)
        return out

    query.range = query_range  # type: ignore[attr-defined]
    return query


def connect_range(url: str, **kw: Any) -> Callable[[str, datetime, datetime, float], dict[float, float]]:
    """A range query function (``query_range(promql, start, end, step_s) -> {unix time: value}``)."""
    return connect(url, **kw).range  # type: ignore[attr-defined, no-any-return]


def scalar(result: list[dict[str, Any]]) -> float | None:
    """The value of a one-series result; None when empty or NaN (e.g. a quantile over no requests)."""
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


@dataclass(frozen=True)
class Reading:
    metrics: Metrics
    queries: dict[str, str]
    reason: str | None = None  # a condition reason when no query could be made (e.g. NoMetricsSource)


def read(query: Query, queries: dict[str, str], lookback_s: float = 0.0, now: float | None = None) -> Reading:
    """One reading. ``Metrics.error`` is set for no data; a rate of 0 with series present is traffic 0.
    With ``lookback_s``, the rate over that past too (``Metrics.rate_history``, for the forecast)."""
    try:
        up = scalar(query(queries["targets_up"]))
        qps_raw = query(queries["qps"])
        inflight_raw = query(queries["inflight"])
    except QueryFailed as exc:
        return Reading(Metrics(error=f"Prometheus query failed: {exc}"), queries)
    if up is not None and up == 0:
        return Reading(Metrics(error="every scrape target of the service is down (up == 0)"), queries)
    qps, inflight = scalar(qps_raw), scalar(inflight_raw)
    if qps is None and inflight is None:
        return Reading(Metrics(error="no series for the service: is Prometheus scraping its pods, with the "
                                     "cosyvoice_service and namespace labels? (" + queries["qps"] + ")"), queries)
    values: dict[str, Any] = {"qps": qps, "inflight": inflight}
    for key in ("qps_short", "qps_slope", "inflight_growth", "inflight_growth_short", "p95_ms", "ttfa_p95_ms",
                "audio_s", "sessions"):
        try:
            values[key] = scalar(query(queries[key]))
        except QueryFailed:
            values[key] = None  # optional signals: a failure here only loses the refinement
    ranged = getattr(query, "range", None)
    if lookback_s > 0 and ranged is not None:
        step = max(60.0, math.ceil(lookback_s / HISTORY_POINTS / 60) * 60)
        end = datetime.fromtimestamp(now, timezone.utc) if now is not None else datetime.now(timezone.utc)
        start = end - timedelta(seconds=lookback_s)
        try:
            points = ranged(queries["qps"], start, end, step)
            work = ranged(queries["audio_rate"], start, end, step) if points else {}
            # the burst window's rate at the same instants: what of the minute's noise is clumps (policy._dispersion)
            short = ranged(queries["qps_short"], start, end, step) if points else {}
        except QueryFailed:
            points, work, short = {}, {}, {}  # the forecast is a refinement too: without history, the policy reacts
        if points:
            t0, n = min(points), round((max(points) - min(points)) / step) + 1
            values["rate_history"] = _regular(points, step, t0, n)
            if work:
                values["work_history"] = _regular(work, step, t0, n)
            if short:
                values["short_history"] = _regular(short, step, t0, n)
            values["history_step_s"] = step
    return Reading(Metrics(**values), queries)


def _regular(points: dict[float, float], step: float, t0: float, n: int) -> tuple[float, ...]:
    """``n`` samples on the grid ``t0 + k × step``, oldest first; a missing sample repeats the one before
    (a scrape gap is not a drop to zero), and the first ones take the first value there is."""
    by_index = {round((t - t0) / step): v for t, v in points.items()}
    out, last = [], by_index[min(by_index)]
    for k in range(n):
        last = by_index.get(k, last)
        out.append(round(last, 4))
    return tuple(out)
