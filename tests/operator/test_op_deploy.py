"""The operator's own install manifests: valid objects, enough permissions, an image and args that work."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cosyvoice_operator import kube
from cosyvoice_operator.cli import build_parser
from cosyvoice_operator.constants import OPERATOR_IMAGE
from cvs_testkit import K8S_VERSION, ROOT

DEPLOY = ROOT / "operator" / "deploy"


def docs() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out += [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    return out


@pytest.mark.parametrize("doc", docs(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_install_manifests_are_valid(doc: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def _granted(role: dict[str, Any], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in role["rules"]:
        if group in rule.get("apiGroups", []) and resource in rule.get("resources", []):
            verbs |= set(rule["verbs"])
    return verbs


def test_the_cluster_role_grants_every_call_the_operator_makes() -> None:
    (role,) = [d for d in docs() if d["kind"] == "ClusterRole"]
    needed = {
        kube.COSYVOICESERVICES: {"get", "list", "watch", "patch"},
        kube.DEPLOYMENTS: {"get", "list", "watch", "create", "patch", "delete"},
        kube.SERVICES: {"get", "list", "watch", "create", "patch", "delete"},
        kube.PDBS: {"get", "list", "watch", "create", "patch", "delete"},
        kube.SERVICE_MONITORS: {"get", "create", "patch", "delete"},
        kube.PODS: {"get", "list", "watch"},
        kube.NODES: {"list"},
    }
    for res, verbs in needed.items():
        group = res.api_version.rsplit("/", 1)[0] if "/" in res.api_version else ""
        assert verbs <= _granted(role, group, res.plural), res.plural
    assert {"patch"} <= _granted(role, "tts.cosyvoice.dev", "cosyvoiceservices/status")
    assert {"create"} <= _granted(role, "", "events")


def test_operator_deployment_runs_the_published_image_with_valid_args() -> None:
    (dep,) = [d for d in docs() if d["kind"] == "Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == OPERATOR_IMAGE
    args = build_parser().parse_args(container["args"])
    assert args.command == "run" and args.all_namespaces and args.liveness.endswith(":8080/healthz")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # leader election makes a rolling update safe: the new pod waits for the old one's Lease
    assert args.leader_elect and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
