"""PromQL scoping and the reading of results: what counts as "no traffic" and what as "no data"."""
from __future__ import annotations

from typing import Any

import pytest

from cosyvoice_operator.autoscaling import prometheus
from cosyvoice_operator.autoscaling.prometheus import QueryFailed, build_queries, read
from cosyvoice_operator.spec import parse_spec


def test_every_query_is_scoped_to_one_service() -> None:
    queries = build_queries("speech", "tts-prod")
    matcher = 'namespace="speech",cosyvoice_service="tts-prod"'
    for key, promql in queries.items():
        assert matcher in promql, key
    assert queries["qps"] == f"sum(rate(cosyvoice_requests_total{{{matcher}}}[1m]))"
    assert 'code="200"' in queries["p95_ms"] and queries["p95_ms"].startswith("histogram_quantile(0.95,")


def test_overrides_take_the_selector() -> None:
    spec = parse_spec({"autoscaling": {"queries": {
        "qps": 'sum(rate(my_requests_total{$selector,route="/v1/audio/speech"}[2m]))'}}})
    queries = build_queries("ns", 'we"ird', spec.autoscaling.queries)
    assert queries["qps"] == ('sum(rate(my_requests_total{namespace="ns",cosyvoice_service="we\\"ird",'
                              'route="/v1/audio/speech"}[2m]))')
    assert queries["inflight"] == build_queries("ns", 'we"ird')["inflight"]  # not overridden


def fake(results: dict[str, Any]) -> prometheus.Query:
    queries = build_queries("ns", "tts")
    by_query = {queries[k]: v for k, v in results.items()}

    def query(promql: str) -> list[dict[str, Any]]:
        value = by_query.get(promql, [])
        if isinstance(value, Exception):
            raise value
        return value
    return query


def vec(value: str) -> list[dict[str, Any]]:
    return [{"metric": {}, "value": [1700000000.0, value]}]


@pytest.mark.parametrize(("results", "error", "qps"), [
    ({"targets_up": vec("1"), "qps": vec("0"), "inflight": vec("0"), "p95_ms": vec("NaN")}, None, 0.0),  # no traffic
    ({"targets_up": vec("2"), "qps": vec("12.5"), "inflight": vec("3")}, None, 12.5),
    ({"targets_up": [], "qps": [], "inflight": []}, "no series for the service", None),  # no data: empty
    ({"targets_up": vec("0"), "qps": vec("0"), "inflight": vec("0")}, "scrape target", None),  # targets down
    ({"targets_up": QueryFailed("ConnectionError: refused")}, "Prometheus query failed", None),
])
def test_no_traffic_is_not_no_data(results: dict[str, Any], error: str | None, qps: float | None) -> None:
    reading = read(fake(results), build_queries("ns", "tts"))
    if error:
        assert reading.metrics.error and error in reading.metrics.error
    else:
        assert reading.metrics.error is None and reading.metrics.qps == qps
        assert reading.metrics.p95_ms is None  # NaN (no requests) or absent: no latency reading


def test_optional_signal_failures_do_not_lose_the_reading() -> None:
    reading = read(fake({"qps": vec("4"), "inflight": vec("1"), "p95_ms": QueryFailed("timeout")}),
                   build_queries("ns", "tts"))
    assert reading.metrics.error is None and reading.metrics.qps == 4.0 and reading.metrics.p95_ms is None


def test_label_values_are_escaped_as_promql_strings() -> None:
    """Backslashes first, then quotes: a value can never end the string early."""
    assert prometheus.selector("ns", 'a\\"b') == 'namespace="ns",cosyvoice_service="a\\\\\\"b"'
    assert prometheus.selector("n\\s", "tts") == 'namespace="n\\\\s",cosyvoice_service="tts"'


def test_the_forecast_history_is_one_grid_for_rate_and_work_with_gaps_held() -> None:
    queries = build_queries("ns", "tts")
    query = fake({"qps": vec("4"), "inflight": vec("1"), "audio_s": vec("12")})
    asked: list[tuple[str, float]] = []

    def ranged(promql: str, start: Any, end: Any, step: float) -> dict[float, float]:
        asked.append((promql, step))
        t0 = start.timestamp()
        if promql == queries["qps"]:
            return {t0 + 60 * k: float(k) for k in range(10) if k != 4}  # one scrape gap
        return {t0 + 60 * k: 12.0 * k for k in range(2, 10)}  # the work series starts later

    query.range = ranged  # type: ignore[attr-defined]
    m = read(query, queries, lookback_s=600, now=1_800_000_000.0).metrics
    assert [q for q, _ in asked] == [queries["qps"], queries["audio_rate"], queries["qps_short"]]
    assert {step for _, step in asked} == {60.0}
    assert m.rate_history == (0, 1, 2, 3, 3, 5, 6, 7, 8, 9) and m.history_step_s == 60.0
    assert len(m.work_history) == len(m.rate_history) and m.work_history[:3] == (24.0, 24.0, 24.0)
    assert m.short_history == m.work_history  # the burst window's rate, on the same grid
    assert m.audio_s == 12.0
    # a week of history is fetched at a coarser step: at most 240 samples
    asked.clear()
    read(query, queries, lookback_s=7 * 86400, now=1_800_000_000.0)
    assert asked[0][1] == 2520.0  # 7 days / 240, in whole minutes
