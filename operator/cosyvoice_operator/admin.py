"""What the cluster administrator decides, and CosyVoiceService authors cannot: the metrics sources
the autoscaler may query (with their credentials) and the bounds every service must stay within.

The operator reads it from one YAML file (``cosyvoice-operator run --config FILE``; the Helm chart
renders it from its values into a ConfigMap). Like KEDA's ClusterTriggerAuthentication, a source's
address and credentials belong to the administrator and a CR only picks one by name
(``spec.autoscaling.metricsSource``): a CR author can never make the operator send a credential to an
address of their choosing. Credentials are files (a Secret of the operator's own namespace mounted into
its pod), so the operator needs no permission to read Secrets for them.

Pure functions only: parsing, bound checks, source resolution. Example::

    >>> policy = AdminPolicy.model_validate({"bounds": {"maxReplicas": 8}})
    >>> policy.bounds.max_replicas
    8
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .spec import Autoscaling, CosyVoiceServiceSpec, InvalidSpec

# The Helm values these settings come from, named in messages so that a CR author knows whom to ask.
HELM_SOURCES = "metricsSources"
HELM_BOUNDS = "bounds"


class PolicyViolation(InvalidSpec):
    """The spec is valid but outside the bounds the cluster administrator set for the operator."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class MetricsSource(_Model):
    """A Prometheus the autoscaler may query, with the credentials the administrator gave it."""
    url: str = Field(pattern=r"^https?://\S+$", max_length=2048)
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    # Namespaces whose services may use the source (globs); empty: every namespace.
    namespaces: tuple[str, ...] = ()
    # Whether a service may run its own PromQL (spec.autoscaling.queries) here. Off: a query is text the CR
    # author writes, and it would run with this source's credentials over every namespace's series; the
    # built-in queries select the service's own. On for a Prometheus that holds only what its users may read.
    allow_query_overrides: bool = False

    def serves(self, namespace: str) -> bool:
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, p) for p in self.namespaces)


class Bounds(_Model):
    # None: only the CRD's own limits apply.
    max_replicas: int | None = Field(default=None, ge=1)
    # Registry or repository prefixes (``ghcr.io/cosyvoice-k8s``, ``registry.example.com``); empty: any image.
    allowed_image_registries: tuple[str, ...] = ()
    # Resource names every server container must set a limit for (e.g. ``memory``).
    required_resource_limits: tuple[str, ...] = ()
    # Scheduling and exposure a service may ask for; empty: what Kubernetes accepts, except what only the
    # cluster's own components should have (RESERVED_*), which must be listed to be allowed.
    allowed_priority_classes: tuple[str, ...] = ()
    allowed_toleration_keys: tuple[str, ...] = ()  # "" allows the keyless toleration of every taint
    allowed_service_types: tuple[Literal["ClusterIP", "NodePort", "LoadBalancer"], ...] = ()
    # Key prefixes of podAnnotations, podLabels and service.annotations (e.g. ``prometheus.io/``, ``team``).
    allowed_metadata_prefixes: tuple[str, ...] = ()


# Priority classes that preempt everything (Kubernetes' own, for its critical components), and taints that
# keep workloads off control-plane nodes: a service gets them only where the administrator lists them.
RESERVED_PRIORITY_PREFIX = "system-"
RESERVED_TOLERATION_PREFIX = "node-role.kubernetes.io/"


class AdminPolicy(_Model):
    metrics_sources: dict[str, MetricsSource] = Field(default_factory=dict)
    # The source a service uses when it names none ("" or None: a service must name one).
    default_metrics_source: str | None = None
    bounds: Bounds = Field(default_factory=Bounds)

    @model_validator(mode="after")
    def _default_exists(self) -> AdminPolicy:
        if self.default_metrics_source and self.default_metrics_source not in self.metrics_sources:
            raise ValueError(f"defaultMetricsSource {self.default_metrics_source!r} is not one of metricsSources "
                             f"({', '.join(sorted(self.metrics_sources)) or 'none defined'})")
        return self


def load(path: str | Path | None) -> AdminPolicy:
    """The policy in ``path`` (YAML); no file: no metrics sources and no bounds. Raises ValueError."""
    if path is None:
        return AdminPolicy()
    try:
        raw: Any = yaml.safe_load(Path(path).read_text()) or {}
        return AdminPolicy.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read the operator configuration {path}: {exc}") from None
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid operator configuration {path}: {details}") from None


# --- bounds -------------------------------------------------------------------------------------------

def image_repository(image: str) -> str:
    """``registry/path`` of an image reference, with Docker Hub's implicit names made explicit.

    >>> image_repository("ubuntu:24.04")
    'docker.io/library/ubuntu'
    >>> image_repository("ghcr.io/cosyvoice-k8s/cosyvoice-server@sha256:abc")
    'ghcr.io/cosyvoice-k8s/cosyvoice-server'
    """
    name = image.split("@", 1)[0]
    head, _, tail = name.rpartition("/")
    name = f"{head}/{tail.split(':', 1)[0]}" if head else tail.split(":", 1)[0]
    first, _, rest = name.partition("/")
    if first in ("docker.io", "index.docker.io") and rest:  # Docker Hub spelt out: the same images as unqualified
        name = rest
    elif rest and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """Prefixes match whole path components: ``ghcr.io/team`` allows ``ghcr.io/team/x``, not ``ghcr.io/teammate``."""
    if not prefixes:
        return True
    repo = image_repository(image)
    return any(repo == p.rstrip("/") or repo.startswith(p.rstrip("/") + "/") for p in prefixes)


def check_bounds(spec: CosyVoiceServiceSpec, limits: dict[str, Any], bounds: Bounds) -> None:
    """Raise PolicyViolation naming every bound the spec exceeds. ``limits``: the server container's
    rendered resource limits (defaults included)."""
    problems: list[str] = []
    if bounds.max_replicas is not None:
        auto = spec.autoscaling
        if spec.replicas > bounds.max_replicas:
            problems.append(f"spec.replicas {spec.replicas} exceeds the cluster's maximum of {bounds.max_replicas}")
        if auto is not None and auto.max_replicas is not None and auto.max_replicas > bounds.max_replicas:
            problems.append(f"spec.autoscaling.maxReplicas {auto.max_replicas} exceeds the cluster's maximum of "
                            f"{bounds.max_replicas}")
    if not image_allowed(spec.image, bounds.allowed_image_registries):
        problems.append(f"spec.image {spec.image!r} is not from an allowed registry "
                        f"({', '.join(bounds.allowed_image_registries)})")
    missing = [r for r in bounds.required_resource_limits if r not in limits]
    if missing:
        problems.append(f"spec.resources.limits must set {', '.join(missing)}")
    problems += scheduling_problems(spec, bounds)
    if problems:
        raise PolicyViolation("; ".join(problems) + f" (bounds set by the cluster administrator: operator "
                                                    f"chart value {HELM_BOUNDS})")


def scheduling_problems(spec: CosyVoiceServiceSpec, bounds: Bounds) -> list[str]:
    """Where the spec's priority class, tolerations, Service type and metadata keys leave the bounds."""
    problems: list[str] = []
    priority = spec.priority_class_name
    if priority is not None and (priority not in bounds.allowed_priority_classes if bounds.allowed_priority_classes
                                 else priority.startswith(RESERVED_PRIORITY_PREFIX)):
        problems.append(f"spec.priorityClassName {priority!r} is not allowed "
                        f"({', '.join(bounds.allowed_priority_classes) or f'any but {RESERVED_PRIORITY_PREFIX}*'})")
    for toleration in spec.tolerations:
        key = toleration.key or ""
        reserved = not key or key.startswith(RESERVED_TOLERATION_PREFIX)
        if key not in bounds.allowed_toleration_keys and (bounds.allowed_toleration_keys or reserved):
            what = f"key {key!r}" if key else "no key (it tolerates every taint)"
            allowed = ", ".join(map(repr, bounds.allowed_toleration_keys)) or \
                f"any key but none and {RESERVED_TOLERATION_PREFIX}*"
            problems.append(f"spec.tolerations: a toleration with {what} is not allowed ({allowed})")
    if bounds.allowed_service_types and spec.service.type not in bounds.allowed_service_types:
        problems.append(f"spec.service.type {spec.service.type} is not allowed "
                        f"({', '.join(bounds.allowed_service_types)})")
    if bounds.allowed_metadata_prefixes:
        for field, keys in (("podAnnotations", spec.pod_annotations), ("podLabels", spec.pod_labels),
                            ("service.annotations", spec.service.annotations)):
            refused = [k for k in keys if not k.startswith(bounds.allowed_metadata_prefixes)]
            if refused:
                problems.append(f"spec.{field} {', '.join(refused)}: keys must start with one of "
                                f"{', '.join(bounds.allowed_metadata_prefixes)}")
    return problems


# --- metrics sources ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceError:
    """Why a service has no usable metrics source: a condition reason and a message for its author."""
    reason: str
    message: str


def resolve_source(policy: AdminPolicy, namespace: str,
                   auto: Autoscaling) -> tuple[str, MetricsSource] | SourceError:
    """The admin-defined source a service's ``spec.autoscaling`` selects.

    ``metricsSource`` names one; else a legacy ``prometheus.url`` selects the source with that exact
    URL (its credentials are the administrator's: Secrets named in the CR are never read); else the
    default source. Everything else fails closed.
    """
    names = ", ".join(sorted(n for n, s in policy.metrics_sources.items() if s.serves(namespace))) or "none"
    legacy = auto.prometheus
    if legacy is not None and (legacy.bearer_token_secret or legacy.ca_secret or legacy.insecure_skip_verify):
        return SourceError("MetricsSourceNotAllowed", "spec.autoscaling.prometheus may not carry credentials or TLS "
                           "settings (bearerTokenSecret, caSecret, insecureSkipVerify): the operator only sends "
                           "credentials its administrator configured; set spec.autoscaling.metricsSource to one of: "
                           f"{names}")
    name = auto.metrics_source
    if name is None and legacy is not None:
        matches = [n for n, s in policy.metrics_sources.items()
                   if s.url.rstrip("/") == legacy.url.rstrip("/") and s.serves(namespace)]
        if not matches:
            return SourceError("MetricsSourceNotAllowed", f"spec.autoscaling.prometheus.url {legacy.url} is not a "
                               "metrics source the operator's administrator allows; set spec.autoscaling.metricsSource"
                               f" to one of: {names}")
        name = sorted(matches)[0]
    if name is None:
        name = policy.default_metrics_source
    if not name:
        return SourceError("NoMetricsSource", "autoscaling is enabled but no metrics source is set: set "
                           f"spec.autoscaling.metricsSource to one of: {names} (sources are defined by the operator's "
                           f"administrator, chart value {HELM_SOURCES})")
    source = policy.metrics_sources.get(name)
    if source is None or not source.serves(namespace):
        return SourceError("MetricsSourceNotAllowed", f"metrics source {name!r} is not defined for namespace "
                           f"{namespace}; available: {names}")
    queries = auto.queries
    overridden = [info.alias or field for field, info in type(queries).model_fields.items()
                  if getattr(queries, field) is not None] if queries is not None else []
    if overridden and not source.allow_query_overrides:
        return SourceError("QueryOverrideNotAllowed", f"spec.autoscaling.queries ({', '.join(overridden)}) would run "
                           f"on metrics source {name!r} with the operator's credentials, which read every namespace's "
                           "series; its administrator allows that per source (operator chart value "
                           f"{HELM_SOURCES}.{name}.allowQueryOverrides). Remove spec.autoscaling.queries: the built-in "
                           "queries select this service's own series")
    return name, source
