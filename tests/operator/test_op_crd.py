"""The CRD itself, and what it admits: examples in, a table of invalid CosyVoiceServices out.

Each invalid spec must be rejected twice, by the CRD (openAPIV3Schema + CEL, as the API server would)
and by the operator's own spec models (for specs that reach the operator another way), so the two
stay in step.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

import kubernetes_validate
import pytest
from cosyvoice_operator.spec import InvalidSpec, check_name, parse_spec
from cvs_crdschema import admit, openapi_schema, structural_problems
from cvs_testkit import CRD_PATH, EXAMPLES, K8S_VERSION, load_example

BASE: dict[str, Any] = {
    "apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
    "metadata": {"name": "tts", "namespace": "default"},
    "spec": {"gpu": {"migProfile": "1g.10gb"}},
}


def cr_with(spec: dict[str, Any] | None = None, name: str = "tts") -> dict[str, Any]:
    cr = copy.deepcopy(BASE)
    cr["metadata"]["name"] = name
    if spec is not None:
        cr["spec"] = spec
    return cr


def operator_verdict(cr: dict[str, Any]) -> str | None:
    try:
        check_name(cr["metadata"]["name"])
        parse_spec(cr["spec"])
    except InvalidSpec as exc:
        return str(exc)
    return None


def test_crd_is_a_valid_apiextensions_object(crd: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(crd, K8S_VERSION, strict=True) == K8S_VERSION


def test_crd_schema_is_structural_and_its_rules_compile(crd: dict[str, Any]) -> None:
    assert structural_problems(openapi_schema(crd)) == []


def test_crd_names_and_subresources(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == \
        ("tts.cosyvoice.dev", "Namespaced", "CosyVoiceService", "cosyvoiceservices")
    assert "cvs" in spec["names"]["shortNames"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}


def _field_exists(schema: dict[str, Any], json_path: str) -> bool:
    node = schema
    for part in json_path.lstrip(".").split("."):
        part = re.sub(r"\[.*\]$", "", part)
        if node.get("type") == "array":
            node = node["items"]
        props = node.get("properties") or {}
        if part not in props:
            return part == "creationTimestamp"  # metadata is not spelled out in CRD schemas
        node = props[part]
    return True


def test_printer_columns_and_scale_paths_point_at_declared_fields(crd: dict[str, Any]) -> None:
    schema = openapi_schema(crd)
    version = crd["spec"]["versions"][0]
    paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
    paths += list(version["subresources"]["scale"].values())
    missing = [p for p in paths if not _field_exists(schema, p.split("[?")[0])]
    assert missing == []
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:3] == ["Ready", "Replicas", "MIG"] and names[-1] == "Age"
    assert {"P95(ms)", "QPS", "Endpoint"} <= set(names)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_admitted_by_the_crd_and_the_operator(crd: dict[str, Any], path: Any) -> None:
    cr = load_example(path)
    _, errors = admit(crd, cr)
    assert errors == []
    assert operator_verdict(cr) is None


@pytest.mark.parametrize("path", [*EXAMPLES, None], ids=lambda p: p.name if p else "empty-spec")
def test_crd_defaults_match_the_operator_defaults(crd: dict[str, Any], path: Any) -> None:
    """A spec means the same whether or not the API server filled in the defaults."""
    cr = load_example(path) if path else cr_with({})
    defaulted, errors = admit(crd, cr)
    assert errors == []
    assert parse_spec(defaulted["spec"]) == parse_spec(cr["spec"])


G = {"gpu": {"migProfile": "1g.10gb"}}
INVALID: list[tuple[str, dict[str, Any] | None, str, str]] = [
    # (id, spec, substring the CRD reports, substring the operator reports)
    ("storage-both-sources", {"storage": {"pvc": {"claimName": "m"}, "storageUri": "s3://b/m.tgz"}},
     "exactly one of storage.pvc or storage.storageUri", "exactly one of storage.pvc or storage.storageUri"),
    ("storage-no-source", {"storage": {}}, "exactly one of", "exactly one of"),
    ("sha256-with-pvc", {"storage": {"pvc": {"claimName": "m"}, "sha256": "a" * 64}},
     "storage.storageUri only", "storage.storageUri only"),
    ("cache-without-digest", {"storage": {"storageUri": "s3://b/m.tar", "cache": {}}},
     "storage.cache needs storage.storageUri and storage.sha256", "storage.cache needs storage.storageUri and storage.sha256"),
    ("cache-with-pvc-source", {"storage": {"pvc": {"claimName": "m"}, "cache": {"pvc": {"claimName": "c"}}}},
     "storage.cache needs", "storage.cache needs"),
    ("size-limit-with-pvc", {"storage": {"pvc": {"claimName": "m"}, "sizeLimit": "5Gi"}},
     "storage.storageUri only", "storage.storageUri only"),
    ("storage-uri-scheme", {"storage": {"storageUri": "ftp://host/model.tgz"}}, "storageUri", "storageUri"),
    ("sha256-not-hex", {"storage": {"storageUri": "s3://b/m", "sha256": "xyz"}}, "sha256", "sha256"),
    ("whole-gpu-with-profile", {"gpu": {"migStrategy": "none", "migProfile": "1g.10gb"}},
     "must not be set with gpu.migStrategy none", "must not be set with gpu.migStrategy none"),
    ("mig-without-profile", {"gpu": {"migStrategy": "mixed"}},
     "gpu.migProfile is required", "gpu.migProfile is required"),
    ("single-without-product", {"gpu": {"migStrategy": "single", "migProfile": "1g.10gb"}},
     "gpu.product is required", "gpu.product is required"),
    ("profile-malformed", {"gpu": {"migProfile": "1g10gb"}}, "migProfile", "migProfile"),
    ("strategy-unknown", {"gpu": {"migProfile": "1g.10gb", "migStrategy": "partial"}},
     "migStrategy", "migStrategy"),
    ("precision-unknown", {**G, "precision": "bf16"}, "precision", "precision"),
    ("replicas-negative", {**G, "replicas": -1}, "replicas", "replicas"),
    ("autoscaling-without-max", {**G, "autoscaling": {"enabled": True, "targetQPSPerReplica": 5}},
     "maxReplicas is required", "maxReplicas is required"),
    ("autoscaling-min-above-max", {**G, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
     "must not exceed autoscaling.maxReplicas", "must not exceed autoscaling.maxReplicas"),
    ("autoscaling-without-target", {**G, "autoscaling": {"enabled": True, "maxReplicas": 4}},
     "at least one target", "at least one target"),
    ("autoscaling-zero-qps", {**G, "autoscaling": {"targetQPSPerReplica": 0}},
     "targetQPSPerReplica", "targetQPSPerReplica"),
    ("autoscaling-policy-type", {**G, "autoscaling": {"scaleUp": {"policies": [
        {"type": "Pod", "value": 1, "periodSeconds": 15}]}}}, "type", "type"),
    ("autoscaling-fallback-above-max", {**G, "autoscaling": {"maxReplicas": 3, "fallback": {"replicas": 5}}},
     "fallback.replicas must not exceed", "fallback.replicas must not exceed"),
    ("prometheus-url", {**G, "autoscaling": {"prometheus": {"url": "prometheus:9090"}}}, "url", "url"),
    ("batch-size-zero", {**G, "batching": {"maxBatchSize": 0}}, "maxBatchSize", "maxBatchSize"),
    ("queue-delay-too-long", {**G, "batching": {"maxQueueDelayMs": 50000}}, "maxQueueDelayMs", "maxQueueDelayMs"),
    ("gpu-in-resources", {**G, "resources": {"limits": {"nvidia.com/gpu": 1}}},
     "remove nvidia.com/*", "remove nvidia.com/*"),
    ("quantity-malformed", {**G, "resources": {"requests": {"cpu": "lots"}}}, "cpu", "cpu"),
    ("rollout-cannot-progress", {**G, "rollout": {"maxSurge": 0, "maxUnavailable": "0%"}},
     "cannot both be 0", "cannot both be 0"),
    ("rollout-surge-not-percent", {**G, "rollout": {"maxSurge": "10"}}, "maxSurge", "maxSurge"),
    ("rollout-surge-negative", {**G, "rollout": {"maxSurge": -1}}, "non-negative", "maxSurge"),
    ("pdb-both-bounds", {**G, "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}},
     "at most one of", "at most one of"),
    ("service-type", {**G, "service": {"type": "ExternalName"}}, "type", "type"),
    ("service-port", {**G, "service": {"port": 70000}}, "port", "port"),
    ("service-monitor-interval", {**G, "monitoring": {"serviceMonitor": {"interval": "15 seconds"}}},
     "interval", "interval"),
    ("served-model-name", {**G, "servedModelName": "my model"}, "servedModelName", "servedModelName"),
    ("toleration-effect", {**G, "tolerations": [{"key": "k", "effect": "Never"}]}, "effect", "effect"),
    ("unknown-field", {**G, "gpus": 1}, "gpus", "gpus"),
    # The operator's own variables cannot be replaced (auth, model, port) ...
    ("env-api-key-file", {**G, "env": [{"name": "COSYVOICE_API_KEY_FILE", "value": "/dev/null"}]},
     "may not set a variable the operator sets", "COSYVOICE_API_KEY_FILE is set by the operator"),
    ("env-api-key", {**G, "env": [{"name": "COSYVOICE_API_KEY", "value": "known"}]},
     "may not set a variable the operator sets", "COSYVOICE_API_KEY is set by the operator"),
    ("env-model-dir", {**G, "env": [{"name": "COSYVOICE_MODEL_DIR", "value": "/tmp"}]},
     "may not set a variable the operator sets", "COSYVOICE_MODEL_DIR is set by the operator"),
    # ... and a valueFrom is one of the four Kubernetes sources, each with its fields.
    ("env-value-from-unknown", {**G, "env": [{"name": "X", "valueFrom": {"secretRef": {"name": "s"}}}]},
     "secretRef", "secretRef"),
    ("env-secret-ref-without-key", {**G, "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
     "key", "key"),
    ("metrics-source-name", {**G, "autoscaling": {"metricsSource": "My Prometheus"}},
     "metricsSource", "metricsSource"),
    # Variables that would load other code into the server, or expose every GPU of the node
    *[(f"env-{name.lower()}", {**G, "env": [{"name": name, "value": "x"}]}, "variables (LD_*, PYTHON*",
       "variables (LD_*, PYTHON*") for name in ("LD_PRELOAD", "PYTHONPATH", "NVIDIA_VISIBLE_DEVICES", "GCONV_PATH")],
    # Object names go into API paths: a '/' or '..' would reach another namespace's objects
    *[(f"name-{where}", {**G, **spec}, field, f"{field}: {bad!r} is not a Kubernetes object name")
      for where, field, bad, spec in (
        ("voices-claim", "claimName", "../../kube-system/secrets/admin", {"voices": {"pvc": {"claimName": "{}"}}}),
        ("storage-claim", "claimName", "a/b", {"storage": {"pvc": {"claimName": "{}"}}}),
        ("env-secret", "secretKeyRef.name", "../../b/secrets/s",
         {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "{}", "key": "k"}}}]}),
        ("env-configmap", "configMapKeyRef.name", "..",
         {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "{}", "key": "k"}}}]}),
        ("api-key", "apiKeySecret.name", "A", {"apiKeySecret": {"name": "{}", "key": "k"}}),
        ("credentials", "credentialsSecret.name", "x/y",
         {"storage": {"storageUri": "s3://b/m", "credentialsSecret": {"name": "{}"}}}),
        ("pull-secret", "name", "x?y", {"imagePullSecrets": [{"name": "{}"}]}),
        ("service-account", "serviceAccountName", "../default", {"serviceAccountName": "{}"}),
        ("priority-class", "priorityClassName", "High", {"priorityClassName": "{}"}),
    ) for spec in [json.loads(json.dumps(spec).replace("{}", bad))]],
    ("storage-subpath-escapes", {**G, "storage": {"pvc": {"claimName": "m", "subPath": "a/../../b"}}},
     "storage.pvc.subPath must stay inside the volume", "storage.pvc.subPath must stay inside the volume"),
    # A canary changes what the stable version runs, with the spec's own rules for each field
    ("canary-changes-nothing", {**G, "canary": {"weight": 10, "modelVersion": "v2"}},
     "spec.canary must change something", "spec.canary must change something"),
    ("canary-same-version-name", {**G, "modelVersion": "v1", "canary": {"weight": 10, "modelVersion": "v1",
                                                                        "precision": "fp32"}},
     "canary.modelVersion must differ", "canary.modelVersion must differ"),
    ("canary-weight-above-100", {**G, "canary": {"weight": 101, "precision": "fp32"}}, "weight", "weight"),
    ("canary-without-weight", {**G, "canary": {"precision": "fp32"}}, "weight", "weight"),
    ("canary-storage-both-sources", {**G, "canary": {"weight": 5, "storage": {
        "pvc": {"claimName": "m"}, "storageUri": "s3://b/m.tgz"}}},
     "exactly one of storage.pvc or storage.storageUri", "exactly one of storage.pvc or storage.storageUri"),
    ("canary-env-reserved", {**G, "canary": {"weight": 5, "env": [{"name": "COSYVOICE_API_KEY", "value": "k"}]}},
     "may not set a variable the operator sets", "COSYVOICE_API_KEY is set by the operator"),
    ("canary-gateway-name", {**G, "canary": {"weight": 5, "precision": "fp32", "gateway": {"name": "../gw"}}},
     "name", "is not a Kubernetes object name"),
    ("canary-step-weight-zero", {**G, "canary": {"weight": 5, "precision": "fp32",
                                                 "analysis": {"stepWeights": [0, 50]}}}, "stepWeights", "stepWeights"),
]


def test_the_crd_reserves_exactly_the_operators_env() -> None:
    """The CEL rules repeat constants.OPERATOR_ENV, which must cover every variable the operator renders, and
    the forbidden loader/interpreter/GPU-runtime variables."""
    import re
    import yaml as _yaml

    from cosyvoice_operator import render
    from cosyvoice_operator.constants import FORBIDDEN_ENV, FORBIDDEN_ENV_PREFIXES, OPERATOR_ENV
    from cosyvoice_operator.spec import FORBIDDEN_ENV_MESSAGE, parse_spec

    env = _yaml.safe_load(CRD_PATH.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]["env"]
    reserved, forbidden = env["x-kubernetes-validations"]
    assert tuple(re.findall(r"'([A-Z_]+)'", reserved["rule"])) == OPERATOR_ENV
    assert tuple(re.findall(r"startsWith\('([A-Z_]+)'\)", forbidden["rule"])) == FORBIDDEN_ENV_PREFIXES
    assert tuple(re.findall(r"'([A-Z_]+)'(?!\))", forbidden["rule"])) == FORBIDDEN_ENV
    assert forbidden["message"] == FORBIDDEN_ENV_MESSAGE
    busiest = parse_spec({"gpu": {"migProfile": "1g.10gb"}, "storage": {"pvc": {"claimName": "m"}},
                          "apiKeySecret": {"name": "k", "key": "k"}})
    assert {e["name"] for e in render.server_env(busiest)} <= set(OPERATOR_ENV)


@pytest.mark.parametrize("spec,crd_says,operator_says", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_specs_are_rejected_by_crd_and_operator(crd: dict[str, Any], spec: dict[str, Any],
                                                        crd_says: str, operator_says: str) -> None:
    _, errors = admit(crd, cr_with(spec))
    assert errors, "the CRD admitted an invalid spec"
    assert any(crd_says in e for e in errors), errors
    verdict = operator_verdict(cr_with(spec))
    assert verdict is not None and operator_says in verdict


@pytest.mark.parametrize("name", ["TTS", "tts_1", "1tts", "a" * 64, "tts.prod"])
def test_names_that_cannot_name_a_service_are_rejected(crd: dict[str, Any], name: str) -> None:
    _, errors = admit(crd, cr_with(name=name))
    assert any("DNS-1035" in e for e in errors)
    assert "DNS-1035" in (operator_verdict(cr_with(name=name)) or "")


def test_a_profile_impossible_on_the_named_gpu_passes_the_schema_but_not_the_operator(crd: dict[str, Any]) -> None:
    cr = cr_with({"gpu": {"migProfile": "1g.5gb", "product": "NVIDIA-H100-80GB-HBM3"}})
    _, errors = admit(crd, cr)
    assert errors == []  # the schema cannot know the catalog
    verdict = operator_verdict(cr)
    assert verdict is not None
    assert "1g.5gb does not exist on H100-80GB" in verdict
    assert "valid profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb" in verdict


def test_the_admission_helper_catches_mutations_of_the_crd(crd: dict[str, Any]) -> None:
    """Guard against a validator that accepts everything: loosen a CEL rule and see the verdict change."""
    broken = copy.deepcopy(crd)
    storage = openapi_schema(broken)["properties"]["spec"]["properties"]["storage"]
    storage["x-kubernetes-validations"] = []
    spec = {"storage": {"pvc": {"claimName": "m"}, "storageUri": "s3://b/m"}}
    assert admit(broken, cr_with(spec))[1] == []
    assert admit(crd, cr_with(spec))[1] != []
    assert CRD_PATH.exists()
