"""Every path of ``decide`` down to what ``kubectl describe`` shows: the count, the reason, the message, the
three conditions and the history the next evaluation resumes from. Each case is a situation an SRE would
recognise; the numbers in the comments are the arithmetic the message states."""
from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from cosyvoice_operator.autoscaling import profile
from cosyvoice_operator.autoscaling.policy import (DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, Decision, History, Metrics,
                                                   Policy, Rules, Settings, decide, scale_limit)

BASE = Settings(min_replicas=1, max_replicas=20, target_qps_per_replica=4.0, target_p95_ms=1000.0,
                scale_down=Rules(0.0, DEFAULT_SCALE_DOWN.policies))
NO_LIMITS = replace(BASE, scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))
PROFILE = profile.load("tiny-cpu")
MEASURED = Settings(min_replicas=1, max_replicas=40, target_p95_ms=2000.0, profile=PROFILE)
NO_SERIES = "no proportional signal (query returned no series)"


def full(d: Decision) -> tuple[Any, ...]:
    return (d.desired, d.reason, d.message, d.metrics_ok, d.able_to_scale, d.able_reason, d.limited,
            d.limited_reason, d.recommendation, {k: round(v, 3) for k, v in d.details.items()})


def ok(desired: int, reason: str, message: str, rec: int, details: dict[str, float], able: str = "ReadyForNewScale",
       limited: str = "") -> tuple[Any, ...]:
    return (desired, reason, message, True, able == "ReadyForNewScale", able, bool(limited), limited, rec, details)


def held(desired: int, reason: str, message: str) -> tuple[Any, ...]:
    return (desired, reason, message, False, True, "ReadyForNewScale", False, "", None, {})


QPS = "qps at 4.00 req/s per replica (targetQPSPerReplica)"
CASES = [
    ("trend", 60.0, NO_LIMITS, Metrics(qps=36.0, qps_slope=0.05, p95_ms=300), 8, History(),  # 36 + 0.05 × 165 s
     ok(12, "ScaleUp", f"qps rising (36.0 → 44.2 in 165 s) at 4.00 req/s per replica (targetQPSPerReplica) "
        f"needs 11.06 replicas", 12, {"needed": 11.062, "demand_qps": 44.25, "latency_ratio": 0.3})),
    ("burst", 60.0, NO_LIMITS, Metrics(qps=8.0, qps_short=40.0, p95_ms=300), 2, History(),
     ok(10, "ScaleUp", f"qps (burst, short window) at 4.00 req/s per replica (targetQPSPerReplica) needs 10.00 "
        f"replicas", 10, {"needed": 10.0, "demand_qps": 40.0, "latency_ratio": 0.3})),
    ("inflight-target", 60.0, replace(NO_LIMITS, target_inflight_per_replica=2.0), Metrics(qps=8.0, inflight=20.0, p95_ms=300),
     2, History(), ok(10, "ScaleUp", "inflight needs 10.00 replicas", 10,
                      {"needed": 10.0, "demand_qps": 8.0, "latency_ratio": 0.3})),
    ("scale-down-window", 100.0, replace(BASE, scale_down=Rules(300.0, DEFAULT_SCALE_DOWN.policies)),
     Metrics(qps=8.0, p95_ms=300), 8, History(recommendations=((0.0, 8),)),
     ok(8, "ScaleDown", f"{QPS} needs 2.00 replicas; held at 8 by the 300 s scale-down window", 2,
        {"needed": 2.0, "demand_qps": 8.0, "latency_ratio": 0.3}, "ScaleDownStabilized")),
    ("scale-down-rate-limit", 400.0, replace(BASE, scale_down=Rules(300.0, DEFAULT_SCALE_DOWN.policies)),
     Metrics(qps=4.0, p95_ms=300), 8, History(recommendations=((50.0, 8), (100.0, 2))),  # 50 % of 8 per minute
     ok(4, "ScaleDown", f"{QPS} needs 1.00 replicas; held at 2 by the 300 s scale-down window; limited to 4 by "
        f"scaleDown policies", 1, {"needed": 1.0, "demand_qps": 4.0, "latency_ratio": 0.3}, "ScaleDownLimit")),
    ("scale-up-window", 100.0, replace(BASE, scale_up=Rules(60.0, ())), Metrics(qps=40.0, p95_ms=300), 4,
     History(recommendations=((50.0, 6),)),
     ok(6, "ScaleUp", f"{QPS} needs 10.00 replicas; held at 6 by the 60 s scale-up window", 10,
        {"needed": 10.0, "demand_qps": 40.0, "latency_ratio": 0.3}, "ScaleUpStabilized")),
    ("scale-up-rate-limit", 60.0, BASE, Metrics(qps=80.0, p95_ms=300), 2, History(),  # max(2 + 4 pods, 2 × 300 %)
     ok(6, "ScaleUp", f"{QPS} needs 20.00 replicas; limited to 6 by scaleUp policies", 20,
        {"needed": 20.0, "demand_qps": 80.0, "latency_ratio": 0.3}, "ScaleUpLimit")),
    ("max-replicas", 60.0, replace(NO_LIMITS, max_replicas=12), Metrics(qps=200.0, p95_ms=300), 10, History(),
     ok(12, "ScaleUp", f"{QPS} needs 50.00 replicas; capped at maxReplicas 12", 50,
        {"needed": 50.0, "demand_qps": 200.0, "latency_ratio": 0.3}, limited="TooManyReplicas")),
    ("min-replicas", 60.0, replace(NO_LIMITS, min_replicas=4), Metrics(qps=2.0, p95_ms=300), 10, History(),
     ok(4, "ScaleDown", f"{QPS} needs 0.50 replicas; raised to minReplicas 4", 1,
        {"needed": 0.5, "demand_qps": 2.0, "latency_ratio": 0.3}, limited="TooFewReplicas")),
    ("latency-adds-capacity", 60.0, NO_LIMITS, Metrics(qps=16.0, p95_ms=2000), 4, History(hot_since=0.0),
     ok(5, "LatencyAboveTarget", "p95 at 200% of its objective with no replica warming: adding capacity; the "
        "sizing gave 4.00 replicas: sized × 1.25 for 60 min (is the target or profile right for this replica?)", 4,
        {"needed": 4.0, "demand_qps": 16.0, "latency_ratio": 2.0})),
    ("latency-blocks-scale-down", 60.0, NO_LIMITS, Metrics(qps=8.0, p95_ms=1050), 4, History(),
     ok(4, "LatencyGuard", f"{QPS} would allow 2 replicas, but p95 is at 105% of its objective (scale-down needs "
        f"≤ 100 %)", 2, {"needed": 2.0, "demand_qps": 8.0, "latency_ratio": 1.05})),
    ("ttfa-blocks-scale-down", 60.0, replace(NO_LIMITS, target_ttfa_ms=300.0),
     Metrics(qps=8.0, p95_ms=300, ttfa_p95_ms=310), 4, History(),
     ok(4, "LatencyGuard", f"{QPS} would allow 2 replicas, but time to first audio is at 103% of its objective "
        f"(scale-down needs ≤ 100 %)", 2, {"needed": 2.0, "demand_qps": 8.0, "latency_ratio": 1.033})),
    ("spare-replica", 60.0, NO_LIMITS, Metrics(qps=8.0, p95_ms=900), 4, History(),
     ok(3, "ScaleDown", f"{QPS} needs 2.00 replicas; p95 at 90% of its objective: keeping a spare replica", 2,
        {"needed": 2.0, "demand_qps": 8.0, "latency_ratio": 0.9})),
    ("spare-replica-is-current", 60.0, NO_LIMITS, Metrics(qps=8.0, p95_ms=900), 3, History(),
     ok(3, "LatencyGuard", f"{QPS} would allow 2 replicas, but p95 is at 90% of its objective: keeping a spare "
        f"replica (below 80% it goes)", 2, {"needed": 2.0, "demand_qps": 8.0, "latency_ratio": 0.9})),
    # a decline of 15 req/s over 5 minutes: not a blip, the 300 s window shrinks to one rate window
    ("falling-load", 330.0, replace(NO_LIMITS, scale_down=Rules(300.0, ())), Metrics(qps=20.0, qps_slope=-0.05, p95_ms=300),
     10, History(recommendations=((0.0, 10), (200.0, 10))),
     ok(5, "ScaleDown", f"{QPS} needs 5.00 replicas", 5, {"needed": 5.0, "demand_qps": 20.0, "latency_ratio": 0.3})),
    # 1.5 req/s over 5 minutes is within the tolerance (2 req/s): the window holds
    ("drift-is-not-a-decline", 330.0, replace(NO_LIMITS, scale_down=Rules(300.0, ())),
     Metrics(qps=20.0, qps_slope=-0.005, p95_ms=300), 10, History(recommendations=((0.0, 10), (200.0, 10))),
     ok(10, "ScaleDown", f"{QPS} needs 5.00 replicas; held at 10 by the 300 s scale-down window", 5,
        {"needed": 5.0, "demand_qps": 20.0, "latency_ratio": 0.3}, "ScaleDownStabilized")),
    # every replica ready, batches full (40 ≥ 16 × 2), a queue growing: 2 × 24 / 10 = 4.8, where the profile
    # at 4 s of audio would ask for 24 / 21.3 = 1.1
    ("saturated", 60.0, MEASURED, Metrics(qps=10.0, inflight=40.0, inflight_growth=14.0, audio_s=4.0, p95_ms=2500), 2,
     History(), ok(5, "ScaleUp", "saturated (2 replicas serve 10.0 of 24.0 req/s with full batches) needs 4.80 replicas",
                   5, {"needed": 4.8, "demand_qps": 24.0, "latency_ratio": 1.25})),
]


@pytest.mark.parametrize(("now", "settings", "metrics", "current", "history", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_as_reported(now: float, settings: Settings, metrics: Metrics, current: int, history: History,
                              expected: tuple[Any, ...]) -> None:
    assert full(decide(now, metrics, current=current, ready=current, policy=settings, history=history)) == expected


def test_saturation_is_not_read_while_replicas_warm() -> None:
    """With a replica still starting, the queue is the demand the new one will take: the profile sizes."""
    m = Metrics(qps=10.0, inflight=40.0, inflight_growth=14.0, audio_s=4.0, p95_ms=2500)
    d = decide(0.0, m, current=3, ready=2, policy=MEASURED, history=History())
    assert (d.desired, d.details["needed"]) == (3, round(24.0 / PROFILE.rate_at_slo(1.6, 4.0), 3)) or \
        d.desired == 3 and "saturated" not in d.message
    # nor below full batches (31 < 16 × 2), nor when the queue does not grow beyond the tolerance
    for changed in ({"inflight": 31.0}, {"inflight_growth": 0.9}):
        d = decide(0.0, replace(m, **changed), current=2, ready=2, policy=MEASURED, history=History())
        assert "saturated" not in d.message


# --- no data ----------------------------------------------------------------------------------------------

def test_outage_follows_the_last_trend_and_says_so() -> None:
    s = replace(NO_LIMITS, scale_down=Rules(300.0, ()))
    h = History(last_ok=1000.0, last_demand=40.0, last_slope=0.05)
    d = decide(1120.0, Metrics(error="boom"), current=10, ready=10, policy=s, history=h)
    # (40 + 0.05 × 120 s) / 4 = 11.5
    assert full(d) == held(12, "MetricsUnavailable",
                           "raised to 12 replicas along the last trend (+0.050 req/s per s) (120 s without data): boom")
    assert (d.history.failures, d.history.scale_events, d.history.last_ok) == (1, ((1120.0, 2),), 1000.0)
    # a trend that stays within the tolerance of the last demand (10 × 1.1) holds
    d = decide(1040.0, Metrics(error="boom"), current=10, ready=10, policy=s, history=h)
    assert full(d) == held(10, "MetricsUnavailable", "holding 10 replicas: boom") and d.history.scale_events == ()


@pytest.mark.parametrize(("elapsed", "desired"), [(0, 2), (59, 2), (60, 9), (299, 9), (300, 2)])
def test_outage_follows_the_recurring_pattern_one_horizon_ahead(elapsed: int, desired: int) -> None:
    """The forecast made at the last reading, a value a minute: what is due within the horizon (195 s:
    four minutes of samples) is held, nothing after it."""
    h = History(last_ok=1000.0, last_demand=8.0, forecast=(1.0, 1.0, 1.0, 1.0, 9.0, 1.0, 1.0, 1.0, 1.0),
                forecast_step_s=60.0)
    d = decide(1000.0 + elapsed, Metrics(), current=2, ready=2, policy=NO_LIMITS, history=h)
    message = (f"raised to 9 replicas along the recurring pattern ({elapsed} s without data): {NO_SERIES}"
               if desired == 9 else f"holding 2 replicas: {NO_SERIES}")
    assert full(d) == held(desired, "MetricsUnavailable", message)


def test_outage_pattern_and_trend_take_the_higher() -> None:
    h = History(last_ok=0.0, last_demand=8.0, last_slope=0.1, forecast=(3.0,) * 6, forecast_step_s=60.0)
    d = decide(120.0, Metrics(), current=2, ready=2, policy=NO_LIMITS, history=h)  # (8 + 0.1 × 120) / 4 = 5
    assert d.desired == 5 and "the last trend (+0.100 req/s per s)" in d.message
    d = decide(120.0, Metrics(), current=2, ready=2, policy=NO_LIMITS, history=replace(h, last_slope=0.01))
    assert d.desired == 3 and "the recurring pattern" in d.message
    # the request length last measured sizes it: long requests, fewer per replica
    s = replace(MEASURED, scale_up=Rules(0.0, ()))
    trend = replace(h, forecast=())
    short = decide(120.0, Metrics(), current=1, ready=1, policy=s, history=replace(trend, last_audio_s=4.0))
    long_ = decide(120.0, Metrics(), current=1, ready=1, policy=s, history=replace(trend, last_audio_s=20.0))
    assert (short.desired, long_.desired) == (1, 10)  # 20 req/s / 21.3 → 1; 20 / 2.04 → 9.8


def test_fallback_after_the_threshold_and_its_message() -> None:
    s = replace(NO_LIMITS, fallback_replicas=6, failure_threshold=2)
    d = decide(50.0, Metrics(error="boom"), current=3, ready=3, policy=s, history=History(failures=1))
    assert full(d) == held(6, "FallbackReplicas", "2 consecutive metric failures: raised to fallback.replicas 6 (boom)")
    assert (d.history.failures, d.history.scale_events) == (2, ((50.0, 3),))
    d = decide(50.0, Metrics(), current=3, ready=3, policy=s, history=History())
    assert full(d) == held(3, "MetricsUnavailable", f"holding 3 replicas: {NO_SERIES}")
    # at the fallback already: nothing to raise, the reason stays MetricsUnavailable
    d = decide(50.0, Metrics(error="boom"), current=6, ready=6, policy=s, history=History(failures=1))
    assert (d.desired, d.reason) == (6, "MetricsUnavailable")
    # the fallback is bounded by maxReplicas
    d = decide(50.0, Metrics(error="boom"), current=3, ready=3, policy=replace(s, max_replicas=5),
               history=History(failures=1))
    assert (d.desired, d.reason) == (5, "FallbackReplicas")


# --- recurring patterns -----------------------------------------------------------------------------------

PERIOD, STEP = 1200, 60.0
MINUTES = range(0, 3 * PERIOD, 60)


def test_a_recurring_shift_to_long_requests_is_pre_warmed() -> None:
    """The same 10 requests/s all along, the requests 20 s long half of every 20 minutes and 4 s the other
    half: three minutes before the long half, the replicas 20 s requests need are asked for."""
    rate = tuple(10.0 for _ in MINUTES)
    work = tuple(10.0 * (20.0 if t % PERIOD < PERIOD / 2 else 4.0) for t in MINUTES)
    m = Metrics(qps=10.0, audio_s=4.0, rate_history=rate[:-3], work_history=work[:-3], history_step_s=STEP,
                p95_ms=300)
    d = decide(0.0, m, current=2, ready=2, policy=MEASURED, history=History())
    # 10 req/s at 20 s of audio: 2.04 req/s per replica
    assert full(d) == ok(5, "ScaleUp", "the load recurring every 20 min (needs 4.90 replicas within 195 s; now 10.0 "
                         "req/s) needs 4.90 replicas", 5,
                         {"needed": 4.903, "demand_qps": 10.0, "season_s": 1203.639, "latency_ratio": 0.15})
    assert tuple(round(x, 2) for x in d.history.forecast) == (0.47, 0.47, 4.19) + (4.9,) * 7
    assert (d.history.season_s, d.history.season_checked, d.history.last_audio_s) == (d.details["season_s"], 0.0, 4.0)
    # the rate alone has no pattern: without the work history nothing is pre-warmed
    plain = decide(0.0, replace(m, work_history=()), current=2, ready=2, policy=MEASURED, history=History())
    assert plain.desired == 2 and "season_s" not in plain.details and plain.details["needed"] < 0.5
    # lengths are those the history saw while the rate was typical: a forecast never goes beyond them
    assert max(d.history.forecast) == pytest.approx(10.0 / PROFILE.rate_at_slo(1.6, 20.0), abs=0.01)


def test_the_period_is_looked_for_again_only_every_five_minutes() -> None:
    hist = tuple(40.0 if t % PERIOD < PERIOD / 2 else 8.0 for t in MINUTES)
    m = Metrics(qps=8.0, rate_history=hist[:-3], history_step_s=STEP)
    first = decide(0.0, m, current=2, ready=2, policy=NO_LIMITS, history=History())
    assert first.history.season_s == pytest.approx(1200.0, abs=30) and first.history.season_checked == 0.0
    flat = replace(m, rate_history=(8.0,) * 57)
    cached = decide(299.0, flat, current=2, ready=2, policy=NO_LIMITS, history=first.history)
    assert (cached.history.season_s, cached.history.season_checked) == (first.history.season_s, 0.0)
    again = decide(300.0, flat, current=2, ready=2, policy=NO_LIMITS, history=first.history)
    assert (again.history.season_s, again.history.season_checked) == (None, 300.0)
    # too little history to look at: nothing found, and looked for again at the next reading
    short = decide(0.0, replace(m, rate_history=hist[:7]), current=2, ready=2, policy=NO_LIMITS, history=History())
    assert (short.history.season_s, short.history.season_checked) == (None, None)
    # during an outage the period found is kept, not looked for
    out = decide(400.0, Metrics(), current=2, ready=2, policy=NO_LIMITS, history=first.history)
    assert (out.history.season_s, out.history.season_checked) == (first.history.season_s, 0.0)


def test_a_pattern_only_adds_beyond_the_tolerance() -> None:
    """A pattern that needs no more than the demand now (within the tolerance) leaves the message to the rate."""
    hist = tuple(8.6 if t % PERIOD < PERIOD / 2 else 8.0 for t in MINUTES)
    d = decide(0.0, Metrics(qps=8.0, rate_history=hist[:-3], history_step_s=STEP), current=2, ready=2,
               policy=NO_LIMITS, history=History())
    assert d.message.startswith(QPS)


# --- bursty arrivals --------------------------------------------------------------------------------------

def test_bursty_arrivals_are_sized_for_their_clumps() -> None:
    """A history whose minute-to-minute rate varies seven times more than Poisson counting allows: the
    replicas are sized for clumps of arrivals, and say so; Poisson noise is sized as Poisson."""
    rnd = random.Random(1)
    bursty = tuple(20.0 + rnd.gauss(0, 4.0) for _ in range(120))
    m = Metrics(qps=20.0, audio_s=12.0, rate_history=bursty, p95_ms=900)
    d = decide(0.0, m, current=4, ready=4, policy=MEASURED, history=History())
    assert full(d) == ok(11, "ScaleUp", "qps at 1.96 req/s per replica (tiny-cpu profile at 12.0 s of audio per "
                         "request, arrivals in clumps of 2.8) needs 10.21 replicas", 11,
                         {"needed": 10.212, "demand_qps": 20.0, "latency_ratio": 0.45})
    poisson = tuple(20.0 + rnd.gauss(0, (20.0 / 60) ** 0.5) for _ in range(120))
    d = decide(0.0, replace(m, rate_history=poisson), current=4, ready=4, policy=MEASURED, history=History())
    assert d.message == ("qps at 5.01 req/s per replica (tiny-cpu profile at 12.0 s of audio per request) needs "
                         "3.99 replicas, within tolerance of 4")
    # a steady climb is not noise: second differences do not see it
    ramp = tuple(10.0 + 0.5 * i for i in range(120))
    d = decide(0.0, replace(m, rate_history=ramp), current=4, ready=4, policy=MEASURED, history=History())
    assert "clumps" not in d.message


def test_clump_size_under_random_routing() -> None:
    assert profile.clump_size(1.0, 4) == 1.0  # Poisson stays Poisson
    assert profile.clump_size(9.0, 4) == 2.0  # dispersion 1 + 8/4 = 3 per replica: clumps of 2
    assert profile.clump_size(9.0, 0.5) == 5.0  # fewer than one replica counts as one
    assert profile.clump_size(0.5, 4) == 1.0  # under-dispersed counts as Poisson
    assert PROFILE.rate_at_slo(1.6, 12.0, 2.0) < PROFILE.rate_at_slo(1.6, 12.0) == \
        PROFILE.rate_at_slo(1.6, 12.0, 0.5)


# --- pieces -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("rules", "current", "events", "up", "limit"), [
    (Rules(0.0, (Policy("Pods", 4, 15.0), Policy("Percent", 200, 15.0)), "Max"), 3, (), True, 9),
    (Rules(0.0, (Policy("Pods", 4, 15.0), Policy("Percent", 200, 15.0)), "Min"), 3, (), True, 7),
    (Rules(0.0, (Policy("Pods", 2, 60.0), Policy("Percent", 50, 60.0)), "Max"), 10, (), False, 5),
    (Rules(0.0, (Policy("Pods", 2, 60.0), Policy("Percent", 50, 60.0)), "Min"), 10, (), False, 8),
    (Rules(0.0, (Policy("Pods", 1, 60.0),), "Max"), 5, (), False, 4),
    (Rules(0.0, (Policy("Percent", 50, 60.0),), "Disabled"), 10, (), False, 10),
    (Rules(0.0, ()), 10, (), True, None),
    # changes in the period count from the replicas at its start: 10 now, 4 added 30 s ago → from 6
    (Rules(0.0, (Policy("Pods", 4, 60.0),)), 10, ((70.0, 4),), True, 10),
    # a change exactly one period old has left the period
    (Rules(0.0, (Policy("Pods", 4, 60.0),)), 10, ((40.0, 4),), True, 14),
    # down: removals in the period count, additions do not
    (Rules(0.0, (Policy("Pods", 2, 60.0),)), 8, ((70.0, -2), (80.0, 3)), False, 8),
    (Rules(0.0, (Policy("Percent", 50, 60.0),)), 7, (), False, 4),  # ceil(3.5): never below half
])
def test_scale_limit(rules: Rules, current: int, events: tuple[tuple[float, int], ...], up: bool,
                     limit: int | None) -> None:
    assert scale_limit(rules, current, events, 100.0, up=up) == limit


def test_per_replica_rate_sources() -> None:
    assert BASE.per_replica_rate(12.0) == (4.0, "targetQPSPerReplica")
    assert Settings().per_replica_rate(12.0) == (None, "")
    rate, source = MEASURED.per_replica_rate(12.0)
    assert rate == PROFILE.rate_at_slo(2.0 * 0.8, 12.0) and source == "tiny-cpu profile at 12.0 s of audio per request"
    # no length measured yet: sized for the longest measured request (the safe side)
    longest = max(L.audio_s for L in PROFILE.lengths)
    assert MEASURED.per_replica_rate(None) == (PROFILE.rate_at_slo(1.6, longest),
                                               f"tiny-cpu profile at {longest:.1f} s of audio per request")
    # both: the lower wins; a profile that cannot meet the objective still divides by something
    assert replace(MEASURED, target_qps_per_replica=1.0).per_replica_rate(12.0) == (1.0, "targetQPSPerReplica")
    assert replace(MEASURED, target_p95_ms=10.0).per_replica_rate(12.0)[0] == 1e-3


def test_history_is_trimmed_to_what_the_rules_look_back() -> None:
    s = replace(BASE, scale_down=Rules(300.0, DEFAULT_SCALE_DOWN.policies), scale_up=DEFAULT_SCALE_UP)
    assert s.history_s == 315.0
    h = History(recommendations=((0.0, 9), (85.0, 8)), scale_events=((0.0, 1), (85.0, -1)))
    d = decide(400.0, Metrics(qps=32.0, p95_ms=300), current=8, ready=8, policy=s, history=h)
    assert d.history.recommendations == ((85.0, 8), (400.0, 8)) and d.history.scale_events == ((85.0, -1),)


def test_the_decision_history_records_what_the_next_one_needs() -> None:
    m = Metrics(qps=40.0, qps_slope=0.05, audio_s=6.0, p95_ms=300)
    d = decide(100.0, m, current=8, ready=8, policy=NO_LIMITS, history=History(last_audio_s=3.0))
    h = d.history
    assert (h.last_ok, h.last_demand, h.last_slope, h.last_audio_s, h.failures) == (100.0, 40.0, 0.05, 6.0, 0)
    assert h.scale_events == ((100.0, d.desired - 8),) and h.recommendations == ((100.0, d.desired),)
    # no length in this reading: the last one is kept
    assert decide(115.0, replace(m, audio_s=None), current=d.desired, ready=d.desired, policy=NO_LIMITS,
                  history=h).history.last_audio_s == 6.0
    # a burst: its time is kept, and the slope (a step's jump) is not
    b = decide(200.0, Metrics(qps=8.0, qps_short=40.0, qps_slope=0.2), current=2, ready=2, policy=NO_LIMITS,
               history=History())
    assert (b.history.burst_at, b.history.last_slope) == (200.0, None)
    later = decide(200.0 + 299, Metrics(qps=40.0, qps_slope=0.2), current=10, ready=10, policy=NO_LIMITS,
                   history=b.history)
    assert later.history.last_slope is None and "rising" not in later.message
    after = decide(200.0 + 300, Metrics(qps=40.0, qps_slope=0.2), current=10, ready=10, policy=NO_LIMITS,
                   history=b.history)
    assert after.history.last_slope == 0.2 and "rising" in after.message


def test_every_sizing_and_forecast_field_reaches_the_policy() -> None:
    from cosyvoice_operator.spec import parse_spec

    auto = parse_spec({"autoscaling": {
        "enabled": True, "maxReplicas": 9, "targetP95LatencyMs": 1500, "capacityProfile": "tiny-cpu",
        "sizingLatencyRatio": 0.7, "coldStartSeconds": 90, "intervalSeconds": 30, "outageForecastSeconds": 300,
        "latencyGuardStepPercent": 50, "latencyGuardMemorySeconds": 900,
        "forecast": {"lookbackSeconds": 7200, "minCorrelation": 0.75}}}).autoscaling
    s = Settings.from_spec(auto, PROFILE)
    assert (s.profile, s.sizing_latency_ratio, s.cold_start_s, s.interval_s, s.follow_trend_s, s.guard_step_percent,
            s.guard_memory_s, s.season_lookback_s, s.season_min_correlation) == \
        (PROFILE, 0.7, 90.0, 30.0, 300.0, 50.0, 900.0, 7200.0, 0.75)


FALLING = replace(NO_LIMITS, scale_down=Rules(300.0, ()))
WINDOW = History(recommendations=((0.0, 10), (200.0, 10)))


@pytest.mark.parametrize(("slope", "history", "desired"), [
    # 20 req/s: Poisson noise of a 1-minute rate 1/3 (req/s)², of a 5-minute least-squares change
    # sqrt(1/3 × 12 × 5 / 24) = 0.913: a decline counts beyond 3 × 0.913 = 2.74 req/s (and the tolerance, 2)
    (-0.0091, (), 10), (-0.0092, (), 5),
    # a history alternating 20/22 (second differences ±4): noise 16 / (6 × 0.455) = 5.86, threshold 11.48 req/s
    (-0.038, (20.0, 22.0) * 6, 10), (-0.0385, (20.0, 22.0) * 6, 5),
    # seven samples are too few to measure the noise: Poisson's threshold again
    (-0.0092, (20.0, 22.0, 20.0, 22.0, 20.0, 22.0, 20.0), 5),
    # eight are enough
    (-0.0092, (20.0, 22.0) * 4, 10),
])
def test_a_decline_shortens_the_scale_down_window_only_beyond_its_noise(slope: float, history: tuple[float, ...],
                                                                         desired: int) -> None:
    m = Metrics(qps=20.0, qps_slope=slope, p95_ms=300, rate_history=history)
    assert decide(330.0, m, current=10, ready=10, policy=FALLING, history=WINDOW).desired == desired


def test_a_small_decline_of_a_large_load_is_within_the_tolerance() -> None:
    """At 200 req/s the counting noise is small; the tolerance (20 req/s over the window) decides."""
    s, window = replace(FALLING, max_replicas=100), History(recommendations=((0.0, 60), (200.0, 60)))
    m = Metrics(qps=200.0, qps_slope=-0.066, p95_ms=300)  # -19.8 req/s over 5 minutes
    assert decide(330.0, m, current=60, ready=60, policy=s, history=window).desired == 60
    m = Metrics(qps=200.0, qps_slope=-0.067, p95_ms=300)  # -20.1
    assert decide(330.0, m, current=60, ready=60, policy=s, history=window).desired == 50
