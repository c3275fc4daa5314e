"""Helpers for the chart and image tests: helm/promtool runners and the pod security checks.

A module of its own (not conftest.py), like tests/operator/cvs_testkit.py, so imports are unambiguous.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_CHART = ROOT / "charts" / "cosyvoice-operator"
SERVICE_CHART = ROOT / "charts" / "cosyvoice-service"
K8S_VERSION = "1.35"
PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1"
Obj = dict[str, Any]

for path in (ROOT, ROOT / "operator"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# Value sets every test renders: (id, --set style values as a nested dict, extra --api-versions).
MONITORING_ON = {"monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                                "dashboard": {"enabled": True},
                                "kubeStateMetrics": {"enabled": True, "serviceAccount": {
                                    "name": "kps-kube-state-metrics", "namespace": "monitoring"}}}}
VALUE_SETS: dict[str, tuple[Obj, tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "namespaced": ({"watch": {"allNamespaces": False, "namespaces": ["tts-a", "tts-b"]}}, ()),
    "monitoring-with-api": (MONITORING_ON, (PROMETHEUS_OPERATOR_API,)),
    "monitoring-without-api": (MONITORING_ON, ()),
    "namespaced-monitoring": ({**MONITORING_ON, "watch": {"allNamespaces": False, "namespaces": ["tts"]}},
                              (PROMETHEUS_OPERATOR_API,)),
    "custom": ({"image": {"digest": "sha256:" + "a" * 64}, "serviceAccount": {"name": "op", "annotations": {"example.com/role": "tts-operator"}},
                "operator": {"logJson": False, "verbose": True, "resyncSeconds": 30},
                "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [{"operator": "Exists"}],
                "priorityClassName": "system-cluster-critical", "podLabels": {"team": "tts"}}, ()),
}


class Helm:
    def __init__(self, binary: Path, tmp: Path) -> None:
        self.binary = binary
        self.tmp = tmp

    def run(self, *args: str, values: Obj | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), *args]
        if values:
            path = self.tmp / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
            path.write_text(yaml.safe_dump(values))
            cmd += ["-f", str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def template(self, chart: Path, values: Obj | None = None, api_versions: tuple[str, ...] = (),
                 namespace: str = "cosyvoice-system", check: bool = True,
                 release: str = "cv") -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(chart), "--namespace", namespace, "--include-crds",
                "--kube-version", K8S_VERSION]
        for api in api_versions:
            args += ["--api-versions", api]
        return self.run(*args, values=values, check=check)

    def render(self, chart: Path, values: Obj | None = None, api_versions: tuple[str, ...] = (),
               namespace: str = "cosyvoice-system") -> list[Obj]:
        out = self.template(chart, values, api_versions, namespace).stdout
        return [d for d in yaml.safe_load_all(out) if d]


def find_tool(name: str) -> Path | None:
    """A binary next to the running interpreter (pip-installed into the venv) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    return Path(found) if found else None


def promtool() -> Path:
    path = find_tool("promtool")
    if path is None:
        pytest.skip("promtool not found: install Debian's prometheus package (make system-deps)")
    return path


def promtool_check_rules(groups: list[Obj], tmp: Path, name: str = "rules.yaml") -> subprocess.CompletedProcess[str]:
    path = tmp / name
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([str(promtool()), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


def of_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d.get("kind") == kind]


# --- pod security -----------------------------------------------------------------------------

RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret", "image"}


def restricted_violations(pod: Obj) -> list[str]:
    """What keeps a pod spec from the Kubernetes "restricted" Pod Security Standard, plus our own rules:
    a read-only root filesystem and an explicit non-root uid on every container. Empty when it passes."""
    problems: list[str] = []
    psc = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"pod {flag}")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUME_TYPES)}")
    if (psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("pod seccompProfile is not RuntimeDefault")
    if psc.get("runAsUser") == 0:
        problems.append("pod runAsUser 0")
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(kind) or []:
            sc = c.get("securityContext") or {}
            name = f"{kind}/{c['name']}"
            if sc.get("privileged"):
                problems.append(f"{name} privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name} allowPrivilegeEscalation is not false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{name} does not drop ALL capabilities")
            if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
                problems.append(f"{name} adds capabilities")
            if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
                problems.append(f"{name} runAsNonRoot is not true")
            if (sc.get("runAsUser") if "runAsUser" in sc else psc.get("runAsUser")) in (None, 0):
                problems.append(f"{name} has no non-root runAsUser")
            seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problems.append(f"{name} seccompProfile {seccomp}")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{name} root filesystem is writable")
            for port in c.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"{name} hostPort {port['hostPort']}")
            if kind != "ephemeralContainers" and not (c.get("resources") or {}).get("limits", {}).get("memory"):
                problems.append(f"{name} has no memory limit")
    return problems
