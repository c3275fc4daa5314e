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


# --- what a CR author reads when a bound refuses the spec: the whole message ------------------------------

TAIL = " (bounds set by the cluster administrator: operator chart value bounds)"


def refusal(spec: dict[str, Any], bounds: admin.Bounds, limits: dict[str, Any] | None = None) -> str:
    with pytest.raises(admin.PolicyViolation) as err:
        admin.check_bounds(parse_spec(spec), limits or {}, bounds)
    return str(err.value)


def autoscaled(max_replicas: int) -> dict[str, Any]:
    return {"autoscaling": {"enabled": True, "maxReplicas": max_replicas, "targetQPSPerReplica": 1}}


def test_autoscaling_max_replicas_may_reach_the_clusters_maximum_but_not_exceed_it() -> None:
    bounds = admin.Bounds(max_replicas=4)
    admin.check_bounds(parse_spec(autoscaled(4)), {}, bounds)  # at the bound: accepted
    assert refusal(autoscaled(5), bounds) == \
        "spec.autoscaling.maxReplicas 5 exceeds the cluster's maximum of 4" + TAIL
    # autoscaling without a maximum of its own: only spec.replicas is bounded
    admin.check_bounds(parse_spec({"replicas": 4, "autoscaling": {"enabled": False}}), {}, bounds)
    assert refusal({"replicas": 5, "autoscaling": {"enabled": False}}, bounds) == \
        "spec.replicas 5 exceeds the cluster's maximum of 4" + TAIL


def test_spec_replicas_and_autoscaling_max_replicas_are_both_named_when_both_exceed() -> None:
    spec = {"replicas": 6, "autoscaling": {"enabled": True, "maxReplicas": 7, "targetQPSPerReplica": 1}}
    assert refusal(spec, admin.Bounds(max_replicas=3)) == (
        "spec.replicas 6 exceeds the cluster's maximum of 3; "
        "spec.autoscaling.maxReplicas 7 exceeds the cluster's maximum of 3" + TAIL)


def test_every_refusal_is_listed_in_order_with_the_allowed_values_and_the_chart_value() -> None:
    bounds = admin.Bounds(max_replicas=2, allowed_image_registries=("ghcr.io/cosyvoice-k8s", "registry.example.com"),
                          required_resource_limits=("memory", "nvidia.com/gpu", "cpu"),
                          allowed_priority_classes=("tts-high", "tts-low"), allowed_toleration_keys=("gpu", "tts"),
                          allowed_service_types=("ClusterIP", "NodePort"),
                          allowed_metadata_prefixes=("prometheus.io/", "team"))
    spec = {"replicas": 3, "image": "docker.io/x/y:1", "priorityClassName": "batch",
            "tolerations": [{"key": "dedicated", "value": "tts"}],
            "service": {"type": "LoadBalancer", "annotations": {"lb/a": "1", "team-x": "2", "lb/b": "3"}},
            "podAnnotations": {"sidecar/inject": "true", "owner": "me"}, "podLabels": {"app": "tts", "tier": "x"}}
    assert refusal(spec, bounds, {"memory": "8Gi"}) == "; ".join([
        "spec.replicas 3 exceeds the cluster's maximum of 2",
        "spec.image 'docker.io/x/y:1' is not from an allowed registry (ghcr.io/cosyvoice-k8s, registry.example.com)",
        "spec.resources.limits must set nvidia.com/gpu, cpu",
        "spec.priorityClassName 'batch' is not allowed (tts-high, tts-low)",
        "spec.tolerations: a toleration with key 'dedicated' is not allowed ('gpu', 'tts')",
        "spec.service.type LoadBalancer is not allowed (ClusterIP, NodePort)",
        "spec.podAnnotations sidecar/inject, owner: keys must start with one of prometheus.io/, team",
        "spec.podLabels app, tier: keys must start with one of prometheus.io/, team",
        "spec.service.annotations lb/a, lb/b: keys must start with one of prometheus.io/, team",
    ]) + TAIL


def test_without_lists_the_reserved_names_are_refused_with_what_is_allowed() -> None:
    spec = {"priorityClassName": "system-cluster-critical", "tolerations": [{"operator": "Exists"}]}
    assert refusal(spec, admin.Bounds()) == (
        "spec.priorityClassName 'system-cluster-critical' is not allowed (any but system-*); "
        "spec.tolerations: a toleration with no key (it tolerates every taint) is not allowed "
        "(any key but none and node-role.kubernetes.io/*)" + TAIL)


# --- image references and registry prefixes -----------------------------------------------------------

@pytest.mark.parametrize("image, repository", [
    ("ubuntu:24.04", "docker.io/library/ubuntu"),
    ("ubuntu@sha256:" + "b" * 64, "docker.io/library/ubuntu"),
    ("localhost/app:1", "localhost/app"),  # the local registry, not Docker Hub's user "localhost"
    ("localhost:5000/team/app:2.1", "localhost:5000/team/app"),
    ("registry.example.com:5000/a/b:tag@sha256:" + "c" * 64, "registry.example.com:5000/a/b"),
    ("library/ubuntu:24.04", "docker.io/library/ubuntu"),
    # Docker Hub spelt out names the same images as the short forms (a docker.io/library prefix allows all)
    ("docker.io/ubuntu:24.04", "docker.io/library/ubuntu"),
    ("index.docker.io/library/ubuntu", "docker.io/library/ubuntu"),
    ("docker.io/bitnami/redis:7", "docker.io/bitnami/redis"),
    # the tag starts at the first ':' after the last '/', the digest at the first '@'
    ("ghcr.io/x/y:1:2", "ghcr.io/x/y"),
    ("ubuntu:1:2", "docker.io/library/ubuntu"),
    ("ghcr.io/x/y@sha256:a@b", "ghcr.io/x/y"),
])
def test_image_repository_of_tags_ports_digests_and_local_registries(image: str, repository: str) -> None:
    assert admin.image_repository(image) == repository


@pytest.mark.parametrize("image, prefixes, allowed", [
    ("ghcr.io/team/app:1", ("ghcr.io/team/",), True),  # a prefix written with a trailing '/'
    ("ghcr.io/team/app:1", ("ghcr.io/team/app/",), True),  # a whole repository, written with a trailing '/'
    ("ghcr.io/team/app:1", ("ghcr.io/team/app",), True),
    ("ghcr.io/teammate/app", ("ghcr.io/team/",), False),
    ("ghcr.io/team/app", ("ghcr.io/teamX",), False),  # a prefix is compared character for character
    ("ghcr.io/team/app", ("ghcr.io/team/appX",), False),
    ("registry.example.com:5000/a/b:tag", ("registry.example.com:5000",), True),
    ("registry.example.com:5000/a/b:tag", ("registry.example.com",), False),  # another port is another registry
    ("localhost/app:1", ("docker.io",), False),
    ("ubuntu:24.04", ("docker.io/library",), True),
    ("ubuntu:24.04", ("ghcr.io", "docker.io/library/"), True),
    ("ubuntu:24.04", (), True),
])
def test_image_prefixes_match_whole_path_components(image: str, prefixes: tuple[str, ...], allowed: bool) -> None:
    assert admin.image_allowed(image, prefixes) is allowed


# --- which metrics source a service gets, and what its author reads when it gets none -------------------

SOURCES = admin.AdminPolicy.model_validate({"metricsSources": {
    "cluster": {"url": "http://prom.monitoring:9090/"},
    "team": {"url": "https://team-prom:9090", "namespaces": ["team-*"]},
    "tenant": {"url": "http://gateway/prometheus/tenant-X", "allowQueryOverrides": True},
    "archive": {"url": "https://thanos:10902", "namespaces": ["team-a", "ops"]}},
    "defaultMetricsSource": "cluster"})


def test_the_sources_listed_are_those_the_namespace_may_use_in_name_order() -> None:
    for namespace, names in [("team-a", "archive, cluster, team, tenant"), ("team-b", "cluster, team, tenant"),
                             ("speech", "cluster, tenant")]:
        found = admin.resolve_source(SOURCES, namespace, auto(metricsSource="nope"))
        assert found == admin.SourceError("MetricsSourceNotAllowed", f"metrics source 'nope' is not defined for "
                                          f"namespace {namespace}; available: {names}")


def test_a_legacy_prometheus_url_selects_the_source_with_that_url_whatever_its_trailing_slash() -> None:
    for url, name in [("http://prom.monitoring:9090", "cluster"), ("https://team-prom:9090/", "team"),
                      ("http://gateway/prometheus/tenant-X", "tenant")]:
        found = admin.resolve_source(SOURCES, "team-a", auto(prometheus={"url": url}))
        assert found == (name, SOURCES.metrics_sources[name])
    twins = admin.AdminPolicy.model_validate({"metricsSources": {"b": {"url": "http://p:9090"},
                                                                 "a": {"url": "http://p:9090/"}}})
    assert admin.resolve_source(twins, "x", auto(prometheus={"url": "http://p:9090"}))[0] == "a"  # type: ignore[index]
    # only sources that serve the namespace match: a twin of the address that does is chosen
    found = admin.resolve_source(SOURCES, "speech", auto(prometheus={"url": "https://team-prom:9090"}))
    assert found == admin.SourceError("MetricsSourceNotAllowed", "spec.autoscaling.prometheus.url "
                                      "https://team-prom:9090 is not a metrics source the operator's administrator "
                                      "allows; set spec.autoscaling.metricsSource to one of: cluster, tenant")
    scoped = admin.AdminPolicy.model_validate({"metricsSources": {"a": {"url": "http://p:9090", "namespaces": ["ops"]},
                                                                  "b": {"url": "http://p:9090"}}})
    assert admin.resolve_source(scoped, "speech", auto(prometheus={"url": "http://p:9090"}))[0] == "b"  # type: ignore[index]
    assert admin.resolve_source(scoped, "ops", auto(prometheus={"url": "http://p:9090"}))[0] == "a"  # type: ignore[index]


def test_a_legacy_url_no_source_has_is_refused_with_the_sources_to_pick_from() -> None:
    found = admin.resolve_source(SOURCES, "team-b", auto(prometheus={"url": "http://prom.monitoring:9091"}))
    assert found == admin.SourceError(
        "MetricsSourceNotAllowed", "spec.autoscaling.prometheus.url http://prom.monitoring:9091 is not a metrics "
        "source the operator's administrator allows; set spec.autoscaling.metricsSource to one of: cluster, team, "
        "tenant")


def test_credentials_in_the_cr_are_refused_with_the_sources_to_pick_from() -> None:
    found = admin.resolve_source(SOURCES, "team-b", auto(prometheus={
        "url": "http://prom.monitoring:9090", "caSecret": {"name": "ca", "key": "ca.crt"}}))
    assert found == admin.SourceError(
        "MetricsSourceNotAllowed", "spec.autoscaling.prometheus may not carry credentials or TLS settings "
        "(bearerTokenSecret, caSecret, insecureSkipVerify): the operator only sends credentials its administrator "
        "configured; set spec.autoscaling.metricsSource to one of: cluster, team, tenant")


def test_no_source_names_what_to_set_and_the_chart_value() -> None:
    policy = admin.AdminPolicy.model_validate({"metricsSources": {"b": {"url": "http://b:9090"},
                                                                  "a": {"url": "http://a:9090"}}})
    assert admin.resolve_source(policy, "speech", auto()) == admin.SourceError(
        "NoMetricsSource", "autoscaling is enabled but no metrics source is set: set spec.autoscaling.metricsSource "
        "to one of: a, b (sources are defined by the operator's administrator, chart value metricsSources)")


def test_own_queries_are_refused_naming_the_fields_as_written_and_the_chart_value() -> None:
    queries = {"p95LatencyMs": "histogram_quantile(0.95, x)", "timeToFirstAudioMs": "y", "qps": "z"}
    found = admin.resolve_source(SOURCES, "speech", auto(queries=queries))
    assert found == admin.SourceError(
        "QueryOverrideNotAllowed", "spec.autoscaling.queries (p95LatencyMs, timeToFirstAudioMs, qps) would run on "
        "metrics source 'cluster' with the operator's credentials, which read every namespace's series; its "
        "administrator allows that per source (operator chart value metricsSources.cluster.allowQueryOverrides). "
        "Remove spec.autoscaling.queries: the built-in queries select this service's own series")
    assert admin.resolve_source(SOURCES, "speech", auto(queries=queries, metricsSource="tenant")) == \
        ("tenant", SOURCES.metrics_sources["tenant"])
