"""The autoscaling decision: a pure function of metrics, replicas, policy and recent history.

No clock, no I/O, no kopf: the operator's loop and the simulator (``simulate.py``) call the same
``decide`` with the same inputs, so what the simulator proves is what the operator does.

How a decision is made (``decide``):

1. **No data** (the query failed, came back empty, or the targets are down) never scales down. The
   replicas are held (``ScalingActive=False, MetricsUnavailable``); with a ``fallback`` the count is
   raised to ``fallback.replicas`` after ``failureThreshold`` consecutive failures, never lowered.
   While data is missing the count follows, raise only, what was forecast at the last reading: the
   recurring pattern (step 2) and a rising trend, the trend for at most ``fallback.followTrendSeconds``.
   Only **no traffic** (series present, rate 0) may scale down.
2. **Demand, forecast one cold start ahead**: the arrival rate (served rate + growth of the in-flight
   gauge, since the served rate saturates at capacity); the arrival rate over the short window when
   it exceeds the long one by more than the tolerance and three standard deviations of Poisson noise
   (Knative's panic window: a step is acted on one scrape after it starts; it bypasses the scale-up
   window); on a rising trend (a rise over the trend window, or over the rate history's last
   ``LONG_TREND_S`` for a slower one, beyond the tolerance and the noise, no burst within it)
   the rate a cold start and an evaluation after the middle of the rate window (``trend_horizon_s``);
   with a recurring pattern in the service's own history (``forecast.py``: rate and request length, so
   a recurring shift to long requests counts too) the most replicas it needs over ``horizon_s`` of its
   1-minute samples (``coldStartSeconds`` + one evaluation + the window by which a sample is late). A forecast only adds: it pre-warms
   for a recurring peak and keeps a scale-down from removing replicas that peak will need; with a
   pattern the scale-down window shrinks to one rate window, so no fixed window can fall into step
   with periodic load. Saturated replicas (all ready, batches full, a queue growing) count as what
   they serve: the count is scaled by offered over served.
3. **Sizing**: replicas = demand / the rate one replica takes within the objective. With a
   ``capacityProfile`` that rate comes from the measured replica (``profile.py``: the Poisson rate at
   which the p95 of response time is ``sizingLatencyRatio × targetP95LatencyMs``, for the mean request
   length now measured, and for the clumps a replica's arrivals come in when the rate history is
   noisier than Poisson: ``_dispersion``, ``_clump``); when the 1-minute rate moves more than the clumps
   within a minute explain (the burst window's rate against the minute's), the excess is the rate itself
   moving, and the demand is taken at the 95th percentile of that spread instead, above the level of the
   trend window's minutes (this minute's rate is one draw of the spread, not a forecast of the next).
   ``targetQPSPerReplica`` is used as given (with both, the lower). The count
   depends on demand only, not on how many replicas exist, so **warming pods count as capacity**.
   ``targetInflightPerReplica`` and ``targetSessionsPerReplica`` (open speech sessions) add counts; the larger wins.
4. **Tolerance**: a recommendation within ``tolerance`` of the current count is no change (HPA's 0.1),
   except upward while the recurring pattern climbs all through the lead time and the load now already
   needs more than the replicas running: the band is for noise; on a slow climb it would keep the count
   a replica short all along.
5. **p95 guardrail with hysteresis**: p95 (or time to first audio) above ``target × (1 + tolerance)``
   for a whole rate window with no pod warming and no backlog draining (the in-flight gauge falling by more
   than its noise over the rate window) adds ``latencyGuardStepPercent``
   of the replicas (at least 1); a p95 above the target forbids scaling down, and one above
   ``sizingLatencyRatio × target`` keeps a spare replica above the demand's count. Latency is not
   proportional to replicas, so it never sets the count alone; but where it adds, the count the sizing gave
   was shown too few for that demand (a profile from faster hardware, a ``targetQPSPerReplica`` too high),
   and the sizing is multiplied by what it was short for ``latencyGuardMemorySeconds``, instead of
   scaling back into the same breach once the scale-down window has passed. Once the replicas it added
   are ready and a whole window was seen with them, a latency no better than when it added them is not
   a capacity shortfall: it adds no more in that breach (``LatencyNotCapacity``) and drops the sizing's
   correction.
6. **Stabilization** (HPA v2 ``behavior``): scale-down takes the highest recommendation of the last
   ``scaleDown.stabilizationWindowSeconds`` (one rate window with a recurring pattern, or on a decline
   beyond the tolerance and the noise that is not a spike ending within the window: ``_falling``), scale-up
   the lowest of ``scaleUp``'s window. Until a whole scale-down window has been observed nothing scales down. The history is part of the decision's
   output; the operator keeps it in ``status.autoscaling.history``, so a restart or a new leader
   resumes the windows where they were.
7. **Rate limits**: ``policies`` of Pods/Percent per period, combined by ``selectPolicy``, counted
   from the replicas at the start of each period (HPA's rules); then ``minReplicas``/``maxReplicas``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from . import forecast
from . import profile as profiles
from .profile import Profile

# The windows of the queries (prometheus.py builds them from these): properties of the signals, not knobs.
RATE_WINDOW_S = 60.0  # rate(...[1m]): the arrival rate and the p95; the guardrail waits this long before adding
SHORT_WINDOW_S = 30.0  # rate(...[30s]), two scrapes at 15 s: the burst detector
TREND_WINDOW_S = 300.0  # deriv(...[5m:15s]): the trend; no trend within this long after a burst
LONG_TREND_S = 900.0  # the rate history's last 15 minutes: a rise too slow to tell from noise in 5 minutes
CHI2_1_MEDIAN = 0.454936  # median of a chi-square with one degree of freedom
ESTIMATE_Z = 2.0  # a measured burstiness counts from two standard errors of its estimate up (97.7 % one-sided)
BURST_Z = 3.0  # a burst is beyond three standard deviations of the short window's Poisson counting noise


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
    """The policy of one CosyVoiceService (``spec.autoscaling``), in plain numbers. The defaults are the
    CRD's (``spec.Autoscaling``); ``from_spec`` is how the operator builds it."""
    min_replicas: int = 1
    max_replicas: int = 10
    target_qps_per_replica: float | None = None
    target_inflight_per_replica: float | None = None
    target_sessions_per_replica: float | None = None
    target_p95_ms: float | None = None
    target_ttfa_ms: float | None = None
    tolerance: float = 0.1
    scale_up: Rules = DEFAULT_SCALE_UP
    scale_down: Rules = DEFAULT_SCALE_DOWN
    fallback_replicas: int | None = None
    failure_threshold: int = 3
    follow_trend_s: float = 600.0
    profile: Profile | None = None
    sizing_latency_ratio: float = 0.8
    cold_start_s: float | None = None  # None: the profile's measured start (``start_s``)
    interval_s: float = 15.0
    season_lookback_s: float = 10800.0
    season_min_correlation: float = 0.6
    guard_step_percent: float = 25.0
    guard_memory_s: float = 3600.0

    @classmethod
    def from_spec(cls, spec: Any, profile: Profile | None = None) -> Settings:
        """From ``spec.Autoscaling`` (the pydantic model); ``profile`` is its ``capacityProfile``, loaded."""
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
            target_sessions_per_replica=spec.target_sessions_per_replica,
            target_p95_ms=spec.target_p95_latency_ms, target_ttfa_ms=spec.target_time_to_first_audio_ms,
            tolerance=spec.tolerance,
            scale_up=rules(spec.scale_up, DEFAULT_SCALE_UP), scale_down=rules(spec.scale_down, DEFAULT_SCALE_DOWN),
            fallback_replicas=spec.fallback.replicas if spec.fallback else None,
            failure_threshold=spec.fallback.failure_threshold if spec.fallback else 3,
            follow_trend_s=float(spec.outage_forecast_seconds),
            profile=profile, sizing_latency_ratio=spec.sizing_latency_ratio,
            cold_start_s=None if spec.cold_start_seconds is None else float(spec.cold_start_seconds),
            interval_s=float(spec.interval_seconds), season_lookback_s=float(spec.forecast.lookback_seconds),
            season_min_correlation=spec.forecast.min_correlation,
            guard_step_percent=float(spec.latency_guard_step_percent),
            guard_memory_s=float(spec.latency_guard_memory_seconds))

    @property
    def start_s(self) -> float:
        """How long a replica created now takes to serve: ``coldStartSeconds`` when set; else the profile's
        measured start on a node without the model (a cache miss: a scale-up beyond the nodes that ran a
        replica pays it, and a forecast shorter than the start leaves the peak's first minutes unserved);
        else the assumption."""
        if self.cold_start_s is not None:
            return self.cold_start_s
        return (self.profile.cold_start if self.profile is not None else profiles.ASSUMED).miss_s

    @property
    def horizon_s(self) -> float:
        """How far ahead demand is forecast: a replica created now serves after the cold start (plus up to
        one evaluation), and a rate over a window shows a change completely only a window later."""
        return self.start_s + RATE_WINDOW_S + self.interval_s

    @property
    def trend_horizon_s(self) -> float:
        """How far ahead a rising trend is projected: what is created now serves after the cold start, and
        must last until what the next evaluation creates serves; the 1-minute rate it starts from describes
        the load half a rate window ago (the middle of its window, on a linear rise)."""
        return self.start_s + self.interval_s + RATE_WINDOW_S / 2

    @property
    def history_s(self) -> float:
        """The longest a rule looks back (recommendations and scale events older than that are dropped)."""
        periods = [p.period_s for p in self.scale_up.policies + self.scale_down.policies]
        return max([self.scale_down.stabilization_s, self.scale_up.stabilization_s, *periods]) + self.interval_s

    def per_replica_rate(self, audio_s: float | None, clump: float = 1.0) -> tuple[float | None, str]:
        """Requests/s one replica takes within the objective, and where that number came from. ``clump``:
        the mean size of the clumps a replica's arrivals come in (1: Poisson; see ``profile.clump_size``)."""
        rates: list[tuple[float, str]] = []
        if self.target_qps_per_replica:
            rates.append((self.target_qps_per_replica, "targetQPSPerReplica"))
        if self.profile is not None and self.target_p95_ms:
            length = audio_s if audio_s else max(L.audio_s for L in self.profile.lengths)
            cap = self.profile.rate_at_slo(self.target_p95_ms * self.sizing_latency_ratio / 1000, length, clump)
            bursts = f", arrivals in clumps of {clump:.1f}" if clump >= 1.05 else ""
            rates.append((max(cap, 1e-3), f"{self.profile.name} profile at {length:.1f} s of audio per request{bursts}"))
        return min(rates) if rates else (None, "")


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
    audio_s: float | None = None  # mean seconds of audio per request (request length, for the profile)
    sessions: float | None = None  # open WebSocket speech sessions (cosyvoice_stream_sessions_open)
    rate_history: tuple[float, ...] = ()  # the rate over the forecast lookback, oldest first, ending now
    work_history: tuple[float, ...] = ()  # the same for seconds of audio per second (the work), when measured
    short_history: tuple[float, ...] = ()  # the short-window rate at the same instants (burstiness within a minute)
    history_step_s: float = 60.0  # spacing of rate_history and work_history

    def season_series(self) -> tuple[float, ...]:
        """The series a recurring pattern is looked for in: the work (audio seconds per second) when it
        is measured, since requests that get longer at the same rate are a change of load too."""
        if self.audio_s and len(self.work_history) == len(self.rate_history) and any(self.work_history):
            return self.work_history
        return self.rate_history
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
    """What ``decide`` needs from the past, returned updated with every decision (kept per service, and
    persisted by the operator in ``status.autoscaling.history``: times are seconds since the epoch)."""
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, stabilized-input recommendation)
    scale_events: tuple[tuple[float, int], ...] = ()  # (time, replica change): + up, - down
    failures: int = 0  # consecutive readings without data
    hot_since: float | None = None  # since when the latency has been over its objective with nothing warming
    burst_at: float | None = None  # the last time the short window saw a burst
    last_ok: float | None = None  # the time of the last reading with data
    last_demand: float | None = None  # its arrival rate (req/s)
    last_slope: float | None = None  # its trend (req/s per s), None after a burst
    last_audio_s: float | None = None  # its mean request length
    season_s: float | None = None  # the recurring period found in the rate history (None: none)
    season_checked: float | None = None  # when it was last looked for
    forecast: tuple[float, ...] = ()  # replicas the seasonal forecast made at last_ok needs, per forecast_step_s
    forecast_step_s: float = 60.0
    undercount: float = 1.0  # what the latency guardrail found the sizing's count short by (a factor ≥ 1)
    undercount_at: float | None = None  # when it last found so
    guard_ratio: float | None = None  # the latency over its objective when the guardrail last added (in this breach)


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


SEASON_RECHECK_S = 300.0  # how often the period is looked for again (it changes over hours, not minutes)


def _season(now: float, m: Metrics, s: Settings, h: History) -> tuple[float | None, float | None]:
    """The recurring period of the rate history (cached in the history for SEASON_RECHECK_S)."""
    if h.season_checked is not None and now - h.season_checked < SEASON_RECHECK_S:
        return h.season_s, h.season_checked
    series = m.season_series()
    if len(series) < 8:
        return None, h.season_checked
    # counting noise of a rate over RATE_WINDOW_S: λ/T for requests; for audio seconds each request adds its
    # length, so about λ·L²/T = mean · L / T
    unit = (m.audio_s or 1.0) if series is m.work_history else 1.0
    poisson = (sum(series) / len(series)) * unit / RATE_WINDOW_S
    # The arrivals' own noise, within a minute where the short window was measured: the second differences of
    # a short pattern are mostly its edges (a 7-minute square wave has four large ones in seven), and would
    # read the pattern itself as noise
    within = _short_dispersion(m)
    noise = poisson * max(1.0, within) if within is not None else _noise_var(series, poisson)
    found = forecast.detect_period(series, m.history_step_s, s.horizon_s, s.season_min_correlation, noise)
    return (found.period_s if found else None), now


def _demand(m: Metrics, s: Settings, since_burst: float, season_s: float | None) -> tuple[float, str]:
    """The arrival rate to size for now (req/s), and what set it."""
    arrival = m.arrival_qps or 0.0
    short = m.arrival_qps_short
    if short is not None and short > arrival * (1 + s.tolerance) and \
            short - arrival > BURST_Z * math.sqrt(max(arrival, 1.0 / SHORT_WINDOW_S) / SHORT_WINDOW_S):
        return short, "qps (burst, short window)"
    slope = _rising(m, s, arrival, since_burst) if season_s is None else None
    if slope is not None:  # (with a recurring pattern, its forecast is the better model of the rise)
        ahead = arrival + slope * s.trend_horizon_s
        return ahead, f"qps rising ({arrival:.1f} → {ahead:.1f} in {s.trend_horizon_s:.0f} s)"
    return arrival, "qps"


def _rising(m: Metrics, s: Settings, arrival: float, since_burst: float) -> float | None:
    """The rate's rise (req/s per s) when it is a trend, beyond the tolerance and the noise: over the trend
    window, or, for a rise too slow to tell from noise there, over the rate history's last ``LONG_TREND_S``
    while the trend window still rises; neither while a window holds a burst, a step's jump (None: no
    rising trend)."""
    if m.qps_slope is None or m.qps_slope <= 0 or since_burst < TREND_WINDOW_S:
        return None
    if _beyond_noise(m.qps_slope * TREND_WINDOW_S, TREND_WINDOW_S / RATE_WINDOW_S, arrival, m, s):
        return m.qps_slope
    if since_burst < LONG_TREND_S:
        return None
    x = _last(m, LONG_TREND_S)
    n = len(x)  # all of it while the history is shorter: longer than the trend window, it still sees more
    if n < 3 or n * m.history_step_s <= TREND_WINDOW_S:  # (a history sampled coarser has too few points)
        return None
    slope = forecast.slope(x) / m.history_step_s
    return slope if _beyond_noise(slope * n * m.history_step_s, n, arrival, m, s) else None


def _last(m: Metrics, seconds: float) -> Sequence[float]:
    """The rate history's samples over its last ``seconds`` (at least the last one; all while it is shorter)."""
    return m.rate_history[-max(1, int(seconds // m.history_step_s)):]


def _falling(m: Metrics, s: Settings) -> bool:
    """The rate fell over the trend window by more than the tolerance and three standard deviations of the
    1-minute rate's noise, and not as the end of a spike: a jump down, back to (or below) where the rate was
    before a jump up at most the scale-down window earlier (the window is there to ride out exactly that: spikes
    come again). In the newest sample a jump down after such a jump up is enough, at any level: it may be a
    spike's end half seen. A jump is a change between two minutes beyond three standard deviations of their
    difference's noise."""
    if m.qps_slope is None or m.arrival_qps is None:
        return False
    x = m.rate_history
    jump = BURST_Z * math.sqrt(2 * _rate_noise_var(m))
    held = int(s.scale_down.stabilization_s // m.history_step_s)
    for i in range(max(1, len(x) - len(_last(m, TREND_WINDOW_S))), len(x)):
        if x[i - 1] - x[i] > jump and any(x[j] - x[j - 1] > jump and (i == len(x) - 1 or x[i] <= x[j - 1] + jump)
                                           for j in range(max(1, i - held), i)):
            return False
    return _beyond_noise(-m.qps_slope * TREND_WINDOW_S, TREND_WINDOW_S / RATE_WINDOW_S, m.arrival_qps, m, s)


def _beyond_noise(change: float, k: float, arrival: float, m: Metrics, s: Settings) -> bool:
    """A change of the rate over a window of ``k`` independent 1-minute rates (the slope fitted to them × the
    window) is more than the tolerance (of the ``arrival`` rate) and three standard deviations of what the
    rates' noise alone gives such a slope: a trend, rising or falling, not the scatter of a constant load."""
    # a least-squares slope over k independent rates: its change over the window has the standard deviation of
    # one rate times sqrt(12 k / (k² - 1))
    noise = math.sqrt(_rate_noise_var(m) * 12 * k / (k * k - 1))
    return change > s.tolerance * arrival and change > BURST_Z * noise


def _rate_noise_var(m: Metrics) -> float:
    """Variance of the 1-minute rate's noise around the load (Poisson counting noise, or what the history shows)."""
    return _noise_var(m.rate_history, max(m.arrival_qps or 0.0, 1.0 / RATE_WINDOW_S) / RATE_WINDOW_S)


def _noise_var(series: Sequence[float], poisson: float) -> float:
    """Variance of a series' noise: Poisson counting noise, or more where the series shows more (bursty
    arrivals). From second differences, which a steady rise does not move (their variance is six times the
    noise's), by the median of their squares over the median of a chi-square with one degree of freedom, which
    the few large ones at a step or the edge of a peak do not move either."""
    if len(series) < 8:
        return poisson
    second = sorted((a - 2 * b + c) ** 2 for a, b, c in zip(series, series[1:], series[2:]))
    return max(poisson, second[len(second) // 2] / (6 * CHI2_1_MEDIAN))


def _dispersion(m: Metrics, season_s: float | None) -> tuple[float, float]:
    """The index of dispersion of the service's arrivals within a minute (variance over mean of the counts; 1:
    Poisson) that the history shows beyond doubt, and the standard deviation of the 1-minute rate beyond what
    that explains (the rate itself moving from minute to minute: users, not clumps).

    The 1-minute rate's noise is read from its second differences (a steady rise does not move them; their
    variance is six times the noise's), by the median of their squares (the few large ones at a step do not
    move it), taken ``ESTIMATE_Z`` standard errors low (``_lower``), so Poisson traffic, whose estimate scatters
    around 1, is sized as Poisson. Over the Poisson noise of the level the history was measured at (not the
    load now: a drop in load would read the same noise as more bursty and add replicas). With a recurring
    pattern the history's changes are mostly the pattern's (its edges, its cycle-to-cycle variation, the
    period known to a sample), which no estimate separates from arrival noise: the arrivals are taken as
    Poisson, and the forecast covers the changes."""
    x = m.rate_history
    if season_s is not None or len(x) < 8:
        return 1.0, 0.0
    level = _level(x)
    minute = _lower(sorted((a - 2 * b + c) ** 2 for a, b, c in zip(x, x[1:], x[2:]))) / 6  # the 1-min rate's variance
    dispersion = minute * RATE_WINDOW_S / level
    short = _short_dispersion(m)
    if short is None:
        return max(1.0, dispersion), 0.0
    # Within the error of two such estimates the minute's stands (clumps show at both scales); beyond it the
    # excess is the rate moving, which no replica started now can follow within the minute: a spread of load
    if dispersion <= short * (1 + ESTIMATE_Z * math.sqrt(2) * 2.33 / math.sqrt(len(x))):
        return max(1.0, dispersion), 0.0
    clumps = max(1.0, short)
    return clumps, math.sqrt(max(0.0, minute - clumps * level / RATE_WINDOW_S))


def _short_dispersion(m: Metrics) -> float | None:
    """The index of dispersion within a minute (None: no short-window history). Minute-to-minute changes of the
    rate itself read the same at one minute as clumps do; within a minute they cancel: the short window's rate
    less the minute's, which share that rate, varies by the clumps alone. Its Poisson variance is the level
    times 1/short - 1/long (nested windows). The rate history has its 8 samples (the callers' condition)."""
    x = m.rate_history
    if len(m.short_history) != len(x):
        return None
    return _lower(sorted((s - r) ** 2 for s, r in zip(m.short_history, x))) / \
        (_level(x) * (1 / SHORT_WINDOW_S - 1 / RATE_WINDOW_S))


def _recent_level(m: Metrics, arrival: float) -> float:
    """The rate the minutes of the last trend window were at: their mean, unless this minute's rate
    (``arrival``) is beyond three standard deviations of the 1-minute rate's noise from it (a change, not a
    draw: then this minute's)."""
    recent = _last(m, TREND_WINDOW_S)
    level = sum(recent) / len(recent)
    return arrival if abs(arrival - level) > BURST_Z * math.sqrt(_rate_noise_var(m)) else level


def _level(x: Sequence[float]) -> float:
    """The rate a history was measured at, at least one request a rate window (its Poisson noise is the
    noise of that level, not of the load now: a drop in load would read the same noise as more bursty)."""
    return max(sum(x) / len(x), 1.0 / RATE_WINDOW_S)


def _lower(squares: Sequence[float]) -> float:
    """The variance behind sorted squared normal deviations, by the median of the squares over a chi-square's
    (robust to the few large ones at a step), taken ``ESTIMATE_Z`` standard errors low (the median of n squares
    is known to about 2.33/√n of itself)."""
    return squares[len(squares) // 2] / CHI2_1_MEDIAN / (1 + ESTIMATE_Z * 2.33 / math.sqrt(len(squares)))


def _clump(s: Settings, dispersion: float, demand: float, length: float | None) -> float:
    """The mean clump one replica's arrivals come in, at the replicas ``demand`` needs: the service's
    ``dispersion`` shared out by random routing. The replicas depend on the clump and the clump on the replicas:
    the fewest replicas n that take the demand with the clump of n (what n replicas need falls as n grows,
    so that is where the two cross; found by doubling, then bisection)."""
    if dispersion <= 1.0 or demand <= 0:
        return 1.0

    def short(n: float) -> bool:  # n replicas are too few for the demand at their clump
        rate, _ = s.per_replica_rate(length, profiles.clump_size(dispersion, n))
        return bool(rate) and demand / rate > n

    lo, hi = 0.0, max(1.0, demand / (s.per_replica_rate(length)[0] or demand))
    while short(hi):
        lo, hi = hi, 2 * hi
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if short(mid) else (lo, mid)
    return profiles.clump_size(dispersion, hi)


def _seasonal_replicas(m: Metrics, s: Settings, season_s: float | None, clump: float = 1.0) -> tuple[float, ...]:
    """Replicas the recurring pattern needs at each coming step (one per ``history_step_s``, over the longer
    of the horizon and ``outageForecastSeconds``): its rate, and its request length when the work is
    measured too (longer requests leave a replica fewer requests/s within the objective)."""
    if season_s is None or not m.rate_history:
        return ()
    season = forecast.Season(season_s, 1.0)
    horizon = max(s.horizon_s, s.follow_trend_s)
    rates = forecast.seasonal(m.rate_history, m.history_step_s, season, horizon)
    lengths: list[float | None] = [m.audio_s] * len(rates)
    if m.audio_s and len(m.work_history) == len(m.rate_history):
        works = forecast.seasonal(m.work_history, m.history_step_s, season, horizon)
        # The history's lengths are those of the requests that finished in each minute. On a rising edge the
        # short ones finish first (all the more while replicas are saturated), so a coming peak's requests
        # would be forecast shorter than they are and its replicas too few: a step's length is at least the
        # length now (the forecast only ever raises the count). Longer ones are capped by the longest measured
        # where the served rate was the offered one (a saturated replica's long requests finish late, in bursts).
        typical = sorted(m.rate_history)[len(m.rate_history) // 2]
        seen = [w / r for r, w in zip(m.rate_history, m.work_history) if r >= typical / 2 and r > 0]
        hi = max(seen, default=m.audio_s)
        lengths = [max(m.audio_s, min(hi, w / r)) if r > 0 else m.audio_s for r, w in zip(rates, works)]
    out = []
    for rate, length in zip(rates, lengths):
        per_replica, _ = s.per_replica_rate(length, clump)
        out.append(round(rate / per_replica, 3) if per_replica else 0.0)
    return tuple(out)


def _proportional(m: Metrics, s: Settings, h: History, since_burst: float, season_s: float | None,
                  current: int, ready: int) -> tuple[float | None, str, float | None, tuple[float, ...], bool]:
    """Replicas the demand needs (a float), which signal set it, the demand (req/s), the seasonal
    forecast (replicas per step, kept for an outage), and whether the count trails a recurring climb
    (the load now needs more than the replicas running and the pattern rises all through the lead time)."""
    best: float | None = None
    which, demand, predicted, rising = "", None, (), False
    length = m.audio_s or h.last_audio_s
    per_replica, source = s.per_replica_rate(length)
    if per_replica and m.arrival_qps is not None:
        demand, which = _demand(m, s, since_burst, season_s)
        # clumps and the minutes' spread count only where the profile models the queue they fill
        dispersion, spread = _dispersion(m, season_s) if s.profile is not None else (1.0, 0.0)
        if spread > 0:
            # The minute's rate moves by more than its arrivals' noise: size for the minutes at its 95th
            # percentile, as the objective is each minute's p95. From the level the recent minutes were at, not
            # from this minute's rate: that is one draw of the spread, which the coming minutes do not repeat
            # (adding the percentile to it sized for the noise twice, and moved the count with every draw).
            level = _recent_level(m, m.arrival_qps)
            lifted = demand - m.arrival_qps + level + profiles.Z95 * spread
            if lifted > demand:
                demand = lifted
                which += f" (recent minutes at {level:.1f}) + {profiles.Z95 * spread:.1f} for their minute-to-minute spread"
        clump = _clump(s, dispersion, demand, length)
        per_replica, source = s.per_replica_rate(length, clump)
        assert per_replica
        best = demand / per_replica
        which += f" at {per_replica:.2f} req/s per replica ({source})"
        predicted = _seasonal_replicas(m, s, season_s, clump)
        # the horizon already counts the rate window by which the history's 1-minute rate shows a change late
        steps = max(1, math.ceil(s.horizon_s / m.history_step_s))
        ahead = predicted[:steps]
        peak = max(ahead, default=0.0)
        # The load now already needs more than the replicas running, and the pattern climbs all through the
        # lead time (not a plateau whose samples differ by noise): the count trails a climb
        climbing = len(ahead) > 1 and ahead[-1] > ahead[0] and all(b >= a for a, b in zip(ahead, ahead[1:]))
        rising = climbing and best > current
        if peak > best * (1 + s.tolerance) or (rising and peak > best):
            best, which = peak, (f"the load recurring every {season_s / 60:.0f} min (needs {peak:.2f} replicas "
                                 f"within {s.horizon_s:.0f} s; now {m.arrival_qps:.1f} req/s)")
        # Saturated: every replica is ready, its batch full and a queue grows. What they serve is their
        # real capacity (the requests may be longer than the measured mean, which lags, or the profile
        # optimistic): the replicas needed are the ready ones scaled by offered over served. Not while
        # replicas warm: they are the capacity on its way.
        batch = s.profile.max_batch_size if s.profile is not None else None
        if batch and ready > 0 and ready == current and m.qps and m.inflight is not None \
                and m.inflight >= batch * ready and m.arrival_qps > m.qps * (1 + s.tolerance):
            saturated = ready * m.arrival_qps / m.qps
            if saturated > best:
                best, which = saturated, (f"saturated ({ready} replicas serve {m.qps:.1f} of {m.arrival_qps:.1f} "
                                          f"req/s with full batches)")
    if s.target_inflight_per_replica and m.inflight is not None:
        value = m.inflight / s.target_inflight_per_replica
        if best is None or value > best:
            best, which = value, "inflight"
    # Open speech sessions: each holds a slot and a KV cache while open, also while it waits for text
    if s.target_sessions_per_replica and m.sessions is not None:
        value = m.sessions / s.target_sessions_per_replica
        if best is None or value > best:
            best, which = value, "sessions"
    return best, which, demand, predicted, rising


def _outage_replicas(now: float, s: Settings, h: History) -> tuple[float | None, str]:
    """Replicas to keep serving while metrics are missing (None: nothing to follow). Raise only: the
    seasonal forecast made at the last reading, within its horizon, and the last rising trend for at
    most ``outageForecastSeconds``; each only once it leaves the tolerance band of the last demand."""
    if h.last_ok is None or h.last_demand is None:
        return None, ""
    per_replica, _ = s.per_replica_rate(h.last_audio_s)
    if not per_replica:
        return None, ""
    best, which = None, ""
    elapsed = now - h.last_ok
    if h.forecast:
        first = int(elapsed // h.forecast_step_s)
        window = h.forecast[first:first + max(1, math.ceil(s.horizon_s / h.forecast_step_s))]
        if window:
            best, which = max(window), "the recurring pattern"
    if h.last_slope is not None and h.last_slope > 0:
        trend = (h.last_demand + h.last_slope * min(elapsed, s.follow_trend_s)) / per_replica
        if best is None or trend > best:
            best, which = trend, f"the last trend (+{h.last_slope:.3f} req/s per s)"
    if best is None or best <= h.last_demand / per_replica * (1 + s.tolerance):
        return None, ""
    return best, which


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


def _trim(items: tuple[tuple[float, int], ...], now: float, keep_s: float) -> tuple[tuple[float, int], ...]:
    return tuple(x for x in items if now - x[0] <= keep_s)


def decide(now: float, metrics: Metrics, *, current: int, ready: int, policy: Settings,
           history: History) -> Decision:
    """Desired replicas for one evaluation. ``current`` is spec.replicas (ready + warming pods)."""
    s = policy
    events = _trim(history.scale_events, now, s.history_s)
    warming = max(0, current - ready)
    since_burst = now - history.burst_at if history.burst_at is not None else math.inf
    season_s, season_checked = (history.season_s, history.season_checked) if metrics.error else \
        _season(now, metrics, s, history)
    needed, signal, demand, predicted, rising = (None, "", None, (), False) if metrics.error else \
        _proportional(metrics, s, history, since_burst, season_s, current, ready)
    burst_at = now if signal.startswith("qps (burst") else history.burst_at

    # 1. No data: hold (or the fallback, never lower). No recommendation is recorded.
    if needed is None:
        failures = history.failures + 1
        why = metrics.error or "no proportional signal (query returned no series)"
        desired, reason = current, "MetricsUnavailable"
        message = f"holding {current} replicas: {why}"
        follow, what = _outage_replicas(now, s, history)
        if follow is not None and ceil_(follow) > current:
            # Load was rising, or a recurring peak is due, when the data vanished: raise along that
            # forecast, within the scale-up policies. Never lowers anything.
            limit = scale_limit(s.scale_up, current, events, now, up=True)
            up = min(ceil_(follow), s.max_replicas, limit if limit is not None else s.max_replicas)
            if up > current:
                desired = up
                message = (f"raised to {desired} replicas along {what} ({now - (history.last_ok or now):.0f} s "
                           f"without data): {why}")
        if s.fallback_replicas is not None and failures >= s.failure_threshold and \
                min(s.fallback_replicas, s.max_replicas) > desired:
            desired = min(s.fallback_replicas, s.max_replicas)
            reason = "FallbackReplicas"
            message = f"{failures} consecutive metric failures: raised to fallback.replicas {desired} ({why})"
        hist = replace(history, failures=failures, scale_events=events + (((now, desired - current),)
                                                                          if desired != current else ()))
        return Decision(desired, reason, message, False, True, "ReadyForNewScale", False, "", hist)

    # What the guardrail found the sizing short by, while it is remembered (rule 5)
    remembered = history.undercount_at is not None and now - history.undercount_at < s.guard_memory_s
    undercount, undercount_at = (history.undercount, history.undercount_at) if remembered else (1.0, None)
    sized = needed
    if undercount > 1.0:
        needed *= undercount
        signal += f" × {undercount:.2f} (what the latency guardrail found it short)"
    raw = math.ceil(needed - 1e-9) if needed > 0 else 0
    lat, lat_name = _latency_ratio(metrics, s)
    rec = current
    reason, message = "WithinTolerance", f"{signal} needs {needed:.2f} replicas, within tolerance of {current}"
    if current == 0 and needed > 0:
        rec, reason = max(1, raw), "ScaleUp"
        message = f"{signal} needs {needed:.2f} replicas"
    elif current > 0 and (abs(needed / current - 1.0) > s.tolerance or (rising and raw > current)):
        # The band keeps noise from moving the count; a forecast of a rise is not noise: inside the band
        # the count would trail a slow climb by a replica for as long as the climb lasts.
        rec = raw
        reason = "ScaleUp" if rec > current else "ScaleDown" if rec < current else reason
        message = f"{signal} needs {needed:.2f} replicas"
    # 5. Latency guardrail, with hysteresis.
    if lat is not None:
        # A backlog already shrinking: the p95 lags it, wait. Shrinking beyond the gauge's noise (in-flight counts
        # scatter like Poisson counts): a slope fitted to a steady gauge is negative half the time, and would
        # keep the guardrail from ever seeing a whole window
        fall = -(metrics.inflight_growth or 0.0) * RATE_WINDOW_S
        draining = fall > BURST_Z * math.sqrt(max(metrics.inflight or 0.0, 1.0))
        hot = lat > 1.0 + s.tolerance and warming == 0 and not draining
        hot_since = (history.hot_since if history.hot_since is not None else now) if hot else None
        # A breach ends when the latency is back within the band: a new one starts with no comparison
        guard_ratio = history.guard_ratio if lat > 1.0 + s.tolerance else None
        # The windowed p95 describes the last rate window: act once all of it was seen at this capacity.
        seen = hot and hot_since is not None and now - hot_since >= RATE_WINDOW_S and rec <= current
        if seen and guard_ratio is not None and lat >= guard_ratio:
            # The replicas the guardrail added last are ready, a whole window was seen with them, and the
            # latency is no better than when it added them: replicas do not fix this breach (a slow
            # dependency, throttled CPU). Adding more would climb to maxReplicas for nothing; scaling down
            # waits for the latency, as always.
            rec = current
            reason = "LatencyNotCapacity"
            message = (f"{lat_name} at {lat:.0%} of its objective, no better than the {guard_ratio:.0%} at which the "
                       f"guardrail last added replicas: not adding more (is something other than capacity slow?)")
            if undercount_at is not None:
                # what the guardrail took for a sizing short of replicas was not: once the latency is back, the
                # count returns to what the sizing gives, rather than keeping the added replicas for the memory
                undercount, undercount_at = 1.0, None
                message += "; the sizing's correction is dropped"
        elif seen:
            guard_ratio = lat
            rec = current + max(1, math.ceil(current * s.guard_step_percent / 100))
            reason = "LatencyAboveTarget"
            message = f"{lat_name} at {lat:.0%} of its objective with no replica warming: adding capacity"
            if sized > 0:
                # `current` replicas were shown too few for this demand, whatever the sizing said: the count
                # is sized up by that until the memory lapses (not back into the breach after one window)
                undercount, undercount_at = max(undercount, (current + 1) / sized), now
                message += f"; the sizing gave {sized:.2f} replicas"
                if s.guard_memory_s:
                    message += f": sized × {undercount:.2f} for {s.guard_memory_s / 60:.0f} min"
                message += " (is the target or profile right for this replica?)"
        elif rec < current and lat > 1.0:
            rec = current
            reason = "LatencyGuard"
            message = (f"{signal} would allow {raw} replicas, but {lat_name} is at {lat:.0%} of its objective "
                       f"(scale-down needs ≤ 100 %)")
        elif rec < current and lat > s.sizing_latency_ratio:
            # Near the objective: go down, but keep one replica above what the demand asks (the latency is
            # not proportional to replicas; the last one before the knee is the one that matters).
            rec = min(current, rec + 1)
            if rec == current:
                reason = "LatencyGuard"
                message = (f"{signal} would allow {raw} replicas, but {lat_name} is at {lat:.0%} of its objective: "
                           f"keeping a spare replica (below {s.sizing_latency_ratio:.0%} it goes)")
            else:
                message += f"; {lat_name} at {lat:.0%} of its objective: keeping a spare replica"
    else:
        hot_since, guard_ratio = None, None
    recs = _trim(history.recommendations, now, s.history_s) + ((now, rec),)

    # 6. Stabilization windows.
    desired = rec
    able, able_reason = True, "ReadyForNewScale"
    if rec < current:
        down_window = s.scale_down.stabilization_s
        if season_s is not None:
            # With a recurring pattern the forecast, not the window, says whether the load comes back within
            # a cold start (the recommendation is the most the pattern needs over the horizon). A fixed window
            # would end at the same phase of every cycle: for a trough shorter than it, just as the load
            # returns (the resonance). What is left is one rate window, so a drop is measured, not a blip.
            down_window = min(down_window, RATE_WINDOW_S)
        elif _falling(metrics, s):
            # A decline measured over the whole trend window, beyond the tolerance and the counting noise,
            # is not a blip that comes back: holding the highest recommendation of a long window would
            # keep the replicas the load had minutes ago. One rate window, as with a pattern.
            down_window = min(down_window, RATE_WINDOW_S)
        window = [r for t, r in recs if now - t <= down_window]
        desired = min(current, max(window))
        if now - recs[0][0] < down_window:
            desired = current  # the window is not observed yet (a first start without history): no scale-down
        if desired > rec:
            able, able_reason = False, "ScaleDownStabilized"
            message += f"; held at {desired} by the {down_window:.0f} s scale-down window"
    elif rec > current:
        up_window = s.scale_up.stabilization_s
        if burst_at == now:
            up_window = 0.0  # a burst is acted on at once, whatever the window
        window = [r for t, r in recs if now - t <= up_window]
        desired = max(current, min(window))
        if desired < rec:
            able, able_reason = False, "ScaleUpStabilized"
            message += f"; held at {desired} by the {s.scale_up.stabilization_s:.0f} s scale-up window"

    # 7. Rate limits, then bounds.
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
    if desired != current:
        hot_since = None  # the capacity changes: the latency has to be re-observed
    hist = History(recommendations=recs, failures=0, hot_since=hot_since, burst_at=burst_at,
                   scale_events=events + (((now, desired - current),) if desired != current else ()),
                   last_ok=now, last_demand=metrics.arrival_qps,
                   # a slope with a step's jump in it is not a trend to follow blind
                   last_slope=None if burst_at is not None and now - burst_at < TREND_WINDOW_S else metrics.qps_slope,
                   last_audio_s=metrics.audio_s or history.last_audio_s, season_s=season_s,
                   season_checked=season_checked, forecast=predicted,
                   forecast_step_s=metrics.history_step_s, undercount=undercount, undercount_at=undercount_at,
                   guard_ratio=guard_ratio)
    details = {"needed": float(needed)}
    if demand is not None:
        details["demand_qps"] = float(demand)
    if season_s is not None:
        details["season_s"] = float(season_s)
    if lat is not None:
        details["latency_ratio"] = float(lat)
    return Decision(desired, reason, message, True, able, able_reason, limited, limited_reason, hist,
                    recommendation=raw, details=details)
