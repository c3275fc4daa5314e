"""Pure functions: a CosyVoiceService (identity + parsed spec) → the Kubernetes objects that run it.

No Kubernetes client here: ``cosyvoice-operator render`` prints these objects without a cluster, and
the operator applies exactly what this module returns.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from . import mig, quantity
from .constants import (
    API_KEY_DIR, API_KEY_FILE, API_VERSION, APP_NAME, COMPONENT, FETCH_COMMAND, GPU_RESOURCE, GROUP, HEALTH_PATH,
    KIND, LABEL_COMPONENT, LABEL_GPU_PRODUCT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_PART_OF,
    LABEL_VERSION, MANAGER, METRICS_PATH, MODEL_CACHE_ENTRY, MODEL_CACHE_MOUNT, MODEL_MOUNT, NODE_MODEL_CACHE_PATH,
    LEXICON_MOUNT, READY_PATH, REGISTRATION_KEY_DIR, REGISTRATION_KEY_FILE, SERVER_COMMAND, SERVER_PORT, SERVER_PORT_NAME, TMP_MOUNT, VOICE_STORE_MOUNT,
)
from .canary.traffic import CANARY, STABLE, split_replicas
from .server_settings import env as setting_env
from .spec import CosyVoiceServiceSpec, Storage

Obj = dict[str, Any]

CONTAINER_NAME = "server"
FETCH_CONTAINER_NAME = "fetch-model"
RUN_AS_ID = 10001
DEFAULT_MODEL_SIZE_LIMIT = "20Gi"
TMP_SIZE_LIMIT = "2Gi"
# Headroom left to the CUDA context and cuDNN workspaces when the arena is capped to a MIG slice.
GPU_ARENA_FRACTION = 0.9
# Seconds between the end of the drain and SIGKILL: time for the process to exit after draining.
EXIT_MARGIN_SECONDS = 5
DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "1", "memory": "4Gi"},
    "limits": {"memory": "8Gi"},
}

DEPLOYMENT = ("apps/v1", "Deployment")
SERVICE = ("v1", "Service")
PDB = ("policy/v1", "PodDisruptionBudget")
SERVICE_MONITOR = ("monitoring.coreos.com/v1", "ServiceMonitor")
HTTP_ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")
# Every kind the operator may own, in the order it applies them.
CHILD_KINDS = (SERVICE, DEPLOYMENT, PDB, SERVICE_MONITOR, HTTP_ROUTE)
# Which version a pod, Deployment or per-version Service runs: stable, or the canary (spec.canary).
LABEL_TRACK = f"{GROUP}/track"
LABEL_MODEL_VERSION = f"{GROUP}/model-version"

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Owner:
    """Who the children belong to. ``uid`` is None when rendering a file without a cluster."""
    name: str
    namespace: str
    uid: str | None = None

    @classmethod
    def from_body(cls, body: Obj, default_namespace: str = "default") -> Owner:
        meta = body.get("metadata") or {}
        return cls(name=meta["name"], namespace=meta.get("namespace") or default_namespace, uid=meta.get("uid"))


@dataclass
class Rendered:
    objects: list[Obj]
    # (apiVersion, kind) of children named like the owner that must not exist (e.g. a disabled PDB).
    absent: list[tuple[str, str]] = field(default_factory=list)
    # (apiVersion, kind, name) of a canary's children that must not exist (no canary, or no gateway).
    absent_canary: list[tuple[str, str, str]] = field(default_factory=list)

    def get(self, kind: str) -> Obj | None:
        return next((o for o in self.objects if o["kind"] == kind), None)


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name}


def selector_string(name: str) -> str:
    """``status.selector`` for the scale subresource (HPA/KEDA read it to find the pods)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def endpoint(owner: Owner, spec: CosyVoiceServiceSpec, cluster_domain: str = "cluster.local") -> str:
    return f"http://{owner.name}.{owner.namespace}.svc.{cluster_domain}:{spec.service.port}"


def image_version(image: str) -> str | None:
    """The tag of ``repo:tag`` when it is a valid label value; None for digests or odd tags."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.split(":", 1)[1]
    return tag if len(tag) <= 63 and _LABEL_VALUE.match(tag) else None


def common_labels(name: str, spec: CosyVoiceServiceSpec) -> dict[str, str]:
    labels = {**selector_labels(name), LABEL_COMPONENT: COMPONENT, LABEL_PART_OF: APP_NAME, LABEL_MANAGED_BY: MANAGER}
    version = image_version(spec.image)
    if version:
        labels[LABEL_VERSION] = version
    return labels


def child_name(owner: Owner, track: str | None) -> str:
    """``<name>`` for the stable Deployment and the Service over both versions, ``<name>-<track>`` else."""
    return owner.name if track in (None, STABLE) else f"{owner.name}-{track}"


def _metadata(owner: Owner, spec: CosyVoiceServiceSpec, name: str | None = None) -> Obj:
    meta: Obj = {"name": name or owner.name, "namespace": owner.namespace, "labels": common_labels(owner.name, spec)}
    if owner.uid:
        meta["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": KIND, "name": owner.name, "uid": owner.uid,
            "controller": True, "blockOwnerDeletion": True,
        }]
    return meta


# --- the pod --------------------------------------------------------------------------------------

def gpu_memory_limit_bytes(spec: CosyVoiceServiceSpec) -> int | None:
    if spec.gpu is None:
        return None
    if spec.gpu.memory_limit_bytes is not None:
        return spec.gpu.memory_limit_bytes or None  # 0 means "no cap"
    if spec.gpu.mig_profile:
        return int(mig.profile_memory_gb(spec.gpu.mig_profile) * 10**9 * GPU_ARENA_FRACTION)
    return None  # a whole GPU of unknown size: let the server use what it finds


def flow_threads(spec: CosyVoiceServiceSpec) -> int | None:
    """A CPU replica's flow threads: its CPU limit, else its request, rounded up. Without a limit the container
    sees every core of the node (and would size its flow by them); the request is the share the scheduler
    reserved for it. None on a GPU (the server's own default) or when spec.env sets the variable itself."""
    if spec.gpu is not None or any(e.name == setting_env("flow_threads") for e in spec.env):
        return None
    resources = container_resources(spec)
    cpu = resources.get("limits", {}).get("cpu") or resources.get("requests", {}).get("cpu")
    if cpu is None:
        return None
    return max(1, math.ceil(quantity.parse(cpu)))


def server_env(spec: CosyVoiceServiceSpec) -> list[Obj]:
    """The server's configuration, then ``spec.env`` (which may not name these: spec.EnvVar checks it)."""
    batching, shutdown = spec.batching, spec.shutdown
    settings: dict[str, object] = {
        "host": "0.0.0.0",
        "port": SERVER_PORT,
        "device": "cuda" if spec.gpu is not None else "cpu",
        "precision": spec.effective_precision,
        "served_model_name": spec.served_model_name,
        "model_version": spec.version,  # the info metric a canary's series are told apart by
        "max_batch_size": batching.max_batch_size,
        "max_queue_delay_ms": f"{batching.max_queue_delay_ms:g}",
        "max_queue_size": batching.max_queue_size,
        "request_timeout_s": batching.request_timeout_seconds,
        "drain_timeout_s": shutdown.drain_timeout_seconds,
    }
    if spec.storage is not None:
        settings["model_dir"] = MODEL_MOUNT
    threads = flow_threads(spec)
    if threads is not None:
        settings["flow_threads"] = threads
    mem = gpu_memory_limit_bytes(spec)
    if mem:
        settings["gpu_mem_limit_bytes"] = mem
    if spec.api_key_secret is not None:
        settings["api_key_file"] = API_KEY_FILE
    voices = spec.voices
    if voices.pvc is not None:
        settings["voice_store_dir"] = VOICE_STORE_MOUNT
    if voices.registration.enabled:
        settings["allow_voice_registration"] = "true"
    if voices.registration.key_secret is not None:
        settings["voice_registration_key_file"] = REGISTRATION_KEY_FILE
    if spec.playground.enabled:
        settings["playground"] = "true"
    lexicons = spec.pronunciation.lexicons
    if lexicons:
        settings["lexicon_dir"] = LEXICON_MOUNT
        defaults = [lex.lexicon_name for lex in lexicons if lex.default]
        if defaults:
            settings["default_lexicons"] = ",".join(defaults)
    # The root filesystem is read-only and uid 10001 has no home: caches go to the /tmp emptyDir.
    values = {"HOME": TMP_MOUNT, **{setting_env(name): str(value) for name, value in settings.items()}}
    env: list[Obj] = [{"name": k, "value": v} for k, v in values.items()]
    return env + [user.model_dump(by_alias=True, exclude_none=True) for user in spec.env]


def container_resources(spec: CosyVoiceServiceSpec) -> Obj:
    if spec.resources is None:
        resources: Obj = {k: dict(v) for k, v in DEFAULT_RESOURCES.items()}
    else:
        resources = {k: dict(v) for k, v in (("requests", spec.resources.requests),
                                               ("limits", spec.resources.limits)) if v}
    if spec.gpu is not None:
        # Extended resources cannot be overcommitted: requests must equal limits.
        for section in ("requests", "limits"):
            resources.setdefault(section, {})[spec.gpu.resource] = 1
    return resources


def container_security_context() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_ID,
        "runAsGroup": RUN_AS_ID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probe(path: str, period: int, timeout: int, failures: int) -> Obj:
    return {"httpGet": {"path": path, "port": SERVER_PORT_NAME}, "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": failures}


def server_container(spec: CosyVoiceServiceSpec) -> Obj:
    mounts: list[Obj] = [{"name": "tmp", "mountPath": TMP_MOUNT}]
    if spec.storage is not None and spec.storage.cache is not None:
        # the node cache's entry, read-only; the fetch step has checked it and the server holds it in use
        mounts.append({"name": "model-cache", "mountPath": MODEL_MOUNT, "readOnly": True,
                       "subPath": MODEL_CACHE_ENTRY.format(digest=spec.storage.sha256)})
    elif spec.storage is not None:
        mount: Obj = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        if spec.storage.pvc is not None and spec.storage.pvc.sub_path:
            mount["subPath"] = spec.storage.pvc.sub_path
        mounts.append(mount)
    if spec.api_key_secret is not None:
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
    voices = spec.voices
    if voices.pvc is not None:
        # Replicas that may not register only read the voices: their mount is read-only.
        store: Obj = {"name": "voices", "mountPath": VOICE_STORE_MOUNT, "readOnly": not voices.registration.enabled}
        if voices.pvc.sub_path:
            store["subPath"] = voices.pvc.sub_path
        mounts.append(store)
    if voices.registration.key_secret is not None:
        mounts.append({"name": "registration-key", "mountPath": REGISTRATION_KEY_DIR, "readOnly": True})
    # A whole volume per lexicon, never a subPath: the kubelet updates those in place (a ConfigMap change reaches
    # the server, which re-reads its lexicons, without a restart); subPath mounts are never updated.
    for i, lex in enumerate(spec.pronunciation.lexicons):
        mounts.append({"name": f"lexicon-{i}", "mountPath": f"{LEXICON_MOUNT}/{lex.lexicon_name}", "readOnly": True})
    container: Obj = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(SERVER_COMMAND),
        "ports": [{"name": SERVER_PORT_NAME, "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": server_env(spec),
        "resources": container_resources(spec),
        # Startup allows a slow first model load; liveness then only catches a wedged process.
        "startupProbe": _probe(HEALTH_PATH, period=5, timeout=2, failures=120),
        "livenessProbe": _probe(HEALTH_PATH, period=10, timeout=3, failures=3),
        "readinessProbe": _probe(READY_PATH, period=5, timeout=2, failures=2),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.shutdown.pre_stop_sleep_seconds:
        # The sleep lets endpoint removal reach every kube-proxy/ingress before SIGTERM starts the drain.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": spec.shutdown.pre_stop_sleep_seconds}}}
    return container


def fetch_container(spec: CosyVoiceServiceSpec) -> Obj | None:
    storage = spec.storage
    if storage is None or storage.storage_uri is None:
        return None
    # A model bigger than its volume would get the pod evicted mid-fetch; fetch refuses it with a reason instead.
    max_bytes = int(quantity.parse(model_volume_size(storage)))
    if storage.cache is not None:  # the model lands in the node's cache, not in a volume of this pod
        where, model_mount = ["--cache-dir", MODEL_CACHE_MOUNT], {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT}
    else:
        where, model_mount = ["--dest", MODEL_MOUNT], {"name": "model", "mountPath": MODEL_MOUNT}
    command = [*FETCH_COMMAND, "--uri", storage.storage_uri, *where, "--max-bytes", str(max_bytes)]
    if storage.sha256:
        command += ["--sha256", storage.sha256]
    if storage.cache is not None:
        command += ["--cache-max-bytes", str(int(quantity.parse(storage.cache.max_size)))]
    container: Obj = {
        "name": FETCH_CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "env": [{"name": "HOME", "value": TMP_MOUNT}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}},
        "securityContext": container_security_context(),
        "volumeMounts": [model_mount, {"name": "tmp", "mountPath": TMP_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if storage.credentials_secret is not None:
        container["envFrom"] = [{"secretRef": {"name": storage.credentials_secret.name}}]
    return container


def model_volume_size(storage: Storage) -> int | str:
    """The fetched model's emptyDir size limit: the CR's ``storage.sizeLimit`` or the default."""
    return storage.size_limit if storage.size_limit is not None else DEFAULT_MODEL_SIZE_LIMIT


def volumes(spec: CosyVoiceServiceSpec) -> list[Obj]:
    vols: list[Obj] = [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}]
    storage = spec.storage
    if storage is not None and storage.pvc is not None:
        vols.append({"name": "model", "persistentVolumeClaim": {
            "claimName": storage.pvc.claim_name, "readOnly": storage.pvc.read_only}})
    elif storage is not None and storage.cache is not None:
        cache = storage.cache
        vols.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": cache.pvc.claim_name}}
                    if cache.pvc is not None else
                    # Directory, not DirectoryOrCreate: the kubelet would create it owned by root, unwritable here
                    {"name": "model-cache", "hostPath": {"path": NODE_MODEL_CACHE_PATH, "type": "Directory"}})
    elif storage is not None:
        vols.append({"name": "model", "emptyDir": {"sizeLimit": model_volume_size(storage)}})
    if spec.api_key_secret is not None:
        vols.append({"name": "api-key", "secret": {
            "secretName": spec.api_key_secret.name,
            "items": [{"key": spec.api_key_secret.key, "path": API_KEY_FILE.rsplit("/", 1)[-1]}],
            "defaultMode": 0o440}})
    voices = spec.voices
    if voices.pvc is not None:
        vols.append({"name": "voices", "persistentVolumeClaim": {
            "claimName": voices.pvc.claim_name, "readOnly": not voices.registration.enabled}})
    if voices.registration.key_secret is not None:
        vols.append({"name": "registration-key", "secret": {
            "secretName": voices.registration.key_secret.name,
            "items": [{"key": voices.registration.key_secret.key, "path": REGISTRATION_KEY_FILE.rsplit("/", 1)[-1]}],
            "defaultMode": 0o440}})
    for i, lex in enumerate(spec.pronunciation.lexicons):
        vols.append({"name": f"lexicon-{i}", "configMap": {
            "name": lex.config_map_ref.name, "defaultMode": 0o444,
            "items": [{"key": lex.config_map_ref.key, "path": f"{lex.lexicon_name}.pls"}]}})
    return vols


def node_selector(spec: CosyVoiceServiceSpec) -> dict[str, str]:
    selector = dict(spec.node_selector)
    gpu = spec.gpu
    if gpu is not None and gpu.product:
        if gpu.mig_strategy == "single" and gpu.mig_profile:
            selector[LABEL_GPU_PRODUCT] = mig.single_strategy_product_label(gpu.product, gpu.mig_profile)
        else:
            selector[LABEL_GPU_PRODUCT] = gpu.product
    return selector


def tolerations(spec: CosyVoiceServiceSpec) -> list[Obj]:
    items = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    # GPU nodes are commonly tainted nvidia.com/gpu:NoSchedule so that only GPU pods land there.
    if spec.gpu is not None and not any(t.key == GPU_RESOURCE for t in spec.tolerations):
        items.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return items


def pod_annotations(spec: CosyVoiceServiceSpec) -> dict[str, str]:
    annotations = {"kubectl.kubernetes.io/default-container": CONTAINER_NAME}
    if spec.monitoring.enabled:
        annotations.update({"prometheus.io/scrape": "true", "prometheus.io/port": str(SERVER_PORT),
                            "prometheus.io/path": METRICS_PATH})
    annotations.update(spec.pod_annotations)
    return annotations


def termination_grace_seconds(spec: CosyVoiceServiceSpec) -> int:
    """Must exceed preStop sleep + drain timeout, or in-flight syntheses are cut off by SIGKILL."""
    return spec.shutdown.pre_stop_sleep_seconds + spec.shutdown.drain_timeout_seconds + EXIT_MARGIN_SECONDS


def pod_spec(spec: CosyVoiceServiceSpec) -> Obj:
    pod: Obj = {
        # Service links would inject COSYVOICE_PORT=tcp://... into pods when a Service is named "cosyvoice".
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": RUN_AS_ID, "runAsGroup": RUN_AS_ID, "fsGroup": RUN_AS_ID,
            # Skip the recursive chown of a large model volume on every start.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [server_container(spec)],
        "volumes": volumes(spec),
    }
    fetch = fetch_container(spec)
    if fetch is not None:
        pod["initContainers"] = [fetch]
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    if spec.priority_class_name:
        pod["priorityClassName"] = spec.priority_class_name
    selector = node_selector(spec)
    if selector:
        pod["nodeSelector"] = selector
    tols = tolerations(spec)
    if tols:
        pod["tolerations"] = tols
    if spec.affinity:
        pod["affinity"] = spec.affinity
    return pod


# --- the children ---------------------------------------------------------------------------------

def deployment(owner: Owner, spec: CosyVoiceServiceSpec, replicas: int | None = None, track: str = STABLE) -> Obj:
    """The Deployment of one version: ``<name>`` (stable) or ``<name>-canary`` (``spec`` is then the canary's)."""
    template_labels = {**spec.pod_labels, **common_labels(owner.name, spec), LABEL_TRACK: track}
    meta = _metadata(owner, spec, child_name(owner, track))
    meta["labels"].update({LABEL_TRACK: track, LABEL_MODEL_VERSION: spec.version})
    # The stable selector predates canaries and is immutable: it also matches canary pods, which their own
    # Deployment's ReplicaSets own (a Deployment only adopts pods and ReplicaSets no controller owns).
    selector = selector_labels(owner.name) if track == STABLE else {**selector_labels(owner.name), LABEL_TRACK: track}
    return {
        "apiVersion": DEPLOYMENT[0], "kind": DEPLOYMENT[1],
        "metadata": meta,
        "spec": {
            "replicas": spec.desired_replicas if replicas is None else replicas,
            "revisionHistoryLimit": 5,
            "progressDeadlineSeconds": spec.rollout.progress_deadline_seconds,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable}},
            "template": {
                "metadata": {"labels": template_labels, "annotations": pod_annotations(spec)},
                "spec": pod_spec(spec),
            },
        },
    }


def service(owner: Owner, spec: CosyVoiceServiceSpec) -> Obj:
    meta = _metadata(owner, spec)
    if spec.service.annotations:
        meta["annotations"] = dict(spec.service.annotations)
    return {
        "apiVersion": SERVICE[0], "kind": SERVICE[1],
        "metadata": meta,
        "spec": {
            "type": spec.service.type,
            "selector": selector_labels(owner.name),
            "ports": [{"name": SERVER_PORT_NAME, "port": spec.service.port, "targetPort": SERVER_PORT_NAME,
                       "protocol": "TCP", "appProtocol": "http"}],
        },
    }


def track_service(owner: Owner, spec: CosyVoiceServiceSpec, track: str) -> Obj:
    """``<name>-stable`` or ``<name>-canary``: one version's pods, a backend of the HTTPRoute."""
    svc = service(owner, spec)
    svc["metadata"]["name"] = child_name(owner, track) if track == CANARY else f"{owner.name}-{STABLE}"
    svc["metadata"]["labels"][LABEL_TRACK] = track
    svc["spec"] = {**svc["spec"], "type": "ClusterIP", "selector": {**selector_labels(owner.name), LABEL_TRACK: track}}
    return svc


def http_route(owner: Owner, spec: CosyVoiceServiceSpec, weight: int) -> Obj:
    """The Gateway API route that splits the traffic: ``weight`` % to the canary's Service, the rest to stable."""
    canary = spec.canary
    assert canary is not None and canary.gateway is not None
    parent: Obj = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": canary.gateway.name}
    if canary.gateway.namespace:
        parent["namespace"] = canary.gateway.namespace
    if canary.gateway.section_name:
        parent["sectionName"] = canary.gateway.section_name
    route: Obj = {"parentRefs": [parent], "rules": [{"backendRefs": [
        {"kind": "Service", "name": f"{owner.name}-{STABLE}", "port": spec.service.port, "weight": 100 - weight},
        {"kind": "Service", "name": child_name(owner, CANARY), "port": spec.service.port, "weight": weight},
    ]}]}
    if canary.hostnames:
        route["hostnames"] = list(canary.hostnames)
    return {"apiVersion": HTTP_ROUTE[0], "kind": HTTP_ROUTE[1], "metadata": _metadata(owner, spec), "spec": route}


def pod_disruption_budget(owner: Owner, spec: CosyVoiceServiceSpec) -> Obj | None:
    pdb = spec.pod_disruption_budget
    if not pdb.enabled:
        return None
    body: Obj = {"selector": {"matchLabels": selector_labels(owner.name)},
                 # A crash-looping pod must not block node drains.
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    if pdb.min_available is not None:
        body["minAvailable"] = pdb.min_available
    else:
        body["maxUnavailable"] = pdb.max_unavailable if pdb.max_unavailable is not None else 1
    return {"apiVersion": PDB[0], "kind": PDB[1], "metadata": _metadata(owner, spec), "spec": body}


def service_monitor(owner: Owner, spec: CosyVoiceServiceSpec) -> Obj | None:
    sm = spec.monitoring.service_monitor
    if not (spec.monitoring.enabled and sm.enabled):
        return None
    meta = _metadata(owner, spec)
    meta["labels"] = {**sm.labels, **meta["labels"]}
    return {
        "apiVersion": SERVICE_MONITOR[0], "kind": SERVICE_MONITOR[1],
        "metadata": meta,
        "spec": {
            # not the per-version Services of a canary: their pods are scraped through the Service over both
            "selector": {"matchLabels": selector_labels(owner.name),
                         "matchExpressions": [{"key": LABEL_TRACK, "operator": "DoesNotExist"}]},
            "endpoints": [{
                "port": SERVER_PORT_NAME, "path": METRICS_PATH, "interval": sm.interval,
                # the autoscaler's and the alerts' queries select a service's pods by this label
                "relabelings": [{"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                                 "targetLabel": "cosyvoice_service"}],
            }],
        },
    }


# The kinds of object a pod can read from its namespace, besides its image: each must be opted in by its owner.
SECRET, CONFIG_MAP, CLAIM, SERVICE_ACCOUNT = "Secret", "ConfigMap", "PersistentVolumeClaim", "ServiceAccount"


def objects_used(pod: Obj) -> list[tuple[str, str, str]]:
    """(kind, where, name) for every Secret, ConfigMap, PersistentVolumeClaim and ServiceAccount a rendered
    pod reads: volumes (projected ones too), env, envFrom and its service account.

    Derived from the pod itself so that no way of naming one is missed. Not included: ``imagePullSecrets``
    (the kubelet sends a pull secret's credentials only to the registry they are for) and the namespace's
    ``default`` ServiceAccount, which every pod that names none runs as.
    """
    found: list[tuple[str, str, str]] = []
    for vol in pod.get("volumes") or []:
        where = f"volume {vol['name']}"
        for kind, key, source in ((SECRET, "secretName", vol.get("secret")), (CONFIG_MAP, "name", vol.get("configMap")),
                                  (CLAIM, "claimName", vol.get("persistentVolumeClaim"))):
            if (source or {}).get(key):
                found.append((kind, where, source[key]))
        for source in (vol.get("projected") or {}).get("sources") or []:
            for kind, ref in ((SECRET, source.get("secret")), (CONFIG_MAP, source.get("configMap"))):
                if (ref or {}).get("name"):
                    found.append((kind, where, ref["name"]))
    for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for env in container.get("env") or []:
            value_from = env.get("valueFrom") or {}
            for kind, ref in ((SECRET, value_from.get("secretKeyRef")), (CONFIG_MAP, value_from.get("configMapKeyRef"))):
                if (ref or {}).get("name"):
                    found.append((kind, f"env {env['name']} of container {container['name']}", ref["name"]))
        for source in container.get("envFrom") or []:
            for kind, ref in ((SECRET, source.get("secretRef")), (CONFIG_MAP, source.get("configMapRef"))):
                if (ref or {}).get("name"):
                    found.append((kind, f"envFrom of container {container['name']}", ref["name"]))
    account = pod.get("serviceAccountName")
    if account and account != "default":
        found.append((SERVICE_ACCOUNT, "serviceAccountName", account))
    return found


def render(owner: Owner, spec: CosyVoiceServiceSpec, canary_weight: int | None = None) -> Rendered:
    """All children of one CosyVoiceService, in the order they should be applied.

    With ``spec.canary``: a second Deployment ``<name>-canary`` and the replicas split by the weight
    (``canary_weight``, the weight in effect, defaults to ``spec.canary.weight``); with a gateway parent also
    one Service per version and the HTTPRoute that splits the traffic by the same weight."""
    canary = spec.canary_spec()
    weight = 0 if spec.canary is None else spec.canary.weight if canary_weight is None else canary_weight
    stable_n, canary_n = split_replicas(spec.desired_replicas, weight) if canary else (spec.desired_replicas, 0)
    objects: list[Obj] = [service(owner, spec), deployment(owner, spec, stable_n)]
    absent: list[tuple[str, str]] = []
    absent_canary = [(*DEPLOYMENT, child_name(owner, CANARY)), (*SERVICE, f"{owner.name}-{STABLE}"),
                     (*SERVICE, child_name(owner, CANARY)), (*HTTP_ROUTE, owner.name)]
    if canary is not None:
        objects.append(deployment(owner, canary, canary_n, CANARY))
        absent_canary = absent_canary[1:]
        if spec.canary is not None and spec.canary.gateway is not None:
            objects += [track_service(owner, spec, STABLE), track_service(owner, canary, CANARY),
                        http_route(owner, spec, weight)]
            absent_canary = []
    for kind, obj in ((PDB, pod_disruption_budget(owner, spec)), (SERVICE_MONITOR, service_monitor(owner, spec))):
        if obj is None:
            absent.append(kind)
        else:
            objects.append(obj)
    return Rendered(objects=objects, absent=absent, absent_canary=absent_canary)
