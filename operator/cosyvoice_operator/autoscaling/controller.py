"""One autoscaling evaluation of one CosyVoiceService: gather inputs, ``decide``, write the result.

No kopf here (handlers.py schedules it). The result goes where `kubectl scale` would put it: the
CR's scale subresource (``spec.replicas``), so ``kubectl get cvs`` shows it and the reconciler rolls
it out; with ``autoscaling.enabled: false`` nothing is written and an external HPA/KEDA can own the
scale subresource instead. Measurements, the decision and HPA-like conditions go to
``status.autoscaling``; each scale gets an event (``SuccessfulRescale``), and a change of
``ScalingActive`` gets one too (``FailedGetMetrics`` / ``MetricsAvailable``).

The decision history (windows, rate-limit periods, outage state) is read from and written to
``status.autoscaling.history`` at every evaluation (``state.py``): the status, not this process's
memory, is the source of truth, so a restart or a leader change resumes where the last writer was.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import admin, apply, kube
from ..spec import InvalidSpec, parse_spec
from ..status import now_iso
from . import prometheus
from . import state as persisted
from . import profile as profiles
from .policy import Decision, History, Metrics, Settings, decide

Obj = dict[str, Any]
Recorder = Callable[[Obj, str, str, str], None]
QueryFactory = Callable[..., prometheus.Query]
EVENTS = kube.Resource("v1", "Event", "events")
DEPLOYMENTS = kube.DEPLOYMENTS
log = logging.getLogger(__name__)


@dataclass
class _State:
    uid: str | None
    history: History = field(default_factory=History)
    last: Decision | None = None
    interval: float = 15.0


def patch_status_section(client: kube.Kube, namespace: str, name: str, section: str, body: Obj, previous: Obj) -> None:
    """Writes ``status.<section>`` through the status subresource unless it already says ``body``: a key set
    to None is cleared only when ``previous`` has it. A CosyVoiceService deleted meanwhile is no error."""
    merged = {k: v for k, v in body.items() if v is not None or k in previous}
    if apply.contains(previous, merged):
        return
    try:
        client.patch(kube.COSYVOICESERVICES, namespace, name, {"status": {section: merged}}, subresource="status")
    except kube.NotFound:
        pass


def post_event(client: kube.Kube, cr: Obj, type_: str, reason: str, message: str) -> None:
    """A core/v1 Event on the CosyVoiceService, written directly: the autoscale loop runs outside any kopf
    handler, where ``kopf.event`` has no queue to post to."""
    meta = cr.get("metadata") or {}
    stamp = now_iso()
    try:
        client.create(EVENTS, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
            "involvedObject": {"apiVersion": cr.get("apiVersion"), "kind": cr.get("kind"), "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1000],
            "source": {"component": "cosyvoice-operator"}, "reportingComponent": "cosyvoice-operator",
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})
    except kube.ApiError as exc:  # an event is worth a log line, never a failed evaluation
        log.warning("could not post event %s on %s: %s", reason, meta.get("name"), exc)


def _condition(type_: str, ok: bool, reason: str, message: str, previous: list[Obj], stamp: str) -> Obj:
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    return {"type": type_, "status": status, "reason": reason, "message": message[:1000],
            "lastTransitionTime": since or stamp}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


class Autoscaler:
    def __init__(self, client: kube.Kube, record: Recorder | None = None, connect: QueryFactory = prometheus.connect,
                 clock: Callable[[], float] = time.time, policy: admin.AdminPolicy | None = None) -> None:
        self.kube = client
        self.policy = policy or admin.AdminPolicy()
        self.record: Recorder = record or (lambda cr, t, r, m: post_event(client, cr, t, r, m))
        self.connect = connect
        self.clock = clock
        self._states: dict[tuple[str, str], _State] = {}
        self._lock = threading.Lock()

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._states.pop((namespace, name), None)

    def interval(self, cr: Obj) -> float | None:
        """Seconds between evaluations, or None when the built-in autoscaler is off for ``cr``."""
        auto = (cr.get("spec") or {}).get("autoscaling") or {}
        if not auto.get("enabled"):
            return None
        return float(auto.get("intervalSeconds") or 15)

    def interval_of(self, namespace: str, name: str) -> float | None:
        """The evaluation period of a service last evaluated (None: not autoscaled)."""
        with self._lock:
            state = self._states.get((namespace, name))
        return state.interval if state else None

    def evaluate(self, namespace: str, name: str) -> Decision | None:
        """One evaluation; None when the service is gone, invalid, or not autoscaled."""
        cr = self.kube.get(kube.COSYVOICESERVICES, namespace, name)
        if cr is None or (cr.get("metadata") or {}).get("deletionTimestamp"):
            self.forget(namespace, name)
            return None
        try:
            spec = parse_spec(cr.get("spec"))
        except InvalidSpec:
            return None  # the reconciler reports it
        auto = spec.autoscaling
        if auto is None or not auto.enabled:
            self.forget(namespace, name)
            return None
        uid = (cr.get("metadata") or {}).get("uid")
        with self._lock:
            state = self._states.get((namespace, name))
            if state is None or state.uid != uid:
                state = self._states[(namespace, name)] = _State(uid)
        state.interval = float(auto.interval_seconds)

        prof = profiles.load(auto.capacity_profile, batching=spec.batching) if auto.capacity_profile else None
        settings = Settings.from_spec(auto, prof)
        queries = prometheus.build_queries(namespace, name, auto.queries)
        now = self.clock()
        reading = self._read(namespace, auto, queries, now)
        # spec.replicas is both versions' total while a canary runs (the reconciler splits it by the weight)
        names = (name, f"{name}-canary") if spec.canary is not None else (name,)
        ready = sum(int(((self.kube.get(DEPLOYMENTS, namespace, n) or {}).get("status") or {}).get("readyReplicas")
                        or 0) for n in names)
        current = spec.replicas
        previous_auto: Obj = (cr.get("status") or {}).get("autoscaling") or {}
        # the status is the shared record (another replica of the operator may have decided last)
        history = persisted.load(previous_auto.get("history")) or state.history
        decision = decide(now, reading.metrics, current=current, ready=min(ready, current),
                          policy=settings, history=history)
        stamp = now_iso()
        if decision.desired != current:
            self.kube.patch(kube.COSYVOICESERVICES, namespace, name, {"spec": {"replicas": decision.desired}},
                            subresource="scale")
            self.record(cr, "Normal", "SuccessfulRescale",
                        f"New size: {decision.desired}; reason: {decision.reason}: {decision.message}")
        if decision.history.undercount_at == now:
            # the guardrail found the sizing's count too few: the target or profile does not fit this replica
            self.record(cr, "Warning", "SizingShort", decision.message)
        if decision.reason == "LatencyNotCapacity" and (state.last is None or state.last.reason != decision.reason):
            # replicas did not fix the breach: something the autoscaler cannot scale is slow (once per breach)
            self.record(cr, "Warning", "LatencyNotCapacity", decision.message)
        state.history = decision.history  # only once the scale is written: a failed patch is retried afresh
        self._write_status(cr, namespace, name, decision, reading, previous_auto, stamp, current)
        state.last = decision
        return decision

    def _read(self, namespace: str, auto: Any, queries: dict[str, str], now: float) -> prometheus.Reading:
        found = admin.resolve_source(self.policy, namespace, auto)
        if isinstance(found, admin.SourceError):
            return prometheus.Reading(Metrics(error=found.message), queries, reason=found.reason)
        name, src = found
        try:
            token = src.bearer_token_file.read_text().strip() if src.bearer_token_file else None
        except OSError as exc:  # a mounted Secret the administrator named is missing: say so, never crash
            return prometheus.Reading(Metrics(error=f"metrics source {name!r}: cannot read its bearer token: {exc}"),
                                      queries)
        query = self.connect(src.url, token=token, insecure_skip_verify=src.insecure_skip_verify,
                             ca_file=str(src.ca_file) if src.ca_file else None)
        return prometheus.read(query, queries, lookback_s=float(auto.forecast.lookback_seconds), now=now)

    def _write_status(self, cr: Obj, namespace: str, name: str, d: Decision, reading: prometheus.Reading,
                      previous: Obj, stamp: str, current: int) -> None:
        m = reading.metrics
        old_conditions = previous.get("conditions") or []
        active_reason = "ValidMetricFound" if d.metrics_ok else reading.reason or "MetricsUnavailable"
        active_message = ("the proportional signal was read from Prometheus" if d.metrics_ok
                          else f"{m.error or d.message}; replicas are held" +
                          (" (fallback applies after repeated failures)" if d.reason == "FallbackReplicas" else ""))
        conditions = [
            _condition("AbleToScale", d.able_to_scale, d.able_reason, d.message, old_conditions, stamp),
            _condition("ScalingActive", d.metrics_ok, active_reason, active_message, old_conditions, stamp),
            _condition("ScalingLimited", d.limited, d.limited_reason or "DesiredWithinRange",
                       d.message if d.limited else "the desired count is within minReplicas..maxReplicas",
                       old_conditions, stamp),
        ]
        was_active = next((c.get("status") for c in old_conditions if c.get("type") == "ScalingActive"), None)
        was_reason = next((c.get("reason") for c in old_conditions if c.get("type") == "ScalingActive"), None)
        if not d.metrics_ok and (was_active != "False" or (reading.reason and was_reason != reading.reason)):
            self.record(cr, "Warning", reading.reason or "FailedGetMetrics", active_message)
        elif was_active == "False" and d.metrics_ok:
            self.record(cr, "Normal", "MetricsAvailable", "metrics are available again; autoscaling resumed")
        body: Obj = {
            "currentQPS": _round(m.qps), "currentP95LatencyMs": _round(m.p95_ms, 1),
            "currentTimeToFirstAudioMs": _round(m.ttfa_p95_ms, 1), "currentInflight": _round(m.inflight),
            "desiredReplicas": d.desired, "reason": d.reason, "message": d.message[:1000],
            "consecutiveFailures": d.history.failures, "conditions": conditions,
            "history": persisted.dump(d.history),
        }
        if d.desired != current:
            body["lastScaleTime"] = stamp
            body["lastScaleReason"] = d.reason
        patch_status_section(self.kube, namespace, name, "autoscaling", body, previous)
