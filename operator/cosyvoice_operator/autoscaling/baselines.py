"""The anchors the policy is compared with, as the simulator runs them.

* ``HPA``: the Kubernetes HPA v2 replica calculation for a Pods metric (per-pod QPS of
  ``cosyvoice_requests_total``, e.g. through prometheus-adapter): ``ceil(current × metric/target)`` skipped within tolerance 0.1, pods without a
  metric (warming) counted as 0 on scale-up and 100 % of target on scale-down, a direction reversal
  by those rules means no change; default ``behavior``: scale-up 100 % or 4 pods per 15 s (Max),
  no stabilization; scale-down 100 % per 15 s after a 300 s stabilization (max of recommendations).
  No metric at all (the query fails or is empty) holds the replicas (``ScalingActive=False``).
* ``hpa-arrival``: the same HPA fed the policy's arrival-rate query (served rate + in-flight growth),
  so the comparison isolates the decision from the signal.
* ``KEDA`` (fed the arrival-rate query too): a ScaledObject with the Prometheus scaler: an External metric with an AverageValue target
  (``ceil(total/threshold)``, tolerance against ``status.replicas``), the same HPA behaviours,
  ``ignoreNullValues: true`` (an empty result reads as 0, keda#3064), ``fallback`` only on query
  errors, ``pollingInterval`` 30 s for activation, ``cooldownPeriod`` 300 s before scaling to 0.
* ``Oracle``: knows the load of the coming minute, sized from the capacity profile at the SLO, and its
  pods start instantly.
* ``ReactiveOracle`` (``reactive-bound``): sees the offered rate of the current second (no metric
  delay, no foresight; nothing while the metrics are missing) and pays the cold start: the bound on
  what any policy reacting to measured load can achieve.
* ``Static``: a pool sized for the trace's peak (from the capacity profile at the SLO).

Each has ``evaluate(now, obs) -> replicas`` and an ``interval`` (seconds between evaluations).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .policy import Decision, History, Metrics, Policy, Rules, Settings, decide, scale_limit

# HPA v2's default behaviours (the project's own defaults are in policy.py: scale-up to 200 % per 15 s,
# scale-down 50 % per 60 s; the baselines keep Kubernetes' defaults, as a cluster running them would).
HPA_SCALE_UP = Rules(0.0, (Policy("Pods", 4, 15.0), Policy("Percent", 100, 15.0)), "Max")
HPA_SCALE_DOWN = Rules(300.0, (Policy("Percent", 100, 15.0),), "Max")


@dataclass
class Observation:
    """What an autoscaler can see at one evaluation (metrics already delayed by the pipeline)."""
    current: int  # spec.replicas
    ready: int
    metrics: Metrics  # Metrics(error=...) when the query fails; qps None when the result is empty
    empty: bool = False  # the query succeeded but returned no series


class ProjectPolicy:
    name = "policy"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.interval = settings.interval_s
        self.lookback_s = settings.season_lookback_s  # the simulator provides this much rate history
        self.history = History()
        self.decisions: list[tuple[float, Decision]] = []

    def evaluate(self, now: float, obs: Observation) -> int:
        d = decide(now, obs.metrics, current=obs.current, ready=obs.ready, policy=self.settings,
                   history=self.history)
        self.history = d.history
        self.decisions.append((now, d))
        return d.desired


def _stabilize_and_limit(rec: int, current: int, now: float, recs: list[tuple[float, int]],
                         events: list[tuple[float, int]], up: Rules, down: Rules) -> int:
    """HPA's normalizeDesiredReplicasWithBehaviors: stabilization windows, then rate limits."""
    recs.append((now, rec))
    cutoff = max(up.stabilization_s, down.stabilization_s, 60.0) + 60
    recs[:] = [r for r in recs if now - r[0] <= cutoff]
    up_rec = min(r for t, r in recs if now - t <= up.stabilization_s) if up.stabilization_s else rec
    down_rec = max(r for t, r in recs if now - t <= down.stabilization_s) if down.stabilization_s else rec
    desired = current
    if rec > current:
        desired = max(current, min(rec, up_rec))
        limit = scale_limit(up, current, events, now, up=True)
        if limit is not None:
            desired = min(desired, max(current, limit))
    elif rec < current:
        desired = min(current, max(rec, down_rec))
        limit = scale_limit(down, current, events, now, up=False)
        if limit is not None:
            desired = max(desired, min(current, limit))
    return desired


@dataclass
class HPA:
    target_qps_per_replica: float
    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    interval: float = 15.0
    arrival: bool = False  # fed the arrival rate (served + in-flight growth) instead of the served rate
    up: Rules = HPA_SCALE_UP
    down: Rules = HPA_SCALE_DOWN
    name: str = "hpa"
    recs: list[tuple[float, int]] = field(default_factory=list)
    events: list[tuple[float, int]] = field(default_factory=list)

    def value(self, m: Metrics) -> float | None:
        return m.arrival_qps if self.arrival else m.qps

    def recommendation(self, obs: Observation) -> int | None:
        m = obs.metrics
        qps = self.value(m)
        if m.error or qps is None or obs.ready == 0:
            return None  # FailedGetPodsMetric: ScalingActive=False, hold
        current, ready = obs.current, obs.ready
        missing = max(0, current - ready)
        target = self.target_qps_per_replica
        ratio = (qps / ready) / target
        if missing == 0:
            return current if abs(ratio - 1) <= self.tolerance else math.ceil(ratio * ready - 1e-9)
        if abs(ratio - 1) <= self.tolerance:
            return current
        if ratio > 1:  # missing pods count as 0 on scale-up
            new = qps / ((ready + missing) * target)
        else:  # and as 100 % of the target on scale-down
            new = (qps + missing * target) / ((ready + missing) * target)
        if abs(new - 1) <= self.tolerance or (new > 1) != (ratio > 1):
            return current
        return math.ceil(new * (ready + missing) - 1e-9)

    def evaluate(self, now: float, obs: Observation) -> int:
        rec = self.recommendation(obs)
        if rec is None:
            return obs.current
        desired = _stabilize_and_limit(rec, obs.current, now, self.recs, self.events, self.up, self.down)
        desired = min(self.max_replicas, max(self.min_replicas, desired))
        if desired != obs.current:
            self.events.append((now, desired - obs.current))
            self.events[:] = [e for e in self.events if now - e[0] <= 1800]
        return desired


@dataclass
class KEDA(HPA):
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    ignore_null_values: bool = True
    fallback_replicas: int | None = None
    failure_threshold: int = 3
    name: str = "keda"
    _failures: int = 0

    def recommendation(self, obs: Observation) -> int | None:
        m = obs.metrics
        if m.error:
            self._failures += 1
            if self.fallback_replicas is not None and self._failures >= self.failure_threshold:
                return self.fallback_replicas
            return None
        self._failures = 0
        value = self.value(m)
        if value is None:  # empty result
            if not self.ignore_null_values:
                return None
            value = 0.0
        current = max(obs.current, 1)
        ratio = value / (self.target_qps_per_replica * current)
        if abs(ratio - 1) <= self.tolerance:
            return obs.current
        return max(0, math.ceil(value / self.target_qps_per_replica - 1e-9))


@dataclass
class Oracle:
    """Replicas for the load of the coming minute, ready at once (cold start 0 in the simulator)."""
    need: list[float]  # replicas the load needs, per second of the trace
    min_replicas: int
    max_replicas: int
    interval: float = 15.0
    name: str = "oracle"
    instant: bool = True
    offset: float = 0.0  # trace time = simulator time - offset (the simulator's warm-up)

    def evaluate(self, now: float, obs: Observation) -> int:
        t = max(0, int(now - self.offset))
        window = self.need[t: t + getattr(self, "lookahead_s", 75)] or [self.need[-1]]
        need = math.ceil(max(window) - 1e-9)
        return min(self.max_replicas, max(self.min_replicas, need))


@dataclass
class ReactiveOracle(Oracle):
    """The best a reactive policy can know: the offered rate of this very second, without the metric
    pipeline's delay, but no foresight, and its pods pay the cold start like everyone's; while the metrics
    are missing it sees nothing either, and holds. Sized at the target like the oracle. Not a policy one
    can run: a bound on what reacting to measured load can achieve."""
    name: str = "reactive-bound"
    instant: bool = False
    lookahead_s: int = 1

    def evaluate(self, now: float, obs: Observation) -> int:
        if obs.empty or obs.metrics.error:
            return obs.current
        return super().evaluate(now, obs)


@dataclass
class Static:
    replicas: int
    interval: float = 60.0
    name: str = "static"

    def evaluate(self, now: float, obs: Observation) -> int:
        return self.replicas
