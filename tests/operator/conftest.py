"""Fixtures for the operator's tests: the CRD and a kmock-emulated cluster with a kubeconfig for it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from cvs_testkit import CRD_PATH, CVS_RESOURCE

Obj = dict[str, Any]


@pytest.fixture(scope="session")
def crd() -> Obj:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture()
def cluster(kmock: kmock.KubernetesEmulator, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> kmock.KubernetesEmulator:
    """The emulated API server with the resources the operator uses, and a kubeconfig pointing at it."""
    import kubernetes.config.kube_config

    kmock.resources.load_bundled()
    kmock.resources[CVS_RESOURCE] = kmock.ResourceInfo(
        kind="CosyVoiceService", singular="cosyvoiceservice", namespaced=True, shortnames={"cvs"},
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"}, subresources={"status", "scale"})
    kmock.objects["v1/namespaces", None, "default"] = {
        "metadata": {"name": "default", "uid": "ns-default", "resourceVersion": "1"}}

    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(config))
    # The kubernetes package reads $KUBECONFIG at import time, and prefers in-cluster credentials:
    # never let a test reach a real cluster the CI runner happens to live in.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return kmock
