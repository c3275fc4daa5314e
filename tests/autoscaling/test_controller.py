"""One evaluation of the controller against a recorded API (no cluster, no Prometheus): what it reads,
what it writes, and where."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cosyvoice_operator import admin
from cosyvoice_operator import kube
from cosyvoice_operator.autoscaling.controller import Autoscaler
from cosyvoice_operator.autoscaling.prometheus import QueryFailed, build_queries

Obj = dict[str, Any]


class FakeKube:
    def __init__(self, objects: dict[tuple[str, str], Obj]) -> None:
        self.objects = objects
        self.patches: list[tuple[str, str | None, Obj]] = []
        self.created: list[Obj] = []

    def get(self, res: kube.Resource, namespace: str | None, name: str) -> Obj | None:
        return self.objects.get((res.plural, name))

    def patch(self, res: kube.Resource, namespace: str | None, name: str, patch: Obj,
              subresource: str | None = None) -> Obj:
        self.patches.append((res.plural, subresource, patch))
        return {}

    def create(self, res: kube.Resource, body: Obj) -> Obj:
        self.created.append(body)
        return body


def service(**auto: Any) -> Obj:
    return {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": "tts", "namespace": "speech", "uid": "u1"},
            "spec": {"replicas": 2, "autoscaling": {"enabled": True, "maxReplicas": 8, "targetQPSPerReplica": 5,
                                                    "metricsSource": "main", **auto}}}


def policy(tmp_path: Path) -> admin.AdminPolicy:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return admin.AdminPolicy.model_validate({"metricsSources": {"main": {
        "url": "https://prom:9090", "bearerTokenFile": str(token)}}})


def vec(value: float) -> list[Obj]:
    return [{"metric": {}, "value": [0, str(value)]}]


def test_scales_through_the_scale_subresource_with_the_sources_token(tmp_path: Path) -> None:
    api = FakeKube({("cosyvoiceservices", "tts"): service(),
                    ("deployments", "tts"): {"status": {"readyReplicas": 2}}})
    seen: dict[str, Any] = {}
    queries = build_queries("speech", "tts")

    def connect(url: str, **kw: Any) -> Any:
        seen.update(kw, url=url)
        return lambda q: vec(30.0) if q == queries["qps"] else vec(1.0) if q == queries["targets_up"] else []

    decision = Autoscaler(api, connect=connect, clock=lambda: 100.0,  # type: ignore[arg-type]
                          policy=policy(tmp_path)).evaluate("speech", "tts")
    assert seen["url"] == "https://prom:9090" and seen["token"] == "s3cret"
    assert decision is not None and decision.desired == 6
    assert ("cosyvoiceservices", "scale", {"spec": {"replicas": 6}}) in api.patches
    (status,) = [p for r, sub, p in api.patches if sub == "status"]
    auto = status["status"]["autoscaling"]
    assert auto["currentQPS"] == 30.0 and auto["desiredReplicas"] == 6 and auto["lastScaleReason"] == "ScaleUp"
    assert {c["type"]: c["status"] for c in auto["conditions"]} == \
        {"AbleToScale": "True", "ScalingActive": "True", "ScalingLimited": "False"}
    (event,) = api.created
    assert event["reason"] == "SuccessfulRescale" and event["involvedObject"]["uid"] == "u1"
    assert event["message"].startswith("New size: 6; reason: ScaleUp")


def test_no_metrics_source_holds_and_says_so(tmp_path: Path) -> None:
    """autoscaling.enabled without a source the administrator defined: replicas held, a condition and an
    event that say what to set, and no query anywhere."""
    api = FakeKube({("cosyvoiceservices", "tts"): service(metricsSource=None)})
    connected: list[Any] = []
    decision = Autoscaler(api, connect=lambda *a, **k: connected.append(a),  # type: ignore[arg-type]
                          policy=policy(tmp_path)).evaluate("speech", "tts")
    assert decision is not None and decision.desired == 2 and connected == []
    assert not [p for r, sub, p in api.patches if sub == "scale"]
    (status,) = [p for r, sub, p in api.patches if sub == "status"]
    active = {c["type"]: c for c in status["status"]["autoscaling"]["conditions"]}["ScalingActive"]
    assert active["status"] == "False" and active["reason"] == "NoMetricsSource"
    assert "set spec.autoscaling.metricsSource to one of: main" in active["message"]
    assert [e["reason"] for e in api.created] == ["NoMetricsSource"]


def test_a_services_own_promql_runs_only_where_the_administrator_allows_it(tmp_path: Path) -> None:
    """spec.autoscaling.queries is text the CR author writes, run with the source's credentials: without the
    source's allowQueryOverrides nothing is queried (another namespace's series, kube-state-metrics' view of
    Secrets) and the replicas hold, with a condition that says why and what to do."""
    stolen = 'sum(rate(cosyvoice_requests_total{namespace="tenant-b"}[2m]))'
    api = FakeKube({("cosyvoiceservices", "tts"): service(queries={"qps": stolen})})
    sent: list[str] = []

    def connect(url: str, **kw: Any) -> Any:
        return lambda q: sent.append(q) or (vec(30.0) if q == stolen else vec(1.0))

    decision = Autoscaler(api, connect=connect, policy=policy(tmp_path)).evaluate("speech", "tts")  # type: ignore[arg-type]
    assert decision is not None and decision.desired == 2 and sent == []
    (status,) = [p for r, sub, p in api.patches if sub == "status"]
    assert "currentQPS" not in status["status"]["autoscaling"]
    active = {c["type"]: c for c in status["status"]["autoscaling"]["conditions"]}["ScalingActive"]
    assert (active["status"], active["reason"]) == ("False", "QueryOverrideNotAllowed")
    assert "spec.autoscaling.queries (qps)" in active["message"] and "allowQueryOverrides" in active["message"]

    allowed = admin.AdminPolicy.model_validate({"metricsSources": {"main": {
        **policy(tmp_path).metrics_sources["main"].model_dump(by_alias=True, mode="json"), "allowQueryOverrides": True}}})
    api = FakeKube({("cosyvoiceservices", "tts"): service(queries={"qps": stolen}),
                    ("deployments", "tts"): {"status": {"readyReplicas": 2}}})
    decision = Autoscaler(api, connect=connect, clock=lambda: 100.0, policy=allowed).evaluate("speech", "tts")  # type: ignore[arg-type]
    assert stolen in sent and decision is not None and decision.desired == 6


def test_failing_prometheus_holds_and_reports(tmp_path: Path) -> None:
    def down(q: str) -> Any:
        raise QueryFailed("ConnectionError: refused")
    api2 = FakeKube({("cosyvoiceservices", "tts"): service()})
    decision = Autoscaler(api2, connect=lambda *a, **k: down,  # type: ignore[arg-type]
                          policy=policy(tmp_path)).evaluate("speech", "tts")
    assert decision is not None and decision.desired == 2
    assert "Prometheus query failed: ConnectionError: refused" in decision.message


def test_disabled_or_gone_services_are_left_alone() -> None:
    api = FakeKube({("cosyvoiceservices", "tts"): service(enabled=False)})
    assert Autoscaler(api).evaluate("speech", "tts") is None  # type: ignore[arg-type]
    assert Autoscaler(FakeKube({})).evaluate("speech", "tts") is None  # type: ignore[arg-type]
    assert api.patches == [] and api.created == []


def test_the_decision_history_goes_to_the_status_and_is_resumed_from_it(tmp_path: Path) -> None:
    """A new Autoscaler (a restarted operator, another leader) decides from status.autoscaling.history:
    a peak recommended 100 s ago holds the 300 s scale-down window; the same service without it holds too
    (a window not yet observed), but the resumed one scales down once the original window ends."""
    from cosyvoice_operator.autoscaling import state
    from cosyvoice_operator.autoscaling.policy import History

    queries = build_queries("speech", "tts")

    def connect(url: str, **kw: Any) -> Any:
        return lambda q: vec(10.0) if q == queries["qps"] else vec(1.0) if q == queries["targets_up"] else []

    def evaluate(now: float, history: History | None) -> Any:
        cr = service()
        cr["spec"]["replicas"] = 6
        if history is not None:
            cr["status"] = {"autoscaling": {"history": state.dump(history)}}
        api = FakeKube({("cosyvoiceservices", "tts"): cr, ("deployments", "tts"): {"status": {"readyReplicas": 6}}})
        scaler = Autoscaler(api, connect=connect, clock=lambda: now, policy=policy(tmp_path))  # type: ignore[arg-type]
        return api, scaler.evaluate("speech", "tts")

    t0 = 1_800_000_000.0
    peak = History(recommendations=tuple((t0 - 400 + 15 * k, 6) for k in range(21)))  # 6 until t0 - 100
    api, held = evaluate(t0, peak)
    assert held.desired == 6 and held.able_reason == "ScaleDownStabilized"  # 10 req/s needs 2
    (status,) = [p for r, sub, p in api.patches if sub == "status"]
    saved = state.load(status["status"]["autoscaling"]["history"])
    assert saved is not None and saved.recommendations[-1] == (t0, 2) and saved.last_demand == 10.0
    _, resumed = evaluate(t0 + 201, saved)  # 300 s after the last 6: the window has passed
    assert resumed.desired == 3  # 50 % per 60 s from 6
    _, fresh = evaluate(t0 + 201, None)  # the same moment with no history: a whole window to observe first
    assert fresh.desired == 6
    assert state.load({"recommendations": [{"time": "x"}]}) is None  # an unreadable history is ignored


def test_a_count_the_guardrail_finds_too_few_is_a_warning_that_names_the_target(tmp_path: Path) -> None:
    """targetQPSPerReplica 5 says 10 req/s need 2 replicas; the p95 has been twice the objective for a minute
    at 2: a third is added and a Warning event says the sizing was short, and for how long it is corrected."""
    from cosyvoice_operator.autoscaling import state
    from cosyvoice_operator.autoscaling.policy import History

    now = 1_800_000_000.0
    cr = service(targetP95LatencyMs=1000)
    cr["status"] = {"autoscaling": {"history": state.dump(History(hot_since=now - 60))}}
    api = FakeKube({("cosyvoiceservices", "tts"): cr, ("deployments", "tts"): {"status": {"readyReplicas": 2}}})
    queries = build_queries("speech", "tts")
    values = {queries["qps"]: 10.0, queries["targets_up"]: 1.0, queries["p95_ms"]: 2000.0, queries["inflight"]: 8.0}

    def connect(url: str, **kw: Any) -> Any:
        return lambda q: vec(values[q]) if q in values else []

    decision = Autoscaler(api, connect=connect, clock=lambda: now,  # type: ignore[arg-type]
                          policy=policy(tmp_path)).evaluate("speech", "tts")
    assert decision is not None and (decision.desired, decision.reason) == (3, "LatencyAboveTarget")
    (short,) = [e for e in api.created if e["reason"] == "SizingShort"]
    assert short["type"] == "Warning" and "the sizing gave 2.00 replicas: sized × 1.50 for 60 min" in short["message"]
    (status,) = [p for r, sub, p in api.patches if sub == "status"]
    assert status["status"]["autoscaling"]["history"]["undercount"] == 1.5


def test_a_breach_replicas_did_not_fix_is_one_warning_and_no_more_replicas(tmp_path: Path) -> None:
    """The guardrail added replicas at a p95 of twice the objective (persisted), and with them ready the p95
    is still twice it: no more replicas, and one Warning event for the breach, not one per evaluation."""
    from cosyvoice_operator.autoscaling import state
    from cosyvoice_operator.autoscaling.policy import History

    now = 1_800_000_000.0
    cr = service(targetP95LatencyMs=1000)
    cr["status"] = {"autoscaling": {"history": state.dump(History(hot_since=now - 60, guard_ratio=2.0))}}
    api = FakeKube({("cosyvoiceservices", "tts"): cr, ("deployments", "tts"): {"status": {"readyReplicas": 2}}})
    queries = build_queries("speech", "tts")
    values = {queries["qps"]: 10.0, queries["targets_up"]: 1.0, queries["p95_ms"]: 2000.0, queries["inflight"]: 8.0}

    def connect(url: str, **kw: Any) -> Any:
        return lambda q: vec(values[q]) if q in values else []

    scaler = Autoscaler(api, connect=connect, clock=lambda: now, policy=policy(tmp_path))  # type: ignore[arg-type]
    for _ in range(2):
        decision = scaler.evaluate("speech", "tts")
        assert decision is not None and (decision.desired, decision.reason) == (2, "LatencyNotCapacity")
    (warning,) = [e for e in api.created if e["reason"] == "LatencyNotCapacity"]
    assert warning["type"] == "Warning" and "no better than the 200% at which the guardrail last" in warning["message"]
    assert not [p for r, sub, p in api.patches if sub == "scale"]
