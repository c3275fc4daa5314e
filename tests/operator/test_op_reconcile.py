"""Reconciler decisions that are awkward to provoke through an emulator: name clashes, API errors,
missing optional APIs, forbidden reads, and how handlers translate errors for kopf."""
from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from cosyvoice_operator import kube
from cosyvoice_operator.handlers import reconcile_service
from cosyvoice_operator.reconcile import ChildConflict, Reconciler, namespace_matches
from cosyvoice_operator.spec import InvalidSpec
from cvs_testkit import merge_patch

Obj = dict[str, Any]




class FakeKube:
    """An in-memory API server: enough of ``kube.Kube`` for the reconciler, with injectable failures."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.calls: list[tuple[str, str, str | None]] = []
        self.fail: dict[tuple[str, str], kube.ApiError] = {}  # (verb, plural) → error

    def _check(self, verb: str, res: kube.Resource, name: str | None = None) -> None:
        self.calls.append((verb, res.plural, name))
        if (verb, res.plural) in self.fail:
            raise self.fail[verb, res.plural]

    def get(self, res: kube.Resource, namespace: str | None, name: str) -> Obj | None:
        self._check("get", res, name)
        found = self.objects.get((res.plural, namespace, name))
        return copy.deepcopy(found) if found else None

    def get_metadata(self, res: kube.Resource, namespace: str | None, name: str) -> Obj | None:
        self._check("get_metadata", res, name)
        found = self.objects.get((res.plural, namespace, name))
        return {"metadata": copy.deepcopy(found["metadata"])} if found else None

    def list(self, res: kube.Resource, namespace: str | None = None, labels: Any = None) -> list[Obj]:
        self._check("list", res)
        return [copy.deepcopy(o) for (plural, ns, _), o in self.objects.items()
                if plural == res.plural and (namespace is None or ns == namespace)
                and all(o["metadata"].get("labels", {}).get(k) == v for k, v in (labels or {}).items())]

    def create(self, res: kube.Resource, body: Obj) -> Obj:
        self._check("create", res, body["metadata"]["name"])
        self.objects[res.plural, body["metadata"].get("namespace"), body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def patch(self, res: kube.Resource, namespace: str | None, name: str, patch: Obj,
              subresource: str | None = None) -> Obj:
        self._check("patch" if subresource is None else f"patch/{subresource}", res, name)
        key = (res.plural, namespace, name)
        self.objects[key] = merge_patch(self.objects[key], patch)
        return self.objects[key]

    def delete(self, res: kube.Resource, namespace: str | None, name: str) -> bool:
        self._check("delete", res, name)
        return self.objects.pop((res.plural, namespace, name), None) is not None


def service(name: str = "tts", namespace: str = "default", **spec: Any) -> Obj:
    return {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1}, "spec": spec}


@pytest.fixture()
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture()
def recorded() -> list[tuple[str, str, str]]:
    return []


@pytest.fixture()
def reconciler(fake: FakeKube, recorded: list[tuple[str, str, str]]) -> Reconciler:
    return Reconciler(fake, record=lambda obj, t, r, m: recorded.append((t, r, m)))  # type: ignore[arg-type]


def add(fake: FakeKube, cr: Obj) -> Obj:
    fake.objects["cosyvoiceservices", cr["metadata"]["namespace"], cr["metadata"]["name"]] = cr
    return cr


def conditions(fake: FakeKube, name: str = "tts") -> dict[str, Obj]:
    cr = fake.objects["cosyvoiceservices", "default", name]
    return {c["type"]: c for c in cr["status"]["conditions"]}


def test_a_name_taken_by_someone_elses_deployment_is_not_hijacked(fake: FakeKube, reconciler: Reconciler) -> None:
    cr = add(fake, service())
    fake.objects["deployments", "default", "tts"] = {"apiVersion": "apps/v1", "kind": "Deployment",
                                                     "metadata": {"name": "tts", "labels": {"app": "mine"}}}
    with pytest.raises(ChildConflict, match="Deployment default/tts already exists and is not controlled by"):
        reconciler.reconcile(cr)
    assert ("patch", "deployments", "tts") not in fake.calls
    assert conditions(fake)["Ready"]["reason"] == "ChildConflict"


def test_children_applied_by_hand_from_render_are_adopted(fake: FakeKube, reconciler: Reconciler) -> None:
    cr = add(fake, service())
    from cosyvoice_operator import render
    from cosyvoice_operator.spec import parse_spec
    for obj in render.render(render.Owner("tts", "default"), parse_spec({})).objects:  # no owner references
        fake.objects[kube.resource_of(obj["apiVersion"], obj["kind"]).plural, "default", "tts"] = obj
    reconciler.reconcile(cr)
    dep = fake.objects["deployments", "default", "tts"]
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "uid-tts"
    assert not any(call[0] == "create" for call in fake.calls)


def test_missing_service_monitor_api_warns_once_and_goes_on(fake: FakeKube, reconciler: Reconciler,
                                                            recorded: list[tuple[str, str, str]]) -> None:
    cr = add(fake, service(monitoring={"serviceMonitor": {"enabled": True}}))
    fake.fail["create", "servicemonitors"] = kube.NotFound(404, "NotFound", "the server could not find the resource")
    reconciler.reconcile(cr)
    reconciler.reconcile(cr)
    assert [r for _, r, _ in recorded].count("ServiceMonitorUnavailable") == 1
    assert ("deployments", "default", "tts") in fake.objects
    assert conditions(fake)["Ready"]["reason"] == "WaitingForReplicas"


def test_the_api_servers_own_rejection_becomes_invalid_spec(fake: FakeKube, reconciler: Reconciler) -> None:
    cr = add(fake, service(affinity={"nodeAffinity": {"bogus": True}}))
    fake.fail["create", "deployments"] = kube.ApiError(422, "Invalid", 'Deployment.apps "tts" is invalid: bogus')
    with pytest.raises(InvalidSpec, match=r"the API server rejected Deployment tts: .*bogus"):
        reconciler.reconcile(cr)
    assert conditions(fake)["Ready"]["reason"] == "InvalidSpec"


def test_unreadable_nodes_leave_capacity_unknown(fake: FakeKube, reconciler: Reconciler) -> None:
    cr = add(fake, service(gpu={"migProfile": "1g.10gb"}))
    fake.fail["list", "nodes"] = kube.ApiError(403, "Forbidden", "nodes is forbidden")
    reconciler.reconcile(cr)
    cap = conditions(fake)["CapacityAvailable"]
    assert (cap["status"], cap["reason"]) == ("Unknown", "NodesUnreadable")


def test_resync_lists_nodes_once_for_all_services(fake: FakeKube, reconciler: Reconciler) -> None:
    for name, ns in (("a", "team-1"), ("b", "team-1"), ("c", "team-2"), ("d", "other")):
        cr = service(name, ns, gpu={"migProfile": "1g.10gb"})
        fake.objects["cosyvoiceservices", ns, name] = cr
    assert reconciler.resync(["team-*"]) == 3
    assert [c for c in fake.calls if c[:2] == ("list", "nodes")] == [("list", "nodes", None)]
    assert ("deployments", "other", "d") not in fake.objects


def test_an_unchanged_status_is_not_written_again(fake: FakeKube, reconciler: Reconciler) -> None:
    cr = add(fake, service())
    reconciler.reconcile(cr)
    writes = [c for c in fake.calls if c[0].startswith("patch")]
    reconciler.reconcile(cr)
    assert [c for c in fake.calls if c[0].startswith("patch")] == writes


@pytest.mark.parametrize("namespace,patterns,expected", [
    ("speech", ["speech"], True), ("speech-a", ["speech-*"], True), ("other", ["speech-*"], False),
    ("speech-b", ["speech-*,!speech-b"], False), ("team", ["!kube-*"], True), ("kube-system", ["!kube-*"], False),
])
def test_namespace_patterns(namespace: str, patterns: list[str], expected: bool) -> None:
    assert namespace_matches(namespace, patterns) is expected


class _Memo(dict):  # what kopf passes as ``memo``
    __getattr__ = dict.__getitem__


def test_handlers_stop_on_invalid_specs_and_back_off_on_api_errors(fake: FakeKube, reconciler: Reconciler) -> None:
    memo = _Memo(reconciler=reconciler)
    add(fake, service(gpu={"migProfile": "1g.20gb", "product": "NVIDIA-A100-SXM4-40GB"}))
    with pytest.raises(kopf.PermanentError, match=r"1g\.20gb does not exist on A100-40GB"):
        reconcile_service(body=service(), memo=memo, retry=0)  # type: ignore[arg-type]
    add(fake, service())
    fake.fail["get", "services"] = kube.ApiError(503, "ServiceUnavailable", "etcd leader changed")
    with pytest.raises(kopf.TemporaryError) as raised:
        reconcile_service(body=service(), memo=memo, retry=3)  # type: ignore[arg-type]
    assert raised.value.delay == 40


@pytest.mark.parametrize("name", ["../../kube-system/secrets/admin", "a/b", "..", ".", "a%2Fb", "a?b", "a#b"])
def test_a_name_that_is_not_one_path_segment_never_reaches_the_api_server(name: str) -> None:
    """Specs are validated first; this is the last line: a name that would address another namespace's
    object with the operator's rights is refused before any request is made."""
    for namespace, obj in ((name, "x"), ("default", name)):
        with pytest.raises(ValueError, match="cannot name a Kubernetes object"):
            kube.SECRETS.path(namespace, obj)
    assert kube.SECRETS.path("default", "tts.key-1") == "/api/v1/namespaces/default/secrets/tts.key-1"
