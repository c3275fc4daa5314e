"""The autoscaler end to end: a real inference server under load, a real Prometheus scraping it, and the
real operator (every kopf handler) against kmock's emulated API server.

Prometheus attaches ``namespace`` and ``cosyvoice_service`` to the server's samples through its
scrape config, as the relabeling documented in docs/autoscaling.md does in a cluster, so the
operator's queries select this service's series and nothing else.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import jsonschema
import pytest
from cosyvoice_operator.admin import AdminPolicy
from cvs_crdschema import openapi_schema, to_jsonschema
from cvs_testkit import CVS_PATH, CVS_RESOURCE, Emulator, eventually, run_operator

pytestmark = [pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(150),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

NS, NAME = "default", "tts"
Obj = dict[str, Any]


def cr_of(cluster: Any) -> Obj:
    return cluster.objects[CVS_RESOURCE, NS, NAME].raw


def auto_status(cluster: Any) -> Obj:
    return (cr_of(cluster).get("status") or {}).get("autoscaling") or {}


def auto_condition(cluster: Any, type_: str) -> Obj:
    for c in auto_status(cluster).get("conditions") or []:
        if c["type"] == type_:
            return c
    raise AssertionError(f"no {type_} condition yet")


def events(cluster: Any) -> list[tuple[str, str]]:
    return [(r.data["reason"], r.data["message"]) for r in list(cluster)
            if str(r.method).upper().endswith("POST") and r.url.path == f"/api/v1/namespaces/{NS}/events"]


class Load:
    """Closed-loop clients against the server, in a thread, until stopped."""

    def __init__(self, url: str, clients: int = 6) -> None:
        self.url, self.clients, self.sent = url, clients, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            async def worker() -> None:
                while not self._stop.is_set():
                    await client.post(self.url + "/v1/audio/speech", json={
                        "model": "tts-1", "input": "Autoscaling keeps the latency objective.", "response_format": "pcm"})
                    self.sent += 1
            await asyncio.gather(*(worker() for _ in range(self.clients)))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# Real processes and real scrape timing on a shared 2-core machine: one retry before calling it a failure.
@pytest.mark.flaky(reruns=1)
async def test_scales_up_on_real_metrics_then_holds_when_prometheus_stops(
        cluster: Any, crd: Obj, start_server: Any, start_prometheus: Any) -> None:
    server = start_server()
    prom = start_prometheus([server.url.removeprefix("http://")], {"namespace": NS, "cosyvoice_service": NAME})
    body = {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"replicas": 1, "autoscaling": {
                "enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetQPSPerReplica": 0.5,
                "targetP95LatencyMs": 5000, "intervalSeconds": 1,
                # no scale-down window: only the missing metrics can keep the replicas up at the end
                "scaleDown": {"stabilizationWindowSeconds": 0},
                "prometheus": {"url": prom.url}}}}
    # the legacy prometheus.url selects the administrator's source with that address
    sources = AdminPolicy.model_validate({"metricsSources": {"local": {"url": prom.url}}})
    async with run_operator(policy=sources):
        async with cluster.post(CVS_PATH.format(ns=NS), json=body) as resp:
            assert resp.status in (200, 201), await resp.text()
        with Load(server.url) as load:
            # Scaled up from what Prometheus measured, and bounded by maxReplicas.
            await eventually(lambda: cr_of(cluster)["spec"]["replicas"] == 4, timeout=60, interval=0.2)
            assert load.sent > 0
            await eventually(lambda: auto_status(cluster)["desiredReplicas"] == 4)
            status = auto_status(cluster)
            # measured traffic, not a default (how much a loaded CI machine serves varies: the in-flight
            # growth alone can justify the scale-up, so no bound on the rate itself)
            assert status["currentQPS"] > 0
            assert status["lastScaleReason"] in ("ScaleUp", "LatencyAboveTarget")
            assert auto_condition(cluster, "ScalingActive")["status"] == "True"
            await eventually(lambda: auto_condition(cluster, "ScalingLimited")["reason"] == "TooManyReplicas",
                             timeout=10)
            await eventually(lambda: any(r == "SuccessfulRescale" and m.startswith("New size: ")
                                         for r, m in events(cluster)))
            # The reconciler rolled the new count out to the Deployment.
            dep = cluster.objects["apps/v1/deployments", NS, NAME].raw
            await eventually(lambda: cluster.objects["apps/v1/deployments", NS, NAME].raw["spec"]["replicas"] == 4)
            assert dep is not None

            # Prometheus goes away, then the load stops: no data must not scale anything down.
            rescales = [e for e in events(cluster) if e[0] == "SuccessfulRescale"]
            prom.stop()
            await eventually(lambda: auto_condition(cluster, "ScalingActive")["status"] == "False", timeout=20)
        active = auto_condition(cluster, "ScalingActive")
        assert active["reason"] == "MetricsUnavailable"
        assert "Prometheus query failed" in active["message"]
        failures = auto_status(cluster)["consecutiveFailures"]
        await eventually(lambda: auto_status(cluster)["consecutiveFailures"] >= failures + 4, timeout=30)
        assert cr_of(cluster)["spec"]["replicas"] == 4
        assert auto_condition(cluster, "ScalingActive")["reason"] == "MetricsUnavailable"
        await eventually(lambda: any(r == "FailedGetMetrics" for r, _ in events(cluster)))
        assert [e for e in events(cluster) if e[0] == "SuccessfulRescale"] == rescales
        # Everything written is declared by the CRD (a real API server would prune anything else).
        schema = openapi_schema(crd)["properties"]["status"]["properties"]["autoscaling"]
        jsonschema.validate(auto_status(cluster), to_jsonschema(schema))


# Real processes and timing on a shared 2-core machine: one retry before calling it a failure.
@pytest.mark.flaky(reruns=1)
async def test_a_restarted_operator_keeps_the_scale_down_window_it_had(
        cluster: Any, crd: Obj, exporter: Any, start_prometheus: Any) -> None:
    """Mid scale-down, the operator stops (a restart, a leader change) and a new one starts 10 s later:
    replicas go down when the window that began before the restart ends, not a whole window after it,
    and not at once. The history it resumes from is in status.autoscaling.history."""
    import time

    window = 24
    prom = start_prometheus([exporter.target], {"namespace": NS, "cosyvoice_service": NAME})
    exporter.demand.set(4.0)
    body = {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"replicas": 4, "autoscaling": {
                "enabled": True, "minReplicas": 1, "maxReplicas": 6, "targetQPSPerReplica": 1,
                "intervalSeconds": 1, "forecast": {"lookbackSeconds": 0},
                "scaleDown": {"stabilizationWindowSeconds": window,
                              "policies": [{"type": "Pods", "value": 10, "periodSeconds": 1}]},
                "queries": {"qps": "max(test_demand_qps{$selector})"}, "metricsSource": "local"}}}
    sources = AdminPolicy.model_validate({"metricsSources": {"local": {"url": prom.url, "allowQueryOverrides": True}}})

    def high_times() -> list[float]:
        recs = (auto_status(cluster).get("history") or {}).get("recommendations") or []
        return [r["time"] for r in recs if r["replicas"] == 4]

    async with run_operator(policy=sources):
        async with cluster.post(CVS_PATH.format(ns=NS), json=body) as resp:
            assert resp.status in (200, 201), await resp.text()
        await eventually(lambda: len(high_times()) >= 3, timeout=30, interval=0.2)
        exporter.demand.set(1.0)  # the load falls: 1 replica is enough, the window holds 4
        await eventually(lambda: auto_condition(cluster, "AbleToScale")["reason"] == "ScaleDownStabilized",
                         timeout=20, interval=0.2)
        assert cr_of(cluster)["spec"]["replicas"] == 4
    last_high = max(high_times())
    await asyncio.sleep(10)  # no operator: a leader change takes a while
    restarted = time.time()
    async with run_operator(policy=sources):
        await eventually(lambda: cr_of(cluster)["spec"]["replicas"] == 1, timeout=window + 20, interval=0.2)
        dropped = time.time()
    # without the persisted history the new operator would wait a whole window from its start
    assert last_high + window - 1 <= dropped < restarted + window - 5, (last_high, restarted, dropped)
    schema = openapi_schema(crd)["properties"]["status"]["properties"]["autoscaling"]
    jsonschema.validate(auto_status(cluster), to_jsonschema(schema))


async def test_a_trace_exported_from_prometheus_replays_in_the_simulator(
        tmp_path: Any, exporter: Any, start_prometheus: Any) -> None:
    """`simulate --from-prometheus URL --query ... --range` against the real Prometheus: the CSV holds the
    rate the exporter produced, and the simulator replays it."""
    import csv
    import time

    from cosyvoice_operator.cli import main

    prom = start_prometheus([exporter.target], {"namespace": NS, "cosyvoice_service": NAME})
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:  # 20 requests/s for 12 s
        exporter.requests.inc(2)
        await asyncio.sleep(0.1)
    out = tmp_path / "trace.csv"
    assert main(["simulate", "--from-prometheus", prom.url, "--query", "sum(rate(test_requests_total[5s]))",
                 "--range", "20s", "--step", "1s", "--save-trace", str(out), "--seeds", "1",
                 "--policies", "policy,static", "--json"]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["t_seconds", "rate_rps"] and len(rows) > 5
    rates = [float(r[1]) for r in rows[1:]]
    assert 12 <= max(rates) <= 28  # what the exporter produced, within scrape jitter
    assert main(["simulate", "--from-prometheus", prom.url, "--query", "sum(rate(nothing_total[1m]))",
                 "--range", "20s", "--save-trace", str(tmp_path / "none.csv")]) == 2
