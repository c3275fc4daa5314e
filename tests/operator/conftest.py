"""Fixtures for the operator's tests: the CRD and a kmock-emulated cluster with a kubeconfig for it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from cvs_testkit import CRD_PATH, emulated_cluster

Obj = dict[str, Any]


@pytest.fixture(scope="session")
def crd() -> Obj:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture()
def cluster(kmock: kmock.KubernetesEmulator, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> kmock.KubernetesEmulator:
    """The emulated API server with the resources the operator uses, and a kubeconfig pointing at it."""
    return emulated_cluster(kmock, tmp_path, monkeypatch)
