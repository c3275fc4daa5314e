"""The administrator's settings (cosyvoice_operator.admin): loading, bounds, and which metrics source a
service gets. Pure functions, no cluster."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cosyvoice_operator import admin
from cosyvoice_operator.spec import parse_spec

POLICY = admin.AdminPolicy.model_validate({
    "metricsSources": {"cluster": {"url": "http://prom.monitoring:9090/"},
                       "team": {"url": "https://team-prom:9090", "namespaces": ["team-*"]}},
    "defaultMetricsSource": "cluster"})


def auto(**fields: Any) -> Any:
    return parse_spec({"autoscaling": {"enabled": True, "maxReplicas": 4, "targetQPSPerReplica": 1,
                                       **fields}}).autoscaling


@pytest.mark.parametrize("namespace, fields, expected", [
    ("speech", {}, "cluster"),  # the default
    ("team-a", {"metricsSource": "team"}, "team"),
    ("speech", {"prometheus": {"url": "http://prom.monitoring:9090"}}, "cluster"),  # legacy URL, same address
    ("speech", {"metricsSource": "team"}, ("MetricsSourceNotAllowed", "not defined for namespace speech")),
    ("speech", {"metricsSource": "missing"}, ("MetricsSourceNotAllowed", "available: cluster")),
    ("speech", {"prometheus": {"url": "http://attacker:80"}}, ("MetricsSourceNotAllowed", "is not a metrics source")),
    ("speech", {"prometheus": {"url": "http://prom.monitoring:9090", "bearerTokenSecret": {"name": "s", "key": "k"}}},
     ("MetricsSourceNotAllowed", "may not carry credentials")),
    ("speech", {"prometheus": {"url": "http://prom.monitoring:9090", "insecureSkipVerify": True}},
     ("MetricsSourceNotAllowed", "may not carry credentials")),
])
def test_a_service_gets_only_a_source_the_administrator_defined(namespace: str, fields: dict[str, Any],
                                                                expected: Any) -> None:
    found = admin.resolve_source(POLICY, namespace, auto(**fields))
    if isinstance(expected, str):
        assert not isinstance(found, admin.SourceError) and found[0] == expected
    else:
        assert isinstance(found, admin.SourceError)
        assert found.reason == expected[0] and expected[1] in found.message


def test_without_a_default_a_service_must_name_a_source() -> None:
    found = admin.resolve_source(admin.AdminPolicy(), "speech", auto())
    assert isinstance(found, admin.SourceError) and found.reason == "NoMetricsSource"
    assert "one of: none" in found.message and "metricsSources" in found.message


@pytest.mark.parametrize("image, repository", [
    ("ubuntu", "docker.io/library/ubuntu"),
    ("team/app:1", "docker.io/team/app"),
    ("localhost:5000/app", "localhost:5000/app"),
    ("registry.example.com:5000/a/b:tag", "registry.example.com:5000/a/b"),
    ("ghcr.io/x/y@sha256:" + "a" * 64, "ghcr.io/x/y"),
])
def test_image_repository(image: str, repository: str) -> None:
    assert admin.image_repository(image) == repository


def test_bounds_name_every_violation_at_once() -> None:
    bounds = admin.Bounds(max_replicas=2, allowed_image_registries=("ghcr.io/cosyvoice-k8s",),
                          required_resource_limits=("memory", "cpu"))
    spec = parse_spec({"replicas": 3, "image": "docker.io/x/y:1"})
    with pytest.raises(admin.PolicyViolation) as err:
        admin.check_bounds(spec, {"memory": "8Gi"}, bounds)
    message = str(err.value)
    assert "spec.replicas 3 exceeds" in message and "not from an allowed registry" in message
    assert "spec.resources.limits must set cpu" in message
    admin.check_bounds(parse_spec({"replicas": 2}), {"memory": "8Gi", "cpu": "2"}, bounds)  # within: no error


def test_what_only_the_clusters_own_components_should_have_is_refused_unless_listed() -> None:
    """Without bounds: Kubernetes' system-* priority classes (they preempt everything) and tolerations of
    every taint or of control-plane nodes are refused, anything else passes; listed, only the list passes."""
    risky = parse_spec({"priorityClassName": "system-node-critical", "tolerations": [
        {"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]})
    with pytest.raises(admin.PolicyViolation) as err:
        admin.check_bounds(risky, {}, admin.Bounds())
    message = str(err.value)
    assert "spec.priorityClassName 'system-node-critical' is not allowed" in message
    assert "a toleration with no key (it tolerates every taint) is not allowed" in message
    assert "a toleration with key 'node-role.kubernetes.io/control-plane' is not allowed" in message
    ordinary = {"priorityClassName": "batch-high", "tolerations": [{"key": "dedicated", "value": "tts"}],
                "service": {"type": "LoadBalancer", "annotations": {"external-dns.alpha.kubernetes.io/hostname": "t"}},
                "podLabels": {"app": "payments"}}
    admin.check_bounds(parse_spec(ordinary), {}, admin.Bounds())
    admin.check_bounds(risky, {}, admin.Bounds(allowed_priority_classes=("system-node-critical",),
                                               allowed_toleration_keys=("", "node-role.kubernetes.io/control-plane")))

    tight = admin.Bounds(allowed_priority_classes=("tts-high",), allowed_toleration_keys=("gpu",),
                         allowed_service_types=("ClusterIP",), allowed_metadata_prefixes=("prometheus.io/", "team"))
    with pytest.raises(admin.PolicyViolation) as err:
        admin.check_bounds(parse_spec(ordinary), {}, tight)
    message = str(err.value)
    assert "spec.priorityClassName 'batch-high' is not allowed (tts-high)" in message
    assert "a toleration with key 'dedicated' is not allowed ('gpu')" in message
    assert "spec.service.type LoadBalancer is not allowed (ClusterIP)" in message
    assert "spec.service.annotations external-dns.alpha.kubernetes.io/hostname: keys must start with" in message
    assert "spec.podLabels app: keys must start with one of prometheus.io/, team" in message
    admin.check_bounds(parse_spec({"priorityClassName": "tts-high", "tolerations": [{"key": "gpu"}],
                                   "podLabels": {"team": "speech"}, "podAnnotations": {"prometheus.io/x": "1"}}),
                       {}, tight)


def test_load_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    assert admin.load(None) == admin.AdminPolicy()
    bad = tmp_path / "config.yaml"
    bad.write_text("metricsSources: {p: {url: 'prometheus:9090'}}\ndefaultMetricsSource: q\n")
    with pytest.raises(ValueError, match=r"invalid operator configuration .*metricsSources\.p\.url"):
        admin.load(bad)
    with pytest.raises(ValueError, match="cannot read the operator configuration"):
        admin.load(tmp_path / "missing.yaml")
