"""The GitOps chart: one CosyVoiceService from values, accepted by the CRD's schema and CEL rules."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chartkit import K8S_VERSION, SERVICE_CHART, Helm
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
