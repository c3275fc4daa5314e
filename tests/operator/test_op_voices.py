"""spec.voices: the shared voice volume, registration and its key, rendered and validated (CRD and operator)."""
from __future__ import annotations

import copy
from typing import Any

import pytest
from cosyvoice_operator import render as r
from cosyvoice_operator.constants import OPT_IN_LABEL, OPT_IN_VALUE, VOICE_STORE_MOUNT
from cosyvoice_operator.spec import InvalidSpec, parse_spec
from cvs_crdschema import admit
from test_op_render import env, pod, server, validate

Obj = dict[str, Any]
KEY = {"name": "keys", "key": "api"}
REG_KEY = {"name": "keys", "key": "register"}
STORE = {"pvc": {"claimName": "voices"}}


def test_registration_mounts_the_store_writable_with_its_key() -> None:
    spec = {"apiKeySecret": KEY, "voices": {**STORE, "registration": {"enabled": True, "keySecret": REG_KEY}}}
    p, c, e = pod(spec), server(spec), env(spec)
    vol = next(v for v in p["volumes"] if v["name"] == "voices")
    assert vol["persistentVolumeClaim"] == {"claimName": "voices", "readOnly": False}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "voices")
    assert mount == {"name": "voices", "mountPath": VOICE_STORE_MOUNT, "readOnly": False}
    assert e["COSYVOICE_VOICE_STORE_DIR"] == VOICE_STORE_MOUNT
    assert e["COSYVOICE_ALLOW_VOICE_REGISTRATION"] == "true"
    key_mount = next(m for m in c["volumeMounts"] if m["name"] == "registration-key")
    assert e["COSYVOICE_VOICE_REGISTRATION_KEY_FILE"].startswith(key_mount["mountPath"] + "/")
    assert key_mount["mountPath"] != next(m for m in c["volumeMounts"] if m["name"] == "api-key")["mountPath"]
    assert ("Secret", "volume registration-key", "keys") in r.objects_used(p)  # the opt-in check covers it
    for obj in r.render(r.Owner("tts", "default", uid="u"), parse_spec(spec)).objects:
        validate(obj)


def test_without_registration_replicas_read_the_store_only() -> None:
    spec = {"voices": {"pvc": {"claimName": "voices", "subPath": "team-a/voices"}}}
    p, c, e = pod(spec), server(spec), env(spec)
    assert next(v for v in p["volumes"] if v["name"] == "voices")["persistentVolumeClaim"]["readOnly"] is True
    mount = next(m for m in c["volumeMounts"] if m["name"] == "voices")
    assert mount["readOnly"] is True and mount["subPath"] == "team-a/voices"
    assert e["COSYVOICE_VOICE_STORE_DIR"] == VOICE_STORE_MOUNT and "COSYVOICE_ALLOW_VOICE_REGISTRATION" not in e


def test_no_voices_no_volume() -> None:
    assert not any(v["name"] in ("voices", "registration-key") for v in pod({})["volumes"])
    assert not any(k.startswith("COSYVOICE_VOICE") or "REGISTRATION" in k for k in env({}))


def cr(spec: Obj) -> Obj:
    return {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": "tts", "namespace": "default"}, "spec": copy.deepcopy(spec)}


@pytest.mark.parametrize("spec, says", [
    ({"voices": {"registration": {"enabled": True}}}, "voices.registration.enabled needs voices.pvc"),
    ({"apiKeySecret": KEY, "voices": {**STORE, "registration": {"enabled": True}}},
     "voices.registration.keySecret is required when apiKeySecret is set"),
    ({"voices": {"pvc": {"claimName": "v", "subPath": "../other"}}}, "must stay inside the volume"),
    ({"voices": {"pvc": {"claimName": "v", "subPath": "a/../../b"}}}, "must stay inside the volume"),
    ({"voices": {"pvc": {"claimName": "v", "subPath": "/abs"}}}, "subPath"),
    ({"voices": {"pvc": {}}}, "claimName"),
])
def test_specs_that_cannot_work_are_refused_by_the_crd_and_the_operator(crd: Obj, spec: Obj, says: str) -> None:
    _, errors = admit(crd, cr(spec))
    assert any(says in e for e in errors), errors
    with pytest.raises(InvalidSpec, match=says.replace(".", r"\.").replace("(", r"\(")):
        parse_spec(spec)


@pytest.mark.parametrize("spec", [
    {"voices": STORE},
    {"voices": {**STORE, "registration": {"enabled": True}}},  # no API key at all: an open dev service
    {"apiKeySecret": KEY, "voices": {**STORE, "registration": {"enabled": True, "keySecret": REG_KEY}}},
    {"apiKeySecret": KEY, "voices": {**STORE, "registration": {"enabled": False}}},
])
def test_working_voice_specs_are_admitted(crd: Obj, spec: Obj) -> None:
    defaulted, errors = admit(crd, cr(spec))
    assert errors == []
    assert parse_spec(defaulted["spec"]) == parse_spec(spec)


# --- the claim's access modes ---------------------------------------------------------------------

def claim(*modes: str) -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "voices", "namespace": "default", "labels": {OPT_IN_LABEL: OPT_IN_VALUE}},
            "spec": {"accessModes": list(modes)}}


@pytest.mark.parametrize("spec, modes, warning", [
    ({"replicas": 2, "voices": STORE}, ("ReadWriteOnce",), "VoiceStoreNotShared"),
    ({"replicas": 2, "voices": {**STORE, "registration": {"enabled": True}}}, ("ReadOnlyMany",), "VoiceStoreNotShared"),
    ({"replicas": 1, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4, "targetQPSPerReplica": 2.0},
      "voices": STORE}, ("ReadWriteOncePod",), "VoiceStoreNotShared"),
    ({"replicas": 2, "voices": {**STORE, "registration": {"enabled": True}}}, ("ReadWriteMany",), None),
    ({"replicas": 2, "voices": STORE}, ("ReadOnlyMany",), None),  # nobody registers: reading is enough
])
def test_a_claim_the_replicas_cannot_share_is_warned_about_once(spec: Obj, modes: tuple[str, ...],
                                                                 warning: str | None) -> None:
    from cosyvoice_operator.reconcile import Reconciler
    from test_op_reconcile import FakeKube, add, service

    fake, recorded = FakeKube(), []
    reconciler = Reconciler(fake, record=lambda obj, t, r, m: recorded.append((t, r, m)))  # type: ignore[arg-type]
    fake.objects["persistentvolumeclaims", "default", "voices"] = claim(*modes)
    cr = add(fake, service(**spec))
    reconciler.reconcile(cr)
    reconciler.reconcile(cr)
    warnings = [(r, m) for t, r, m in recorded if r.startswith("VoiceStore")]
    if warning is None:
        assert warnings == []
    else:
        assert [r for r, _ in warnings] == [warning] and "voices" in warnings[0][1]
    assert ("deployments", "default", "tts") in fake.objects  # a warning never blocks the service


def test_one_replica_needs_no_look_at_the_claim() -> None:
    from cosyvoice_operator.reconcile import Reconciler
    from test_op_reconcile import FakeKube, add, service

    fake = FakeKube()
    fake.objects["persistentvolumeclaims", "default", "voices"] = claim("ReadWriteOnce")
    Reconciler(fake).reconcile(add(fake, service(voices=STORE)))
    # the opt-in label is read (metadata), the access modes are not
    assert not any((verb, plural) == ("get", "persistentvolumeclaims") for verb, plural, _ in fake.calls)
