"""The autoscaling decision, table-driven: each row is a situation an SRE would recognise and the count
(and reason) they would expect."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cosyvoice_operator.autoscaling.policy import (DEFAULT_SCALE_DOWN, Decision, History, Metrics, Policy, Rules,
                                                   Settings, decide, scale_limit)
from cosyvoice_operator.spec import parse_spec

BASE = Settings(min_replicas=1, max_replicas=20, target_qps_per_replica=4.0, target_p95_ms=1000.0,
                scale_down=Rules(0.0, DEFAULT_SCALE_DOWN.policies))
NO_LIMITS = replace(BASE, scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))


def m(qps: float | None = None, **kw: float | str | None) -> Metrics:
    return Metrics(qps=qps, **kw)  # type: ignore[arg-type]


CASES = [
    # id, settings, metrics, current, ready, expected desired, expected reason
    ("proportional-up", NO_LIMITS, m(40.0, p95_ms=500), 4, 4, 10, "ScaleUp"),
    ("proportional-down", NO_LIMITS, m(8.0, p95_ms=300), 4, 4, 2, "ScaleDown"),
    ("within-tolerance-up", NO_LIMITS, m(17.0, p95_ms=500), 4, 4, 4, "WithinTolerance"),  # 4.25 vs 4: +6 %
    ("within-tolerance-down", NO_LIMITS, m(15.0, p95_ms=500), 4, 4, 4, "WithinTolerance"),
    ("outside-tolerance", NO_LIMITS, m(18.0, p95_ms=500), 4, 4, 5, "ScaleUp"),  # 4.5: +12.5 %
    ("served-rate-saturated-backlog-growing", NO_LIMITS, m(16.0, inflight_growth=24.0, p95_ms=900), 4, 4, 10,
     "ScaleUp"),
    ("backlog-draining-is-not-demand", NO_LIMITS, m(30.0, inflight_growth=-10.0, p95_ms=500), 5, 5, 5,
     "WithinTolerance"),
    ("burst-short-window", NO_LIMITS, m(8.0, qps_short=40.0, p95_ms=500), 2, 2, 10, "ScaleUp"),
    # a step saturating the replicas: the served short rate is capped, the queue filling up is the rest
    ("burst-short-window-queue-filling", NO_LIMITS,
     m(8.0, qps_short=10.0, inflight_growth_short=26.0, p95_ms=500), 2, 2, 9, "ScaleUp"),
    # a rising trend is sized for the rate a cold start (120 s) + interval (15 s) ahead of the middle of the
    # rate window (30 s ago)
    ("trend-forecast", NO_LIMITS, m(36.0, qps_slope=0.05, p95_ms=500), 8, 8, 12, "ScaleUp"),  # 36 → 44.25
    ("flat-noisy-slope-no-forecast", NO_LIMITS, m(36.0, qps_slope=0.01, p95_ms=500), 8, 8, 9, "ScaleUp"),
    ("inflight-target-wins", replace(NO_LIMITS, target_inflight_per_replica=2.0), m(8.0, inflight=20.0, p95_ms=500),
     2, 2, 10, "ScaleUp"),
    ("no-traffic-scales-to-min", NO_LIMITS, m(0.0, inflight=0.0), 6, 6, 1, "ScaleDown"),
    ("no-traffic-scale-to-zero", replace(NO_LIMITS, min_replicas=0), m(0.0, inflight=0.0), 3, 3, 0, "ScaleDown"),
    ("from-zero-any-traffic-wakes", replace(NO_LIMITS, min_replicas=0), m(0.5), 0, 0, 1, "ScaleUp"),
    # Warming pods are capacity: the same demand while they start asks for nothing more.
    ("warming-pods-count", NO_LIMITS, m(40.0, p95_ms=5000), 10, 4, 10, "WithinTolerance"),
    ("latency-guard-waits-a-window", NO_LIMITS, m(16.0, p95_ms=2000), 4, 4, 4, "WithinTolerance"),
    ("latency-guard-waits-for-warming", NO_LIMITS, m(16.0, p95_ms=2000), 5, 4, 5, "LatencyGuard"),
    ("latency-hysteresis-keeps-a-spare", NO_LIMITS, m(8.0, p95_ms=900), 4, 4, 3, "ScaleDown"),  # 2 needed, +1
    ("latency-hysteresis-spare-is-current", NO_LIMITS, m(8.0, p95_ms=900), 3, 3, 3, "LatencyGuard"),
    ("latency-above-objective-blocks-scale-down", NO_LIMITS, m(8.0, p95_ms=1050), 4, 4, 4, "LatencyGuard"),
    ("low-latency-allows-scale-down", NO_LIMITS, m(8.0, p95_ms=700), 4, 4, 2, "ScaleDown"),
    ("ttfa-blocks-scale-down", replace(NO_LIMITS, target_ttfa_ms=300.0), m(8.0, p95_ms=500, ttfa_p95_ms=310), 4, 4,
     4, "LatencyGuard"),
    ("ttfa-keeps-a-spare", replace(NO_LIMITS, target_ttfa_ms=300.0), m(8.0, p95_ms=500, ttfa_p95_ms=290), 4, 4,
     3, "ScaleDown"),
    ("bounded-by-max", replace(NO_LIMITS, max_replicas=6), m(100.0), 4, 4, 6, "ScaleUp"),
    ("bounded-by-min", replace(NO_LIMITS, min_replicas=3), m(1.0), 5, 5, 3, "ScaleDown"),
    ("scale-up-step-limit-pods", replace(BASE, scale_up=Rules(0.0, (Policy("Pods", 2, 60.0),))), m(100.0), 3, 3, 5,
     "ScaleUp"),
    ("scale-up-step-limit-percent", replace(BASE, scale_up=Rules(0.0, (Policy("Percent", 50, 60.0),))), m(100.0), 4,
     4, 6, "ScaleUp"),
    ("scale-up-max-of-policies", BASE, m(200.0), 2, 2, 6, "ScaleUp"),  # the default: max(2 + 4, 2 × 3)
    ("scale-up-max-of-policies-percent", BASE, m(200.0), 5, 5, 15, "ScaleUp"),  # max(5 + 4, 5 × 3)
    ("scale-down-percent-limit", BASE, m(4.0, p95_ms=100), 10, 10, 5, "ScaleDown"),  # 50 % per 60 s
    ("scale-down-disabled", replace(BASE, scale_down=Rules(0.0, DEFAULT_SCALE_DOWN.policies, "Disabled")),
     m(4.0, p95_ms=100), 10, 10, 10, "ScaleDown"),
    # No data: held, whatever the previous traffic was.
    ("query-failed-holds", NO_LIMITS, Metrics(error="Prometheus query failed: connection refused"), 6, 6, 6,
     "MetricsUnavailable"),
    ("empty-result-holds", NO_LIMITS, Metrics(), 6, 6, 6, "MetricsUnavailable"),
    ("empty-result-holds-above-max", replace(NO_LIMITS, max_replicas=4), Metrics(), 6, 6, 6, "MetricsUnavailable"),
]


@pytest.mark.parametrize(("settings", "metrics", "current", "ready", "desired", "reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision(settings: Settings, metrics: Metrics, current: int, ready: int, desired: int, reason: str) -> None:
    d = decide(1000.0, metrics, current=current, ready=ready, policy=settings, history=History())
    assert (d.desired, d.reason) == (desired, reason), d.message
    assert d.metrics_ok == (reason not in ("MetricsUnavailable", "FallbackReplicas"))


@pytest.mark.parametrize(("metrics", "ready", "added"), [
    (m(16.0, p95_ms=2000), 4, True),  # over the objective for a whole window, nothing warming: +25 %
    (m(16.0, p95_ms=500, ttfa_p95_ms=600), 4, True),  # the streaming objective counts the same way
    (m(16.0, p95_ms=2000, inflight=60, inflight_growth=-3.0), 4, False),  # a backlog draining: the p95 lags, wait
    # a steady gauge's slope is negative half the time: 3 fewer in flight over the minute is its noise at 20
    (m(16.0, p95_ms=2000, inflight=20, inflight_growth=-0.05), 4, True),
    (m(16.0, p95_ms=2000, inflight=25, inflight_growth=-0.25), 4, True),  # 15 fewer at 25: three deviations, not more
    (m(16.0, p95_ms=2000, inflight=1, inflight_growth=-0.06), 4, False),  # the last of a backlog going: 3.6 > 3 × 1
    (m(16.0, p95_ms=2000), 3, False),  # a pod is warming: it is the capacity on its way
    (m(16.0, p95_ms=1050), 4, False),  # within tolerance of the objective
])
def test_latency_guardrail_needs_a_sustained_breach(metrics: Metrics, ready: int, added: bool) -> None:
    s = replace(NO_LIMITS, target_ttfa_ms=300.0)
    history = History()
    for now in (0.0, 15.0, 30.0, 45.0, 60.0):
        d = decide(now, metrics, current=4, ready=ready, policy=s, history=history)
        history = d.history
        if now < 60.0:
            assert d.desired == 4  # a single window of high p95 may be the past capacity's
    assert (d.desired, d.reason) == ((5, "LatencyAboveTarget") if added else (4, d.reason))
    assert added == (d.reason == "LatencyAboveTarget")


def test_the_guardrail_remembers_the_count_it_found_too_few_until_its_memory_lapses() -> None:
    """targetQPSPerReplica 4 says 16 req/s need 4 replicas, and at 4 the p95 stays over the objective: the
    guardrail adds one, and from then on the sizing counts × 5/4, rather than going back into the breach once
    the scale-down window has passed: 5 replicas at that load, 10 (not 8) at twice it. The correction is in
    the persisted history, and lapses after latencyGuardMemorySeconds (0: not kept at all)."""
    from cosyvoice_operator.autoscaling import state

    def run_(s: Settings, steps: list[tuple[float, Metrics]], current: int, h: History) -> tuple[Decision, History]:
        for now, metrics in steps:
            d = decide(now, metrics, current=current, ready=current, policy=s, history=h)
            current, h = d.desired, d.history
        return d, h

    s = replace(BASE, guard_memory_s=600.0)
    hot = [(t, m(16.0, p95_ms=2000, inflight=20)) for t in (0.0, 15.0, 30.0, 45.0, 60.0)]
    d, h = run_(s, hot, 4, History())
    assert (d.desired, d.reason) == (5, "LatencyAboveTarget") and "sized × 1.25 for 10 min" in d.message
    met = [(t, m(16.0, p95_ms=500, inflight=10)) for t in range(75, 600, 15)]
    d, h = run_(s, met, 5, h)
    assert d.desired == 5 and d.message.startswith(
        "qps at 4.00 req/s per replica (targetQPSPerReplica) × 1.25 (what the latency guardrail found it short)")
    loaded = state.load(state.dump(h))
    assert loaded is not None and (loaded.undercount, loaded.undercount_at) == (1.25, 60.0)
    assert decide(600.0, m(32.0, p95_ms=500), current=5, ready=5, policy=s, history=loaded).desired == 10
    d = decide(660.0, m(16.0, p95_ms=500, inflight=10), current=5, ready=5, policy=s, history=h)
    assert d.desired == 4 and "×" not in d.message  # 600 s after: forgotten, the target's count
    d, h = run_(replace(s, guard_memory_s=0.0), hot, 4, History())
    assert d.desired == 5 and d.message.endswith(
        "the sizing gave 4.00 replicas (is the target or profile right for this replica?)")
    d, _ = run_(replace(s, guard_memory_s=0.0), met[:4], 5, h)
    assert d.desired == 4


@pytest.mark.parametrize(("after", "added"), [(2000.0, False), (2400.0, False), (1900.0, True)])
def test_a_breach_that_replicas_do_not_fix_stops_the_guardrail(after: float, added: bool) -> None:
    """The p95 is twice the objective at 4 replicas: the guardrail adds a fifth. Once it is ready and a whole
    window was seen with it, a p95 no better (a slow dependency, throttled CPU) is not a capacity shortfall:
    no sixth, seventh... up to maxReplicas, and no scale-down either while the objective is breached. A p95
    that fell is a shortfall still being closed: one more. The comparison is persisted with the history, and
    a breach that ends forgets it."""
    from cosyvoice_operator.autoscaling import state

    h, current = History(), 4
    for now in (0.0, 15.0, 30.0, 45.0, 60.0):
        d = decide(now, m(16.0, p95_ms=2000, inflight=20), current=current, ready=4, policy=NO_LIMITS, history=h)
        current, h = d.desired, d.history
    assert (current, d.reason, h.guard_ratio, h.undercount) == (5, "LatencyAboveTarget", 2.0, 1.25)
    h = state.load(state.dump(h))
    assert h is not None and h.guard_ratio == 2.0
    for forged in (-1, 0.5, 1.0, "2", float("nan"), True):  # never recorded by a guardrail: none at all
        loaded = state.load({"guardLatencyRatio": forged})
        assert loaded is not None and loaded.guard_ratio is None
    for now in (75.0, 90.0, 180.0):  # the fifth warming: nothing to compare yet
        d = decide(now, m(16.0, p95_ms=after, inflight=20), current=5, ready=4, policy=NO_LIMITS, history=h)
        h = d.history
    reasons = []
    for now in (195.0, 210.0, 225.0, 240.0, 255.0):  # ready, and a whole window seen with it
        d = decide(now, m(16.0, p95_ms=after, inflight=20), current=5, ready=5, policy=NO_LIMITS, history=h)
        h = d.history
        reasons.append(d.reason)
    assert reasons[:-1] == ["WithinTolerance"] * 4  # not before the window is seen
    if added:
        assert (d.desired, d.reason, d.history.guard_ratio) == (7, "LatencyAboveTarget", 1.9)
    else:
        assert (d.desired, d.reason) == (5, "LatencyNotCapacity")
        assert f"at {after / 1000:.0%} of its objective, no better than the 200% at which the guardrail last" in d.message
        # it was not the sizing that was short: no correction kept for latencyGuardMemorySeconds
        assert d.message.endswith("; the sizing's correction is dropped") and d.history.undercount_at is None
        assert d.history.undercount == 1.0
        # back at the band's edge (110 % of the objective): the breach is over, the next is compared afresh
        calm = decide(270.0, m(16.0, p95_ms=1100, inflight=20), current=5, ready=5, policy=NO_LIMITS, history=h)
        assert calm.history.guard_ratio is None


@pytest.mark.parametrize(("qps", "current", "found"), [
    (2.0, 1, 4.0),  # the target's 0.5 replicas, and 1 was too few: × 2 / 0.5
    (0.0, 2, 1.0),  # no request arriving (the last slow ones in the p95): no count to correct
])
def test_what_the_guardrail_finds_is_the_next_count_over_the_sizings(qps: float, current: int, found: float) -> None:
    h = History(hot_since=0.0)
    d = decide(60.0, m(qps, p95_ms=2000, inflight=1), current=current, ready=current, policy=BASE, history=h)
    assert d.reason == "LatencyAboveTarget" and d.history.undercount == found


def test_a_rise_within_the_noise_of_a_constant_load_is_not_a_trend() -> None:
    """At 10 req/s the slope fitted to 5 minutes of 1-minute rates scatters by 0.65 req/s over the window
    (Poisson counting noise): a rise of 1.5 is past the 10 % tolerance but within three of those, and is not
    projected (on constant load it would be a scale-up and, a window later, a reversal); 2.5 is."""
    calm = decide(0.0, m(10.0, qps_slope=1.5 / 300), current=3, ready=3, policy=NO_LIMITS, history=History())
    assert "rising" not in calm.message
    trend = decide(0.0, m(10.0, qps_slope=2.5 / 300), current=3, ready=3, policy=NO_LIMITS, history=History())
    assert "qps rising (10.0 → 11.4 in 165 s)" in trend.message


SLOW = tuple(10.0 + 0.1 * i for i in range(15))  # +0.1 req/s a minute for 15 minutes


@pytest.mark.parametrize(("history", "slope", "burst_ago", "rising"), [
    (SLOW, 0.002, None, "qps rising (11.4 → 11.7 in 165 s)"),  # 1.5 in 15 min
    ((11.4,) * 15, 0.002, None, None),  # the 5-minute slope's scatter on a flat history
    (SLOW, -0.001, None, None),  # the climb has turned: no longer projected
    (SLOW[:5], 0.002, None, None),  # no longer than the trend window: nothing more seen
    (SLOW, 0.002, 899.0, None),  # a burst (a step's jump) still in the 15 minutes
    (SLOW, 0.002, 900.0, "qps rising (11.4 → 11.7 in 165 s)"),
    ((9.0,) * 10 + SLOW, 0.002, None, "qps rising (11.4 → 11.7 in 165 s)"),  # the last 15 of a longer history
    (SLOW[:8], 0.002, None, None),  # 8 minutes of it: +0.8, within the tolerance
    (SLOW, 0.0, None, None),  # the 5-minute slope flat: the climb is over
    ((10.0, 10.5, 11.0, 11.5, 12.0), 0.002, None, None),  # 2.5 in 5 minutes is the trend window's to see
])
def test_a_rise_too_slow_for_five_minutes_is_a_trend_over_fifteen(history: tuple[float, ...], slope: float,
                                                                  burst_ago: float | None, rising: str | None) -> None:
    """+0.1 req/s a minute at 11 req/s is within the 5-minute slope's noise, but over the history's last 15
    one-minute rates it is beyond the tolerance and three standard deviations: a slow rise (a morning, a
    long sine) is projected a cold start ahead like a fast one."""
    h = History(burst_at=1000.0 - burst_ago) if burst_ago is not None else History()
    d = decide(1000.0, m(history[-1], qps_slope=slope, rate_history=history), current=3, ready=3, policy=NO_LIMITS,
               history=h)
    if rising:  # projected along the fitted slope, +0.1 req/s a minute, a cold start and an interval ahead
        assert d.details["demand_qps"] == pytest.approx(history[-1] + 0.1 / 60 * 165)
    assert (rising in d.message) if rising else ("rising" not in d.message), d.message


@pytest.mark.parametrize(("history", "step", "fitted"), [
    ((9.5,) + SLOW[1:12], 60.0, True),  # every sample of a history shorter than 15 minutes
    ((10.0, 12.0, 14.0), 300.0, True),  # a coarser history: its three samples in 15 minutes
    ((12.0, 16.0), 300.0, False),  # two samples: no slope to trust
])
def test_the_slow_rise_is_fitted_to_the_samples_of_its_15_minutes(history: tuple[float, ...], step: float,
                                                                  fitted: bool) -> None:
    import numpy as np

    d = decide(1000.0, m(history[-1], qps_slope=0.001, rate_history=history, history_step_s=step), current=3,
               ready=3, policy=NO_LIMITS, history=History())
    slope = float(np.polyfit(np.arange(len(history)), history, 1)[0]) / step if fitted else 0.0
    assert d.details["demand_qps"] == pytest.approx(history[-1] + 165 * slope), d.message


def test_no_trend_forecast_for_a_trend_window_after_a_burst() -> None:
    """A step's jump is in the 5-minute slope for 5 minutes: extrapolating it would overshoot the step."""
    from cosyvoice_operator.autoscaling.policy import TREND_WINDOW_S

    burst = decide(0.0, m(10.0, qps_short=40.0), current=3, ready=3, policy=NO_LIMITS, history=History())
    assert (burst.desired, burst.history.burst_at) == (10, 0.0)
    after = m(40.0, qps_slope=0.2)  # the slope of the step: +60 req/s over 5 min
    d = decide(60.0, after, current=10, ready=10, policy=NO_LIMITS, history=burst.history)
    assert d.desired == 10 and "rising" not in d.message
    # nor is that slope followed if the metrics vanish now
    assert decide(120.0, Metrics(), current=10, ready=10, policy=NO_LIMITS, history=d.history).desired == 10
    d = decide(TREND_WINDOW_S + 1, after, current=10, ready=10, policy=NO_LIMITS, history=burst.history)
    assert d.desired == 19 and "rising" in d.message  # 40 + 0.2 × 165 s = 73 → 18.25
    assert decide(TREND_WINDOW_S + 121, Metrics(), current=10, ready=10, policy=NO_LIMITS,
                  history=d.history).desired == 16  # a trend again, followed: 40 + 0.2 × 120 s = 64 → 16


def test_limits_set_conditions() -> None:
    d = decide(0.0, m(100.0), current=4, ready=4, policy=replace(NO_LIMITS, max_replicas=6), history=History())
    assert (d.limited, d.limited_reason) == (True, "TooManyReplicas")
    d = decide(0.0, m(100.0), current=2, ready=2, policy=BASE, history=History())
    assert (d.able_to_scale, d.able_reason) == (False, "ScaleUpLimit")
    assert d.desired == 6 and "limited to 6 by scaleUp policies" in d.message


def run(settings: Settings, steps: list[tuple[float, Metrics]], current: int) -> list[int]:
    """Evaluations over time, the count carried forward as the cluster would apply it."""
    history, out = History(), []
    for now, metrics in steps:
        d = decide(now, metrics, current=current, ready=current, policy=settings, history=history)
        history, current = d.history, d.desired
        out.append(current)
    return out


def test_scale_down_stabilization_takes_the_highest_recent_recommendation() -> None:
    s = replace(NO_LIMITS, scale_down=Rules(300.0, ()))
    # Demand for 10 at t=0, then for 2: nothing goes down until 300 s after the last high recommendation.
    steps = [(0.0, m(40.0))] + [(t, m(8.0, p95_ms=100)) for t in (15.0, 150.0, 299.0, 301.0)]
    assert run(s, steps, 10) == [10, 10, 10, 10, 2]


def test_no_scale_down_before_a_whole_window_was_observed() -> None:
    """After an operator restart the history is empty: the first low reading must not drop replicas."""
    s = replace(NO_LIMITS, scale_down=Rules(300.0, ()))
    steps = [(t, m(8.0, p95_ms=100)) for t in (1000.0, 1100.0, 1299.0, 1300.0)]
    assert run(s, steps, 10) == [10, 10, 10, 2]


def test_scale_up_stabilization_takes_the_lowest_recent_recommendation() -> None:
    s = replace(NO_LIMITS, scale_up=Rules(60.0, ()))
    steps = [(0.0, m(16.0)), (15.0, m(40.0)), (45.0, m(40.0)), (76.0, m(40.0))]
    assert run(s, steps, 4) == [4, 4, 4, 10]


def test_scale_up_rate_limit_counts_from_the_start_of_the_period() -> None:
    s = replace(BASE, scale_up=Rules(0.0, (Policy("Pods", 2, 60.0),)))
    steps = [(t, m(100.0)) for t in (0.0, 15.0, 30.0, 61.0)]
    assert run(s, steps, 2) == [4, 4, 4, 6]


def test_scale_limit_helper_matches_hpa_percent_rounding() -> None:
    up = Rules(0.0, (Policy("Percent", 100, 15.0), Policy("Pods", 4, 15.0)), "Max")
    assert scale_limit(up, 3, [], 0.0, up=True) == 7  # max(3 × 2, 3 + 4)
    assert scale_limit(replace(up, select="Min"), 3, [], 0.0, up=True) == 6
    down = Rules(0.0, (Policy("Percent", 50, 60.0),))
    assert scale_limit(down, 5, [], 0.0, up=False) == 3  # ceil(5 × 0.5)
    assert scale_limit(down, 5, [(10.0, -2)], 30.0, up=False) == 4  # the period started at 7


def test_no_data_never_scales_down_and_fallback_only_raises() -> None:
    s = replace(NO_LIMITS, fallback_replicas=8, failure_threshold=3)
    outage = Metrics(error="Prometheus query failed")
    assert run(s, [(float(t), outage) for t in range(5)], 4) == [4, 4, 8, 8, 8]
    assert run(s, [(float(t), outage) for t in range(5)], 10) == [10] * 5  # above the fallback: held
    # Data again: the failure count resets and the proportional signal decides.
    d = decide(0.0, outage, current=4, ready=4, policy=s, history=History(failures=2))
    assert (d.desired, d.reason, d.history.failures) == (8, "FallbackReplicas", 3)
    d = decide(1.0, m(16.0), current=8, ready=8, policy=s, history=d.history)
    assert d.history.failures == 0 and d.desired == 4


def test_no_data_during_a_ramp_follows_the_last_trend_up_only_and_bounded() -> None:
    """Metrics vanish while the rate climbs: the count follows the last known slope (raise only), for at
    most outageForecastSeconds; then it holds."""
    s = replace(NO_LIMITS, scale_down=Rules(300.0, ()))
    ramp = m(40.0, qps_slope=0.02, p95_ms=500)  # 40 req/s, +0.02 req/s per s: +1.2 req/s a minute
    d = decide(0.0, ramp, current=12, ready=12, policy=s, history=History())
    history, current, counts = d.history, d.desired, []
    outage = Metrics()  # an empty result: the series vanished
    for now in range(15, 3000, 15):
        d = decide(float(now), outage, current=current, ready=current, policy=s, history=history)
        assert d.desired >= current and not d.metrics_ok and d.reason == "MetricsUnavailable"
        history, current = d.history, d.desired
        counts.append(current)
    # the projection stops follow_trend_s after the last reading: (40 + 0.02 × 600) / 4 = 13
    assert max(counts) == counts[-1] == math.ceil((40 + 0.02 * s.follow_trend_s) / 4) == 13
    assert counts[:3] == [12, 12, 12]  # the projection has to leave the tolerance band first
    assert counts.index(13) * 15 + 15 <= s.follow_trend_s
    # A flat or falling trend, or no reading yet, holds exactly.
    for slope in (0.0, -0.05):
        h = decide(0.0, m(40.0, qps_slope=slope), current=10, ready=10, policy=s, history=History()).history
        assert decide(600.0, outage, current=10, ready=10, policy=s, history=h).desired == 10
    assert decide(600.0, outage, current=10, ready=10, policy=s, history=History()).desired == 10
    steep = decide(0.0, m(40.0, qps_slope=1.0), current=10, ready=10, policy=s, history=History()).history
    assert decide(600.0, outage, current=10, ready=10, policy=replace(s, max_replicas=12), history=steep).desired == 12
    # Within the scale-up policies: the default allows +4 pods or +200 % per 15 s.
    assert decide(600.0, outage, current=3, ready=3, policy=replace(s, scale_up=BASE.scale_up),
                  history=steep).desired == 9
    # A fixed fallback above the trend still wins, and the trend never lowers a higher count.
    assert decide(600.0, outage, current=10, ready=10, policy=replace(s, fallback_replicas=18, failure_threshold=1),
                  history=replace(steep, last_slope=0.02)).desired == 18
    assert decide(600.0, outage, current=200, ready=200, policy=replace(s, max_replicas=300),
                  history=steep).desired == 200


def test_a_recurring_peak_is_pre_warmed_and_outlives_a_metrics_outage() -> None:
    """Three periods of a 20-minute square wave in the rate history: the count rises a horizon before
    the next peak, while the current rate is still low; and the forecast keeps holding through an outage."""
    period, step = 1200, 60.0
    hist = tuple(40.0 if (t % period) < period / 2 else 8.0 for t in range(0, 3 * period, 60))
    # now: 3 minutes before the next rise (the trough ends at 3600 s)
    now_hist = hist[:-3]
    d = decide(0.0, m(8.0, rate_history=now_hist, history_step_s=step), current=2, ready=2, policy=NO_LIMITS,
               history=History())
    assert d.desired == 10 and "recurring every 20 min" in d.message
    far = hist[:-8]  # 8 minutes before: nothing to pre-warm yet
    assert decide(0.0, m(8.0, rate_history=far, history_step_s=step), current=2, ready=2, policy=NO_LIMITS,
                  history=History()).desired == 2
    h = decide(0.0, m(8.0, rate_history=far, history_step_s=step), current=2, ready=2, policy=NO_LIMITS,
               history=History()).history
    out = decide(5 * 60.0, Metrics(), current=2, ready=2, policy=NO_LIMITS, history=h)
    assert out.desired == 10 and not out.metrics_ok  # no data, but the peak is due: raised, never lowered


def test_a_step_is_not_a_season() -> None:
    from cosyvoice_operator.autoscaling import forecast

    step = [10.0] * 60 + [50.0] * 120
    assert forecast.detect_period(step, 60.0, 195.0, 0.6) is None


def test_a_noisy_rise_is_not_a_season() -> None:
    """Three hours of a slow rise (a day's morning) with ±12 % minute-to-minute noise: the series correlates
    with itself at every lag through its trend, and its noise makes some lag a local maximum; without the
    trend nothing recurs. The same noise on a 30-minute wave is found."""
    import random

    from cosyvoice_operator.autoscaling import forecast

    rnd = random.Random(5)
    noise = [rnd.gauss(1.0, 0.12) for _ in range(180)]
    rise = [(10.0 + 10.0 * i / 180) * e for i, e in enumerate(noise)]
    assert forecast.detect_period(rise, 60.0, 195.0, 0.6) is None
    wave = [(15.0 + 5.0 * math.sin(2 * math.pi * i / 30)) * e for i, e in enumerate(noise)]
    found = forecast.detect_period([w + 0.05 * i for i, w in enumerate(wave)], 60.0, 195.0, 0.6)
    assert found is not None and abs(found.period_s - 1800) < 60  # the period, not one of its multiples


def test_a_short_square_wave_is_found_by_the_noise_within_a_minute() -> None:
    """A 7-minute square wave, 20 ↔ 50 req/s: four of every seven second differences of its 1-minute rate are
    its edges, so the noise they read is the pattern itself and nothing recurs above it. The short window
    against the minute's shows the arrivals' own noise (Poisson here), and the pattern is found and followed:
    in the trough, replicas for the coming peak."""
    period = 420
    rates = tuple(50.0 if (t % period) < period / 2 else 20.0 for t in range(0, 3 * 3600, 60))
    poisson = tuple(r + (0.5 if i % 2 else -0.5) * math.sqrt(r / 60) for i, r in enumerate(rates))
    now = rates[:-2]  # the trough: the peak returns within the horizon
    blind = decide(0.0, m(20.0, rate_history=now, history_step_s=60.0), current=5, ready=5, policy=NO_LIMITS,
                   history=History())
    seen = decide(0.0, m(20.0, rate_history=now, short_history=poisson[:-2], history_step_s=60.0), current=5,
                  ready=5, policy=NO_LIMITS, history=History())
    assert "season_s" not in blind.details
    peak = math.ceil(50.0 / (NO_LIMITS.target_qps_per_replica or 0))
    assert abs(seen.details["season_s"] - period) < 30 and seen.desired == peak > 5
    assert "the load recurring every 7 min" in seen.message  # not a multiple, which correlates as well


def test_no_traffic_versus_no_data() -> None:
    """Series present with rate 0 may scale down; an empty result (no series) may not."""
    zero = decide(0.0, m(0.0, inflight=0.0), current=5, ready=5, policy=NO_LIMITS, history=History())
    empty = decide(0.0, Metrics(qps=None, inflight=None), current=5, ready=5, policy=NO_LIMITS, history=History())
    assert (zero.desired, zero.metrics_ok) == (1, True)
    assert (empty.desired, empty.metrics_ok, empty.reason) == (5, False, "MetricsUnavailable")


def test_constant_load_with_noise_does_not_flap() -> None:
    """±8 % noise around the target, within the 10 % tolerance: no scale event at all."""
    noisy = [40.0 * (1 + 0.08 * ((i * 7919) % 17 - 8) / 8) for i in range(200)]
    counts = run(BASE, [(15.0 * i, m(q, p95_ms=600)) for i, q in enumerate(noisy)], 10)
    assert set(counts) == {10}


def test_settings_from_the_crd_example() -> None:
    import yaml
    from cvs_testkit import EXAMPLES_DIR

    spec = parse_spec(yaml.safe_load((EXAMPLES_DIR / "mig-mixed-autoscaling.yaml").read_text())["spec"])
    s = Settings.from_spec(spec.autoscaling)
    assert (s.min_replicas, s.max_replicas, s.target_qps_per_replica, s.target_p95_ms) == (2, 12, 6, 800)
    assert s.scale_down == Rules(300.0, (Policy("Pods", 1, 60.0),), "Max")
    assert (s.fallback_replicas, s.failure_threshold) == (4, 3)
    defaults = Settings.from_spec(parse_spec({"autoscaling": {"enabled": True, "maxReplicas": 3,
                                                              "targetQPSPerReplica": 1}}).autoscaling)
    assert defaults.scale_down.stabilization_s == 300.0 and defaults.fallback_replicas is None


def test_capacity_profile_sizes_for_the_objective_and_the_request_length() -> None:
    from cosyvoice_operator.autoscaling import profile
    from cosyvoice_operator.spec import InvalidSpec

    auto = parse_spec({"autoscaling": {"enabled": True, "maxReplicas": 20, "targetP95LatencyMs": 1000,
                                       "capacityProfile": "tiny-cpu", "coldStartSeconds": 60}}).autoscaling
    s = Settings.from_spec(auto, profile.load(auto.capacity_profile))
    assert (s.cold_start_s, s.horizon_s, s.sizing_latency_ratio, s.follow_trend_s) == (60.0, 135.0, 0.8, 600.0)
    short, _ = s.per_replica_rate(4.0)
    long_, _ = s.per_replica_rate(16.0)
    assert short and long_ and short > 2 * long_  # long requests: fewer per replica within the objective
    same_rate = m(40.0, p95_ms=300)
    assert decide(0.0, replace(same_rate, audio_s=16.0), current=2, ready=2, policy=s, history=History()).desired > \
        decide(0.0, replace(same_rate, audio_s=4.0), current=2, ready=2, policy=s, history=History()).desired
    for bad, why in [({"capacityProfile": "a100"}, "not a bundled profile"),
                     ({"capacityProfile": "tiny-cpu", "targetP95LatencyMs": None, "targetQPSPerReplica": 5}, "set it too"),
                     ({"capacityProfile": "../../etc/passwd"}, "not a bundled profile")]:
        raw = {"enabled": True, "maxReplicas": 3, "targetP95LatencyMs": 1000, **bad}
        raw = {k: v for k, v in raw.items() if v is not None}
        with pytest.raises(InvalidSpec, match=why):
            parse_spec({"autoscaling": raw})


def test_a_forecast_rise_is_not_held_inside_the_tolerance_band() -> None:
    """A slow recurring climb (an hour-long sawtooth, 8 → 28 req/s): 50 minutes into the climb the load
    needs 6.17 replicas at 4 req/s each and the pattern 6.58 within the horizon — both inside the ±10 %
    band around the 6 running, where noise is held. The pattern says the load keeps rising, so the count
    goes up now rather than trailing the climb by a replica. The same reading without a pattern is noise
    and is held."""
    period, step = 3600, 60.0
    climb = [8.0 + 20.0 * (t % period) / period for t in range(0, 3 * period, 60)]
    now = tuple(climb[:2 * 60 + 51])
    rate = now[-1]
    assert 6.0 < rate / 4 < 6.2
    d = decide(0.0, m(rate, rate_history=now, history_step_s=step), current=6, ready=6,
               policy=NO_LIMITS, history=History())
    assert (d.desired, d.reason) == (7, "ScaleUp") and "recurring every 60 min" in d.message
    flat = tuple(rate + (0.5 if i % 2 else -0.5) for i in range(len(now)))
    d = decide(0.0, m(rate, rate_history=flat, history_step_s=step), current=6, ready=6, policy=NO_LIMITS,
               history=History())
    assert (d.desired, d.reason) == (6, "WithinTolerance")



def test_a_drop_in_bursty_load_never_adds_replicas() -> None:
    """Bursty traffic at 20 req/s (the history's minute-to-minute noise five times Poisson's): its dispersion
    is the noise over the Poisson noise of the level it was measured at. When the load then drops, the same
    history must not read as burstier and ask for more replicas than at 20 req/s."""
    import random

    from cosyvoice_operator.autoscaling import profile

    rnd = random.Random(7)
    history = tuple(20.0 + rnd.gauss(0.0, 4.0) for _ in range(60))
    s = Settings(max_replicas=100, target_p95_ms=2000.0, profile=profile.load("tiny-cpu"))

    def needed(qps: float) -> float:
        d = decide(0.0, m(qps, audio_s=12.0, rate_history=history), current=1, ready=1, policy=s,
                   history=History())
        return d.details["needed"]

    at_20, at_5, idle = needed(20.0), needed(5.0), needed(0.1)
    assert at_20 > 20.0 / s.per_replica_rate(12.0)[0]  # bursty: more than Poisson sizing
    assert at_5 < at_20 and idle < 1.0


def test_minute_to_minute_changes_of_the_rate_are_not_sized_as_clumps() -> None:
    """The same 1-minute history (20 req/s, its minute-to-minute noise ±4 req/s, Poisson's √(20/60) ≈ 0.58) is
    two different services: arrivals in clumps (the burst window's rate moves against the minute's as much as
    the minutes move: the clumps show at both scales), or users whose rate moves from minute to minute (within
    a minute the two windows share that rate and differ by Poisson noise only). Only the first needs the
    replicas a clumped queue needs; the second needs replicas for its busier minutes, as Poisson arrivals."""
    import random

    from cosyvoice_operator.autoscaling import profile

    rnd = random.Random(11)
    level, n = 20.0, 120
    rates = tuple(level + rnd.gauss(0.0, 4.0) for _ in range(n))
    s = Settings(max_replicas=100, target_p95_ms=2000.0, profile=profile.load("tiny-cpu"))
    poisson = level / s.per_replica_rate(12.0)[0]

    def decision(short: tuple[float, ...]) -> Decision:
        return decide(0.0, m(level, audio_s=12.0, rate_history=rates, short_history=short), current=1, ready=1,
                      policy=s, history=History())

    minute_only = decision(()).details["needed"]
    # clumps: the short window's rate less the minute's varies by D·λ·(1/30 - 1/60) = D·λ/60, the 1-min rate's
    # own variance (4²) when the dispersion D is the same at both scales
    clumped = decision(tuple(r + rnd.gauss(0.0, 4.0) for r in rates)).details["needed"]
    users = decision(tuple(r + rnd.gauss(0.0, math.sqrt(level / 60)) for r in rates))
    assert minute_only > 1.5 * poisson and clumped == minute_only
    # sized for its minutes at the 95th percentile of their ±4 req/s spread above the last 5 minutes' level, as
    # Poisson arrivals within them
    recent = sum(rates[-5:]) / 5
    assert poisson < users.details["needed"] < (recent + 1.645 * 4.0) / s.per_replica_rate(12.0)[0] < minute_only
    assert f"(recent minutes at {recent:.1f}) + " in users.message and "for their minute-to-minute spread" in users.message


def test_a_busy_minute_within_the_spread_is_a_draw_and_one_beyond_it_a_change() -> None:
    """Users whose rate moves ±4 req/s from minute to minute around 20. The minute now is one draw of that
    spread: the count is sized for the spread's 95th percentile above the recent minutes' level, and a draw
    moves it only by its share of that level (a fifth), where adding the percentile to the draw itself moved it
    whole. A minute beyond three standard deviations of the noise is a change: sized from it."""
    import random

    from cosyvoice_operator.autoscaling import profile

    rnd = random.Random(12)
    rates = tuple(20.0 + rnd.gauss(0.0, 4.0) for _ in range(120))
    short = tuple(r + rnd.gauss(0.0, math.sqrt(20.0 / 60)) for r in rates)
    s = Settings(max_replicas=100, target_p95_ms=2000.0, profile=profile.load("tiny-cpu"))
    per_replica = s.per_replica_rate(12.0)[0]
    assert per_replica is not None

    def needed(now: float) -> float:  # this minute's rate is the history's last sample too
        d = decide(0.0, m(now, audio_s=12.0, rate_history=rates[:-1] + (now,), short_history=short), current=4,
                   ready=4, policy=s, history=History())
        return float(d.details["needed"])

    level = sum(rates[-5:-1]) / 4  # the four minutes before this one
    quiet, busy = needed(level - 8.0), needed(level + 8.0)  # ±2 standard deviations
    assert 0 < busy - quiet < 16.0 / 4 / per_replica  # its fifth of the level (and of the noise's estimate)
    assert busy < (level + 8.0 + 1.645 * 4.0) / per_replica  # not the percentile on top of the draw
    jump = level + 16.0  # four standard deviations: the load moved
    assert needed(jump) > (jump + 1.645 * 3.0) / per_replica
