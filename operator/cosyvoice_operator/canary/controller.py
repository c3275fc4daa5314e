"""One evaluation of one CosyVoiceService's canary: read both versions' figures, apply the analysis'
verdict, write ``status.canary``.

No kopf here (handlers.py schedules it, like the autoscaler). The weight the analysis reached lives in
``status.canary`` (keyed by the canary's version), and the reconciler renders it: this module never
touches the Deployments or the HTTPRoute itself. A promotion is the patch a person would apply by hand
(the canary's fields into the spec, ``spec.canary`` removed); promotions and aborts are Kubernetes events.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .. import admin, kube, render
from ..autoscaling import prometheus
from ..autoscaling.controller import patch_status_section, post_event
from ..spec import Autoscaling, CosyVoiceServiceSpec, InvalidSpec, parse_spec
from ..status import now_iso
from . import metrics
from .analysis import Figures, State, Verdict, decide
from .traffic import ABORTED, CANARY, effective_weight

Obj = dict[str, Any]
# Seconds between readings of the figures when no analysis sets the interval.
FIGURES_SECONDS = 30.0
log = logging.getLogger(__name__)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(float(value), digits)


def figures_status(version: str, deployment: Obj | None, figures: Figures) -> Obj:
    dep = (deployment or {}).get("status") or {}
    out = {"version": version, "replicas": int(dep.get("replicas") or 0),
           "readyReplicas": int(dep.get("readyReplicas") or 0), "requestRate": _round(figures.rate),
           "requests": _round(figures.requests, 1), "p95LatencyMs": _round(figures.p95_ms, 1),
           "timeToFirstAudioMs": _round(figures.ttfa_ms, 1), "errorRate": _round(figures.error_rate, 4)}
    return {k: v for k, v in out.items() if v is not None}


class CanaryController:
    def __init__(self, client: kube.Kube, policy: admin.AdminPolicy | None = None,
                 connect: Callable[..., prometheus.Query] = prometheus.connect,
                 applied: Callable[[str, str], None] | None = None) -> None:
        self.kube = client
        self.policy = policy or admin.AdminPolicy()
        self.connect = connect
        self.applied = applied or (lambda namespace, name: None)  # the reconciler renders the new weight

    @staticmethod
    def interval(cr: Obj) -> float | None:
        """Seconds between evaluations, or None when ``cr`` has no canary."""
        canary = (cr.get("spec") or {}).get("canary")
        if not canary:
            return None
        return float((canary.get("analysis") or {}).get("intervalSeconds") or FIGURES_SECONDS)

    def evaluate(self, namespace: str, name: str) -> float | None:
        """One evaluation; the seconds until the next one, None when there is no canary (any more)."""
        cr = self.kube.get(kube.COSYVOICESERVICES, namespace, name)
        if cr is None or (cr.get("metadata") or {}).get("deletionTimestamp"):
            return None
        try:
            spec = parse_spec(cr.get("spec"))
        except InvalidSpec:
            return FIGURES_SECONDS  # the reconciler reports it; a fixed spec resumes here
        canary_spec = spec.canary_spec()
        if spec.canary is None or canary_spec is None:
            return None
        rules, version = spec.canary.analysis, canary_spec.version
        interval = float(rules.interval_seconds) if rules else FIGURES_SECONDS
        previous: Obj = (cr.get("status") or {}).get("canary") or {}
        same = previous.get("version") == version
        weight = effective_weight(spec.canary, version, previous)
        stable_fig, canary_fig, problem = self._read(namespace, name, spec, version, interval)
        deps = {track: self.kube.get(kube.DEPLOYMENTS, namespace, render.child_name(render.Owner(name, namespace),
                                                                                     track)) for track in ("stable", CANARY)}
        body: Obj = {"version": version, "stableVersion": spec.version, "weight": weight,
                     "stable": figures_status(spec.version, deps["stable"], stable_fig),
                     "canary": figures_status(version, deps[CANARY], canary_fig)}
        if same and previous.get("phase") == ABORTED:
            body.update(phase=ABORTED, reason=ABORTED, message=previous.get("message") or "aborted")
        elif rules is None:
            body.update(phase="Progressing", reason=problem[0] if problem else "WeightSet",
                        message=problem[1] if problem else f"{weight}% of the traffic to {version} (set by "
                        "spec.canary.weight; no analysis)", failedChecks=0)
        else:
            state = State(weight, int(previous.get("failedChecks") or 0) if same else 0)
            verdict = decide(state, stable_fig, canary_fig, rules)
            if problem and verdict.reason == "MetricsUnavailable":
                verdict = Verdict("hold", weight, state.failed_checks, problem[0], f"{problem[1]}; weight held at "
                                  f"{weight}%")
            body.update(phase=verdict.phase, reason=verdict.reason, message=verdict.message,
                        weight=verdict.weight, failedChecks=verdict.failed_checks, lastAnalysisTime=now_iso())
            if not self._act(cr, spec, verdict):
                return interval
        self._write(namespace, name, body, previous)
        self.applied(namespace, name)
        return interval

    def _act(self, cr: Obj, spec: CosyVoiceServiceSpec, verdict: Verdict) -> bool:
        """Events for the verdicts a person must hear of; a promotion patches the spec. False: the CR is gone."""
        meta = cr.get("metadata") or {}
        if verdict.action == "abort":
            post_event(self.kube, cr, "Warning", "CanaryAborted", verdict.message)
        elif verdict.action == "step":
            post_event(self.kube, cr, "Normal", "CanaryWeight", verdict.message)
        elif verdict.action == "promote":
            try:
                self.kube.patch(kube.COSYVOICESERVICES, meta.get("namespace") or "", meta["name"],
                                {"spec": spec.promotion(cr.get("spec") or {})})
            except kube.NotFound:
                return False
            post_event(self.kube, cr, "Normal", "CanaryPromoted", verdict.message)
        return True

    def _read(self, namespace: str, name: str, spec: CosyVoiceServiceSpec, version: str,
              window: float) -> tuple[Figures, Figures, tuple[str, str] | None]:
        """Both versions' figures from the administrator's metrics source the spec selects (the rules of
        ``admin.resolve_source``, as for the autoscaler), or why there are none."""
        canary, auto = spec.canary, spec.autoscaling
        assert canary is not None
        selects = Autoscaling(metrics_source=canary.metrics_source or (auto.metrics_source if auto else None),
                              prometheus=None if canary.metrics_source or auto is None else auto.prometheus)
        found = admin.resolve_source(self.policy, namespace, selects)
        if isinstance(found, admin.SourceError):
            return Figures(), Figures(), (found.reason, found.message)
        source_name, src = found
        try:
            token = src.bearer_token_file.read_text().strip() if src.bearer_token_file else None
            query = self.connect(src.url, token=token, insecure_skip_verify=src.insecure_skip_verify,
                                 ca_file=str(src.ca_file) if src.ca_file else None)
            return (metrics.read(query, metrics.queries(namespace, name, spec.version, window)),
                    metrics.read(query, metrics.queries(namespace, name, version, window)), None)
        except OSError as exc:
            return Figures(), Figures(), ("MetricsUnavailable", f"metrics source {source_name!r}: cannot read its "
                                          f"bearer token: {exc}")
        except prometheus.QueryFailed as exc:
            return Figures(), Figures(), ("MetricsUnavailable", f"Prometheus query failed: {exc}")

    def _write(self, namespace: str, name: str, body: Obj, previous: Obj) -> None:
        # figures of a version no longer measured are dropped, not kept from an earlier reading
        body = {**body, **{key: {**{k: None for k in previous.get(key) or {} if k not in body[key]}, **body[key]}
                           for key in ("stable", "canary")}}
        patch_status_section(self.kube, namespace, name, "canary", body, previous)
