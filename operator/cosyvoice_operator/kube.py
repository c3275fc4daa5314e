"""A small, generic Kubernetes client over the official ``kubernetes`` package: plain dicts in and out.

The only module that talks to the API server. Errors are classified once here: ``NotFound``,
``Conflict``, and ``ApiError.transient`` (worth a retry with backoff) versus everything else.

Every call made through it must be granted in ``permissions.py`` (the RBAC source): tests/charts
scans the operator's calls and records the running operator's requests to check.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from .constants import API_VERSION, KIND, PLURAL

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# Metadata only: the operator checks a Secret's labels without ever receiving its data.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
TRANSIENT_STATUSES = frozenset({0, 408, 409, 429, 500, 502, 503, 504})


def _segment(value: str) -> str:
    """A namespace or name as one path segment. Names come from specs: one that is not a single segment
    ('../../kube-system/secrets/x', 'a%2Fb') would address another object with the operator's rights."""
    if value in (".", "..") or any(c in value for c in "/%?#\\"):
        raise ValueError(f"{value!r} cannot name a Kubernetes object")
    return value


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(_segment(name))
            if subresource:
                parts.append(subresource)
        return "/".join(parts)


COSYVOICESERVICES = Resource(API_VERSION, KIND, PLURAL)
DEPLOYMENTS = Resource("apps/v1", "Deployment", "deployments")
SERVICES = Resource("v1", "Service", "services")
PDBS = Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
SERVICE_MONITORS = Resource("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors")
PODS = Resource("v1", "Pod", "pods")
NODES = Resource("v1", "Node", "nodes", namespaced=False)
SECRETS = Resource("v1", "Secret", "secrets")
CONFIG_MAPS = Resource("v1", "ConfigMap", "configmaps")
PVCS = Resource("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SERVICE_ACCOUNTS = Resource("v1", "ServiceAccount", "serviceaccounts")
LEASES = Resource("coordination.k8s.io/v1", "Lease", "leases")
HTTP_ROUTES = Resource("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes")
_BY_KIND = {(r.api_version, r.kind): r for r in (COSYVOICESERVICES, DEPLOYMENTS, SERVICES, PDBS, SERVICE_MONITORS,
                                                 PODS, NODES, HTTP_ROUTES)}


def resource_of(api_version: str, kind: str) -> Resource:
    return _BY_KIND[(api_version, kind)]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT_STATUSES


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


def _error(status: int, body: bytes | str | None, fallback: str) -> ApiError:
    reason, message = fallback, ""
    try:
        parsed = json.loads(body or b"{}")
        reason = parsed.get("reason") or fallback
        message = parsed.get("message") or ""
    except (ValueError, AttributeError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body or ""))[:500]
    cls = NotFound if status == 404 else Conflict if status == 409 else ApiError
    return cls(status, reason, message)


def _matches(obj: Obj, labels: Mapping[str, str] | None) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in (labels or {}).items())


class Kube:
    """Synchronous calls; kopf runs sync handlers in a thread pool, which keeps the event loop free."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout: tuple[float, float] = (5.0, 30.0)) -> None:
        self.api = api_client
        self.timeout = timeout

    @classmethod
    def from_environment(cls, retries: int | None = None) -> Kube:
        """In-cluster service account first, then ``$KUBECONFIG`` / ``~/.kube/config``. ``retries``:
        urllib3's retries per call (None: the kubernetes package's default)."""
        config = kubernetes.client.Configuration()
        config.retries = retries
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=config)
        return cls(kubernetes.client.ApiClient(config))

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def request(self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str = "application/json", accept: str = "application/json") -> Obj | None:
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            verb, url, headers, payload, _ = self.api.param_serialize(
                method=method, resource_path=path, query_params=list((query or {}).items()),
                header_params=headers, body=body, auth_settings=["BearerToken"])
            response = self.api.call_api(verb, url, header_params=headers, body=payload,
                                         _request_timeout=self.timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        except ApiException as exc:
            raise _error(exc.status or 0, exc.body, exc.reason or "ApiException") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc)) from None
        if not 200 <= response.status < 300:
            raise _error(response.status, data, response.reason or "Error")
        return json.loads(data) if data else None

    def get(self, res: Resource, namespace: str | None, name: str) -> Obj | None:
        try:
            return self.request("GET", res.path(namespace, name))
        except NotFound:
            return None

    def get_metadata(self, res: Resource, namespace: str | None, name: str) -> Obj | None:
        """The object's metadata only (``PartialObjectMetadata``); None when it does not exist."""
        try:
            obj = self.request("GET", res.path(namespace, name), accept=METADATA_ONLY) or {}
        except NotFound:
            return None
        return {"metadata": obj.get("metadata") or {}}  # never keep more, whatever the server sent

    def list(self, res: Resource, namespace: str | None = None, labels: Mapping[str, str] | None = None) -> list[Obj]:
        query = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
        result = self.request("GET", res.path(namespace), query=query) or {}
        # Filter here too: the selector is an optimisation some API servers (and emulators) ignore.
        return [item for item in result.get("items") or [] if _matches(item, labels)]

    def create(self, res: Resource, body: Obj) -> Obj:
        namespace = (body.get("metadata") or {}).get("namespace")
        return self.request("POST", res.path(namespace), body=body) or body

    def patch(self, res: Resource, namespace: str | None, name: str, patch: Obj,
              subresource: str | None = None) -> Obj:
        return self.request("PATCH", res.path(namespace, name, subresource), body=patch,
                            content_type=MERGE_PATCH) or {}

    def delete(self, res: Resource, namespace: str | None, name: str) -> bool:
        try:
            self.request("DELETE", res.path(namespace, name), body={"propagationPolicy": "Background"})
        except NotFound:
            return False
        return True
