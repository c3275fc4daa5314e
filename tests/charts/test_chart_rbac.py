"""Least-privilege RBAC: one list of the operator's API calls (cosyvoice_operator.permissions) is what the
chart's ClusterRole/Roles and operator/deploy/rbac.yaml grant, and every call the operator makes is in it."""
from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import ROOT, Obj, of_kind
from cosyvoice_operator import kube, permissions, render

OPERATOR_PKG = ROOT / "operator" / "cosyvoice_operator"
Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def expand(rules: list[Obj]) -> set[Grant]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def group_of(api_version: str) -> str:
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def test_cluster_mode_grants_exactly_the_permissions_list(rendered: dict[str, list[Obj]]) -> None:
    (role,) = of_kind(rendered["defaults"], "ClusterRole")
    assert expand(role["rules"]) == expand(permissions.rules("cluster"))
    (own,) = of_kind(rendered["defaults"], "Role")  # the Lease, in the operator's own namespace only
    assert own["metadata"]["namespace"] == "cosyvoice-system"
    assert expand(own["rules"]) == expand(permissions.rules(own_namespace=True)) == {
        ("coordination.k8s.io", "leases", v) for v in ("get", "create", "patch")}


def test_namespaced_mode_uses_roles_and_a_read_only_cluster_role(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["namespaced"]
    (cluster_role,) = of_kind(docs, "ClusterRole")
    assert expand(cluster_role["rules"]) == expand(permissions.rules("namespaced", cluster_wide=True))
    assert {verb for _, _, verb in expand(cluster_role["rules"])} <= {"get", "list", "watch"}
    assert ("", "namespaces", "list") not in expand(cluster_role["rules"])  # namespaces are listed explicitly
    for role in of_kind(docs, "Role"):
        own = role["metadata"]["name"].endswith("-leader-election")
        assert expand(role["rules"]) == expand(permissions.rules("namespaced", cluster_wide=False, own_namespace=own))


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_no_wildcards_and_no_secrets_unless_listed(rendered: dict[str, list[Obj]], name: str) -> None:
    listed = {(p.api_group, p.resource) for p in permissions.PERMISSIONS}
    for role in of_kind(rendered[name], "ClusterRole") + of_kind(rendered[name], "Role"):
        for group, resource, verb in expand(role["rules"]):
            assert "*" not in (group, resource, verb), role["metadata"]["name"]
            assert (group, resource) in listed


def test_plain_install_manifests_grant_the_same_permissions() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "operator" / "deploy" / "rbac.yaml").read_text()) if d]
    (role,) = of_kind(docs, "ClusterRole")
    assert expand(role["rules"]) == expand(permissions.rules("cluster"))
    (own,) = of_kind(docs, "Role")
    assert expand(own["rules"]) == expand(permissions.rules(own_namespace=True))


def test_secrets_are_only_read_for_their_labels() -> None:
    """The one Secret permission is `get`, used for metadata only (the opt-in label): never list or watch,
    and no call in the operator reads a Secret's data."""
    assert permissions.granted("", "secrets") == {"get"}
    calls = [c for c in _kube_calls() if not isinstance(c[3], str) and any(r.plural == "secrets" for r in c[3])]
    assert calls and all(verb == "get" for _, _, verb, _, _ in calls)
    for file, line, *_ in calls:  # and that get is the metadata-only one
        source = (OPERATOR_PKG / file).read_text().splitlines()[line - 1]
        assert ".get_metadata(" in source, f"{file}:{line} may read a Secret's data: {source.strip()}"


# --- every API call of the operator is in the list ---------------------------------------------

_KUBE_VERBS = {"get": "get", "get_metadata": "get", "list": "list", "create": "create", "patch": "patch",
               "delete": "delete"}
_KUBE_RECEIVERS = {"kube", "client"}  # how the operator's code names its kube.Kube


def _module_globals(path: Path) -> dict[str, Any]:
    """The module-level names of one operator module (to resolve ``SECRETS`` to a kube.Resource)."""
    import importlib
    rel = path.relative_to(OPERATOR_PKG.parent).with_suffix("")
    return vars(importlib.import_module(".".join(rel.parts)))


def _kube_calls() -> list[tuple[str, int, str, list[kube.Resource] | str, str | None]]:
    """(file, line, verb, resources, subresource) of every kube.Kube call in the operator package.

    A call is ``<receiver>.<get|list|create|patch|delete>(<resource>, ...)`` where the resource is a
    kube.Resource constant (``kube.PODS``, a module's own ``SECRETS``), or any first argument when the
    receiver is the client (``self.kube``, ``client``): then it is computed (``kube.resource_of(...)``)
    and stands for any child render.py owns. An unresolvable constant is reported as its name."""
    kube_consts = {n: v for n, v in vars(kube).items() if isinstance(v, kube.Resource)}
    children = [kube.resource_of(*k) for k in render.CHILD_KINDS]
    calls: list[tuple[str, int, str, list[kube.Resource] | str, str | None]] = []
    for path in sorted(OPERATOR_PKG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        local = None
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _KUBE_VERBS and node.args):
                continue
            receiver = node.func.value
            receiver_name = receiver.attr if isinstance(receiver, ast.Attribute) else \
                receiver.id if isinstance(receiver, ast.Name) else ""
            first = node.args[0]
            if isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) and first.value.id == "kube":
                resources: list[kube.Resource] | str = [kube_consts[first.attr]] if first.attr in kube_consts \
                    else f"kube.{first.attr}"
            elif isinstance(first, ast.Name) and first.id.isupper():
                local = local if local is not None else _module_globals(path)
                value = local.get(first.id)
                if value is not None and not isinstance(value, kube.Resource):
                    continue  # a string constant: annotations.get(LAST_APPLIED_ANNOTATION)
                resources = [value] if value is not None else first.id
            elif isinstance(first, ast.Subscript) and isinstance(first.value, ast.Name) and first.value.id.isupper():
                # a module's table of resources (``_REFERENCED[kind]``): any of its values
                local = local if local is not None else _module_globals(path)
                table = local.get(first.value.id)
                resources = [v for v in table.values() if isinstance(v, kube.Resource)] \
                    if isinstance(table, dict) else first.value.id
            elif receiver_name in _KUBE_RECEIVERS:
                resources = children
            else:
                continue  # dict.get(...), list(...) etc.
            sub = next((kw.value.value for kw in node.keywords if kw.arg == "subresource"
                        and isinstance(kw.value, ast.Constant)), None)
            calls.append((str(path.relative_to(OPERATOR_PKG)), node.lineno, _KUBE_VERBS[node.func.attr],
                          resources, sub))
    return calls


def test_every_kube_call_in_the_operator_code_is_granted() -> None:
    calls = _kube_calls()
    assert len(calls) >= 8, "the scan found too few calls: did kube.Kube's interface change?"
    missing = []
    for file, line, verb, resources, sub in calls:
        if isinstance(resources, str):
            missing.append(f"{file}:{line} {verb} on {resources}: not a kube.Resource constant")
            continue
        for res in resources:
            resource = f"{res.plural}/{sub}" if sub else res.plural
            if verb not in permissions.granted(group_of(res.api_version), resource):
                missing.append(f"{file}:{line} {verb} {group_of(res.api_version)}/{resource}")
    assert missing == [], "add these to operator/cosyvoice_operator/permissions.py"


def _grant_of(method: str, path: str, params: dict[str, str]) -> tuple[Grant, str | None] | None:
    """The RBAC (group, resource, verb) and namespace of one API request; None for discovery."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    watching = str(params.get("watch", "false")).lower() in ("true", "1")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(method) or (
        ("delete" if name else "deletecollection") if method == "DELETE"
        else "watch" if watching else "get" if name else "list")
    return (group, f"{resource}/{sub}" if sub else resource, verb), namespace


def _allowed(grant: Grant, namespace: str | None, cluster_rules: set[Grant],
             namespaced_rules: dict[str, set[Grant]]) -> bool:
    if grant in cluster_rules:
        return True
    return namespace is not None and grant in namespaced_rules.get(namespace, set())


@pytest.mark.timeout(120)
@pytest.mark.kmock(cls=__import__("cvs_testkit").Emulator)
@pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")
async def test_the_running_operator_makes_only_granted_calls(cluster: Any, helm: Any) -> None:
    """The real operator (every kopf handler) against the emulated API server, through a service's life:
    create (GPU capacity check, ServiceMonitor), edit, a child changed by hand, a failing pod, resync,
    delete. Every request it sends must be allowed by the chart's namespaced-mode RBAC for that namespace."""
    from chartkit import OPERATOR_CHART
    from cvs_testkit import CVS_PATH, eventually, run_operator

    docs = helm.render(OPERATOR_CHART, {"watch": {"allNamespaces": False, "namespaces": ["default"]}})
    cluster_rules = expand(of_kind(docs, "ClusterRole")[0]["rules"])
    namespaced_rules = {r["metadata"]["namespace"]: expand(r["rules"]) for r in of_kind(docs, "Role")}

    cluster.objects["v1/nodes", None, "gpu-a"] = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a", "uid": "n1", "resourceVersion": "1",
                                                          "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}, "conditions": [{"type": "Ready", "status": "True"}]}}
    base = CVS_PATH.format(ns="default")
    body = {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": "tts", "namespace": "default"},
            "spec": {"gpu": {"migProfile": "1g.10gb"}, "storage": {"storageUri": "s3://m/cv2.tar.gz"},
                     "apiKeySecret": {"name": "tts-key", "key": "api-key"},
                     "monitoring": {"serviceMonitor": {"enabled": True}}}}
    cluster.objects["v1/secrets", "default", "tts-key"] = {  # opted in: its label is read, then the pods mount it
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tts-key", "namespace": "default", "uid": "s1",
                                                           "resourceVersion": "1", "labels": {
                                                               "tts.cosyvoice.dev/allow-reference": "true"}},
        "data": {"api-key": "c2VjcmV0"}}
    mine = {"X-Test-Client": "1"}  # the test's own requests (a user's kubectl), not the operator's
    merge = {"Content-Type": "application/merge-patch+json", **mine}

    def seen(method: str, fragment: str) -> bool:
        return any(str(r.method).upper().endswith(method) and fragment in r.url.path for r in list(cluster))

    async with run_operator(namespaces=("default",), resync_seconds=0.3):
        async with cluster.post(base, json=body, headers=mine) as resp:
            assert resp.status in (200, 201)
        await eventually(lambda: seen("POST", "/deployments") and seen("GET", "/nodes"))
        async with cluster.patch("/apis/apps/v1/namespaces/default/deployments/tts",
                                 json={"spec": {"replicas": 5}}, headers=merge) as resp:
            assert resp.status == 200
        async with cluster.patch(f"{base}/tts", json={"spec": {"replicas": 2, "monitoring": {
                "serviceMonitor": {"enabled": False}}}}, headers=merge) as resp:
            assert resp.status == 200
        await eventually(lambda: seen("PATCH", "/deployments/tts") and seen("PATCH", "/cosyvoiceservices/tts/status"))
        await asyncio.sleep(1.0)  # a few resyncs
        async with cluster.delete(f"{base}/tts", headers=mine) as resp:
            assert resp.status == 200
        await asyncio.sleep(0.5)

    denied, checked = [], set()
    for request in list(cluster):
        if request.headers.get("X-Test-Client"):
            continue
        parsed = _grant_of(str(request.method).upper().rsplit(".", 1)[-1], request.url.path, dict(request.params))
        if parsed is None:
            continue
        grant, namespace = parsed
        checked.add(grant)
        if not _allowed(grant, namespace, cluster_rules, namespaced_rules):
            denied.append(f"{request.method} {request.url.path} → {grant} in {namespace}")
    assert denied == [], "add these to operator/cosyvoice_operator/permissions.py"
    assert {("", "nodes", "list"), ("", "pods", "list"), ("apps", "deployments", "create"),
            ("apps", "deployments", "patch"), ("apps", "deployments", "watch"), ("", "events", "create"),
            ("monitoring.coreos.com", "servicemonitors", "create"), ("", "secrets", "get"),
            ("tts.cosyvoice.dev", "cosyvoiceservices/status", "patch")} <= checked, sorted(checked)
