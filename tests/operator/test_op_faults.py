"""The operator's fault matrix on kmock: the real operator against an API server that fails the way real
ones do (watch 410 Gone and ERROR events, 500s, timeouts, conflicting writes), and CosyVoiceServices
written by someone trying to make the operator leak what they may not read.

What is asserted is what a user or an attacker would observe: objects in the cluster, status
conditions and events, and the requests that reached an outside listener.
"""
from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import pytest
from cosyvoice_operator import admin
from cosyvoice_operator.constants import OPT_IN_LABEL
from cosyvoice_operator.kube import Kube
from cvs_testkit import CVS_PATH, Emulator, eventually, run_operator
from test_op_kmock import DEPLOYMENTS, NS, condition, create, cvs, events, live, patch, requests, status_of

pytestmark = [pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

Obj = dict[str, Any]
Rule = Callable[[Any], bool]
CVS_URL = CVS_PATH.format(ns=NS)
DEP_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments"


def status(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code,
            "message": message}


class Faulty(Emulator):
    """The emulated API server with scripted faults: each (rule, answer, times) answers the first
    ``times`` matching requests in place of the server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults: list[list[Any]] = []

    def fail(self, rule: Rule, answer: Callable[[], Any], times: int = 1) -> None:
        self.faults.append([rule, answer, times])

    async def _handle(self, request: Any) -> Any:
        for fault in self.faults:
            rule, answer, times = fault
            if times > 0 and rule(request):
                fault[2] -= 1
                result = answer()
                return await result if asyncio.iscoroutine(result) else result
        return await super()._handle(request)


def is_(method: str, path: str, watch: bool | None = None) -> Rule:
    def rule(request: Any) -> bool:
        if not str(request.method).upper().endswith(method) or not request.url.path.startswith(path):
            return False
        return watch is None or (request.url.query.get("watch") == "true") == watch
    return rule


def watch_answer(kind: str) -> Callable[[], Any]:
    """How an API server ends a watch: HTTP 410 on the request itself, or an ERROR event in the stream."""
    if kind == "http-410":
        return lambda: aiohttp.web.json_response(status(410, "Expired", "too old resource version: 1 (2001)"),
                                                 status=410)
    code = 410 if kind == "event-410" else 500
    event = {"type": "ERROR", "object": status(code, "Expired" if code == 410 else "InternalError", "watch failed")}
    return lambda: aiohttp.web.Response(text=json.dumps(event) + "\n", content_type="application/json")


def secret(name: str, opted_in: bool, value: bytes = b"hunter2") -> Obj:
    labels = {OPT_IN_LABEL: "true"} if opted_in else {}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": NS, "uid": f"s-{name}", "resourceVersion": "1", "labels": labels},
            "data": {"token": base64.b64encode(value).decode(), "api-key": base64.b64encode(value).decode()}}


# --- the API server fails --------------------------------------------------------------------------

@pytest.mark.kmock(cls=Faulty)
@pytest.mark.parametrize("kind", ["http-410", "event-410", "event-500"])
async def test_a_failed_watch_is_listed_again_and_nothing_is_missed(cluster: Any, kind: str) -> None:
    """410 Gone (resource version too old) as an HTTP status or as an event, or another ERROR event, on
    the CosyVoiceService watch: the operator lists again and keeps serving instead of exiting."""
    cluster.fail(is_("GET", CVS_URL, watch=True), watch_answer(kind), times=2)
    async with run_operator():
        await eventually(lambda: cluster.faults[0][2] == 0)  # both failures were served
        await create(cluster, cvs())
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        lists = [r for r in requests(cluster, "GET", CVS_URL) if r.url.query.get("watch") != "true"]
        assert len(lists) >= 2  # listed again after the failure


@pytest.mark.kmock(cls=Faulty)
async def test_child_writes_failing_with_500_or_timing_out_are_retried_without_duplicates(cluster: Any) -> None:
    cluster.fail(is_("POST", DEP_PATH), lambda: aiohttp.web.json_response(
        status(500, "InternalError", "etcdserver: request timed out"), status=500), times=2)

    async def hang() -> Any:
        await asyncio.sleep(3)
        return aiohttp.web.json_response(status(504, "Timeout", "too late"), status=504)

    cluster.fail(is_("POST", f"/api/v1/namespaces/{NS}/services"), hang, times=1)
    client = Kube.from_environment()
    client.timeout = (2.0, 1.0)  # read timeout well under the server's delay
    async with run_operator(kube=client):
        await create(cluster, cvs())
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None, timeout=40)
        await eventually(lambda: condition(cluster, "Progressing")["reason"] == "Creating" or
                         status_of(cluster).get("observedGeneration") == 1, timeout=20)
    created = [r for r in requests(cluster, "POST", DEP_PATH)]
    assert len(created) == 3  # two 500s, then one create: no duplicate
    assert len([k for k in cluster.objects if k[0] == kmock.resource(DEPLOYMENTS)
                and not cluster.objects[k].deleted]) == 1


@pytest.mark.kmock(cls=Faulty)
async def test_a_conflicting_write_is_retried(cluster: Any) -> None:
    """Someone else wrote the Deployment between the operator's read and its patch: 409, then a retry."""
    async with run_operator():
        await create(cluster, cvs())
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        cluster.fail(is_("PATCH", f"{DEP_PATH}/tts"), lambda: aiohttp.web.json_response(
            status(409, "Conflict", "the object has been modified"), status=409), times=1)
        await patch(cluster, CVS_URL + "/tts", {"spec": {"batching": {"maxBatchSize": 32}}})

        def batch() -> str:
            env = live(cluster, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["env"]
            return next(e["value"] for e in env if e["name"] == "COSYVOICE_MAX_BATCH_SIZE")

        await eventually(lambda: batch() == "32", timeout=30)
        assert len(requests(cluster, "PATCH", f"{DEP_PATH}/tts")) == 2


def test_kopf_is_started_again_when_it_stops_on_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last line of defence: kopf stopping with an error is followed by a fresh start, not an exit."""
    import threading

    import kopf
    from cosyvoice_operator import runtime

    runs: list[int] = []
    stop = threading.Event()

    async def operator(**kwargs: Any) -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("watcher failed")
        stop.set()  # the third run is stopped by its flag

    monkeypatch.setattr(kopf, "operator", operator)
    runtime.operate(runtime.Options(restart_backoff=(0.01, 0.02)), kopf.Memo(), stop_flag=stop)
    assert len(runs) == 3


# --- a CosyVoiceService author tries to make the operator leak -----------------------------------

class Listener:
    """An HTTP server on 127.0.0.1 that records what reaches it (an attacker's, or a stand-in Prometheus)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append({"path": request.path, "authorization": request.headers.get("Authorization", "")})
        return aiohttp.web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    spy = Listener()
    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", spy.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    spy.url = f"http://127.0.0.1:{port}"
    yield spy
    await runner.cleanup()


AUTOSCALED = {"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 5, "intervalSeconds": 1}


def auto_condition(cluster: Any, type_: str) -> Obj:
    auto = status_of(cluster).get("autoscaling") or {}
    for c in auto.get("conditions", []):
        if c["type"] == type_:
            return c
    raise AssertionError(f"no autoscaling condition {type_} yet")


def secret_reads(cluster: Any) -> list[Any]:
    return requests(cluster, "GET", f"/api/v1/namespaces/{NS}/secrets")


async def test_a_service_cannot_send_a_secret_to_its_own_listener(cluster: Any, listener: Listener) -> None:
    """The audited attack: prometheus.url → the author's listener, bearerTokenSecret → another
    application's Secret. Nothing reaches the listener and the Secret is never read; the service says why."""
    cluster.objects["v1/secrets", NS, "db-password"] = secret("db-password", opted_in=False)
    async with run_operator():
        await create(cluster, cvs(autoscaling={**AUTOSCALED, "prometheus": {
            "url": listener.url, "bearerTokenSecret": {"name": "db-password", "key": "token"}}}))
        await eventually(lambda: auto_condition(cluster, "ScalingActive")["reason"] == "MetricsSourceNotAllowed")
        assert "may not carry credentials" in auto_condition(cluster, "ScalingActive")["message"]
        await eventually(lambda: any(r == "MetricsSourceNotAllowed" for r, _ in events(cluster)))
        await asyncio.sleep(2.5)  # two more evaluations
    assert listener.seen == [] and secret_reads(cluster) == []


async def test_a_url_alone_reaches_only_an_address_the_administrator_allowed(
        cluster: Any, listener: Listener, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("admin-token\n")
    policy = admin.AdminPolicy.model_validate({"metricsSources": {
        "cluster": {"url": listener.url, "bearerTokenFile": str(token)},
        "team-b": {"url": listener.url + "/b", "namespaces": ["team-b"]}}})
    async with run_operator(policy=policy):
        # a URL of the author's choosing: refused, nothing sent
        await create(cluster, cvs("rogue", autoscaling={**AUTOSCALED, "prometheus": {"url": "http://127.0.0.1:9/x"}}))
        # a source meant for another namespace: refused
        await create(cluster, cvs("other", autoscaling={**AUTOSCALED, "metricsSource": "team-b"}))
        # the administrator's source: queried with the administrator's credentials
        await create(cluster, cvs("tts", autoscaling={**AUTOSCALED, "metricsSource": "cluster"}))
        await eventually(lambda: listener.seen)
        await eventually(lambda: auto_condition(cluster, "ScalingActive")["reason"] == "MetricsUnavailable")
        for name, message in (("rogue", "is not a metrics source the operator's administrator allows"),
                              ("other", "metrics source 'team-b' is not defined for namespace default")):
            auto = (status_of(cluster, name).get("autoscaling") or {}).get("conditions") or []
            assert any(c["reason"] == "MetricsSourceNotAllowed" and message in c["message"] for c in auto), auto
    assert {s["authorization"] for s in listener.seen} == {"Bearer admin-token"}
    assert all(s["path"] == "/api/v1/query" for s in listener.seen)  # never the team-b path


async def test_autoscaling_without_a_metrics_source_says_what_to_set(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(autoscaling=AUTOSCALED))
        await eventually(lambda: auto_condition(cluster, "ScalingActive")["reason"] == "NoMetricsSource")
        assert "set spec.autoscaling.metricsSource" in auto_condition(cluster, "ScalingActive")["message"]
        await eventually(lambda: any(r == "NoMetricsSource" for r, _ in events(cluster)))
        assert live(cluster, DEPLOYMENTS) is not None  # the service itself still runs, at spec.replicas


LEAK_PATHS = {
    "api-key": {"apiKeySecret": {"name": "db-password", "key": "api-key"}},
    "storage-credentials": {"storage": {"storageUri": "s3://models/cv2.tar.gz",
                                        "credentialsSecret": {"name": "db-password"}}},
    "env-secret-key-ref": {"env": [{"name": "LEAK", "valueFrom": {"secretKeyRef": {"name": "db-password",
                                                                                   "key": "token"}}}]},
}


@pytest.mark.parametrize("path", LEAK_PATHS)
async def test_a_secret_reaches_pods_only_when_its_owner_opted_in(cluster: Any, path: str) -> None:
    """A Secret named by the spec must carry the opt-in label; until it does nothing is rolled out. The
    operator checks the label from the Secret's metadata and never asks for its data."""
    cluster.objects["v1/secrets", NS, "db-password"] = secret("db-password", opted_in=False)
    async with run_operator(resync_seconds=0.5):
        await create(cluster, cvs(**LEAK_PATHS[path]))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "SecretNotAllowed")
        message = condition(cluster, "Ready")["message"]
        assert f"Secret db-password" in message and f"kubectl label secret db-password -n {NS}" in message
        await eventually(lambda: any(r == "SecretNotAllowed" for r, _ in events(cluster)))  # events post asynchronously
        await asyncio.sleep(1.0)
        assert live(cluster, DEPLOYMENTS) is None

        await patch(cluster, f"/api/v1/namespaces/{NS}/secrets/db-password",
                    {"metadata": {"labels": {OPT_IN_LABEL: "true"}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)  # the next resync rolls it out
    assert secret_reads(cluster) and all("as=PartialObjectMetadata" in r.headers.get("Accept", "")
                                         for r in secret_reads(cluster))


OTHER_OBJECTS = {
    # kind, the emulator's resource, what names it, what the pod gets from it
    "model-claim": ("persistentvolumeclaim", "v1/persistentvolumeclaims", {"storage": {"pvc": {"claimName": "db-data"}}}),
    "voice-claim": ("persistentvolumeclaim", "v1/persistentvolumeclaims", {"voices": {"pvc": {"claimName": "db-data"}}}),
    "env-config-map": ("configmap", "v1/configmaps", {"env": [{"name": "DB_URL", "valueFrom": {"configMapKeyRef": {
        "name": "db-data", "key": "url"}}}]}),
    "service-account": ("serviceaccount", "v1/serviceaccounts", {"serviceAccountName": "db-data"}),
    "lexicon-config-map": ("configmap", "v1/configmaps", {"pronunciation": {"lexicons": [{"configMapRef": {
        "name": "db-data", "key": "brands.pls"}, "default": True}]}}),
}


@pytest.mark.parametrize("path", OTHER_OBJECTS)
async def test_claims_config_maps_and_service_accounts_need_their_owners_opt_in_too(cluster: Any, path: str) -> None:
    """Another workload's volume, its settings or its cloud identity reach a CosyVoiceService's pods only
    when their owner labelled them; the operator reads their metadata only."""
    kind, resource, spec = OTHER_OBJECTS[path]
    cluster.objects[resource, NS, "db-data"] = {"apiVersion": "v1", "kind": kind, "metadata": {
        "name": "db-data", "namespace": NS, "uid": "o-1", "resourceVersion": "1", "labels": {}}}
    async with run_operator(resync_seconds=0.5):
        await create(cluster, cvs(**spec))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "ReferenceNotAllowed")
        assert f"kubectl label {kind} db-data -n {NS} {OPT_IN_LABEL}=true" in condition(cluster, "Ready")["message"]
        assert live(cluster, DEPLOYMENTS) is None

        await patch(cluster, f"/api/v1/namespaces/{NS}/{resource.split('/')[1]}/db-data",
                    {"metadata": {"labels": {OPT_IN_LABEL: "true"}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
    reads = requests(cluster, "GET", f"/api/v1/namespaces/{NS}/{resource.split('/')[1]}/db-data")
    assert reads and all("as=PartialObjectMetadata" in r.headers.get("Accept", "") for r in reads)


async def test_a_revoked_opt_in_stops_the_pods_that_use_it(cluster: Any) -> None:
    """The running pods keep a Secret volume (the kubelet even keeps it up to date) after its owner removed
    the label: the Deployment goes to 0 replicas, and comes back when the label does. A refused object the
    pods do not use yet stops nothing."""
    cluster.objects["v1/secrets", NS, "tts-key"] = secret("tts-key", opted_in=True)
    async with run_operator(resync_seconds=0.5):
        await create(cluster, cvs(replicas=2, apiKeySecret={"name": "tts-key", "key": "api-key"}))
        await eventually(lambda: (live(cluster, DEPLOYMENTS) or {}).get("spec", {}).get("replicas") == 2)

        await patch(cluster, f"/api/v1/namespaces/{NS}/secrets/tts-key", {"metadata": {"labels": {OPT_IN_LABEL: None}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 0)
        assert condition(cluster, "Ready")["reason"] == "SecretNotAllowed"
        await eventually(lambda: any(r == "ScaledToZero" for r, _ in events(cluster)))

        await patch(cluster, f"/api/v1/namespaces/{NS}/secrets/tts-key", {"metadata": {"labels": {OPT_IN_LABEL: "true"}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 2)

        # naming another, unlabelled object refuses the change, but the pods do not use it yet: they run on
        cluster.objects["v1/secrets", NS, "other"] = secret("other", opted_in=False)
        await patch(cluster, CVS_PATH.format(ns=NS) + "/tts", {"spec": {"env": [
            {"name": "OTHER", "valueFrom": {"secretKeyRef": {"name": "other", "key": "token"}}}]}})
        await eventually(lambda: "Secret other" in condition(cluster, "Ready")["message"])
        await asyncio.sleep(1.0)  # two resyncs
        assert live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 2


async def test_env_cannot_switch_off_the_api_key(cluster: Any) -> None:
    """The CRD rejects it at admission; an object that got past an older CRD is refused by the operator."""
    cluster.objects["v1/secrets", NS, "tts-key"] = secret("tts-key", opted_in=True)
    async with run_operator():
        await create(cluster, cvs(apiKeySecret={"name": "tts-key", "key": "api-key"},
                                  env=[{"name": "COSYVOICE_API_KEY_FILE", "value": "/dev/null"}]))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "InvalidSpec")
        assert "COSYVOICE_API_KEY_FILE is set by the operator" in condition(cluster, "Ready")["message"]
        await asyncio.sleep(0.5)
        assert live(cluster, DEPLOYMENTS) is None


BOUNDS = admin.AdminPolicy.model_validate({"bounds": {
    "maxReplicas": 4, "allowedImageRegistries": ["ghcr.io/cosyvoice-k8s"], "requiredResourceLimits": ["memory"]}})


@pytest.mark.parametrize("spec, message", [
    ({"replicas": 1000}, "spec.replicas 1000 exceeds the cluster's maximum of 4"),
    ({"autoscaling": {"maxReplicas": 50}}, "spec.autoscaling.maxReplicas 50 exceeds the cluster's maximum of 4"),
    ({"image": "evil.example.com/miner:latest"}, "is not from an allowed registry (ghcr.io/cosyvoice-k8s)"),
    ({"image": "ghcr.io/cosyvoice-k8s-fork/server:1"}, "is not from an allowed registry"),
    ({"resources": {}}, "spec.resources.limits must set memory"),
], ids=["replicas", "autoscaling-max", "registry", "registry-lookalike", "no-limits"])
async def test_bounds_set_by_the_administrator_are_enforced(cluster: Any, spec: Obj, message: str) -> None:
    async with run_operator(policy=BOUNDS):
        await create(cluster, cvs(**spec))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "PolicyViolation")
        assert message in condition(cluster, "Ready")["message"]
        assert "operator chart value bounds" in condition(cluster, "Ready")["message"]
        assert live(cluster, DEPLOYMENTS) is None


async def test_scaling_past_the_bound_keeps_what_runs(cluster: Any) -> None:
    async with run_operator(policy=BOUNDS):
        await create(cluster, cvs(replicas=2))
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        await patch(cluster, CVS_URL + "/tts/scale", {"spec": {"replicas": 1000}})  # kubectl scale
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "PolicyViolation")
        assert live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 2
