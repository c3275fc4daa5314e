"""A canary's children, rendered without a cluster: two Deployments, the traffic split, the promotion patch."""
from __future__ import annotations

from typing import Any

import pytest
from cosyvoice_operator import render
from cosyvoice_operator.canary.traffic import effective_weight, split_replicas
from cosyvoice_operator.spec import InvalidSpec, parse_spec
from cvs_testkit import EXAMPLES_DIR, load_example

OWNER = render.Owner("tts", "default", uid="u-1")
TRACK = render.LABEL_TRACK


def spec_with(**canary: Any) -> Any:
    return parse_spec({"replicas": 10, "storage": {"pvc": {"claimName": "cv2"}},
                       "canary": {"weight": 10, "storage": {"storageUri": "s3://m/cv3/"}, **canary}})


def by_name(rendered: render.Rendered, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in rendered.objects if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.parametrize("total,weight,split", [
    (10, 10, (9, 1)), (10, 0, (10, 0)), (10, 100, (0, 10)), (1, 10, (1, 1)), (2, 50, (1, 1)), (3, 1, (2, 1)),
    (10, 95, (1, 10)), (20, 25, (15, 5)), (0, 10, (0, 0)),
])
def test_replicas_follow_the_weight_with_at_least_one_canary(total: int, weight: int, split: tuple[int, int]) -> None:
    assert split_replicas(total, weight) == split


def test_without_a_gateway_one_service_spans_both_deployments_in_proportion() -> None:
    spec = spec_with()
    out = render.render(OWNER, spec)
    stable, canary = by_name(out, "Deployment", "tts"), by_name(out, "Deployment", "tts-canary")
    assert (stable["spec"]["replicas"], canary["spec"]["replicas"]) == (9, 1)
    # the Service selects both versions' pods; each Deployment its own (the stable selector is the old one)
    service = by_name(out, "Service", "tts")
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in (stable, canary)]
    assert all(service["spec"]["selector"].items() <= labels.items() for labels in pods)
    assert canary["spec"]["selector"]["matchLabels"][TRACK] == "canary"
    assert [p[TRACK] for p in pods] == ["stable", "canary"]
    assert not canary["spec"]["selector"]["matchLabels"].items() <= pods[0].items()
    # the canary runs its own model, everything else is the stable spec's
    assert canary["spec"]["template"]["spec"]["initContainers"][0]["command"][3] == "s3://m/cv3/"
    assert "initContainers" not in stable["spec"]["template"]["spec"]
    assert stable["metadata"]["labels"][render.LABEL_MODEL_VERSION] != canary["metadata"]["labels"][
        render.LABEL_MODEL_VERSION]
    assert not any(o["kind"] == "HTTPRoute" for o in out.objects)
    assert (*render.HTTP_ROUTE, "tts") in out.absent_canary
    assert (*render.DEPLOYMENT, "tts-canary") not in out.absent_canary


def test_a_gateway_parent_gets_an_httproute_with_backend_weights() -> None:
    spec = spec_with(gateway={"name": "inference", "namespace": "gateways"}, hostnames=["tts.example.com"])
    out = render.render(OWNER, spec, canary_weight=25)
    route = by_name(out, "HTTPRoute", "tts")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference", "namespace": "gateways"}]
    assert route["spec"]["hostnames"] == ["tts.example.com"]
    backends = {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}
    assert backends == {"tts-stable": 75, "tts-canary": 25}
    for track in ("stable", "canary"):
        svc = by_name(out, "Service", f"tts-{track}")
        assert svc["spec"]["selector"][TRACK] == track
    assert route["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert out.absent_canary == []
    # the replicas follow the weight in effect too
    assert by_name(out, "Deployment", "tts-canary")["spec"]["replicas"] == 3


def test_the_service_monitor_skips_the_per_version_services() -> None:
    spec = parse_spec({"monitoring": {"serviceMonitor": {"enabled": True}}, "precision": "fp16",
                       "canary": {"weight": 5, "precision": "fp32", "gateway": {"name": "gw"}}})
    out = render.render(OWNER, spec)
    selector = out.get("ServiceMonitor")["spec"]["selector"]  # type: ignore[index]
    assert selector["matchExpressions"] == [{"key": TRACK, "operator": "DoesNotExist"}]
    assert "tts.cosyvoice.dev/track" in by_name(out, "Service", "tts-canary")["metadata"]["labels"]
    assert TRACK not in by_name(out, "Service", "tts")["metadata"]["labels"]


def test_no_canary_no_canary_children() -> None:
    out = render.render(OWNER, parse_spec({}))
    assert [o["metadata"]["name"] for o in out.objects if o["kind"] == "Deployment"] == ["tts"]
    assert len(out.absent_canary) == 4


def test_promotion_replaces_the_stable_fields_whole_and_removes_the_canary() -> None:
    raw = {"storage": {"pvc": {"claimName": "cv2"}}, "modelVersion": "cosyvoice2",
           "canary": {"weight": 10, "modelVersion": "cosyvoice3", "storage": {"storageUri": "s3://m/cv3/"}}}
    patch = parse_spec(raw).promotion(raw)
    assert patch == {"storage": {"pvc": None, "storageUri": "s3://m/cv3/"}, "modelVersion": "cosyvoice3",
                     "canary": None}
    from cvs_testkit import merge_patch
    promoted = parse_spec(merge_patch(raw, patch))
    assert promoted.canary is None and promoted.version == "cosyvoice3"
    assert promoted.storage is not None and promoted.storage.storage_uri == "s3://m/cv3/"


def test_the_weight_in_effect() -> None:
    spec = spec_with(analysis={"stepWeights": [25, 50]})
    canary = spec.canary
    version = spec.canary_spec().version  # type: ignore[union-attr]
    assert effective_weight(canary, version, None) == 10
    assert effective_weight(canary, version, {"version": version, "weight": 25}) == 25
    assert effective_weight(canary, version, {"version": "older", "weight": 25}) == 10  # an older canary's
    assert effective_weight(canary, version, {"version": version, "weight": 25, "phase": "Aborted"}) == 0
    manual = spec_with()
    assert effective_weight(manual.canary, version, {"version": version, "weight": 25}) == 10  # type: ignore[arg-type]


def test_a_canary_is_refused_where_it_would_make_an_invalid_spec() -> None:
    with pytest.raises(InvalidSpec, match="spec.canary.voices: voices.registration.enabled needs voices.pvc"):
        parse_spec({"canary": {"weight": 5, "voices": {"registration": {"enabled": True}}}})
    with pytest.raises(InvalidSpec, match="spec.canary makes an invalid spec: .*voices.registration.keySecret is required"):
        parse_spec({"apiKeySecret": {"name": "k", "key": "k"}, "voices": {"pvc": {"claimName": "v"}},
                    "canary": {"weight": 5, "voices": {"pvc": {"claimName": "v"}, "registration": {"enabled": True}}}})
    with pytest.raises(InvalidSpec, match="stepWeights must increase"):
        spec_with(analysis={"stepWeights": [50, 25]})


def test_the_example_renders_two_versions_at_ninety_ten() -> None:
    cr = load_example(EXAMPLES_DIR / "canary.yaml")
    out = render.render(render.Owner.from_body(cr), parse_spec(cr["spec"]))
    replicas = {o["metadata"]["name"]: o["spec"]["replicas"] for o in out.objects if o["kind"] == "Deployment"}
    assert replicas == {"tts": 9, "tts-canary": 1}
    weights = [b["weight"] for b in by_name(out, "HTTPRoute", "tts")["spec"]["rules"][0]["backendRefs"]]
    assert weights == [90, 10]
