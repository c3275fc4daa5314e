"""`kubectl apply -f examples/canary.yaml` on the real operator under kmock's emulated API server: two
Deployments and the 90/10 split, by HTTPRoute weights with a Gateway parent and by replicas without."""
from __future__ import annotations

from typing import Any

import kmock
import pytest
from cosyvoice_operator.constants import OPT_IN_LABEL
from cvs_testkit import CVS_PATH, CVS_RESOURCE, EXAMPLES_DIR, Emulator, eventually, load_example, run_operator

pytestmark = [pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

Obj = dict[str, Any]
NS = "default"
ROUTES = "gateway.networking.k8s.io/v1/httproutes"


def live(cluster: Any, resource: str, name: str) -> Obj | None:
    key = (kmock.resource(resource), NS, name)
    if key not in cluster.objects or cluster.objects[key].deleted:
        return None
    return cluster.objects[key].raw


def replicas(cluster: Any) -> dict[str, int | None]:
    return {n: (live(cluster, "apps/v1/deployments", n) or {}).get("spec", {}).get("replicas")
            for n in ("tts", "tts-canary")}


def weights(cluster: Any) -> dict[str, int]:
    route = live(cluster, ROUTES, "tts") or {}
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


def canary_condition(cluster: Any) -> Obj:
    status = (live(cluster, CVS_RESOURCE, "tts") or {}).get("status") or {}
    return next(c for c in status.get("conditions", []) if c["type"] == "Canary")


async def patch_spec(cluster: Any, spec: Obj) -> None:
    async with cluster.patch(f"{CVS_PATH.format(ns=NS)}/tts", json={"spec": spec},
                             headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status == 200, await resp.text()


async def test_the_example_runs_two_versions_at_ninety_ten_by_route_then_by_replicas(cluster: Any) -> None:
    meta = {"namespace": NS, "resourceVersion": "1", "labels": {OPT_IN_LABEL: "true"}}
    cluster.objects["v1/persistentvolumeclaims", NS, "cosyvoice2-model"] = {
        "metadata": {**meta, "name": "cosyvoice2-model", "uid": "pvc-1"}, "spec": {"accessModes": ["ReadOnlyMany"]}}
    cluster.objects["v1/secrets", NS, "model-store-credentials"] = {
        "metadata": {**meta, "name": "model-store-credentials", "uid": "s-1"}, "data": {}}
    cr = load_example(EXAMPLES_DIR / "canary.yaml")
    async with run_operator():
        async with cluster.post(CVS_PATH.format(ns=NS), json={**cr, "metadata": {**cr["metadata"], "namespace": NS}}
                                ) as resp:
            assert resp.status in (200, 201), await resp.text()
        await eventually(lambda: replicas(cluster) == {"tts": 9, "tts-canary": 1})
        await eventually(lambda: weights(cluster) == {"tts-stable": 90, "tts-canary": 10})
        canary = live(cluster, "apps/v1/deployments", "tts-canary") or {}
        assert canary["metadata"]["labels"]["tts.cosyvoice.dev/model-version"] == "cosyvoice3"
        fetch = canary["spec"]["template"]["spec"]["initContainers"][0]
        assert "s3://models/cosyvoice3-0.5b-onnx/" in fetch["command"]
        assert [s for s in ("tts", "tts-stable", "tts-canary") if live(cluster, "v1/services", s)] == \
            ["tts", "tts-stable", "tts-canary"]
        # no metrics source the administrator defined: the canary serves, and its status says why no figures
        await eventually(lambda: (live(cluster, CVS_RESOURCE, "tts") or {})["status"]["canary"]["reason"]
                         == "MetricsSourceNotAllowed")
        assert (live(cluster, CVS_RESOURCE, "tts") or {})["status"]["replicaSummary"].endswith("/10")

        # without a gateway the Service over both versions splits by replicas; the route and its Services go
        await patch_spec(cluster, {"canary": {"gateway": None}})
        await eventually(lambda: live(cluster, ROUTES, "tts") is None and live(cluster, "v1/services", "tts-canary")
                         is None and live(cluster, "v1/services", "tts-stable") is None)
        assert replicas(cluster) == {"tts": 9, "tts-canary": 1}
        assert canary_condition(cluster)["status"] == "False"  # no pod of it is ready in an emulator

        # the canary removed (not promoted): stable takes all ten again
        await patch_spec(cluster, {"canary": None})
        await eventually(lambda: replicas(cluster) == {"tts": 10, "tts-canary": None})
        await eventually(lambda: "canary" not in ((live(cluster, CVS_RESOURCE, "tts") or {}).get("status") or {}))
        assert not any(c["type"] == "Canary" for c in (live(cluster, CVS_RESOURCE, "tts") or {})["status"]["conditions"])
