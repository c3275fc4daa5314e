"""spec → Kubernetes objects: every example and edge case renders into objects the API server accepts."""
from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from cosyvoice_operator import render as r
from cosyvoice_operator.spec import InvalidSpec, parse_spec
from cosyvoice_operator.constants import OPT_IN_LABEL
from cvs_testkit import EXAMPLES, K8S_VERSION, example_objects, load_example

Obj = dict[str, Any]
OWNER = r.Owner(name="tts", namespace="speech", uid="0b7c6f6e-1111-2222-3333-444455556666")


def rendered(spec: Obj, owner: r.Owner = OWNER) -> r.Rendered:
    return r.render(owner, parse_spec(spec))


def deployment(spec: Obj) -> Obj:
    dep = rendered(spec).get("Deployment")
    assert dep is not None
    return dep


def pod(spec: Obj) -> Obj:
    return deployment(spec)["spec"]["template"]["spec"]


def server(spec: Obj) -> Obj:
    return pod(spec)["containers"][0]


def env(spec: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in server(spec)["env"]}


def validate(obj: Obj) -> None:
    if obj["kind"] == "ServiceMonitor":  # a Prometheus Operator CRD: kubernetes-validate has no schema
        assert set(obj["spec"]) == {"selector", "endpoints"}
        return
    if obj["kind"] == "HTTPRoute":  # a Gateway API CRD: no schema either; its fields as gateway-api v1 names them
        assert set(obj["spec"]) <= {"parentRefs", "hostnames", "rules"}
        assert all(set(b) == {"kind", "name", "port", "weight"} for b in obj["spec"]["rules"][0]["backendRefs"])
        return
    assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION


EDGE_CASES: dict[str, Obj] = {
    "empty": {},
    "mixed": {"gpu": {"migProfile": "1g.10gb"}},
    "mixed-with-product": {"gpu": {"migProfile": "3g.40gb", "product": "NVIDIA-A100-SXM4-80GB"}},
    "single": {"gpu": {"migStrategy": "single", "migProfile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"}},
    "whole-gpu": {"gpu": {"migStrategy": "none"}},
    "storage-uri-everything": {"storage": {"storageUri": "gs://b/m.zip", "sha256": "0" * 64, "sizeLimit": "3Gi",
                                           "credentialsSecret": {"name": "gcs"}}},
    "pvc-rw-subpath": {"storage": {"pvc": {"claimName": "models", "subPath": "v2", "readOnly": False}}},
    "api-key": {"apiKeySecret": {"name": "key", "key": "token"}},
    "percent-rollout-and-pdb": {"rollout": {"maxSurge": "25%", "maxUnavailable": "0%"},
                                "podDisruptionBudget": {"minAvailable": "50%"}},
    "no-pdb-no-monitoring": {"podDisruptionBudget": {"enabled": False}, "monitoring": {"enabled": False}},
    "service-monitor": {"monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "scaled-to-zero": {"replicas": 0},
    "no-pre-stop": {"shutdown": {"preStopSleepSeconds": 0, "drainTimeoutSeconds": 0}},
    "scheduling": {"nodeSelector": {"pool": "a"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
                   "priorityClassName": "high", "serviceAccountName": "tts", "imagePullSecrets": [{"name": "reg"}],
                   "gpu": {"migProfile": "1g.10gb"}},
    "env-valuefrom": {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}]},
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects(path: Any) -> None:
    cr = load_example(path)
    owner = r.Owner.from_body(cr)
    out = r.render(r.Owner(owner.name, owner.namespace, uid="u-1"), parse_spec(cr["spec"]))
    assert [o["kind"] for o in out.objects][:2] == ["Service", "Deployment"]
    for obj in out.objects:
        validate(obj)


@pytest.mark.parametrize("spec", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_edge_cases_render_valid_objects(spec: Obj) -> None:
    for obj in rendered(spec).objects:
        validate(obj)
    for obj in rendered(spec, r.Owner("tts", "default")).objects:  # no uid: `render` without a cluster
        validate(obj)


def test_the_validator_rejects_a_broken_deployment() -> None:
    """Guard against a validation that cannot fail."""
    dep = copy.deepcopy(deployment({}))
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


# --- GPU placement --------------------------------------------------------------------------------

def test_mixed_strategy_requests_one_mig_slice() -> None:
    c = server({"gpu": {"migProfile": "1g.10gb"}})
    assert c["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == 1
    assert c["resources"]["requests"]["nvidia.com/mig-1g.10gb"] == 1
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert "nodeSelector" not in pod({"gpu": {"migProfile": "1g.10gb"}})
    assert env({"gpu": {"migProfile": "1g.10gb"}})["COSYVOICE_DEVICE"] == "cuda"


def test_mixed_strategy_with_product_pins_the_gpu_model() -> None:
    p = pod({"gpu": {"migProfile": "3g.40gb", "product": "NVIDIA-A100-SXM4-80GB"}})
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_single_strategy_requests_a_gpu_on_nodes_cut_into_that_profile() -> None:
    spec = {"gpu": {"migStrategy": "single", "migProfile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"},
            "nodeSelector": {"pool": "tts"}}
    assert server(spec)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod(spec)["nodeSelector"] == {"pool": "tts",
                                         "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}


def test_no_mig_requests_a_whole_gpu() -> None:
    limits = server({"gpu": {"migStrategy": "none"}})["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    assert not any(k.startswith("nvidia.com/mig-") for k in limits)


def test_cpu_only_requests_no_gpu_and_runs_fp32() -> None:
    c = server({})
    assert not any(k.startswith("nvidia.com/") for section in c["resources"].values() for k in section)
    assert env({})["COSYVOICE_DEVICE"] == "cpu"
    assert env({})["COSYVOICE_PRECISION"] == "fp32"
    assert "tolerations" not in pod({})
    assert env({"gpu": {"migStrategy": "none"}})["COSYVOICE_PRECISION"] == "fp16"
    assert env({"precision": "int8"})["COSYVOICE_PRECISION"] == "int8"


def test_tolerations_render_with_their_kubernetes_field_names() -> None:
    """A NoExecute toleration keeps its tolerationSeconds: pods stay that long on a node that goes bad."""
    tol = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
    p = pod({"tolerations": [tol]})
    assert p["tolerations"] == [tol]
    validate(deployment({"tolerations": [tol]}))


def test_gpu_pods_tolerate_the_gpu_taint_once() -> None:
    assert pod({"gpu": {"migProfile": "1g.10gb"}})["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    own = pod({"gpu": {"migProfile": "1g.10gb"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    assert own["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_gpu_memory_cap_leaves_headroom_on_a_mig_slice() -> None:
    assert env({"gpu": {"migProfile": "1g.10gb"}})["COSYVOICE_GPU_MEM_LIMIT_BYTES"] == str(9 * 10**9)
    assert "COSYVOICE_GPU_MEM_LIMIT_BYTES" not in env({"gpu": {"migStrategy": "none"}})
    assert "COSYVOICE_GPU_MEM_LIMIT_BYTES" not in env({"gpu": {"migProfile": "1g.10gb", "memoryLimitBytes": 0}})
    assert env({"gpu": {"migStrategy": "none", "memoryLimitBytes": 123}})["COSYVOICE_GPU_MEM_LIMIT_BYTES"] == "123"


def test_a_cpu_replicas_flow_threads_follow_its_cpu_limit_else_its_request() -> None:
    """Without a CPU limit the container sees every core of the node: the flow's threads follow what the pod
    was given, never the node's count."""
    assert env({})["COSYVOICE_FLOW_THREADS"] == "1"  # the default request, 1 CPU
    assert env({"resources": {"requests": {"cpu": "2500m"}}})["COSYVOICE_FLOW_THREADS"] == "3"
    assert env({"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}})["COSYVOICE_FLOW_THREADS"] == "4"
    assert "COSYVOICE_FLOW_THREADS" not in env({"resources": {"requests": {"memory": "4Gi"}}})
    assert "COSYVOICE_FLOW_THREADS" not in env({"gpu": {"migProfile": "1g.10gb"}})
    own = env({"resources": {"requests": {"cpu": "2"}}, "env": [{"name": "COSYVOICE_FLOW_THREADS", "value": "6"}]})
    assert own["COSYVOICE_FLOW_THREADS"] == "6"


# --- model source ---------------------------------------------------------------------------------

def test_storage_uri_is_fetched_by_an_init_container_into_a_size_limited_volume() -> None:
    spec = {"storage": {"storageUri": "s3://bucket/cosyvoice2.tar.gz", "sha256": "ab" * 32,
                        "credentialsSecret": {"name": "s3"}}}
    p = pod(spec)
    (fetch,) = p["initContainers"]
    assert fetch["command"] == ["cosyvoice-server", "fetch", "--uri", "s3://bucket/cosyvoice2.tar.gz",
                                "--dest", "/models", "--max-bytes", str(20 * 2**30), "--sha256", "ab" * 32]
    assert fetch["image"] == server(spec)["image"]
    assert fetch["envFrom"] == [{"secretRef": {"name": "s3"}}]
    assert {"name": "model", "mountPath": "/models"} in fetch["volumeMounts"]
    model = next(v for v in p["volumes"] if v["name"] == "model")
    assert model == {"name": "model", "emptyDir": {"sizeLimit": "20Gi"}}
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in server(spec)["volumeMounts"]
    assert env(spec)["COSYVOICE_MODEL_DIR"] == "/models"
    sized = pod({"storage": {"storageUri": "https://h/m.zip", "sizeLimit": "5Gi"}})
    assert next(v for v in sized["volumes"] if v["name"] == "model")["emptyDir"] == {"sizeLimit": "5Gi"}
    assert "--sha256" not in sized["initContainers"][0]["command"]


def test_pvc_is_mounted_read_only_with_its_sub_path() -> None:
    spec = {"storage": {"pvc": {"claimName": "models", "subPath": "cosyvoice2"}}}
    p = pod(spec)
    assert "initContainers" not in p
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in p["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True, "subPath": "cosyvoice2"} in \
        server(spec)["volumeMounts"]


def test_without_storage_the_bundled_model_is_used() -> None:
    assert "COSYVOICE_MODEL_DIR" not in env({})
    assert [v["name"] for v in pod({})["volumes"]] == ["tmp"]


# --- the server contract --------------------------------------------------------------------------

def test_server_configuration_is_passed_as_environment() -> None:
    e = env({"batching": {"maxBatchSize": 16, "maxQueueDelayMs": 3, "maxQueueSize": 64, "requestTimeoutSeconds": 30},
             "shutdown": {"drainTimeoutSeconds": 20}, "servedModelName": "cv2", "precision": "fp16",
             "modelVersion": "cv2-fp16"})
    assert e == {
        "HOME": "/tmp", "COSYVOICE_HOST": "0.0.0.0", "COSYVOICE_PORT": "8000", "COSYVOICE_DEVICE": "cpu",
        "COSYVOICE_PRECISION": "fp16", "COSYVOICE_SERVED_MODEL_NAME": "cv2", "COSYVOICE_MODEL_VERSION": "cv2-fp16",
        "COSYVOICE_MAX_BATCH_SIZE": "16",
        "COSYVOICE_MAX_QUEUE_DELAY_MS": "3", "COSYVOICE_MAX_QUEUE_SIZE": "64", "COSYVOICE_REQUEST_TIMEOUT_S": "30",
        "COSYVOICE_DRAIN_TIMEOUT_S": "20", "COSYVOICE_FLOW_THREADS": "1"}
    c = server({})
    assert c["command"] == ["cosyvoice-server", "serve"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_user_env_is_appended_after_the_operators() -> None:
    items = server({"env": [{"name": "EXTRA", "value": "1"},
                            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})["env"]
    assert items[-2:] == [{"name": "EXTRA", "value": "1"},
                          {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]


@pytest.mark.parametrize("name", ["COSYVOICE_API_KEY_FILE", "COSYVOICE_API_KEY", "COSYVOICE_HOST", "HOME"])
def test_user_env_cannot_replace_the_operators(name: str) -> None:
    """Otherwise COSYVOICE_API_KEY_FILE=/dev/null (or a known COSYVOICE_API_KEY) would switch off the key
    the administrator of the namespace put in spec.apiKeySecret."""
    with pytest.raises(InvalidSpec, match=f"{name} is set by the operator and cannot be overridden"):
        parse_spec({"apiKeySecret": {"name": "k", "key": "k"}, "env": [{"name": name, "value": "/dev/null"}]})


def test_every_object_the_pod_reads_is_listed() -> None:
    spec = {"apiKeySecret": {"name": "key", "key": "k"},
            "storage": {"storageUri": "s3://b/m.tar.gz", "credentialsSecret": {"name": "s3"}},
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}}],
            "imagePullSecrets": [{"name": "pull"}], "serviceAccountName": "s3-reader"}
    found = r.objects_used(pod(spec))
    assert found == [("Secret", "volume api-key", "key"), ("Secret", "envFrom of container fetch-model", "s3"),
                     ("Secret", "env X of container server", "other"),
                     ("ConfigMap", "env Y of container server", "settings"),
                     ("ServiceAccount", "serviceAccountName", "s3-reader")]
    claims = r.objects_used(pod({"storage": {"pvc": {"claimName": "models"}}, "voices": {"pvc": {"claimName": "v"}},
                                 "serviceAccountName": "default"}))
    assert claims == [("PersistentVolumeClaim", "volume model", "models"), ("PersistentVolumeClaim", "volume voices", "v")]


def test_api_key_secret_is_mounted_as_the_file_the_server_reads() -> None:
    spec = {"apiKeySecret": {"name": "tts-key", "key": "token"}}
    p, e = pod(spec), env(spec)
    vol = next(v for v in p["volumes"] if v["name"] == "api-key")
    assert vol["secret"]["secretName"] == "tts-key"
    assert vol["secret"]["items"] == [{"key": "token", "path": "api-key"}]
    assert vol["secret"]["defaultMode"] == 0o440  # the pod's user and group read it; nobody else, nothing runs it
    mount = next(m for m in server(spec)["volumeMounts"] if m["name"] == "api-key")
    assert e["COSYVOICE_API_KEY_FILE"] == f"{mount['mountPath']}/api-key" and mount["readOnly"] is True
    assert "COSYVOICE_API_KEY_FILE" not in env({})


def test_probes_and_graceful_shutdown_fit_the_drain() -> None:
    spec = {"shutdown": {"drainTimeoutSeconds": 45, "preStopSleepSeconds": 7}}
    c, p = server(spec), pod(spec)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 7}}}
    # a crash's last log lines become its termination message, which the CR's Ready condition quotes
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert p["terminationGracePeriodSeconds"] > 7 + 45
    assert env(spec)["COSYVOICE_DRAIN_TIMEOUT_S"] == "45"
    assert "lifecycle" not in server({"shutdown": {"preStopSleepSeconds": 0}})


def test_every_container_runs_restricted_with_a_writable_tmp() -> None:
    p = pod({"storage": {"storageUri": "s3://b/m"}, "gpu": {"migProfile": "1g.10gb"}})
    assert p["securityContext"]["runAsNonRoot"] is True
    assert p["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # volumes belong to the pod's group, and a volume already owned by it (a large model PVC) is not re-owned
    # file by file at every start
    assert p["securityContext"]["fsGroup"] == 10001 and p["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert p["automountServiceAccountToken"] is False and p["enableServiceLinks"] is False
    for c in [*p["initContainers"], *p["containers"]]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["runAsNonRoot"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}} in p["volumes"]


def test_default_and_custom_cpu_memory() -> None:
    assert server({})["resources"] == {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    custom = server({"resources": {"requests": {"cpu": "500m"}}, "gpu": {"migStrategy": "none"}})["resources"]
    assert custom == {"requests": {"cpu": "500m", "nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}


# --- metadata, selectors, availability ------------------------------------------------------------

def test_labels_selectors_and_owner_references() -> None:
    out = rendered({"podLabels": {"team": "speech", "app.kubernetes.io/instance": "hijack"}})
    selector = {"app.kubernetes.io/name": "cosyvoice", "app.kubernetes.io/instance": "tts"}
    for obj in out.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "cosyvoice-operator"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert selector.items() <= labels.items()
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService", "name": "tts",
                       "uid": OWNER.uid, "controller": True, "blockOwnerDeletion": True}
        assert obj["metadata"]["namespace"] == "speech"
    dep, svc, pdb = out.get("Deployment"), out.get("Service"), out.get("PodDisruptionBudget")
    assert dep["spec"]["selector"]["matchLabels"] == selector == svc["spec"]["selector"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    template_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert template_labels["team"] == "speech" and template_labels["app.kubernetes.io/instance"] == "tts"
    assert r.selector_string("tts") == "app.kubernetes.io/instance=tts,app.kubernetes.io/name=cosyvoice"
    assert all("ownerReferences" not in o["metadata"] for o in rendered({}, r.Owner("tts", "x")).objects)


def test_version_label_only_for_plain_tags() -> None:
    assert r.image_version("ghcr.io/a/b:1.2.3") == "1.2.3"
    assert r.image_version("registry:5000/a/b") is None
    assert r.image_version("ghcr.io/a/b@sha256:" + "0" * 64) is None
    assert r.image_version("ghcr.io/a/b@sha256:abc") is None  # a digest, however it is spelled
    assert r.image_version("ghcr.io/a/b:1.2:3") is None  # not repo:tag: no version is guessed
    labels = deployment({"image": "registry:5000/a/b"})["metadata"]["labels"]
    assert "app.kubernetes.io/version" not in labels


def test_rollout_needs_no_spare_slice_by_default() -> None:
    strategy = deployment({"gpu": {"migProfile": "1g.10gb"}})["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_pod_disruption_budget() -> None:
    pdb = rendered({}).get("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    min_available = rendered({"podDisruptionBudget": {"minAvailable": 2}}).get("PodDisruptionBudget")
    assert min_available["spec"]["minAvailable"] == 2 and "maxUnavailable" not in min_available["spec"]
    max_unavailable = rendered({"podDisruptionBudget": {"maxUnavailable": 2}}).get("PodDisruptionBudget")
    assert max_unavailable["spec"]["maxUnavailable"] == 2 and "minAvailable" not in max_unavailable["spec"]
    off = rendered({"podDisruptionBudget": {"enabled": False}})
    assert off.get("PodDisruptionBudget") is None and ("policy/v1", "PodDisruptionBudget") in off.absent


def test_service_and_endpoint() -> None:
    spec = {"service": {"type": "LoadBalancer", "port": 80, "annotations": {"a": "b"}}}
    svc = rendered(spec).get("Service")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP",
                                     "appProtocol": "http"}]
    assert svc["metadata"]["annotations"] == {"a": "b"}
    assert r.endpoint(OWNER, parse_spec(spec)) == "http://tts.speech.svc.cluster.local:80"


def test_kubectl_logs_and_exec_pick_the_server_container() -> None:
    """With the fetch-model init container in the pod, kubectl needs the default container named."""
    dep = deployment({"storage": {"storageUri": "s3://b/m"}})
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["kubectl.kubernetes.io/default-container"] == dep["spec"]["template"]["spec"]["containers"][0]["name"]


def test_pods_run_as_the_service_account_and_pull_with_the_secrets_asked_for() -> None:
    p = pod({"serviceAccountName": "tts-runner", "imagePullSecrets": [{"name": "reg"}, {"name": "mirror"}]})
    assert p["serviceAccountName"] == "tts-runner"
    assert p["imagePullSecrets"] == [{"name": "reg"}, {"name": "mirror"}]
    assert "serviceAccountName" not in pod({}) and "imagePullSecrets" not in pod({})


def test_rollback_history_keeps_five_revisions() -> None:
    """`kubectl rollout undo` can go back five revisions (docs/operator.md); older ReplicaSets are removed."""
    assert deployment({})["spec"]["revisionHistoryLimit"] == 5


def test_monitoring_annotations_and_service_monitor() -> None:
    ann = deployment({})["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "8000"
    assert ann["prometheus.io/path"] == "/metrics"
    assert "prometheus.io/scrape" not in deployment({"monitoring": {"enabled": False}})["spec"]["template"][
        "metadata"]["annotations"]
    assert rendered({}).get("ServiceMonitor") is None
    out = rendered({"monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    sm = out.get("ServiceMonitor")
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    # it selects this service's Service and no other CosyVoiceService's
    match = sm["spec"]["selector"]["matchLabels"].items()
    assert match and match <= out.get("Service")["metadata"]["labels"].items()
    other = rendered({}, r.Owner("other", "speech", uid="u-2")).get("Service")
    assert not match <= other["metadata"]["labels"].items()
    # the autoscaler's queries and the alerts select one service's pods by cosyvoice_service=<CR name>
    assert sm["spec"]["endpoints"] == [{
        "port": "http", "path": "/metrics", "interval": "15s",
        "relabelings": [{"sourceLabels": ["__meta_kubernetes_service_label_app_kubernetes_io_instance"],
                         "targetLabel": "cosyvoice_service"}],
    }]


def test_rendering_is_pure() -> None:
    spec = parse_spec(load_example(EXAMPLES[0])["spec"])
    before = spec.model_dump()
    assert r.render(OWNER, spec) == r.render(OWNER, spec)
    assert spec.model_dump() == before


LEXICONS = {"pronunciation": {"lexicons": [
    {"configMapRef": {"name": "brands", "key": "brands.pls"}, "default": True},
    {"configMapRef": {"name": "shared-words", "key": "zh.pls"}, "name": "places"}]}}


def test_lexicons_are_whole_configmap_volumes_the_server_reads_and_the_operator_checks() -> None:
    p = pod(LEXICONS)
    mounts = {m["name"]: m for m in server(LEXICONS)["volumeMounts"]}
    vols = {v["name"]: v for v in p["volumes"]}
    assert [(vols[n]["configMap"]["name"], vols[n]["configMap"]["items"], mounts[n]["mountPath"])
            for n in ("lexicon-0", "lexicon-1")] == [
        ("brands", [{"key": "brands.pls", "path": "brands.pls"}], "/etc/cosyvoice/lexicons/brands"),
        ("shared-words", [{"key": "zh.pls", "path": "places.pls"}], "/etc/cosyvoice/lexicons/places")]
    # read-only, and never a subPath: the kubelet does not update subPath mounts
    assert all(mounts[n]["readOnly"] and "subPath" not in mounts[n] for n in ("lexicon-0", "lexicon-1"))
    assert env(LEXICONS)["COSYVOICE_LEXICON_DIR"] == "/etc/cosyvoice/lexicons"
    assert env(LEXICONS)["COSYVOICE_DEFAULT_LEXICONS"] == "brands"
    # the ConfigMaps are references like any other: same namespace only, opted in by their owner
    assert {(k, n) for k, _, n in r.objects_used(p)} >= {("ConfigMap", "brands"), ("ConfigMap", "shared-words")}
    assert "COSYVOICE_LEXICON_DIR" not in env({})


@pytest.mark.parametrize("lexicons, problem", [
    ([{"configMapRef": {"name": "a", "key": "x.pls"}}, {"configMapRef": {"name": "a", "key": "y.pls"}}],
     "two lexicons are named 'a'"),
    ([{"configMapRef": {"name": "a" * 70, "key": "x.pls"}}], "give the lexicon a name"),
    ([{"configMapRef": {"name": "../other", "key": "x.pls"}}], "not a Kubernetes object name"),
    ([{"configMapRef": {"name": "a", "key": "../x"}}], "configMapRef.key"),
])
def test_bad_lexicon_references_are_invalid_specs(lexicons, problem) -> None:
    with pytest.raises(InvalidSpec, match=problem):
        parse_spec({"pronunciation": {"lexicons": lexicons}})


@pytest.mark.parametrize("path", [p for p in EXAMPLES if len(example_objects(p)) > 1], ids=lambda p: p.name)
def test_the_objects_an_example_brings_are_valid_too(path: Any) -> None:
    """A lexicon ConfigMap beside its service: a valid object, labelled for the service to use, whose PLS
    document the server reads."""
    from cosyvoice_server.pronunciation.lexicon import parse_pls

    cr = load_example(path)
    used = {(k, n) for k, _, n in r.objects_used(pod(cr["spec"]))}
    for obj in example_objects(path):
        if obj is cr or obj["kind"] == "CosyVoiceService":
            continue
        validate(obj)
        assert (obj["kind"], obj["metadata"]["name"]) in used
        assert obj["metadata"]["labels"][OPT_IN_LABEL] == "true"
        for key, text in obj.get("data", {}).items():
            if key.endswith(".pls"):
                assert parse_pls(key.removesuffix(".pls"), text).entries
