"""The autoscaling decision: a pure function of metrics, replicas, policy and recent history.

No clock, no I/O, no kopf: the operator's loop and the simulator (``simulate.py``) call the same
``decide`` with the same inputs, so what the simulator proves is what the operator does.

How a decision is made (``decide``):

1. **No data** (the query failed, came back empty, or the targets are down) never scales down. The
   replicas are held (``ScalingActive=False, MetricsUnavailable``); with a ``fallback`` the count is
   raised to ``fallback.replicas`` after ``failureThreshold`` consecutive failures, never lowered.
   If the last reading with data showed a rising trend, the count follows that trend up (raise only)
   for at most ``TREND_FALLBACK_S`` and ``1 + TREND_FALLBACK_MAX_RISE`` times the last demand, then
   holds. Only **no traffic** (series present, rate 0) may scale down.
2. **Proportional signal**: the arrival rate (served rate + growth of the in-flight gauge, since the
   served rate saturates at capacity) over ``targetQPSPerReplica``; on a rising trend (a rise over the
   trend window beyond the tolerance, and no burst within it), the rate ``FORECAST_S`` ahead (a
   replica's cold start: what starts now serves then); or the arrival rate over a short window when it
   exceeds the long one by ``BURST_RATIO`` (Knative's panic window: a step is acted on one scrape after
   it starts, not a rate window later; it bypasses the scale-up window); and/or in-flight over
   ``targetInflightPerReplica``; the larger wins. The result is a replica count independent of how
   many replicas exist, so **warming pods count as capacity**: while they start, the same demand
   gives the same count and nothing runs away.
3. **Tolerance**: a recommendation within ``tolerance`` of the current count is no change (HPA's 0.1).
4. **p95 guardrail with hysteresis**: p95 (or time to first audio) above ``target × (1 + tolerance)``
   for a whole rate window (``LATENCY_WINDOW_S``) with no pod warming and no backlog draining (the
   windowed p95 lags a recovery) adds ``max(1, 25 %)`` replicas; a p95 above the target forbids
   scaling down, and one above ``target × SCALE_DOWN_LATENCY_RATIO`` keeps a spare replica above the
   demand's count. Latency is not proportional to replicas, so it never sets the count alone.
5. **Stabilization** (HPA v2 ``behavior``): scale-down takes the highest recommendation of the last
   ``scaleDown.stabilizationWindowSeconds``, scale-up the lowest of ``scaleUp``'s window. Until a whole
   scale-down window has been observed (the history lives in the operator's memory, so after a
   restart) nothing scales down.
6. **Rate limits**: ``policies`` of Pods/Percent per period, combined by ``selectPolicy``, counted
   from the replicas at the start of each period (HPA's rules); then ``minReplicas``/``maxReplicas``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

FORECAST_S = 120.0  # scale up for the demand this far ahead on a rising trend: a GPU replica's cold start
TREND_WINDOW_S = 300.0  # the trend query's range ([5m]): a trend is a rise over it of more than the tolerance
TREND_MIN_RISE = 1.0  # × tolerance: below that rise over TREND_WINDOW_S, the slope is the noise of a flat load
FORECAST_CAP = 0.1  # the trend adds at most this share of the current rate (a step is not a trend)
BURST_RATIO = 1.5  # a short-window rate this far above the long one is a burst: scale up on it at once
SCALE_DOWN_LATENCY_RATIO = 0.8  # p95 above 80 % of the objective: scale-down keeps a spare replica (the band)
NO_SCALE_DOWN_LATENCY_RATIO = 1.0  # p95 above the objective: no scale-down at all
LATENCY_WINDOW_S = 60.0  # the p95 query's rate window: the guardrail waits this long before adding
GUARD_STEP_RATIO = 0.25  # the latency guardrail adds this share of the replicas (at least 1)
TREND_FALLBACK_S = 900.0  # no data during a ramp: follow the last known trend (raise only) for at most this long
TREND_FALLBACK_MAX_RISE = 1.0  # ... and to at most (1 + this) × the last demand seen
HISTORY_SECONDS = 3600.0  # the longest window any rule may look back


@dataclass(frozen=True)
class Policy:
    """A rate-limiting policy: at most ``value`` Pods or Percent of change per ``period_s``."""
    type: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True)
class Rules:
    stabilization_s: float
    policies: tuple[Policy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


# Safe for GPUs: scale up faster than HPA's 4 pods or 100 % per 15 s — up to 4 pods or 200 % (a 5× step
# is reached in two periods, not three: every 15 s lost is 15 s more of the cold start unserved), which
# does not overshoot because warming pods are counted and maxReplicas bounds it; scale down slowly (a
# replica costs 60-180 s to bring back).
DEFAULT_SCALE_UP = Rules(0.0, (Policy("Pods", 4, 15.0), Policy("Percent", 200, 15.0)), "Max")
DEFAULT_SCALE_DOWN = Rules(300.0, (Policy("Percent", 50, 60.0),), "Max")


@dataclass(frozen=True)
class Settings:
    """The policy of one CosyVoiceService (``spec.autoscaling``), in plain numbers."""
    min_replicas: int = 1
    max_replicas: int = 10
    target_qps_per_replica: float | None = None
    target_inflight_per_replica: float | None = None
    target_p95_ms: float | None = None
    target_ttfa_ms: float | None = None
    tolerance: float = 0.1
    scale_up: Rules = DEFAULT_SCALE_UP
    scale_down: Rules = DEFAULT_SCALE_DOWN
    fallback_replicas: int | None = None
    failure_threshold: int = 3

    @classmethod
    def from_spec(cls, spec: Any) -> Settings:
        """From ``spec.Autoscaling`` (the pydantic model)."""
        def rules(raw: Any, default: Rules) -> Rules:
            if raw is None:
                return default
            window = default.stabilization_s if raw.stabilization_window_seconds is None \
                else float(raw.stabilization_window_seconds)
            policies = tuple(Policy(p.type, p.value, float(p.period_seconds)) for p in raw.policies) \
                or default.policies
            return Rules(window, policies, raw.select_policy)

        return cls(
            min_replicas=spec.min_replicas, max_replicas=spec.max_replicas or max(spec.min_replicas, 1),
            target_qps_per_replica=spec.target_qps_per_replica,
            target_inflight_per_replica=spec.target_inflight_per_replica,
            target_p95_ms=spec.target_p95_latency_ms, target_ttfa_ms=spec.target_time_to_first_audio_ms,
            tolerance=spec.tolerance,
            scale_up=rules(spec.scale_up, DEFAULT_SCALE_UP), scale_down=rules(spec.scale_down, DEFAULT_SCALE_DOWN),
            fallback_replicas=spec.fallback.replicas if spec.fallback else None,
            failure_threshold=spec.fallback.failure_threshold if spec.fallback else 3)


@dataclass(frozen=True)
class Metrics:
    """One reading of the service's metrics. ``error`` set (or no proportional signal) means no data.

    ``qps`` is the rate of answered requests (all codes, 429s included), ``inflight_growth`` the
    per-second change of the in-flight gauge (``deriv``): their sum is the arrival rate, also while
    the served rate is saturated (growing backlog) or above it (a backlog draining).
    """
    qps: float | None = None
    inflight: float | None = None
    inflight_growth: float | None = None
    p95_ms: float | None = None
    ttfa_p95_ms: float | None = None
    qps_short: float | None = None  # the same rate over a short window (2 scrapes): the burst detector
    qps_slope: float | None = None  # d(qps)/dt over the last minutes (req/s per s): the trend of a ramp
    inflight_growth_short: float | None = None  # the in-flight gauge's growth over the short window
    error: str | None = None

    @property
    def arrival_qps(self) -> float | None:
        if self.qps is None:
            return None
        return max(0.0, self.qps + (self.inflight_growth or 0.0))

    @property
    def arrival_qps_short(self) -> float | None:
        """The arrival rate over the short window: answered plus queued, like ``arrival_qps``."""
        if self.qps_short is None:
            return None
        return max(0.0, self.qps_short + (self.inflight_growth_short or 0.0))


@dataclass(frozen=True)
class History:
    """What ``decide`` needs from the past, returned updated with every decision (keep it per service)."""
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, stabilized-input recommendation)
    scale_events: tuple[tuple[float, int], ...] = ()  # (time, replica change): + up, - down
    failures: int = 0  # consecutive readings without data
    hot_since: float | None = None  # since when the latency has been over its objective with nothing warming
    burst_at: float | None = None  # the last time the short window saw a burst
    last_ok: float | None = None  # the time of the last reading with data
    last_demand: float | None = None  # its arrival rate (req/s)
    last_slope: float | None = None  # its trend (req/s per s)


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str  # why this count (a CamelCase reason, as in conditions and events)
    message: str
    metrics_ok: bool  # ScalingActive
    able_to_scale: bool  # AbleToScale: False while a rate limit or window holds the change back
    able_reason: str
    limited: bool  # ScalingLimited: the bounds clipped the recommendation
    limited_reason: str
    history: History
    recommendation: int | None = None  # the raw proportional count, before rules and bounds
    details: dict[str, float] = field(default_factory=dict)


def _proportional(m: Metrics, s: Settings, after_burst: bool = False) -> tuple[float | None, str]:
    """Replicas the demand needs (a float), and which signal set it."""
    best: float | None = None
    which = ""
    arrival = m.arrival_qps
    if s.target_qps_per_replica and arrival is not None:
        best, which = arrival / s.target_qps_per_replica, "qps"
        rise = m.qps_slope * TREND_WINDOW_S if m.qps_slope is not None else 0.0
        # a trend: a rise over the trend window beyond the tolerance (below: the noise of a flat load), and
        # no burst within the trend window (a step's jump is in the slope then: not a ramp to extrapolate)
        if TREND_MIN_RISE * s.tolerance * arrival < rise and not after_burst:
            # capped: a trend is a ramp's; a step's jump is not a slope to extrapolate
            ahead = arrival + min(m.qps_slope * FORECAST_S, FORECAST_CAP * arrival)
            best, which = ahead / s.target_qps_per_replica, f"qps rising ({arrival:.1f} → {ahead:.1f} in " \
                                                            f"{FORECAST_S:.0f} s)"
        short = m.arrival_qps_short
        if short is not None and short > BURST_RATIO * max(arrival, 1e-9):
            best, which = short / s.target_qps_per_replica, "qps (burst, short window)"
    if s.target_inflight_per_replica and m.inflight is not None:
        value = m.inflight / s.target_inflight_per_replica
        if best is None or value > best:
            best, which = value, "inflight"
    return best, which


def _trend_fallback(now: float, s: Settings, h: History) -> float | None:
    """Replicas for the demand the last known trend projects, during a metrics outage (None: no trend).

    Only a rising trend is followed (the fallback never lowers), from the last reading with data, for at
    most ``TREND_FALLBACK_S``, to at most ``1 + TREND_FALLBACK_MAX_RISE`` times the last demand, and
    only once the projection is more than ``tolerance`` above the last measured demand (a noisy slope on
    a flat load raises nothing). After that the count is held.
    """
    if (not s.target_qps_per_replica or h.last_ok is None or h.last_demand is None or h.last_slope is None
            or h.last_slope <= 0):
        return None
    elapsed = min(now - h.last_ok, TREND_FALLBACK_S)  # the demand the trend gives for now, no lead
    demand = min(h.last_demand + h.last_slope * elapsed, h.last_demand * (1 + TREND_FALLBACK_MAX_RISE))
    if demand <= h.last_demand * (1 + s.tolerance):
        return None  # within the tolerance of what was measured: noise, not a ramp
    return demand / s.target_qps_per_replica


def ceil_(x: float) -> int:
    return math.ceil(x - 1e-9)


def _latency_ratio(m: Metrics, s: Settings) -> tuple[float | None, str]:
    """The worst latency over its objective (1.0 = exactly at the SLO), or None without a reading."""
    ratios = []
    if s.target_p95_ms and m.p95_ms is not None and not math.isnan(m.p95_ms):
        ratios.append((m.p95_ms / s.target_p95_ms, "p95"))
    if s.target_ttfa_ms and m.ttfa_p95_ms is not None and not math.isnan(m.ttfa_p95_ms):
        ratios.append((m.ttfa_p95_ms / s.target_ttfa_ms, "time to first audio"))
    if not ratios:
        return None, ""
    return max(ratios)


def scale_limit(rules: Rules, current: int, events: Sequence[tuple[float, int]], now: float, up: bool) -> int | None:
    """HPA v2's rate limit: the furthest count ``rules`` allow from ``current`` (None: no limit).

    ``events`` are signed replica changes. Each policy counts from the replicas at the start of its
    period (``current`` minus the changes made in the period in that direction); ``Max`` picks the
    policy allowing the most change.
    """
    if rules.select == "Disabled":
        return current
    if not rules.policies:
        return None
    limits = []
    for p in rules.policies:
        recent = [d for t, d in events if now - t < p.period_s]
        start = current - sum(d for d in recent if d > 0) if up else current - sum(d for d in recent if d < 0)
        if up:
            limits.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
        else:
            limits.append(start - p.value if p.type == "Pods" else math.ceil(start * (1 - p.value / 100)))
    if up:
        return max(limits) if rules.select == "Max" else min(limits)
    return min(limits) if rules.select == "Max" else max(limits)


def _trim(items: tuple[tuple[float, int], ...], now: float) -> tuple[tuple[float, int], ...]:
    return tuple(x for x in items if now - x[0] <= HISTORY_SECONDS)


def decide(now: float, metrics: Metrics, *, current: int, ready: int, policy: Settings,
           history: History) -> Decision:
    """Desired replicas for one evaluation. ``current`` is spec.replicas (ready + warming pods)."""
    s = policy
    events = _trim(history.scale_events, now)
    warming = max(0, current - ready)
    after_burst = history.burst_at is not None and now - history.burst_at < TREND_WINDOW_S
    needed, signal = (None, "") if metrics.error else _proportional(metrics, s, after_burst)
    burst_at = now if signal.startswith("qps (burst") else history.burst_at

    # 1. No data: hold (or the fallback, never lower). No recommendation is recorded.
    if needed is None:
        failures = history.failures + 1
        why = metrics.error or "no proportional signal (query returned no series)"
        desired, reason = current, "MetricsUnavailable"
        message = f"holding {current} replicas: {why}"
        trend = _trend_fallback(now, s, history)
        if trend is not None and ceil_(trend) > current:
            # A ramp was under way when the data vanished: keep adding along its last known slope, raise
            # only, for a bounded time and rise, within the scale-up policies. Never lowers anything.
            limit = scale_limit(s.scale_up, current, events, now, up=True)
            up = min(ceil_(trend), s.max_replicas, limit if limit is not None else s.max_replicas)
            if up > current:
                desired = up
                message = (f"raised to {desired} replicas along the last known trend "
                           f"(+{history.last_slope:.3f} req/s per s, {now - (history.last_ok or now):.0f} s "
                           f"without data): {why}")
        if s.fallback_replicas is not None and failures >= s.failure_threshold and \
                min(s.fallback_replicas, s.max_replicas) > desired:
            desired = min(s.fallback_replicas, s.max_replicas)
            reason = "FallbackReplicas"
            message = f"{failures} consecutive metric failures: raised to fallback.replicas {desired} ({why})"
        hist = replace(history, failures=failures, scale_events=events + (((now, desired - current),)
                                                                          if desired != current else ()))
        return Decision(desired, reason, message, False, True, "ReadyForNewScale", False, "", hist)

    raw = math.ceil(needed - 1e-9) if needed > 0 else 0
    lat, lat_name = _latency_ratio(metrics, s)
    rec = current
    reason, message = "WithinTolerance", f"{signal} needs {needed:.2f} replicas, within tolerance of {current}"
    if current == 0 and needed > 0:
        rec, reason = max(1, raw), "ScaleUp"
        message = f"{signal} needs {needed:.2f} replicas"
    elif current > 0 and abs(needed / current - 1.0) > s.tolerance:
        rec = raw
        reason = "ScaleUp" if rec > current else "ScaleDown" if rec < current else reason
        message = f"{signal} needs {needed:.2f} replicas"
    # 4. Latency guardrail, with hysteresis.
    if lat is not None:
        draining = (metrics.inflight_growth or 0.0) < 0  # a backlog already shrinking: the p95 lags, wait
        hot = lat > 1.0 + s.tolerance and warming == 0 and not draining
        hot_since = (history.hot_since if history.hot_since is not None else now) if hot else None
        # The windowed p95 describes the last LATENCY_WINDOW_S: act once all of it was seen at this capacity.
        if hot and hot_since is not None and now - hot_since >= LATENCY_WINDOW_S and rec <= current:
            rec = current + max(1, math.ceil(current * GUARD_STEP_RATIO))
            reason = "LatencyAboveTarget"
            message = f"{lat_name} at {lat:.0%} of its objective with no replica warming: adding capacity"
        elif rec < current and lat > NO_SCALE_DOWN_LATENCY_RATIO:
            rec = current
            reason = "LatencyGuard"
            message = (f"{signal} would allow {raw} replicas, but {lat_name} is at {lat:.0%} of its objective "
                       f"(scale-down needs ≤ {NO_SCALE_DOWN_LATENCY_RATIO:.0%})")
        elif rec < current and lat > SCALE_DOWN_LATENCY_RATIO:
            # Near the objective: go down, but keep one replica above what the demand asks (the latency is
            # not proportional to replicas; the last one before the knee is the one that matters).
            rec = min(current, rec + 1)
            if rec == current:
                reason = "LatencyGuard"
                message = (f"{signal} would allow {raw} replicas, but {lat_name} is at {lat:.0%} of its objective: "
                           f"keeping a spare replica (below {SCALE_DOWN_LATENCY_RATIO:.0%} it goes)")
            else:
                message += f"; {lat_name} at {lat:.0%} of its objective: keeping a spare replica"
    else:
        hot_since = None
    recs = _trim(history.recommendations, now) + ((now, rec),)

    # 5. Stabilization windows.
    desired = rec
    able, able_reason = True, "ReadyForNewScale"
    if rec < current:
        window = [r for t, r in recs if now - t <= s.scale_down.stabilization_s]
        desired = min(current, max(window))
        if now - recs[0][0] < s.scale_down.stabilization_s:
            desired = current  # the window is not observed yet (e.g. after an operator restart): no scale-down
        if desired > rec:
            able, able_reason = False, "ScaleDownStabilized"
            message += f"; held at {desired} by the {s.scale_down.stabilization_s:.0f} s scale-down window"
    elif rec > current:
        up_window = s.scale_up.stabilization_s
        if burst_at == now:
            up_window = 0.0  # a burst is acted on at once, whatever the window
        window = [r for t, r in recs if now - t <= up_window]
        desired = max(current, min(window))
        if desired < rec:
            able, able_reason = False, "ScaleUpStabilized"
            message += f"; held at {desired} by the {s.scale_up.stabilization_s:.0f} s scale-up window"

    # 6. Rate limits, then bounds.
    if desired > current:
        limit = scale_limit(s.scale_up, current, events, now, up=True)
        if limit is not None and desired > limit:
            desired, able, able_reason = max(current, limit), False, "ScaleUpLimit"
            message += f"; limited to {desired} by scaleUp policies"
    elif desired < current:
        limit = scale_limit(s.scale_down, current, events, now, up=False)
        if limit is not None and desired < limit:
            desired, able, able_reason = min(current, limit), False, "ScaleDownLimit"
            message += f"; limited to {desired} by scaleDown policies"
    limited, limited_reason = False, ""
    if desired > s.max_replicas:
        desired, limited, limited_reason = s.max_replicas, True, "TooManyReplicas"
        message += f"; capped at maxReplicas {s.max_replicas}"
    elif desired < s.min_replicas:
        desired, limited, limited_reason = s.min_replicas, True, "TooFewReplicas"
        message += f"; raised to minReplicas {s.min_replicas}"
    if desired == current and reason in ("ScaleUp", "ScaleDown") and not limited and able:
        reason = "WithinTolerance"
    if desired != current:
        hot_since = None  # the capacity changes: the latency has to be re-observed
    hist = History(recommendations=recs, failures=0, hot_since=hot_since, burst_at=burst_at,
                   scale_events=events + (((now, desired - current),) if desired != current else ()),
                   last_ok=now, last_demand=metrics.arrival_qps,
                   # a slope with a step's jump in it is not a trend to follow blind
                   last_slope=None if burst_at is not None and now - burst_at < TREND_WINDOW_S else metrics.qps_slope)
    details = {"needed": float(needed)}
    if lat is not None:
        details["latency_ratio"] = float(lat)
    return Decision(desired, reason, message, True, able, able_reason, limited, limited_reason, hist,
                    recommendation=raw, details=details)
