"""Helpers for the operator's tests: paths, a more realistic kmock emulator, the operator runner.

A module of its own (not conftest.py) so that ``import`` finds it unambiguously next to other test
directories' conftest modules."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "cosyvoiceservice.yaml"
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
K8S_VERSION = "1.35"  # the newest schemas kubernetes-validate ships that we target

CVS_RESOURCE = "tts.cosyvoice.dev/v1alpha1/cosyvoiceservices"
CVS_PATH = "/apis/tts.cosyvoice.dev/v1alpha1/namespaces/{ns}/cosyvoiceservices"
Obj = dict[str, Any]


def load_example(path: Path) -> Obj:
    """The example's CosyVoiceService (a file may also hold objects it uses, such as a ConfigMap)."""
    return next(d for d in example_objects(path) if d["kind"] == "CosyVoiceService")


def example_objects(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- a more realistic emulator ------------------------------------------------------------------

def merge_patch(live: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(live) if isinstance(live, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def emulated_cluster(emulator: Any, tmp_path: Path, monkeypatch: Any) -> Any:
    """kmock's emulator with the resources the operator uses, and a kubeconfig pointing at it."""
    import kubernetes.config.kube_config

    emulator.resources.load_bundled()
    emulator.resources[CVS_RESOURCE] = kmock.ResourceInfo(
        kind="CosyVoiceService", singular="cosyvoiceservice", namespaced=True, shortnames={"cvs"},
        verbs={"get", "list", "watch", "create", "patch", "update", "delete"}, subresources={"status", "scale"})
    emulator.objects["v1/namespaces", None, "default"] = {
        "metadata": {"name": "default", "uid": "ns-default", "resourceVersion": "1"}}
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "kmock", "user": {"token": "test"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(config))
    # The kubernetes package reads $KUBECONFIG at import time, and prefers in-cluster credentials:
    # never let a test reach a real cluster the CI runner happens to live in.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return emulator


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus what an API server adds: uid, resourceVersion, generation, creationTimestamp,
    and resourceVersion preconditions on writes (409 Conflict when the object changed meanwhile).

    ``generation`` grows when a write changes ``spec`` (not through /status), so observedGeneration
    means what it means on a real cluster.
    """
    _versions = itertools.count(1000)

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.resource is not None and isinstance(data, dict):
            if request.action == kmock.action.CREATE:
                meta = data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp",
                                datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"))
                meta["resourceVersion"] = str(next(self._versions))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                if key in self.objects and not self.objects[key].deleted:
                    current = self.objects[key].raw
                    meta = data.setdefault("metadata", {})
                    expected = meta.get("resourceVersion")  # a precondition, as the API server treats it
                    if expected and expected != (current.get("metadata") or {}).get("resourceVersion"):
                        return aiohttp.web.json_response(
                            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                             "message": "the object has been modified; please apply your changes to the latest "
                                        "version and try again"}, status=409)
                    meta["resourceVersion"] = str(next(self._versions))
                    spec_changed = "spec" in data and merge_patch(current.get("spec") or {}, data["spec"]) != (
                        current.get("spec") or {})
                    if request.subresource != "status" and spec_changed:
                        meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1
        return await super()._handle(request)


# --- cluster and operator -------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def run_operator(namespaces: tuple[str, ...] = ("default",), resync_seconds: float = 3600.0,
                       policy: Any = None, kube: Any = None) -> AsyncIterator[Any]:
    """The real operator (all its kopf handlers, restarted after watch failures as ``cosyvoice-operator run``
    does), like kopf's KopfRunner: in a thread with its own loop.

    A separate loop keeps kopf's shutdown from waiting on the emulator's open watch connections, and
    runs the operator the way it runs in production: beside, not inside, the API server.
    """
    import cosyvoice_operator.handlers  # noqa: F401  # registers the handlers
    import kopf
    from cosyvoice_operator import runtime

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True  # no CRD/namespace discovery: the emulator serves fixed resources
    stop, ready = threading.Event(), threading.Event()
    memo = kopf.Memo(namespaces=list(namespaces), resync_seconds=resync_seconds, policy=policy, kube=kube)
    failure: list[BaseException] = []
    options = runtime.Options(namespaces=list(namespaces), resync_seconds=resync_seconds, restart_backoff=(0.2, 1.0))

    def target() -> None:
        try:
            runtime.operate(options, memo, settings=settings, stop_flag=stop, ready_flag=ready)
        except BaseException as exc:  # surfaced in the test below
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=target, name="operator", daemon=True)
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, ready.wait, 10)
    try:
        yield memo
    finally:
        stop.set()
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        if failure:
            raise failure[0]


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns a truthy value without raising; re-raise its last failure."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
            failure: BaseException = AssertionError(f"{check} stayed falsy for {timeout}s")
        except (AssertionError, KeyError, ValueError, TypeError, IndexError) as exc:
            failure = exc
        if asyncio.get_running_loop().time() > deadline:
            raise failure
        await asyncio.sleep(interval)
