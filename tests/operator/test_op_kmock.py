"""The real operator (kopf, every handler) against kmock's emulated Kubernetes API.

What is asserted is what a user would see in the cluster: objects, their fields, status, events,
and the API requests the operator made (for idempotence: no duplicate creates, no needless patches).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import kmock
import pytest
from cosyvoice_operator.constants import OPT_IN_LABEL, OPT_IN_VALUE
from cvs_testkit import CVS_PATH, CVS_RESOURCE, Emulator, eventually, run_operator

pytestmark = [pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

Obj = dict[str, Any]
NS = "default"
DEPLOYMENTS, SERVICES, PDBS = "apps/v1/deployments", "v1/services", "policy/v1/poddisruptionbudgets"
DEP_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments"
MIG = "nvidia.com/mig-1g.10gb"


def cvs(name: str = "tts", **spec: Any) -> Obj:
    return {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def gpu_node(name: str, slices: int, **labels: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"node-{name}", "resourceVersion": "1",
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **labels}},
            "status": {"allocatable": {"cpu": "32", MIG: str(slices)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def live(cluster: Any, resource: str, name: str = "tts") -> Obj | None:
    key = (kmock.resource(resource), NS, name)  # the array's `in` does not parse string keys
    if key not in cluster.objects or cluster.objects[key].deleted:
        return None
    return cluster.objects[key].raw


def status_of(cluster: Any, name: str = "tts") -> Obj:
    return (live(cluster, CVS_RESOURCE, name) or {}).get("status") or {}


def condition(cluster: Any, type_: str, name: str = "tts") -> Obj:
    for c in status_of(cluster, name).get("conditions", []):
        if c["type"] == type_:
            return c
    raise AssertionError(f"no {type_} condition yet")


def requests(cluster: Any, method: str, path: str) -> list[Any]:
    return [r for r in list(cluster) if str(r.method).upper().endswith(method) and r.url.path.startswith(path)]


def events(cluster: Any) -> list[tuple[str, str]]:
    return [(r.data["reason"], r.data["message"]) for r in requests(cluster, "POST", f"/api/v1/namespaces/{NS}/events")]


async def create(cluster: Any, body: Obj) -> Obj:
    async with cluster.post(CVS_PATH.format(ns=NS), json=body) as resp:
        assert resp.status in (200, 201), await resp.text()
        return dict(await resp.json())


async def patch(cluster: Any, path: str, body: Obj) -> None:
    async with cluster.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"}) as resp:
        assert resp.status == 200, await resp.text()


async def test_create_deploys_children_with_owner_references_and_reports_status(cluster: Any) -> None:
    for name in ("a", "b"):
        cluster.objects["v1/nodes", None, name] = gpu_node(name, 2)
    async with run_operator():
        cr = await create(cluster, cvs(gpu={"migProfile": "1g.10gb"}, replicas=2,
                                       storage={"storageUri": "s3://models/cv2.tar.gz"}))
        await eventually(lambda: condition(cluster, "CapacityAvailable")["status"] == "True")

        dep, svc, pdb = live(cluster, DEPLOYMENTS), live(cluster, SERVICES), live(cluster, PDBS)
        for child in (dep, svc, pdb):
            assert child is not None
            (ref,) = child["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == \
                ("CosyVoiceService", "tts", cr["metadata"]["uid"], True)
        pod = dep["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"][MIG] == 1
        assert pod["initContainers"][0]["command"][:4] == ["cosyvoice-server", "fetch", "--uri", "s3://models/cv2.tar.gz"]
        assert dep["spec"]["replicas"] == 2

        status = status_of(cluster)
        assert status["endpoint"] == "http://tts.default.svc.cluster.local:8000"
        assert status["selector"] == "app.kubernetes.io/instance=tts,app.kubernetes.io/name=cosyvoice"
        assert status["replicaSummary"] == "0/2" and status["observedGeneration"] == 1
        assert condition(cluster, "Ready")["status"] == "False"
        assert condition(cluster, "CapacityAvailable")["message"] == \
            f"2 × {MIG} requested, 4 allocatable on nodes a, b"
        await eventually(lambda: ("Created", "Created Deployment tts") in events(cluster))

        # The Deployment controller reports the pods ready: the service turns Ready.
        await patch(cluster, f"{DEP_PATH}/tts/status", {"status": {
            "observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}})
        await eventually(lambda: condition(cluster, "Ready")["status"] == "True")
        assert status_of(cluster)["replicaSummary"] == "2/2" and status_of(cluster)["readyReplicas"] == 2
        assert condition(cluster, "Progressing")["reason"] == "RolloutComplete"
        await eventually(lambda: ("Ready", "2/2 replicas ready") in events(cluster))


async def test_spec_change_patches_only_what_changed(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(batching={"maxBatchSize": 8}))
        await eventually(lambda: status_of(cluster).get("observedGeneration") == 1)
        created = len(requests(cluster, "POST", DEP_PATH))

        await patch(cluster, CVS_PATH.format(ns=NS) + "/tts", {"spec": {"batching": {"maxBatchSize": 32},
                                                                         "podDisruptionBudget": {"enabled": False}}})

        def env() -> dict[str, str]:
            dep = live(cluster, DEPLOYMENTS)
            return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

        await eventually(lambda: env()["COSYVOICE_MAX_BATCH_SIZE"] == "32")
        await eventually(lambda: live(cluster, PDBS) is None)
        await eventually(lambda: status_of(cluster).get("observedGeneration") == 2)
        assert len(requests(cluster, "POST", DEP_PATH)) == created  # patched, not re-created
        (dep_patch,) = requests(cluster, "PATCH", f"{DEP_PATH}/tts")
        assert set(dep_patch.data["spec"]) == {"template"}  # replicas, selector, strategy untouched
        assert requests(cluster, "PATCH", f"/api/v1/namespaces/{NS}/services") == []
        deleted = ("Deleted", "Deleted PodDisruptionBudget tts (disabled in the spec)")
        await eventually(lambda: deleted in events(cluster))


async def test_scale_subresource_drives_the_deployment(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs())
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        # What `kubectl scale cvs/tts --replicas=3` and an HPA targeting the CR send:
        await patch(cluster, CVS_PATH.format(ns=NS) + "/tts/scale", {"spec": {"replicas": 3}})
        await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 3)
        await patch(cluster, f"{DEP_PATH}/tts/status", {"status": {
            "observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 1}})
        await eventually(lambda: status_of(cluster)["replicas"] == 3)
        assert status_of(cluster)["replicaSummary"] == "1/3"


async def test_children_deleted_or_edited_by_hand_are_put_back(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(gpu={"migProfile": "1g.10gb"}))
        await eventually(lambda: live(cluster, PDBS) is not None and live(cluster, DEPLOYMENTS) is not None)

        async with cluster.delete(f"{DEP_PATH}/tts") as resp:
            assert resp.status == 200
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        await eventually(lambda: ("Recreated", "Recreated Deployment tts (it was deleted)") in events(cluster))
        async with cluster.delete(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/tts") as resp:
            assert resp.status == 200
        await eventually(lambda: live(cluster, PDBS) is not None)

        # kubectl edit: someone swaps the image and scales the Deployment directly.
        await patch(cluster, f"{DEP_PATH}/tts", {"spec": {"replicas": 4, "template": {"spec": {"containers": [
            {"name": "server", "image": "someone/else:latest"}]}}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 1)
        container = live(cluster, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "ghcr.io/cosyvoice-k8s/cosyvoice-server:0.1.0"
        assert container["resources"]["limits"][MIG] == 1


async def test_not_enough_mig_slices_sets_capacity_unavailable(cluster: Any) -> None:
    cluster.objects["v1/nodes", None, "a"] = gpu_node("a", 1)
    cluster.objects["v1/nodes", None, "b"] = gpu_node("b", 1)
    async with run_operator(resync_seconds=0.3):
        await create(cluster, cvs(gpu={"migProfile": "1g.10gb"}, replicas=4))
        await eventually(lambda: condition(cluster, "CapacityAvailable")["status"] == "False")
        cap = condition(cluster, "CapacityAvailable")
        assert cap["reason"] == "InsufficientCapacity"
        assert cap["message"] == f"4 × {MIG} requested, 2 allocatable on nodes a, b"
        await eventually(lambda: ("InsufficientCapacity", cap["message"]) in events(cluster))
        assert live(cluster, DEPLOYMENTS) is not None  # deployed anyway: pods schedule as slices free up

        # A new node joins; the periodic resync notices without any change to the service.
        cluster.objects["v1/nodes", None, "c"] = gpu_node("c", 7)
        await eventually(lambda: condition(cluster, "CapacityAvailable")["status"] == "True")
        assert condition(cluster, "CapacityAvailable")["message"] == \
            f"4 × {MIG} requested, 9 allocatable on nodes a, b, c"


async def test_operator_restart_creates_no_duplicates_and_patches_nothing(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(gpu={"migProfile": "1g.10gb"}))
        await eventually(lambda: condition(cluster, "CapacityAvailable"))
    before = len(list(cluster))
    async with run_operator():
        # The resume handler runs for the existing service: wait until it has read the children.
        await eventually(lambda: any(r.url.path == f"{DEP_PATH}/tts" and r.id > before for r in list(cluster)))
        await asyncio.sleep(0.5)
    after = list(cluster)[before:]
    writes = [(str(r.method), r.url.path) for r in after if str(r.method).upper().split(".")[-1] in ("POST", "PATCH",
                                                                                                     "DELETE")]
    # Only kopf's own bookkeeping on the CR may be written; children and status stay untouched.
    assert [w for w in writes if "/cosyvoiceservices/" not in w[1] or w[1].endswith("/status")] == []
    assert len([k for k in cluster.objects if k[0] == DEPLOYMENTS and not cluster.objects[k].deleted]) == 1


async def test_invalid_spec_is_reported_once_without_a_retry_storm(cluster: Any) -> None:
    async with run_operator():
        # Passes the CRD schema (it cannot know the catalog) but not the operator.
        await create(cluster, cvs(gpu={"migProfile": "1g.20gb", "product": "NVIDIA-A100-SXM4-40GB"}))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "InvalidSpec")
        message = condition(cluster, "Ready")["message"]
        assert "1g.20gb does not exist on A100-40GB" in message
        assert "valid profiles: 1g.5gb, 1g.5gb+me, 1g.10gb" in message
        assert condition(cluster, "Degraded")["status"] == "True"
        await asyncio.sleep(2)
        assert live(cluster, DEPLOYMENTS) is None
        assert len(requests(cluster, "PATCH", CVS_PATH.format(ns=NS) + "/tts/status")) == 1
        assert [r for r, _ in events(cluster)].count("InvalidSpec") == 1

        # Fixing the spec recovers.
        await patch(cluster, CVS_PATH.format(ns=NS) + "/tts", {"spec": {"gpu": {"migProfile": "1g.10gb"}}})
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        await eventually(lambda: condition(cluster, "Ready")["reason"] != "InvalidSpec")


async def test_failing_pods_surface_in_status(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(image="ghcr.io/cosyvoice-k8s/cosyvoice-server:nope"))
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        labels = live(cluster, DEPLOYMENTS)["spec"]["template"]["metadata"]["labels"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "tts-7d9f-x1", "namespace": NS, "labels": labels},
               "spec": {"containers": [{"name": "server", "image": "x"}]},
               "status": {"phase": "Pending", "containerStatuses": [{"name": "server", "state": {"waiting": {
                   "reason": "ImagePullBackOff",
                   "message": 'Back-off pulling image "ghcr.io/cosyvoice-k8s/cosyvoice-server:nope"'}}}]}}
        async with cluster.post(f"/api/v1/namespaces/{NS}/pods", json=pod) as resp:
            assert resp.status == 200
        await eventually(lambda: condition(cluster, "Degraded")["reason"] == "ImagePullBackOff")
        assert "pod tts-7d9f-x1" in condition(cluster, "Degraded")["message"]
        assert condition(cluster, "Ready")["reason"] == "ImagePullBackOff"


async def test_deleting_the_service_leaves_children_to_the_garbage_collector(cluster: Any) -> None:
    """No finalizer blocks `kubectl delete cvs`; children go through their owner references.

    kmock has no garbage collector, so the children stay in the emulator: what is asserted is that
    they point at the deleted owner and that the operator itself deleted nothing.
    """
    async with run_operator():
        cr = await create(cluster, cvs())
        await eventually(lambda: live(cluster, PDBS) is not None and live(cluster, SERVICES) is not None)
        assert not (live(cluster, CVS_RESOURCE) or {}).get("metadata", {}).get("finalizers")
        async with cluster.delete(CVS_PATH.format(ns=NS) + "/tts") as resp:
            assert resp.status == 200
        await eventually(lambda: live(cluster, CVS_RESOURCE) is None)
        await asyncio.sleep(0.5)
        for resource in (DEPLOYMENTS, SERVICES, PDBS):
            child = live(cluster, resource)
            assert child is not None
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == cr["metadata"]["uid"] and ref["blockOwnerDeletion"] is True
        deletes = [r.url.path for r in list(cluster) if str(r.method).upper().endswith("DELETE")]
        assert deletes == [CVS_PATH.format(ns=NS) + "/tts"]  # only the user's own delete


def test_events_outside_handlers_are_written_directly() -> None:
    """The resync loop runs outside kopf's handlers, where kopf.event has no queue: its events
    (drift put back, status changes) still reach `kubectl describe`."""
    from cosyvoice_operator.handlers import _recorder

    posted: list[Obj] = []

    class Client:
        def create(self, resource: Any, body: Obj) -> Obj:
            posted.append(body)
            return body

    body = cvs()
    body["metadata"]["uid"] = "u-1"
    _recorder(Client())(body, "Normal", "Recreated", "Recreated Deployment tts (it was deleted)")  # type: ignore[arg-type]
    assert len(posted) == 1
    ev = posted[0]
    assert (ev["reason"], ev["type"], ev["involvedObject"]["name"], ev["involvedObject"]["uid"]) == (
        "Recreated", "Normal", "tts", "u-1")


async def test_a_gpu_serving_the_bundled_demo_model_is_told_so(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(gpu={"migProfile": "1g.10gb"}))
        await eventually(lambda: condition(cluster, "DemoModel")["status"] == "True")
        demo = condition(cluster, "DemoModel")
        assert demo["reason"] == "BundledDemoModelOnGPU" and "random weights" in demo["message"]

        def warnings() -> list[Obj]:
            return [r.data for r in requests(cluster, "POST", f"/api/v1/namespaces/{NS}/events")
                    if r.data["reason"] == "BundledDemoModelOnGPU"]

        await eventually(lambda: len(warnings()) == 1)  # kopf posts events asynchronously
        assert warnings()[0]["type"] == "Warning"
        assert live(cluster, DEPLOYMENTS) is not None  # served, not refused

        cluster.objects["v1/persistentvolumeclaims", NS, "cv2"] = {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "cv2", "namespace": NS, "labels": {OPT_IN_LABEL: OPT_IN_VALUE}}}
        await patch(cluster, CVS_PATH.format(ns=NS) + "/tts", {"spec": {"storage": {"pvc": {"claimName": "cv2"}}}})
        await eventually(lambda: condition(cluster, "DemoModel")["reason"] == "ModelFromStorage")


async def test_a_typo_dropped_from_the_applied_manifest_is_reported_with_the_field_it_meant(cluster: Any) -> None:
    body = cvs(autoscaling={"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2.0})
    applied = cvs(autoscaling={"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 2.0, "minReplica": 2})
    body["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied)}
    async with run_operator():
        await create(cluster, body)
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "UnknownField")
        message = condition(cluster, "Ready")["message"]
        assert "spec.autoscaling.minReplica: unknown field; did you mean 'minReplicas'?" in message
        assert live(cluster, DEPLOYMENTS) is None


async def test_an_autoscaled_service_without_replicas_starts_at_min_replicas(cluster: Any) -> None:
    async with run_operator():
        await create(cluster, cvs(replicas=1, autoscaling={"enabled": True, "minReplicas": 3, "maxReplicas": 6,
                                                           "targetQPSPerReplica": 2.0}))
        await eventually(lambda: live(cluster, DEPLOYMENTS) is not None)
        assert live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 3


async def test_replicas_above_max_replicas_that_reach_the_operator_are_refused(cluster: Any) -> None:
    """The CRD's rule refuses this at admission; a cluster with an older CRD lets it through to the operator."""
    async with run_operator():
        await create(cluster, cvs(replicas=20, autoscaling={"enabled": True, "maxReplicas": 12,
                                                            "targetQPSPerReplica": 2.0}))
        await eventually(lambda: condition(cluster, "Ready")["reason"] == "InvalidSpec")
        assert "spec.replicas must not exceed autoscaling.maxReplicas" in condition(cluster, "Ready")["message"]
        assert live(cluster, DEPLOYMENTS) is None  # nothing renders 20
