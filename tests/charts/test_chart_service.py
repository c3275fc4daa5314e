"""The GitOps chart: one CosyVoiceService from values, accepted by the CRD's schema and CEL rules."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chartkit import K8S_VERSION, SERVICE_CHART, Helm
from cosyvoice_operator.constants import OPT_IN_LABEL, OPT_IN_VALUE
from cvs_crdschema import admit
from cvs_testkit import CRD_PATH, EXAMPLES, load_example


def test_lint_strict(helm: Helm) -> None:
    done = helm.run("lint", "--strict", str(SERVICE_CHART), "--kube-version", K8S_VERSION, check=False)
    assert done.returncode == 0 and "[WARNING]" not in done.stdout, done.stdout + done.stderr


def test_defaults_render_a_service_named_after_the_release(helm: Helm) -> None:
    (cr,) = helm.render(SERVICE_CHART, namespace="tts")
    assert (cr["kind"], cr["metadata"]["name"], cr["metadata"]["namespace"]) == ("CosyVoiceService", "cv", "tts")
    assert admit(yaml.safe_load(CRD_PATH.read_text()), cr)[1] == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_round_trips_and_is_admitted_by_the_crd(helm: Helm, example: Path) -> None:
    source = load_example(example)
    values = {"name": source["metadata"]["name"], "spec": source["spec"], "labels": {"team": "voice"}}
    (cr,) = helm.render(SERVICE_CHART, values, namespace="tts")
    assert cr["spec"] == source["spec"] and cr["metadata"]["labels"]["team"] == "voice"
    _, errors = admit(yaml.safe_load(CRD_PATH.read_text()), cr)
    assert errors == []


def test_schema_rejects_a_bad_name_and_unknown_keys(helm: Helm) -> None:
    for values in ({"name": "Bad_Name"}, {"replicas": 2}):
        done = helm.template(SERVICE_CHART, values, check=False)
        assert done.returncode != 0, values


def test_the_voice_store_claim_is_shared_kept_and_wired_into_the_spec(helm: Helm) -> None:
    import kubernetes_validate

    spec = {"voices": {"registration": {"enabled": True}}}
    docs = helm.render(SERVICE_CHART, {"spec": spec, "voiceStore": {"create": True, "size": "20Gi",
                                                                    "storageClassName": "nfs-client"}}, namespace="tts")
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    cr = next(d for d in docs if d["kind"] == "CosyVoiceService")
    assert pvc["metadata"]["name"] == "cv-voices" and pvc["metadata"]["namespace"] == "tts"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["storageClassName"] == "nfs-client"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["metadata"]["labels"][OPT_IN_LABEL] == OPT_IN_VALUE  # the service may mount what it was made for
    kubernetes_validate.validate(pvc, K8S_VERSION, strict=True)
    assert cr["spec"]["voices"] == {"pvc": {"claimName": "cv-voices"}, "registration": {"enabled": True}}
    assert admit(yaml.safe_load(CRD_PATH.read_text()), cr)[1] == []
    # a claim named in the spec wins; without create there is no claim
    own = {"voices": {"pvc": {"claimName": "mine"}}}
    docs = helm.render(SERVICE_CHART, {"spec": own, "voiceStore": {"create": True}}, namespace="tts")
    assert next(d for d in docs if d["kind"] == "CosyVoiceService")["spec"] == own
    assert [d["kind"] for d in helm.render(SERVICE_CHART, {"spec": own})] == ["CosyVoiceService"]


def test_the_notes_say_how_to_reach_the_playground_when_it_is_on(helm: Helm) -> None:
    def notes(spec: dict) -> str:
        done = helm.run("install", "cv", str(SERVICE_CHART), "--dry-run=client", "--namespace", "tts",
                        values={"spec": spec})
        return done.stdout.partition("NOTES:")[2]

    assert "playground" not in notes({})
    on = notes({"playground": {"enabled": True}, "service": {"port": 9000}})
    assert "kubectl -n tts port-forward svc/cv 8000:9000" in on and "http://localhost:8000/" in on
