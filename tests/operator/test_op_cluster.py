"""End to end on a real cluster (any ``KUBECONFIG``): skipped when none is configured.

    KUBECONFIG=~/.kube/config .venv/bin/python -m pytest tests/operator -m cluster

It installs the CRD, runs the operator in-process against a fresh namespace, deploys a CPU-only
CosyVoiceService and checks what the API server and its controllers (scheduler, garbage collector)
make of it. Knobs: ``COSYVOICE_E2E_IMAGE`` (server image the nodes can pull),
``COSYVOICE_E2E_EXPECT_READY=0`` (do not wait for a Ready server, e.g. without that image),
``COSYVOICE_E2E_READY_TIMEOUT`` and ``COSYVOICE_E2E_GC_TIMEOUT`` (seconds, default 600 and 120).
"""
from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cosyvoice_operator import kube as k
from cosyvoice_operator.constants import DEFAULT_IMAGE
from cvs_testkit import CRD_PATH, eventually, run_operator

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

CRDS = k.Resource("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False)
NAMESPACES = k.Resource("v1", "Namespace", "namespaces", namespaced=False)


@pytest.fixture(scope="module")
def client() -> Iterator[k.Kube]:
    config = os.environ.get("KUBECONFIG")
    if not config or not all(Path(p).expanduser().exists() for p in config.split(os.pathsep)):
        pytest.skip("no KUBECONFIG: the real-cluster test is skipped")
    try:
        kube = k.Kube.from_environment()
        kube.request("GET", "/version")
    except Exception as exc:
        pytest.skip(f"KUBECONFIG is set but the cluster is unreachable: {exc}")
    yield kube
    kube.close()


@pytest.fixture()
def namespace(client: k.Kube) -> Iterator[str]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    if client.get(CRDS, None, crd["metadata"]["name"]) is None:
        client.create(CRDS, crd)
    else:
        client.patch(CRDS, None, crd["metadata"]["name"], {"spec": crd["spec"]})
    name = f"cvs-e2e-{uuid.uuid4().hex[:6]}"
    client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    client.delete(NAMESPACES, None, name)


def _condition(cr: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((cr or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    raise AssertionError(f"no {type_} condition yet")


async def test_cpu_service_end_to_end(client: k.Kube, namespace: str) -> None:
    expect_ready = os.environ.get("COSYVOICE_E2E_EXPECT_READY", "1") != "0"
    ready_timeout = float(os.environ.get("COSYVOICE_E2E_READY_TIMEOUT", "600"))
    body = {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": "tts-e2e", "namespace": namespace},
            "spec": {"image": os.environ.get("COSYVOICE_E2E_IMAGE", DEFAULT_IMAGE), "replicas": 1,
                     "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}}}
    loop = asyncio.get_running_loop()

    def get(res: k.Resource, name: str = "tts-e2e") -> dict[str, Any] | None:
        return client.get(res, namespace, name)

    async with run_operator(namespaces=(namespace,), resync_seconds=10):
        cr = await loop.run_in_executor(None, client.create, k.COSYVOICESERVICES, body)
        uid = cr["metadata"]["uid"]
        await eventually(lambda: get(k.DEPLOYMENTS) and get(k.SERVICES) and get(k.PDBS), timeout=60, interval=1)
        for res in (k.DEPLOYMENTS, k.SERVICES, k.PDBS):
            child = get(res)
            assert child is not None and child["metadata"]["ownerReferences"][0]["uid"] == uid
        await eventually(lambda: (get(k.COSYVOICESERVICES) or {}).get("status", {}).get("endpoint"), timeout=60,
                         interval=1)
        assert get(k.COSYVOICESERVICES)["status"]["endpoint"] == \
            f"http://tts-e2e.{namespace}.svc.cluster.local:8000"

        if expect_ready:
            await eventually(lambda: _condition(get(k.COSYVOICESERVICES), "Ready")["status"] == "True",
                             timeout=ready_timeout, interval=2)
        else:  # the server may not start here, but the operator must say why
            await eventually(lambda: _condition(get(k.COSYVOICESERVICES), "Ready")["reason"], timeout=120, interval=2)

        # kubectl scale cvs/tts-e2e --replicas=2
        await loop.run_in_executor(None, lambda: client.patch(k.COSYVOICESERVICES, namespace, "tts-e2e",
                                                              {"spec": {"replicas": 2}}, subresource="scale"))
        await eventually(lambda: get(k.DEPLOYMENTS)["spec"]["replicas"] == 2, timeout=60, interval=1)

        # The real garbage collector removes the children through their owner references.
        await loop.run_in_executor(None, client.delete, k.COSYVOICESERVICES, namespace, "tts-e2e")
        await eventually(lambda: get(k.COSYVOICESERVICES) is None, timeout=60, interval=1)
        gc_timeout = float(os.environ.get("COSYVOICE_E2E_GC_TIMEOUT", "120"))
        await eventually(lambda: get(k.DEPLOYMENTS) is None and get(k.SERVICES) is None, timeout=gc_timeout, interval=2)
