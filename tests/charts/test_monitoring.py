"""Alerts and dashboard: the PrometheusRule passes `promtool check rules`, its alerts fire when they
should (`promtool test rules`), every dashboard query parses, and every metric they read exists."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
import kubernetes_validate
from chartkit import K8S_VERSION, OPERATOR_CHART, ROOT, Obj, of_kind, promtool, promtool_check_rules

from tools import dashboard as dashboard_code

SERVER_PKG = ROOT / "inference_image" / "cosyvoice_server"
PROMQL_WORD = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b")
# Metrics from other exporters the rules and dashboard rely on (documented in docs/operations.md).
KUBE_STATE_METRICS = {"kube_deployment_spec_replicas", "kube_deployment_status_replicas_ready",
                      "kube_deployment_status_replicas_available"}


def server_metric_names() -> set[str]:
    """Every series name the inference server exposes (histogram suffixes included)."""
    from cosyvoice_server.metrics import Metrics
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",)}
    names = {family.name + suffix for family in Metrics().registry.collect()
             for suffix in suffixes.get(family.type, ("",))}
    names |= set(re.findall(r'GaugeMetricFamily\(\s*"([a-z_]+)"', (SERVER_PKG / "gpu.py").read_text()))
    return names


def ksm_metric_names(docs: list[Obj]) -> set[str]:
    (cm,) = [c for c in of_kind(docs, "ConfigMap") if "config.yaml" in c["data"]]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    return {f"{res['metricNamePrefix']}_{m['name']}" for res in config["spec"]["resources"] for m in res["metrics"]}


def metric_names_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers not followed by `(`, not inside quotes or
    label matchers, not keywords or durations."""
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    keywords = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "le", "inf", "nan"}
    names = set()
    for match in PROMQL_WORD.finditer(expr):
        word = match.group(1)
        rest = expr[match.end():].lstrip()
        if rest.startswith("(") or word.lower() in keywords or word[0].isdigit():
            continue
        names.add(word)
    return names


@pytest.fixture(scope="module")
def monitoring(rendered: dict[str, list[Obj]]) -> list[Obj]:
    return rendered["monitoring-with-api"]


@pytest.fixture(scope="module")
def rule_groups(monitoring: list[Obj]) -> list[Obj]:
    (rule,) = of_kind(monitoring, "PrometheusRule")
    return rule["spec"]["groups"]


def alerts(groups: list[Obj]) -> list[Obj]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_prometheus_rule_passes_promtool(rule_groups: list[Obj], tmp_path: Path) -> None:
    done = promtool_check_rules(rule_groups, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts(rule_groups))} rules found" in done.stdout


def test_the_alerts_an_sre_pages_on_are_there_with_runbooks(rule_groups: list[Obj]) -> None:
    names = {a["alert"] for a in alerts(rule_groups)}
    assert names >= {"CosyVoiceLatencySLOBreached", "CosyVoiceTimeToFirstAudioSLOBreached", "CosyVoiceHighErrorRatio",
                     "CosyVoiceRequestsRejected", "CosyVoiceQueueSaturated", "CosyVoiceGPUMemoryNearLimit",
                     "CosyVoiceReplicasPinnedAtMax", "CosyVoiceAutoscalerMetricsUnavailable", "CosyVoiceOperatorDown"}
    operations = (ROOT / "docs" / "operations.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^#+\s*(.+)$", operations, re.M)}
    for alert in alerts(rule_groups):
        ann = alert["annotations"]
        assert {"summary", "description", "runbook", "runbook_url"} <= set(ann), alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning")
        anchor = ann["runbook_url"].rsplit("#", 1)[1]
        assert anchor == alert["alert"].lower() and anchor in headings, f"docs/operations.md lacks ## {alert['alert']}"


def test_rules_and_dashboard_read_only_metrics_that_exist(rule_groups: list[Obj], monitoring: list[Obj]) -> None:
    known = server_metric_names() | ksm_metric_names(monitoring) | KUBE_STATE_METRICS
    exprs = [a["expr"] for a in alerts(rule_groups)] + dashboard_code.queries(dashboard_code.build())
    unknown = {name for expr in exprs for name in metric_names_in(expr)} - known
    assert unknown == set(), f"not exported by the server, kube-state-metrics or the chart's ksm config: {unknown}"
    assert "cosyvoice_request_duration_seconds_bucket" in known  # the name source works


def test_every_dashboard_query_parses(monitoring: list[Obj], tmp_path: Path) -> None:
    (cm,) = [c for c in of_kind(monitoring, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (doc,) = cm["data"].values()
    board = json.loads(doc)
    assert board == dashboard_code.build()
    queries = dashboard_code.queries(board)
    titles = " | ".join(p["title"] for p in board["panels"]).lower()
    for topic in ("latency", "first audio", "requests per second", "batch size", "queue depth", "real-time factor",
                  "desired vs ready", "gpu utilization", "gpu memory"):
        assert topic in titles
    # Grafana's variables → values Prometheus accepts; each query becomes a recording rule promtool parses.
    rules = [{"record": f"dashboard:query_{i}:check",
              "expr": q.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$service", ".*")}
             for i, q in enumerate(queries)]
    done = promtool_check_rules([{"name": "dashboard", "rules": rules}], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    variables = [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    assert all(v.startswith("label_values(cosyvoice_ready") for v in variables)


# --- the alerts fire when they should: promtool's rule unit tests ---------------------------------

def _bucket_series(service: str, metric: str, buckets: dict[str, int]) -> list[Obj]:
    """A histogram whose requests all land in one bucket range (per minute increments)."""
    return [{"series": f'{metric}_bucket{{namespace="default", cosyvoice_service="{service}", code="200", le="{le}"}}',
             "values": f"0+{per_min}x40"} for le, per_min in buckets.items()]


def test_alerts_fire_on_the_right_services(rule_groups: list[Obj], tmp_path: Path) -> None:
    groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
              for g in rule_groups]  # annotations are templated; check rules validated them above
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    latency = "cosyvoice_request_duration_seconds"
    series = (
        # a: p95 ≈ 1 s against its own 500 ms SLO (from kube-state-metrics) → fires
        _bucket_series("a", latency, {"0.5": 0, "1.0": 10, "+Inf": 10})
        + [{"series": 'cosyvoice_service_autoscaling_target_p95_latency_ms{namespace="default", name="a"}',
            "values": "500x40"}]
        # b: p95 ≈ 1 s, no SLO of its own → the chart default (5 s) → quiet
        + _bucket_series("b", latency, {"0.5": 0, "1.0": 10, "+Inf": 10})
        # c: p95 ≈ 7 s, no SLO of its own → above the default → fires
        + _bucket_series("c", latency, {"5.0": 0, "10.0": 10, "+Inf": 10})
        # d: pinned at max for 40 minutes
        + [{"series": 'cosyvoice_service_autoscaling_desired_replicas{namespace="default", name="d"}', "values": "8x40"},
           {"series": 'cosyvoice_service_autoscaling_max_replicas{namespace="default", name="d"}', "values": "8x40"},
           {"series": 'cosyvoice_service_autoscaling_desired_replicas{namespace="default", name="e"}', "values": "3x40"},
           {"series": 'cosyvoice_service_autoscaling_max_replicas{namespace="default", name="e"}', "values": "8x40"}]
        # f: the autoscaler has had no metrics since minute 10; g: it has
        + [{"series": 'cosyvoice_service_autoscaling_condition{namespace="default", name="f", type="ScalingActive", '
                      'status="False", reason="MetricsUnavailable"}', "values": "_x10 1x30"},
           {"series": 'cosyvoice_service_autoscaling_condition{namespace="default", name="g", type="ScalingActive", '
                      'status="True", reason="ValidMetricFound"}', "values": "1x40"}]
        # the operator Deployment loses its pod after 5 minutes
        + [{"series": 'kube_deployment_status_replicas_available{namespace="cosyvoice-system", '
                      'deployment="cv-cosyvoice-operator"}', "values": "1x5 0x35"}]
    )
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "25m", "alertname": "CosyVoiceLatencySLOBreached", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "namespace": "default", "cosyvoice_service": "a"}},
                    {"exp_labels": {"severity": "critical", "namespace": "default", "cosyvoice_service": "c"}}]},
                {"eval_time": "35m", "alertname": "CosyVoiceReplicasPinnedAtMax", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "namespace": "default", "name": "d"}}]},
                {"eval_time": "20m", "alertname": "CosyVoiceReplicasPinnedAtMax", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "CosyVoiceAutoscalerMetricsUnavailable", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "CosyVoiceAutoscalerMetricsUnavailable", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "namespace": "default", "name": "f"}}]},
                {"eval_time": "10m", "alertname": "CosyVoiceOperatorDown", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "CosyVoiceOperatorDown", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "namespace": "cosyvoice-system",
                                    "deployment": "cv-cosyvoice-operator"}}]},
            ],
        }],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run([str(promtool()), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_kube_state_metrics_config_reads_fields_the_crd_has(monitoring: list[Obj]) -> None:
    """A CRD change that moves a field the alerts read (e.g. the autoscaler's conditions) fails here."""
    crd = yaml.safe_load((ROOT / "crds" / "cosyvoiceservice.yaml").read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def walk(schema: Obj, path: list[str]) -> Obj:
        for part in path:
            if schema.get("type") == "array":
                schema = schema["items"]
            schema = schema.get("properties", {}).get(part) if part not in ("metadata",) else {"properties": {
                "name": {}, "namespace": {}}}
            assert schema is not None, f"{path}: no {part!r} in the CRD"
        return schema

    (cm,) = [c for c in of_kind(monitoring, "ConfigMap") if "config.yaml" in c["data"]]
    (resource,) = yaml.safe_load(cm["data"]["config.yaml"])["spec"]["resources"]
    assert resource["groupVersionKind"] == {"group": crd["spec"]["group"], "version": crd["spec"]["versions"][0]["name"],
                                            "kind": crd["spec"]["names"]["kind"]}
    for metric in resource["metrics"]:
        each = metric["each"][metric["each"]["type"].lower()]
        target = walk(root, each["path"])
        for sub in each.get("labelsFromPath", {}).values():
            walk(target, sub)


def test_kube_state_metrics_option_binds_its_role_to_kube_state_metrics(rendered: dict[str, list[Obj]],
                                                                       helm: Any) -> None:
    """The ConfigMap alone exports nothing: kube-state-metrics must also be allowed to list the CRs."""
    docs = rendered["monitoring-with-api"]
    (role,) = [r for r in of_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-kube-state-metrics")]
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding")
                  if b["metadata"]["name"].endswith("-kube-state-metrics")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kps-kube-state-metrics",
                                    "namespace": "monitoring"}]
    assert {"list", "watch"} <= {v for rule in role["rules"] if "cosyvoiceservices" in rule["resources"]
                                 for v in rule["verbs"]}

    # The ServiceAccount's namespace defaults to the ConfigMap's (kube-state-metrics' own).
    docs = helm.render(OPERATOR_CHART, {"monitoring": {"kubeStateMetrics": {
        "enabled": True, "namespace": "observability", "serviceAccount": {"name": "kube-state-metrics"}}}})
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding")
                  if b["metadata"]["name"].endswith("-kube-state-metrics")]
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "kube-state-metrics",
                                      "namespace": "observability"}
    assert kubernetes_validate.validate(binding, K8S_VERSION, strict=True) == K8S_VERSION

    # Enabled without saying whom to bind: a clear error, not a ClusterRole nobody holds.
    done = helm.template(OPERATOR_CHART, {"monitoring": {"kubeStateMetrics": {"enabled": True}}}, check=False)
    assert done.returncode != 0 and "monitoring.kubeStateMetrics.serviceAccount.name is required" in done.stderr
