"""Every Kubernetes API permission the operator needs: the one list RBAC is generated from and checked against.

``operator/deploy/rbac.yaml`` and the Helm chart's ClusterRole/Roles are derived from :data:`PERMISSIONS`
(``python -m tools.sync_chart`` writes the chart's copy; ``tests/charts`` fails when either drifts), and a
test records the calls the running operator makes against an emulated API server and checks each one is
listed here. Adding an API call to the operator therefore means adding one line below.

Example::

    >>> from cosyvoice_operator.permissions import rules
    >>> rules(scope="cluster")[0]
    {'apiGroups': ['tts.cosyvoice.dev'], 'resources': ['cosyvoiceservices'], 'verbs': ['get', 'list', 'watch', 'patch']}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .constants import GROUP, PLURAL

Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete"]
Scope = Literal["cluster", "namespaced"]
VERB_ORDER: Final[tuple[Verb, ...]] = ("get", "list", "watch", "create", "update", "patch", "delete")


@dataclass(frozen=True)
class Permission:
    """One RBAC rule: an API group, one resource (``plural`` or ``plural/subresource``) and its verbs.

    ``cluster_wide`` rules can only be granted by a ClusterRole: cluster-scoped resources (nodes, CRDs,
    namespaces) and lists across all namespaces (pods on GPU nodes, for the capacity check). A
    namespaced install therefore still binds a small read-only ClusterRole for them.
    ``own_namespace`` rules are needed only in the operator's own namespace (its leader election Lease):
    a Role there, in every install mode.
    """
    api_group: str
    resource: str
    verbs: tuple[Verb, ...]
    why: str
    cluster_wide: bool = False
    own_namespace: bool = False
    # Granted only where the chart value of that name is enabled (a feature not every cluster has).
    feature: str | None = None


PERMISSIONS: Final[tuple[Permission, ...]] = (
    # The custom resource: kopf watches it and patches its finalizer/progress annotations; the reconciler reads it.
    Permission(GROUP, PLURAL, ("get", "list", "watch", "patch"), "watch and reconcile CosyVoiceServices"),
    Permission(GROUP, f"{PLURAL}/status", ("patch",), "write status (conditions, replicas, endpoint, autoscaling)"),
    # The autoscaler sets spec.replicas through the scale subresource, like `kubectl scale`.
    Permission(GROUP, f"{PLURAL}/scale", ("patch",), "autoscaler: set replicas"),
    # The children the operator renders and owns.
    Permission("apps", "deployments", ("get", "list", "watch", "create", "patch", "delete"),
               "the inference Deployment"),
    Permission("", "services", ("get", "list", "watch", "create", "patch", "delete"), "the inference Service"),
    Permission("policy", "poddisruptionbudgets", ("get", "list", "watch", "create", "patch", "delete"),
               "the inference PodDisruptionBudget"),
    Permission("monitoring.coreos.com", "servicemonitors", ("get", "create", "patch", "delete"),
               "the inference ServiceMonitor (when spec.monitoring asks for one; not watched)"),
    # Status: pod failure reasons (CrashLoopBackOff, image pull errors, Pending on GPUs).
    Permission("", "pods", ("get", "list", "watch"), "report failing inference pods in status"),
    # GPU capacity: MIG slices already held by pods in any namespace.
    Permission("", "pods", ("list",), "count GPU/MIG slices held by all pods", cluster_wide=True),
    # A Secret, ConfigMap, claim or ServiceAccount a CosyVoiceService's pods would use must carry the opt-in
    # label: the operator reads their metadata only (never a Secret's data; metrics credentials are files
    # mounted into the operator's pod).
    Permission("", "secrets", ("get",), "check the opt-in label of Secrets a CosyVoiceService names (metadata)"),
    Permission("", "configmaps", ("get",), "check the opt-in label of ConfigMaps a CosyVoiceService names (metadata)"),
    Permission("", "serviceaccounts", ("get",),
               "check the opt-in label of the ServiceAccount a CosyVoiceService names (metadata)"),
    # The claims' opt-in label; the voice store's access modes: one the replicas cannot share gets a warning.
    Permission("", "persistentvolumeclaims", ("get",), "check the opt-in label of claims a CosyVoiceService mounts "
               "(metadata); warn when spec.voices.pvc cannot be shared by the replicas"),
    # kopf posts Kubernetes events about handler outcomes.
    Permission("", "events", ("create",), "kopf's events on CosyVoiceServices"),
    # Cluster-scoped: GPU capacity (allocatable MIG slices) and kopf's resource/namespace discovery.
    Permission("", "nodes", ("list",), "GPU/MIG capacity check", cluster_wide=True),
    Permission("apiextensions.k8s.io", "customresourcedefinitions", ("get", "list", "watch"),
               "kopf discovers the CosyVoiceService resource", cluster_wide=True),
    Permission("", "namespaces", ("get", "list", "watch"), "kopf follows namespaces as they appear",
               cluster_wide=True),
    # A canary's traffic split on a Gateway (spec.canary.gateway): only with the Gateway API installed.
    Permission("gateway.networking.k8s.io", "httproutes", ("get", "create", "patch", "delete"),
               "the canary's HTTPRoute (spec.canary.gateway)", feature="gatewayAPI"),
    # Leader election among operator replicas: one Lease in the operator's own namespace.
    Permission("coordination.k8s.io", "leases", ("get", "create", "patch"), "leader election (one Lease)",
               own_namespace=True),
)


def rules(scope: Scope = "cluster", *, cluster_wide: bool | None = None,
          own_namespace: bool = False, feature: str | None = None) -> list[dict[str, Any]]:
    """RBAC ``rules`` for a Role or ClusterRole, merged per (apiGroup, resource).

    ``scope="cluster"``: everything for the watched namespaces (the operator watches all of them).
    ``scope="namespaced"`` drops namespace discovery (the namespaces are listed explicitly).
    ``cluster_wide`` filters further: True → only the rules a ClusterRole must hold, False → only the
    per-namespace ones (a Role). ``own_namespace=True``: only the rules of the Role in the operator's
    own namespace (which the others never include). ``feature``: only the rules of that optional feature
    (the others never include them).
    """
    merged: dict[tuple[str, str], set[str]] = {}
    for p in PERMISSIONS:
        if p.own_namespace != own_namespace or p.feature != feature:
            continue
        if scope == "namespaced" and p.resource == "namespaces":
            continue
        if cluster_wide is not None and p.cluster_wide != cluster_wide:
            continue
        merged.setdefault((p.api_group, p.resource), set()).update(p.verbs)
    return [{"apiGroups": [group], "resources": [resource], "verbs": [v for v in VERB_ORDER if v in verbs]}
            for (group, resource), verbs in merged.items()]


def granted(api_group: str, resource: str) -> frozenset[str]:
    """The verbs :data:`PERMISSIONS` grants on one resource (empty when it is not listed)."""
    return frozenset(v for p in PERMISSIONS if (p.api_group, p.resource) == (api_group, resource) for v in p.verbs)
