"""The model-fetch init container as the pod runs it, and the version label taken from the image tag."""
from __future__ import annotations

import pytest
from cosyvoice_operator import render as r
from cosyvoice_operator.spec import parse_spec


def test_the_fetch_container_has_a_writable_home_bounded_memory_and_the_servers_pull_policy() -> None:
    spec = parse_spec({"image": "registry.example/cosyvoice-server:1.4", "imagePullPolicy": "Always",
                       "storage": {"storageUri": "s3://bucket/m.tar.gz"}})
    fetch = r.fetch_container(spec)
    assert fetch is not None
    # a read-only root filesystem: tools that write under $HOME (cloud SDK caches) get the tmp volume
    assert fetch["env"] == [{"name": "HOME", "value": "/tmp"}]
    assert fetch["volumeMounts"] == [{"name": "model", "mountPath": "/models"}, {"name": "tmp", "mountPath": "/tmp"}]
    # unpacking a multi-GB archive streams: 2 GiB bound the download, 256 MiB is what it is scheduled with
    assert fetch["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
    assert (fetch["image"], fetch["imagePullPolicy"]) == ("registry.example/cosyvoice-server:1.4", "Always")
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the failure reason reaches the status
    assert fetch["securityContext"] == r.container_security_context()
    assert "envFrom" not in fetch
    assert r.fetch_container(parse_spec({"storage": {"pvc": {"claimName": "models"}}})) is None
    assert r.fetch_container(parse_spec({})) is None


@pytest.mark.parametrize(("image", "version"), [
    ("ghcr.io/cosyvoice-k8s/cosyvoice-server:0.3.1", "0.3.1"),
    ("cosyvoice-server:latest", "latest"),
    ("registry:5000/team/cosyvoice-server:v2_rc.1", "v2_rc.1"),
    ("registry:5000/team/cosyvoice-server", None),  # a port is not a tag
    ("cosyvoice-server", None),
    ("ghcr.io/x/cosyvoice-server@sha256:" + "a" * 64, None),  # a digest: no version to show
    ("ghcr.io/x/cosyvoice-server:1.0@sha256:" + "a" * 64, None),
    ("cosyvoice-server:" + "1" * 63, "1" * 63),
    ("cosyvoice-server:" + "1" * 64, None),  # longer than a label value may be
    ("cosyvoice-server:1.0-", None),  # a label value must end alphanumeric
])
def test_the_version_label_is_the_image_tag_when_it_is_a_valid_label_value(image: str, version: str | None) -> None:
    assert r.image_version(image) == version
    labels = r.common_labels("tts", parse_spec({"image": image}))
    assert labels.get("app.kubernetes.io/version") == version


@pytest.mark.parametrize(("size_limit", "max_bytes"), [
    (None, 20 * 2**30), ("1.5Gi", 3 * 2**29), ("500M", 500 * 10**6), (4_000_000_000, 4_000_000_000), ("2e9", 2 * 10**9)])
def test_fetch_refuses_a_model_larger_than_its_volume(size_limit, max_bytes) -> None:
    storage = {"storageUri": "https://models.example/m.tar.gz"} | ({"sizeLimit": size_limit} if size_limit else {})
    spec = parse_spec({"storage": storage})
    command = r.fetch_container(spec)["command"]
    assert command[command.index("--max-bytes") + 1] == str(max_bytes)
    model = next(v for v in r.volumes(spec) if v["name"] == "model")
    assert model["emptyDir"]["sizeLimit"] == (size_limit or "20Gi")


def test_a_cache_claim_holds_the_model_instead_of_a_pod_volume_and_needs_its_owners_opt_in() -> None:
    digest = "ab" * 32
    spec = parse_spec({"storage": {"storageUri": "s3://b/m.tar", "sha256": digest,
                                   "cache": {"pvc": {"claimName": "model-cache"}, "maxSize": "50Gi"}}})
    pod = r.pod_spec(spec)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "model" not in volumes  # nothing is downloaded into the pod's own storage
    assert volumes["model-cache"] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
    command = pod["initContainers"][0]["command"]
    assert command[command.index("--cache-dir") + 1] == "/model-cache" and "--dest" not in command
    assert command[command.index("--cache-max-bytes") + 1] == str(50 * 2**30)
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model-cache"]
    assert mount == {"name": "model-cache", "mountPath": "/models", "readOnly": True, "subPath": f"sha256-{digest}/model"}
    assert ("PersistentVolumeClaim", "volume model-cache", "model-cache") in r.objects_used(pod)
