"""The autoscaling decision at its edges: each test pins a boundary or a path of ``decide`` that the
coarser scenarios in ``test_policy_paths.py`` pass through without deciding it (``make mutation`` found
them: a ``>`` that could be ``>=``, a constant, a dropped argument). Every assertion is on what the
operator reports: the replica count, the reason and message of the condition, or the history it keeps in
``status.autoscaling.history`` for the next evaluation."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from cosyvoice_operator.autoscaling import profile
from cosyvoice_operator.autoscaling.policy import (DEFAULT_SCALE_UP, Decision, History, Metrics, Policy, Rules,
                                                   Settings, decide)

# four requests/s a replica, no stabilization window and no rate limit: the count is the demand's
FREE = Settings(min_replicas=0, max_replicas=20, target_qps_per_replica=4.0, target_p95_ms=1000.0,
                scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))
PROFILE = profile.load("tiny-cpu")
MEASURED = Settings(min_replicas=1, max_replicas=40, target_p95_ms=2000.0, profile=PROFILE,
                    scale_up=Rules(0.0, ()), scale_down=Rules(0.0, ()))
QPS = "qps at 4.00 req/s per replica (targetQPSPerReplica)"


def run(m: Metrics, current: int, s: Settings = FREE, h: History = History(), now: float = 60.0,
        ready: int | None = None) -> Decision:
    return decide(now, m, current=current, ready=current if ready is None else ready, policy=s, history=h)


# --- the proportional count and its tolerance ----------------------------------------------------------------

def test_no_traffic_keeps_a_service_at_zero() -> None:
    d = run(Metrics(qps=0.0, p95_ms=300), 0)
    assert (d.desired, d.reason, d.message) == (0, "WithinTolerance",
                                                f"{QPS} needs 0.00 replicas, within tolerance of 0")


def test_the_first_requests_wake_a_service_at_zero_and_say_why() -> None:
    d = run(Metrics(qps=6.0, p95_ms=300), 0)
    assert (d.desired, d.reason, d.message) == (2, "ScaleUp", f"{QPS} needs 1.50 replicas")


def test_a_single_replica_scales_up() -> None:
    d = run(Metrics(qps=12.0, p95_ms=300), 1)
    assert (d.desired, d.reason, d.message) == (3, "ScaleUp", f"{QPS} needs 3.00 replicas")


def test_a_change_exactly_at_the_tolerance_is_no_change() -> None:
    """5 replicas needed with 4 running is exactly 25 %: within a tolerance of 0.25 (HPA: strictly beyond)."""
    d = run(Metrics(qps=20.0, p95_ms=300), 4, replace(FREE, tolerance=0.25))
    assert (d.desired, d.reason) == (4, "WithinTolerance")
    d = run(Metrics(qps=20.4, p95_ms=300), 4, replace(FREE, tolerance=0.25))
    assert (d.desired, d.reason) == (6, "ScaleUp")


@pytest.mark.parametrize(("bounds", "desired", "limited"), [({"max_replicas": 3}, 3, "TooManyReplicas"),
                                                            ({"min_replicas": 5}, 5, "TooFewReplicas")])
def test_a_count_moved_only_by_the_bounds_keeps_the_demands_reason(bounds: dict[str, int], desired: int,
                                                                   limited: str) -> None:
    """3.5 replicas needed with 4 running: beyond the tolerance, but it rounds to the count running. The
    reason describes the demand (no change); ScalingLimited says the bounds moved it."""
    d = run(Metrics(qps=14.0, p95_ms=300), 4, replace(FREE, **bounds))
    assert (d.desired, d.reason, d.limited_reason) == (desired, "WithinTolerance", limited)
    assert d.message.startswith(f"{QPS} needs 3.50 replicas;")


def test_at_max_replicas_the_demand_still_reads_scale_up() -> None:
    d = run(Metrics(qps=32.0, p95_ms=300), 5, replace(FREE, max_replicas=5))
    assert (d.desired, d.reason, d.limited, d.limited_reason, d.able_to_scale) == (5, "ScaleUp", True,
                                                                                  "TooManyReplicas", True)
    assert d.message == f"{QPS} needs 8.00 replicas; capped at maxReplicas 5"


# --- the latency guardrail ----------------------------------------------------------------------------------

def test_latency_exactly_at_the_tolerance_adds_nothing() -> None:
    s = replace(FREE, tolerance=0.25)
    assert run(Metrics(qps=16.0, p95_ms=1250), 4, s, History(hot_since=0.0)).reason == "WithinTolerance"
    assert run(Metrics(qps=16.0, p95_ms=1260), 4, s, History(hot_since=0.0)).reason == "LatencyAboveTarget"


def test_latency_must_stay_hot_a_whole_window_from_its_first_hot_reading() -> None:
    """A cool reading, then a hot one a minute later: the window starts at the hot one."""
    cool = run(Metrics(qps=16.0, p95_ms=500), 4, now=0.0)
    assert cool.history.hot_since is None
    hot = run(Metrics(qps=16.0, p95_ms=2000), 4, h=cool.history, now=60.0)
    assert (hot.desired, hot.history.hot_since) == (4, 60.0)
    assert run(Metrics(qps=16.0, p95_ms=2000), 4, h=hot.history, now=120.0).desired == 5


def test_a_reading_without_latency_restarts_the_hot_window() -> None:
    gap = run(Metrics(qps=16.0), 4, h=History(hot_since=0.0), now=30.0)
    assert gap.history.hot_since is None
    assert run(Metrics(qps=16.0, p95_ms=2000), 4, h=gap.history, now=60.0).desired == 4


def test_after_adding_capacity_the_latency_is_observed_again() -> None:
    added = run(Metrics(qps=16.0, p95_ms=2000), 4, h=History(hot_since=0.0), now=60.0)
    assert (added.desired, added.history.hot_since) == (5, None)
    again = run(Metrics(qps=16.0, p95_ms=2000), 5, h=added.history, now=75.0)
    assert (again.desired, again.history.hot_since) == (5, 75.0)


@pytest.mark.parametrize(("current", "step", "desired"), [
    (8, 25.0, 10),  # 25 % of 8
    (3, 67.0, 6),  # 67 % of 3 = 2.01 replicas: a started replica is a whole one
    (2, 25.0, 3),  # at least one
])
def test_the_guardrail_adds_its_step_percent(current: int, step: float, desired: int) -> None:
    s = replace(FREE, guard_step_percent=step)
    d = run(Metrics(qps=4.0 * current, p95_ms=2000), current, s, History(hot_since=0.0))
    assert (d.desired, d.reason) == (desired, "LatencyAboveTarget")


def test_latency_exactly_at_the_objective_allows_a_scale_down_with_a_spare() -> None:
    d = run(Metrics(qps=8.0, p95_ms=1000), 4)
    assert (d.desired, d.reason) == (3, "ScaleDown") and d.message.endswith("keeping a spare replica")


def test_latency_exactly_at_the_sizing_ratio_needs_no_spare() -> None:
    d = run(Metrics(qps=8.0, p95_ms=800), 4)
    assert (d.desired, d.reason, d.message) == (2, "ScaleDown", f"{QPS} needs 2.00 replicas")


# --- bursts, trends and declines ----------------------------------------------------------------------------

def demand(m: Metrics, s: Settings = FREE) -> float:
    return run(m, 10, s).details["demand_qps"]


@pytest.mark.parametrize(("qps", "short", "tolerance", "burst"), [
    (100.0, 125.0, 0.25, False),  # exactly the tolerance above the long window
    (100.0, 125.5, 0.25, True),
    (100.0, 108.0, 0.1, False),  # beyond the noise (5.5) but within the tolerance
    (8.0, 12.0, 0.1, True),  # one and a half times: beyond both
    (1.0, 1.5, 0.1, False),  # beyond the tolerance, within three standard deviations (0.55) of the noise
    (2.0, 4.0, 0.1, True),  # 2 beyond 0.77
    (30.0, 33.0, 0.05, False),  # exactly three standard deviations (3 × √(30 / 30 s))
    (30.0, 33.1, 0.05, True),
    (0.0, 0.125, 0.1, True),  # from nothing: the noise of one request per short window (0.1)
    (0.0, 0.09, 0.1, False),
])
def test_the_short_window_is_a_burst_beyond_tolerance_and_noise(qps: float, short: float, tolerance: float,
                                                                 burst: bool) -> None:
    d = run(Metrics(qps=qps, qps_short=short, p95_ms=300), 10, replace(FREE, tolerance=tolerance))
    assert d.message.startswith("qps (burst, short window)") is burst
    assert d.details["demand_qps"] == (short if burst else qps)


def test_a_rise_exactly_at_the_tolerance_is_not_a_trend() -> None:
    s = replace(FREE, tolerance=0.5)  # 12 req/s: the tolerance is 6 req/s over the 5-minute trend window
    assert demand(Metrics(qps=12.0, qps_slope=0.02, p95_ms=300), s) == 12.0
    assert demand(Metrics(qps=12.0, qps_slope=0.021, p95_ms=300), s) > 12.0


FALLING = replace(FREE, min_replicas=1, scale_down=Rules(300.0, ()))
WINDOW = History(recommendations=((0.0, 10), (200.0, 10)))


def after_decline(m: Metrics, s: Settings = FALLING) -> int:
    """The count from 10 replicas 330 s into a 300 s scale-down window: 10 held, lower where a decline
    shortened the window to one rate window."""
    return run(m, 10, s, WINDOW, now=330.0).desired


def test_a_decline_exactly_at_the_tolerance_keeps_the_window() -> None:
    s = replace(FALLING, tolerance=0.25)  # 24 req/s: 6 req/s over the trend window
    assert after_decline(Metrics(qps=24.0, qps_slope=-0.02, p95_ms=300), s) == 10
    assert after_decline(Metrics(qps=24.0, qps_slope=-0.021, p95_ms=300), s) == 6


def test_a_load_that_fell_to_nothing_is_a_decline_beyond_one_request_a_minute() -> None:
    """At 0 req/s the noise is that of one request per rate window: 3 × sqrt(1/3600 × 2.5) = 0.079 req/s
    over the trend window."""
    assert after_decline(Metrics(qps=0.0, qps_slope=-0.1 / 300, p95_ms=300)) == 1
    assert after_decline(Metrics(qps=0.0, qps_slope=-0.07 / 300, p95_ms=300)) == 10


def test_a_decline_exactly_at_three_standard_deviations_keeps_the_window() -> None:
    # 24 req/s: the 1-minute rate's Poisson variance is 24 / 60 s = 0.4, the 5-minute change's 0.4 × 2.5 = 1:
    # the threshold is a drop of 3 req/s (the tolerance, 2.4, is below)
    assert after_decline(Metrics(qps=24.0, qps_slope=-3.0 / 300, p95_ms=300)) == 10
    assert after_decline(Metrics(qps=24.0, qps_slope=-3.1 / 300, p95_ms=300)) == 6


def test_the_noise_of_a_noisy_history_is_its_typical_second_difference() -> None:
    """Squared second differences 1, 1, 1, 1, 9, 9, 9, 9, 9, 9: the median (9) sets the noise, not a lower
    quantile. 20 req/s: noise 9 / (6 × 0.455) = 3.3, the threshold a drop of 3 × sqrt(3.3 × 2.5) = 8.6."""
    history = (0.0, 0.0, 1.0, 3.0, 6.0, 10.0, 17.0, 27.0, 40.0, 56.0, 75.0, 97.0)
    assert after_decline(Metrics(qps=20.0, qps_slope=-8.0 / 300, p95_ms=300, rate_history=history)) == 10
    assert after_decline(Metrics(qps=20.0, qps_slope=-9.0 / 300, p95_ms=300, rate_history=history)) == 5


def blip(before: int, held: int, after: int, high: float = 30.0, back: float = 10.0) -> Metrics:
    """10 req/s for ``before`` minutes, ``high`` for ``held``, then ``back`` for ``after``: a drop of the
    1-minute rate beyond its noise (Poisson at 10 req/s: a jump between two minutes is beyond
    3 × sqrt(2 × 10 / 60) = 1.73 req/s), and a decline over the trend window beyond the tolerance and the noise."""
    history = (10.0,) * before + (high,) * held + (back,) * after
    return Metrics(qps=10.0, qps_slope=-(high - back) / 300, p95_ms=300, rate_history=history)


@pytest.mark.parametrize(("history", "desired"), [
    (blip(12, 5, 2), 10),  # a spike of 5 minutes, over: the 300 s window rides it out, as for a recurrence
    (blip(11, 6, 2), 3),  # held 6 minutes, beyond the window: a level that ended, the window shrinks
    (blip(12, 3, 5), 10),  # the drop into the trend window's first minute counts
    (blip(11, 3, 6), 3),  # one minute earlier it is outside the trend window: the decline alone decides
    (blip(12, 3, 2, back=11.7), 10),  # back within a jump of where it was before the spike: a blip
    (blip(12, 3, 2, back=11.8), 3),  # not back: a change of level (a flash crowd decaying), the window shrinks
    (blip(12, 3, 2, back=5.0), 10),  # below where it was: the spike is over as well
    (blip(12, 3, 1, back=20.0), 10),  # the drop is the newest minute: where it settles is not known yet
], ids=["spike-5-min", "level-6-min", "drop-first-in-window", "drop-before-window", "back-within-a-jump",
        "back-beyond-a-jump", "back-below", "drop-just-now"])
def test_a_spike_that_ends_within_the_scale_down_window_keeps_the_window(history: Metrics, desired: int) -> None:
    """Spikes come again: scaling down one rate window after each met the next a cold start short (random
    spikes of 1-8 minutes: more violating minutes than HPA). A decline is a trend; the end of a spike is not."""
    assert after_decline(history) == desired


@pytest.mark.parametrize(("history", "desired"), [
    ((30.0,) * 12 + (40.0,) * 3 + (37.0,), 8),  # a drop of exactly one jump is not a jump
    ((30.0,) * 12 + (40.0,) * 3 + (36.99,), 10),
    ((30.0,) * 12 + (33.0,) * 3 + (20.0,), 8),  # nor is a rise of exactly one
    ((30.0,) * 12 + (33.01,) * 3 + (20.0,), 10),
    ((28.0,) * 11 + (30.0,) + (40.0,) * 3 + (33.0,) * 2, 10),  # back to exactly a jump above the minute before it
    ((30.0, 40.0, 40.0, 30.0), 10),  # a spike at the start of a short history
], ids=["drop-of-one-jump", "drop-beyond", "rise-of-one-jump", "rise-beyond", "back-exactly", "short-history"])
def test_a_jump_is_strictly_beyond_three_standard_deviations(history: tuple[float, ...], desired: int) -> None:
    """At 30 req/s the Poisson variance of a 1-minute rate is 0.5: two minutes differ by a jump beyond
    3 × sqrt(2 × 0.5) = 3 req/s. A decline of 10 req/s over the trend window is beyond the tolerance and the
    noise; 30 req/s need 8 replicas, 10 are held by the window."""
    assert after_decline(Metrics(qps=30.0, qps_slope=-10 / 300, p95_ms=300, rate_history=history)) == desired


# --- inflight, sessions and saturation ----------------------------------------------------------------------

def test_the_inflight_target_adds_a_count_only_when_it_is_larger() -> None:
    s = replace(FREE, target_inflight_per_replica=2.0)
    d = run(Metrics(qps=40.0, inflight=4.0, p95_ms=300), 2, s)
    assert (d.desired, d.message) == (10, f"{QPS} needs 10.00 replicas")
    d = run(Metrics(qps=8.0, inflight=4.0, p95_ms=300), 1, s)  # both need 2: the request rate says so
    assert d.message == f"{QPS} needs 2.00 replicas"


def test_sessions_add_a_count_only_when_it_is_larger() -> None:
    s = replace(FREE, target_sessions_per_replica=8.0)
    d = run(Metrics(qps=40.0, sessions=8.0, p95_ms=300), 2, s)
    assert (d.desired, d.message) == (10, f"{QPS} needs 10.00 replicas")
    d = run(Metrics(qps=8.0, sessions=16.0, p95_ms=300), 1, s)
    assert d.message == f"{QPS} needs 2.00 replicas"
    d = run(Metrics(qps=8.0, sessions=40.0, p95_ms=300), 1, s)
    assert (d.desired, d.message) == (5, "sessions needs 5.00 replicas")
    # without the target, open sessions are not a signal
    assert run(Metrics(qps=8.0, sessions=40.0, p95_ms=300), 1).desired == 2


def test_a_reading_without_a_request_rate_leaves_nothing_to_follow_in_an_outage() -> None:
    """Sized by in-flight requests alone (the rate query came back empty): no demand is kept, so an outage
    after it holds, whatever slope was read."""
    s = replace(FREE, target_inflight_per_replica=2.0)
    d = run(Metrics(inflight=8.0, qps_slope=0.5, p95_ms=300), 4, s, now=0.0)
    assert (d.desired, d.history.last_ok, d.history.last_demand) == (4, 0.0, None)
    out = run(Metrics(error="boom"), 4, s, d.history, now=120.0)
    assert (out.desired, out.message) == (4, "holding 4 replicas: boom")


SAT = replace(MEASURED, target_qps_per_replica=5.0)  # 5 req/s a replica, below the profile's rate at 4 s


@pytest.mark.parametrize(("ready", "qps", "inflight", "growth", "saturated"), [
    (1, 4.0, 16.0, 11.0, True),  # one replica serves 4 of 15 req/s offered, its batch of 16 full: 3.75 replicas
    (2, 8.0, 32.0, 7.0, True),  # exactly full batches
    (2, 8.0, 31.0, 7.0, False),
    (2, 8.0, 40.0, 2.0, False),  # offered exactly the tolerance (25 %) above served
    (2, 8.0, 40.0, 2.1, True),
])
def test_saturation_reads_full_batches_and_a_growing_queue(ready: int, qps: float, inflight: float, growth: float,
                                                           saturated: bool) -> None:
    s = replace(SAT, tolerance=0.25)
    d = run(Metrics(qps=qps, inflight=inflight, inflight_growth=growth, audio_s=4.0, p95_ms=500), ready, s)
    assert d.message.startswith("saturated") is saturated, d.message
    if saturated:
        assert d.details["needed"] == pytest.approx(ready * (qps + growth) / qps)


def test_saturation_counts_only_when_it_asks_for_more_than_the_demand() -> None:
    """2 replicas serve 10 of 15 req/s: 3 replicas, the same as 15 req/s at 5 a replica: the demand says it."""
    d = run(Metrics(qps=10.0, inflight=32.0, inflight_growth=5.0, audio_s=4.0, p95_ms=500), 2, SAT)
    assert d.message == "qps at 5.00 req/s per replica (targetQPSPerReplica) needs 3.00 replicas"


# --- rate limits ------------------------------------------------------------------------------------------

def test_a_count_within_tolerance_after_a_big_step_is_not_rate_limited() -> None:
    """8 replicas added 10 s ago: the scale-up policy (4 pods a minute) is spent, but holding is no scale-up;
    likewise holding after 6 were removed is no scale-down."""
    s = replace(FREE, scale_up=Rules(0.0, (Policy("Pods", 4, 60.0),)))
    d = run(Metrics(qps=40.0, p95_ms=300), 10, s, History(scale_events=((50.0, 8),)))
    assert (d.desired, d.able_to_scale, d.able_reason) == (10, True, "ReadyForNewScale")
    s = replace(FREE, scale_down=Rules(0.0, (Policy("Pods", 1, 60.0),)))
    d = run(Metrics(qps=16.0, p95_ms=300), 4, s, History(scale_events=((50.0, -6),)))
    assert (d.desired, d.able_to_scale, d.able_reason) == (4, True, "ReadyForNewScale")


def test_a_scale_up_exactly_to_the_limit_is_not_limited() -> None:
    s = replace(FREE, scale_up=Rules(0.0, (Policy("Pods", 4, 60.0),)))
    d = run(Metrics(qps=24.0, p95_ms=300), 2, s)
    assert (d.desired, d.able_to_scale, d.message) == (6, True, f"{QPS} needs 6.00 replicas")


def test_removals_in_the_period_count_against_the_scale_down_policy() -> None:
    s = replace(FREE, scale_down=Rules(0.0, (Policy("Pods", 2, 60.0),)))
    d = run(Metrics(qps=4.0, p95_ms=300), 8, s, History(scale_events=((30.0, -1),)), now=60.0)
    assert (d.desired, d.able_reason) == (7, "ScaleDownLimit")  # 9 at the period's start, 2 a minute
    d = run(Metrics(qps=4.0, p95_ms=300), 8, s, History(scale_events=((0.0, -1),)), now=60.0)
    assert d.desired == 6  # a minute old: out of the period


def test_one_added_replica_counts_against_the_scale_up_policy() -> None:
    s = replace(FREE, scale_up=Rules(0.0, (Policy("Pods", 1, 60.0),)))
    d = run(Metrics(qps=40.0, p95_ms=300), 4, s, History(scale_events=((30.0, 1),)), now=60.0)
    assert (d.desired, d.able_reason) == (4, "ScaleUpLimit")


def test_a_percent_scale_up_counts_whole_percent() -> None:
    """7 replicas and 43 %: 10.01 → 11 (a started pod is a whole one)."""
    s = replace(FREE, scale_up=Rules(0.0, (Policy("Percent", 43, 60.0),)))
    assert run(Metrics(qps=80.0, p95_ms=300), 7, s).desired == 11


# --- stabilization windows --------------------------------------------------------------------------------

def test_a_burst_bypasses_the_scale_up_window_even_right_after_a_low_recommendation() -> None:
    s = replace(FREE, scale_up=Rules(60.0, ()))
    h = History(recommendations=((59.5, 2),))
    d = run(Metrics(qps=8.0, qps_short=40.0, p95_ms=300), 2, s, h, now=60.0)
    assert (d.desired, d.able_to_scale) == (10, True)


# --- outages ------------------------------------------------------------------------------------------------

OUTAGE = History(last_ok=1000.0, last_demand=40.0, last_slope=0.05)  # 10 replicas, rising 3 req/s a minute


def test_an_outage_rise_is_within_the_scale_up_policies_and_max_replicas() -> None:
    # (40 + 0.05 × 120 s) / 4 = 11.5 → 12, capped by maxReplicas 11 (the default policies allow 30)
    s = replace(FREE, max_replicas=11, scale_up=DEFAULT_SCALE_UP)
    d = run(Metrics(error="boom"), 10, s, OUTAGE, now=1120.0)
    assert d.desired == 11
    # a replica added 5 s ago counts against a one-pod-a-minute policy: nothing more may be added
    s = replace(FREE, scale_up=Rules(0.0, (Policy("Pods", 1, 60.0),)))
    d = run(Metrics(error="boom"), 10, s, replace(OUTAGE, scale_events=((1115.0, 1),)), now=1120.0)
    assert (d.desired, d.message) == (10, "holding 10 replicas: boom")
    d = run(Metrics(error="boom"), 10, s, replace(OUTAGE, scale_events=((1000.0, 1),)), now=1120.0)
    assert d.desired == 11


def test_an_outage_forecast_exactly_at_the_tolerance_holds() -> None:
    s = replace(FREE, tolerance=0.25)  # the last demand needs 2 replicas: the band reaches 2.5
    h = History(last_ok=0.0, last_demand=8.0, forecast=(2.5,) * 4)
    assert run(Metrics(), 2, s, h, now=60.0).desired == 2
    h = History(last_ok=0.0, last_demand=8.0, forecast=(2.6,) * 4)
    assert run(Metrics(), 2, s, h, now=60.0).desired == 3


def test_an_outage_pattern_and_trend_that_agree_are_reported_as_the_pattern() -> None:
    h = History(last_ok=0.0, last_demand=8.0, last_slope=0.1, forecast=(5.0,) * 6)
    d = run(Metrics(), 2, h=h, now=120.0)  # (8 + 0.1 × 120) / 4 = 5: the trend ties the pattern
    assert d.desired == 5 and "along the recurring pattern" in d.message


def test_an_outage_with_a_coarse_forecast_looks_one_step_ahead() -> None:
    """A forecast a value every 5 minutes (a long lookback) and a 195 s horizon: the step due now, not the
    peak 5 minutes after it."""
    h = History(last_ok=0.0, last_demand=8.0, forecast=(2.0, 9.0), forecast_step_s=300.0)
    assert run(Metrics(), 2, h=h, now=60.0).desired == 2
    assert run(Metrics(), 2, h=h, now=300.0).desired == 9


# --- the per-replica rate's message -------------------------------------------------------------------------

def test_clumps_are_named_once_they_show_in_the_message() -> None:
    """The source names the clump size from the size that prints above 1.0 (1.05 prints as 1.1)."""
    assert MEASURED.per_replica_rate(12.0, 1.05)[1].endswith("per request, arrivals in clumps of 1.1")
    assert MEASURED.per_replica_rate(12.0, 1.5)[1].endswith("per request, arrivals in clumps of 1.5")
    assert MEASURED.per_replica_rate(12.0, 1.04)[1].endswith("per request")


# --- bursty arrivals ----------------------------------------------------------------------------------------

def noisy(mean: float, sd: float, n: int, seed: int) -> tuple[float, ...]:
    rnd = random.Random(seed)
    return tuple(round(max(0.0, mean + rnd.gauss(0, sd)), 2) for _ in range(n))


def test_eight_samples_are_enough_to_see_clumps_and_seven_are_not() -> None:
    history = noisy(20.0, 4.0, 8, 7)  # twelve times Poisson's variance at 20 req/s
    m = Metrics(qps=20.0, audio_s=12.0, rate_history=history, p95_ms=300)
    assert "arrivals in clumps of" in run(m, 4, MEASURED).message
    d = run(replace(m, rate_history=history[1:]), 4, MEASURED)
    assert d.message == ("qps at 5.01 req/s per replica (tiny-cpu profile at 12.0 s of audio per request) needs 3.99 "
                         "replicas, within tolerance of 4")


def test_no_traffic_comes_in_no_clumps() -> None:
    m = Metrics(qps=0.0, audio_s=12.0, rate_history=noisy(20.0, 4.0, 120, 1), p95_ms=300)
    assert run(m, 1, MEASURED).message == ("qps at 5.01 req/s per replica (tiny-cpu profile at 12.0 s of audio per "
                                           "request) needs 0.00 replicas; raised to minReplicas 1")


def test_clumps_are_seen_below_one_request_a_second() -> None:
    m = Metrics(qps=0.8, audio_s=12.0, rate_history=noisy(0.8, 0.4, 60, 8), p95_ms=300)
    assert "arrivals in clumps of" in run(m, 1, MEASURED).message


def test_a_mild_excess_over_poisson_is_sized_for() -> None:
    """A history 2.2 times as variable as Poisson counting at 10 req/s (read as 1.7 after the estimate's
    margin): clumps of 1.2 at two replicas, and more replicas than Poisson arrivals need."""
    m = Metrics(qps=10.0, audio_s=12.0, rate_history=noisy(10.0, (2.2 * 10 / 60) ** 0.5, 120, 1), p95_ms=300)
    d = run(m, 2, MEASURED)
    assert "arrivals in clumps of 1.2" in d.message
    assert d.details["needed"] > 10.0 / PROFILE.rate_at_slo(1.6, 12.0)


# --- recurring patterns -------------------------------------------------------------------------------------

def square(high: float, low: float, *, period: float = 1200.0, step: float = 60.0, n: int = 60,
           end: int = 3) -> tuple[float, ...]:
    """A rate ``high`` the first half of every period and ``low`` the second, ``n`` samples, the last ``end``
    of them cut off (where in the cycle "now" is)."""
    return tuple(high if (i * step) % period < period / 2 else low for i in range(n))[:n - end]


def test_the_recurring_period_is_named_in_minutes() -> None:
    hourly = square(40.0, 8.0, period=3600.0, n=180)
    d = run(Metrics(qps=8.0, rate_history=hourly), 2)
    assert d.message.startswith("the load recurring every 60 min (needs 10.00 replicas within 195 s;")


def test_a_pattern_within_the_tolerance_of_the_load_now_leaves_the_count_to_the_load() -> None:
    """97 req/s now, 103 due within the horizon: 6 % more, within the 10 % tolerance."""
    d = run(Metrics(qps=97.0, rate_history=square(103.0, 97.0, end=3)), 25, replace(FREE, max_replicas=40))
    assert "season_s" in d.details
    assert d.message == f"{QPS} needs 24.25 replicas, within tolerance of 25"


def test_a_pattern_half_again_the_load_now_is_pre_warmed() -> None:
    d = run(Metrics(qps=10.0, rate_history=square(15.0, 10.0, end=3)), 3)
    assert (d.desired, d.message[:47]) == (4, "the load recurring every 20 min (needs 3.75 rep")


def test_with_a_coarse_history_the_pattern_is_read_one_step_ahead() -> None:
    """A sample every 5 minutes (a long lookback): the horizon (195 s) is within the next sample; a peak two
    samples ahead is not pre-warmed yet, and the forecast is kept with its step for an outage."""
    coarse = square(40.0, 8.0, period=3600.0, step=300.0, n=36, end=0)
    d = run(Metrics(qps=8.0, rate_history=coarse[:-2], history_step_s=300.0), 2)
    assert (d.desired, d.history.forecast_step_s) == (2, 300.0) and d.history.forecast[1] > 9
    d = run(Metrics(qps=8.0, rate_history=coarse[:-1], history_step_s=300.0), 2)
    assert d.desired == 10 and d.message.startswith("the load recurring every 60 min")


def test_a_recurring_pattern_is_its_own_model_of_a_rise() -> None:
    """In the trough of a known pattern a rising slope is not projected: the pattern says when the load comes."""
    d = run(Metrics(qps=8.0, qps_slope=0.1, rate_history=square(40.0, 8.0, end=8)), 2)
    assert "season_s" in d.details and d.details["demand_qps"] == 8.0


def test_with_a_pattern_a_drop_scales_down_after_one_rate_window() -> None:
    """Into the trough of a 20-minute pattern: the 300 s scale-down window would hold the peak's replicas until
    the next peak; with the pattern the forecast says the load stays down, and one rate window suffices."""
    s = replace(FREE, scale_down=Rules(300.0, ()))
    h = History(recommendations=((200.0, 10), (230.0, 10)))
    d = run(Metrics(qps=8.0, rate_history=square(40.0, 8.0, end=8)), 10, s, h, now=300.0)
    assert "season_s" in d.details and d.desired == 2


def test_a_smooth_pattern_is_not_read_as_clumped_arrivals() -> None:
    """A sinusoidal daily-like pattern moves the minute-to-minute rate far beyond Poisson noise; with the
    pattern known, that is the pattern, and the arrivals are sized as Poisson."""
    wave = tuple(20.0 + 15.0 * math.sin(2 * math.pi * i / 10) for i in range(123))
    d = run(Metrics(qps=wave[-1], audio_s=4.0, rate_history=wave, p95_ms=300), 4, MEASURED)
    assert "season_s" in d.details and "clumps" not in d.message


def test_the_period_found_is_kept_for_five_minutes_from_when_it_was_looked_for() -> None:
    h = History(season_s=1200.0, season_checked=1000.0)
    flat = Metrics(qps=8.0, rate_history=(8.0,) * 57)
    assert run(flat, 2, h=h, now=1299.0).history.season_s == 1200.0
    assert run(flat, 2, h=h, now=1300.0).history.season_s is None


def test_eight_samples_are_looked_at_for_a_period() -> None:
    eight = run(Metrics(qps=8.0, rate_history=square(40.0, 8.0, n=8, end=0)), 2, now=100.0)
    assert (eight.history.season_s, eight.history.season_checked) == (None, 100.0)
    seven = run(Metrics(qps=8.0, rate_history=square(40.0, 8.0, n=7, end=0)), 2, now=100.0)
    assert seven.history.season_checked is None


# The noise a swing must beat to be a pattern: the counting noise of the series it is found in.

def test_a_swing_in_the_work_within_its_counting_noise_is_no_pattern() -> None:
    """10 req/s of 10 s requests: 100 audio seconds a second, whose 1-minute rate has a variance of about
    100 × 10 / 60 = 16.7 (each request adds its length): a ±5 swing (variance 25) is under twice that noise.
    A ±20 swing is a pattern."""
    rate = (10.0,) * 57
    m = Metrics(qps=10.0, audio_s=10.0, rate_history=rate, work_history=square(105.0, 95.0))
    assert "season_s" not in run(m, 3, MEASURED).details
    m = replace(m, work_history=square(120.0, 80.0))
    assert "season_s" in run(m, 3, MEASURED).details


def test_a_swing_in_the_rate_beyond_its_counting_noise_is_a_pattern_whatever_the_request_length() -> None:
    """±1 around 10 req/s (variance 1) beats four times the rate's noise (10 / 60): found with or without a
    request length measured, when there is no work history to look in instead."""
    m = Metrics(qps=10.0, audio_s=10.0, rate_history=square(11.0, 9.0), p95_ms=300)
    assert "season_s" in run(m, 3, MEASURED).details
    assert "season_s" in run(replace(m, audio_s=None), 3, MEASURED).details


def test_the_work_history_is_looked_in_only_with_a_request_length() -> None:
    """Without a length in this reading the work series is not the one to read: the flat rate has no pattern."""
    m = Metrics(qps=10.0, rate_history=(10.0,) * 57, work_history=square(120.0, 80.0))
    assert "season_s" not in run(m, 3, MEASURED).details


# --- request lengths in the forecast ------------------------------------------------------------------------

def replicas_at(rate: float, audio_s: float) -> float:
    return round(rate / PROFILE.rate_at_slo(1.6, audio_s), 3)


def forecast(rate: tuple[float, ...], work: tuple[float, ...], qps: float, audio_s: float) -> tuple[float, ...]:
    d = run(Metrics(qps=qps, audio_s=audio_s, rate_history=rate, work_history=work), 2, MEASURED)
    assert "season_s" in d.details
    return d.history.forecast


def test_a_peak_whose_requests_finished_shorter_is_forecast_at_the_length_now() -> None:
    """18 req/s half of every 20 minutes, 6 the other half, 12 s requests all along; on each rise the short
    ones finished first, so the history measured 9 s at the peak. The peak is forecast at 12 s: at 9 s it
    would be a replica short, every cycle."""
    f = forecast(square(18.0, 6.0), square(18.0 * 9.0, 6.0 * 12.0), 6.0, 12.0)
    assert (f[0], max(f)) == (replicas_at(6.0, 12.0), replicas_at(18.0, 12.0))
    assert replicas_at(18.0, 9.0) < max(f) - 0.3


def test_longer_lengths_are_forecast_only_where_the_rate_was_at_least_half_its_typical_value() -> None:
    """10 req/s of 4 s requests, then 4 req/s of 20 s ones: a length measured while the rate was under half
    its typical value (the median, 10) is not one the forecast trusts; at exactly half it is."""
    below = forecast(square(10.0, 4.0), square(40.0, 80.0), 4.0, 4.0)
    assert (below[0], max(below)) == (replicas_at(4.0, 4.0), replicas_at(10.0, 4.0))
    half = forecast(square(10.0, 5.0), square(40.0, 100.0), 5.0, 4.0)
    assert half[0] == replicas_at(5.0, 20.0)
    # rejected at the typical rate (answered, no audio), 20 s requests only at a quarter of it: no length the
    # history measured is trusted, and every step is sized at the length now
    f = forecast(square(20.0, 5.0), square(0.0, 100.0), 5.0, 4.0)
    assert (f[0], max(f)) == (replicas_at(5.0, 4.0), replicas_at(20.0, 4.0))


def test_a_quiet_service_forecasts_its_request_lengths_too() -> None:
    """A quarter of a request a second, 20 s requests half of every 20 minutes and 4 s ones the other half
    (1 audio second a second), 4 s now: the long half is forecast at its own length."""
    f = forecast((0.25,) * 57, square(5.0, 1.0), 0.25, 4.0)
    assert (f[0], max(f)) == (replicas_at(0.25, 4.0), replicas_at(0.25, 20.0))


def test_without_audio_in_the_history_the_forecast_uses_the_length_now() -> None:
    """Servers that exported no audio seconds: the work history is all zero; the rate's pattern is sized at
    the length this reading measured."""
    f = forecast(square(40.0, 8.0), (0.0,) * 57, 8.0, 4.0)
    assert (f[0], max(f)) == (replicas_at(8.0, 4.0), replicas_at(40.0, 4.0))


def test_an_idle_phase_forecasts_no_replicas() -> None:
    f = forecast(square(10.0, 0.0), square(40.0, 0.0), 0.0, 4.0)
    assert (f[0], max(f)) == (0.0, replicas_at(10.0, 4.0))


def test_a_service_idle_most_of_each_cycle_forecasts_its_busy_quarter() -> None:
    """10 req/s of 8 s requests the first quarter of every 20 minutes, none the rest: the typical (median)
    rate is 0, and the idle samples measure no length at all."""
    rate = tuple(10.0 if i % 20 < 5 else 0.0 for i in range(57))
    f = forecast(rate, tuple(8.0 * r for r in rate), 0.0, 8.0)
    assert max(f) == replicas_at(10.0, 8.0) and min(f) == 0.0


def test_a_pattern_remembered_over_a_history_now_all_idle_forecasts_nothing() -> None:
    """The period found a minute ago is kept for five; if the history now reads all zero (a new Prometheus),
    the forecast is zero, not an error."""
    m = Metrics(qps=0.0, audio_s=4.0, rate_history=(0.0,) * 57, work_history=(0.0,) * 57)
    d = run(m, 2, MEASURED, History(season_s=1200.0, season_checked=0.0))
    assert d.history.forecast and set(d.history.forecast) == {0.0}


def test_the_forecast_kept_in_the_status_is_rounded_to_thousandths() -> None:
    f = forecast(square(40.0, 8.0), square(160.0, 32.0), 8.0, 4.0)
    assert all(x == round(x, 3) for x in f) and any(x != round(x, 2) for x in f)


@pytest.mark.parametrize(("qps", "sd", "samples", "seed", "desired", "message"), [
    (20.0, 4.0, 120, 54, 3, "qps at 8.72 req/s per replica (tiny-cpu profile at 4.0 s of audio per request, arrivals "
                            "in clumps of 7.7) needs 2.29 replicas"),
    (40.0, 3.0, 30, 29, 2, "qps at 19.98 req/s per replica (tiny-cpu profile at 4.0 s of audio per request, arrivals "
                           "in clumps of 1.7) needs 2.00 replicas, within tolerance of 2"),
])
def test_bursty_arrivals_are_sized_at_the_clump_their_replicas_see(qps: float, sd: float, samples: int, seed: int,
                                                                    desired: int, message: str) -> None:
    """Clumps get smaller as the replicas share them out; the count is the fewest replicas that take the
    demand at the clump they see (found by bisection, well within the 0.1 steps the clump is read at)."""
    m = Metrics(qps=qps, audio_s=4.0, rate_history=noisy(qps, sd, samples, seed), p95_ms=300)
    d = run(m, 2, MEASURED)
    assert (d.desired, d.message) == (desired, message)


def test_clumps_at_a_trickle_count_against_the_level_the_history_was_measured_at() -> None:
    """A request every 40 s on average (history level 0.025 req/s), in minutes of 0 or 3 requests: above the
    floor of one request a minute, the dispersion is read against that level (clumps of 1.3, not 1.1)."""
    rnd = random.Random(1)
    history = tuple(rnd.choice((0.0, 0.05)) for _ in range(120))
    d = run(Metrics(qps=0.025, audio_s=12.0, rate_history=history, p95_ms=300), 1, MEASURED)
    assert "arrivals in clumps of 1.3)" in d.message


# --- a recurring climb --------------------------------------------------------------------------------------

SEASON = History(season_s=1200.0, season_checked=0.0)  # a 20-minute period, looked for just now


def climb(ahead: tuple[float, ...], samples: int = 20) -> list[float]:
    """One cycle of ``samples`` whose forecast for the next steps is ``ahead`` (req/s, non-decreasing): each
    forecast step is the highest of its sample and the two around it; 4 req/s the rest of the cycle."""
    c = [ahead[0], *ahead, ahead[-1], ahead[-1]]
    return c + [4.0] * (samples - len(c))


@pytest.mark.parametrize(("ahead", "climbing"), [
    ((8.4, 8.4, 8.8, 9.0), True),  # level, then up: still a climb through the lead time
    ((8.4, 8.4, 8.4, 8.8), True),  # up only at the last step
    ((8.4, 8.8, 8.8, 8.8), True),  # up at the first step, then level
    ((8.8, 8.8, 8.8, 8.8), False),  # a plateau is no climb
])
def test_a_pattern_climbing_through_the_lead_time_is_followed_inside_the_tolerance(ahead: tuple[float, ...],
                                                                                  climbing: bool) -> None:
    """8.4 req/s now: 2.1 replicas with 2 running, within the tolerance; the pattern climbs to at most 9 req/s
    (2.25, also within it). A climb is followed at once (3 replicas); a plateau leaves the count."""
    d = run(Metrics(qps=8.4, rate_history=tuple(climb(ahead) * 2)), 2, h=SEASON)
    assert (d.desired, d.message.startswith("the load recurring every 20 min")) == ((3, True) if climbing else (2, False))


def test_a_pattern_that_dips_within_the_lead_time_is_no_climb() -> None:
    """Two cycles that differ: the forecast (their average) goes 2.08, 2.18, 2.10, 2.25 replicas: it ends higher,
    but dips on the way (samples differing by noise, not a climb)."""
    first = [8.6, 8.0, 8.0, 8.0, 9.2, 9.2] + [4.0] * 14
    second = [8.0, 8.0, 8.8, 8.8, 8.8, 8.8] + [4.0] * 14
    d = run(Metrics(qps=8.4, rate_history=tuple(first + second)), 2, h=SEASON)
    assert d.history.forecast[:4] == (2.079, 2.179, 2.104, 2.254)
    assert (d.desired, d.message) == (2, f"{QPS} needs 2.10 replicas, within tolerance of 2")


def test_a_climb_is_followed_only_when_the_load_now_needs_more_than_runs() -> None:
    d = run(Metrics(qps=8.0, rate_history=tuple(climb((8.0, 8.0, 8.4, 8.6)) * 2)), 2, h=SEASON)
    assert (d.desired, d.message) == (2, f"{QPS} needs 2.00 replicas, within tolerance of 2")


def test_a_climb_that_tops_out_at_the_load_now_adds_no_forecast() -> None:
    """10 req/s now (2.5 replicas), the pattern climbing to exactly that: the load now sizes it."""
    d = run(Metrics(qps=10.0, rate_history=tuple(climb((9.0, 9.2, 9.6, 10.0)) * 2)), 2, h=SEASON)
    assert (d.desired, d.message) == (3, f"{QPS} needs 2.50 replicas")


def test_a_climb_seen_in_two_coarse_steps_is_followed() -> None:
    """A sample every 2 minutes: the lead time (195 s) is two samples, enough to see a climb."""
    d = run(Metrics(qps=8.4, rate_history=tuple(climb((8.4, 8.8), samples=10) * 4), history_step_s=120.0), 2,
            h=SEASON)
    assert d.desired == 3 and d.message.startswith("the load recurring every 20 min")


# --- limits reached exactly ---------------------------------------------------------------------------------

def test_a_scale_down_exactly_to_the_limit_is_not_limited() -> None:
    s = replace(FREE, scale_down=Rules(0.0, (Policy("Percent", 50, 60.0),)))
    d = run(Metrics(qps=16.0, p95_ms=300), 8, s)
    assert (d.desired, d.able_to_scale, d.message) == (4, True, f"{QPS} needs 4.00 replicas")


def test_a_scale_up_exactly_to_max_replicas_is_not_limited() -> None:
    d = run(Metrics(qps=20.0, p95_ms=300), 2, replace(FREE, max_replicas=5))
    assert (d.desired, d.limited, d.limited_reason, d.message) == (5, False, "", f"{QPS} needs 5.00 replicas")


# --- clumps or a moving rate --------------------------------------------------------------------------------

CHI2_1_MEDIAN, ESTIMATE_Z, Z95 = 0.454936, 2.0, 1.6448536269514722


def margin(n: int) -> float:
    """An estimate of noise from n squares is taken ESTIMATE_Z standard errors (2.33/√n of itself) low."""
    return 1 + ESTIMATE_Z * 2.33 / math.sqrt(n)


def minute_variance(x: tuple[float, ...]) -> float:
    """The 1-minute rate's noise as the policy reads it: the median squared second difference, over six."""
    squares = sorted((a - 2 * b + c) ** 2 for a, b, c in zip(x, x[1:], x[2:]))
    return squares[len(squares) // 2] / CHI2_1_MEDIAN / margin(len(squares)) / 6


def shifted(rates: tuple[float, ...], b: float) -> tuple[float, ...]:
    """The burst window's rate at the same instants: ±b from the minute's (every squared deviation b²)."""
    return tuple(r + (b if i % 3 else -b) for i, r in enumerate(rates))


def within_deviation(rates: tuple[float, ...], dispersion: float) -> float:
    """The ±b that reads as ``dispersion`` within a minute: b² = D·level·(1/30 - 1/60), before the margin."""
    return math.sqrt(dispersion * CHI2_1_MEDIAN * margin(len(rates)) * sum(rates) / len(rates) / 60)


@pytest.mark.parametrize(("ratio", "spread"), [(1.45, False), (1.7, True)])
def test_the_minutes_noise_is_a_moving_rate_only_beyond_the_error_of_the_two_estimates(ratio: float,
                                                                                         spread: bool) -> None:
    """120 samples: each estimate is known to 2.33/√120 of itself, their ratio to √2 of that; two standard
    errors (×1.60) separate a moving rate from clumps that show at both scales a little differently."""
    rates = noisy(20.0, 4.0, 120, 3)
    level = sum(rates) / len(rates)
    minute = minute_variance(rates) * 60 / level  # the dispersion the minutes read
    b = within_deviation(rates, minute / ratio)
    d = run(Metrics(qps=20.0, audio_s=12.0, rate_history=rates, short_history=shifted(rates, b), p95_ms=300), 4,
            MEASURED)
    assert ("minute-to-minute spread" in d.message) is spread and "arrivals in clumps of" in d.message


@pytest.mark.parametrize("step", [60.0, 300.0])
def test_the_spread_is_what_the_minutes_vary_beyond_the_clumps_within_them(step: float) -> None:
    """2 req/s whose 1-minute rate varies several times more than Poisson's 2/60; within the minute the
    arrivals are Poisson (clumps of 1), and the demand is taken at the 95th percentile of the rest, above
    the level of the trend window's samples: the last 5 a minute apart, or the last one 5 minutes apart."""
    rates = noisy(2.0, 0.5, 120, 4)
    level = sum(rates) / len(rates)
    d = run(Metrics(qps=2.0, audio_s=12.0, rate_history=rates, short_history=shifted(rates, 0.01), p95_ms=300,
                    history_step_s=step), 1, MEASURED)
    extra = Z95 * math.sqrt(minute_variance(rates) - level / 60)
    assert 0 < extra < Z95  # a spread under one request/s: neither rounded up to one nor away
    recent = sum(rates[-5:]) / 5 if step == 60.0 else rates[-1]  # the level this minute's 2.0 is a draw around
    assert d.details["demand_qps"] == pytest.approx(recent + extra, rel=1e-9)
    assert d.message.startswith(f"qps (recent minutes at {recent:.1f}) + {extra:.1f} for their minute-to-minute "
                                "spread at ") and "clumps" not in d.message


def test_without_a_profile_the_count_is_the_target_rates_whatever_the_spread() -> None:
    rates = noisy(20.0, 4.0, 120, 5)
    d = run(Metrics(qps=20.0, rate_history=rates, short_history=shifted(rates, 0.1), p95_ms=300), 5)
    assert d.message == f"{QPS} needs 5.00 replicas, within tolerance of 5"


def test_with_a_pattern_the_minutes_changes_are_the_patterns_not_a_spread() -> None:
    rnd = random.Random(6)
    rates = tuple(r + rnd.gauss(0.0, 1.0) for r in square(40.0, 20.0, end=13))  # mid-peak
    d = run(Metrics(qps=40.0, audio_s=12.0, rate_history=rates, short_history=shifted(rates, 0.1),
                    history_step_s=60.0, p95_ms=300), 8, MEASURED)
    assert "season_s" in d.details and d.details["demand_qps"] == 40.0 and "spread" not in d.message


@pytest.mark.parametrize(("within", "found"), [(0.5, True), (3.0, False)])
def test_a_pattern_is_one_whose_swing_exceeds_twice_the_arrivals_noise_within_a_minute(within: float,
                                                                                          found: bool) -> None:
    """A 20-minute square wave ±1.7 req/s around 30 (its variance 2.9): Poisson noise of a 1-minute rate at 30
    req/s has variance 0.5, so the swing is a pattern for Poisson arrivals (2.9 ≥ 4 × 0.5) and not for
    arrivals three times as dispersed within a minute (2.9 < 4 × 1.5)."""
    rates = square(31.7, 28.3)
    d = run(Metrics(qps=30.0, rate_history=rates, short_history=shifted(rates, within_deviation(rates, within)),
                    history_step_s=60.0, p95_ms=300), 8)
    assert ("season_s" in d.details) is found


def test_poisson_arrivals_at_both_scales_are_sized_as_poisson() -> None:
    """The minutes vary as Poisson counting does, and so does the burst window against the minute: no clumps,
    no spread, the count Poisson arrivals need."""
    rates = noisy(20.0, math.sqrt(20.0 / 60), 120, 7)
    short = shifted(rates, within_deviation(rates, 1.0))
    d = run(Metrics(qps=20.0, audio_s=12.0, rate_history=rates, short_history=short, p95_ms=300), 4, MEASURED)
    assert "clumps" not in d.message and "spread" not in d.message
    assert d.details["needed"] == pytest.approx(20.0 / PROFILE.rate_at_slo(1.6, 12.0), rel=1e-3)
