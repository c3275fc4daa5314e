"""What a user is told about specs that cannot mean what they say: replicas outside the autoscaling
bounds, scale to zero, media-extension MIG profiles, misspelt field names, and a GPU serving the
bundled demo model. Each rejection is checked twice, by the CRD (schema + CEL, as the API server
admits) and by the operator's spec models, so the two stay in step."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cosyvoice_operator import cli
from cosyvoice_operator.autoscaling.simconfig import SimConfig, add_arguments
from cosyvoice_operator.reconcile import LAST_APPLIED, check_applied_manifest
from cosyvoice_operator.render import Owner, render
from cosyvoice_operator.spec import InvalidSpec, UnknownField, parse_spec
from cosyvoice_operator.status import Observed, conditions_for, transitions
from cvs_crdschema import admit
from cvs_testkit import EXAMPLES, load_example

AUTO = {"enabled": True, "minReplicas": 2, "maxReplicas": 12, "targetQPSPerReplica": 2.5}
GPU = {"migProfile": "1g.10gb"}


def cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "tts.cosyvoice.dev/v1alpha1", "kind": "CosyVoiceService",
            "metadata": {"name": "tts", "namespace": "default"}, "spec": copy.deepcopy(spec)}


def verdicts(crd: dict[str, Any], spec: dict[str, Any]) -> tuple[list[str], str | None]:
    _, errors = admit(crd, cr(spec))
    try:
        parse_spec(spec)
        operator = None
    except InvalidSpec as exc:
        operator = str(exc)
    return errors, operator


def deployment_replicas(spec: dict[str, Any], crd: dict[str, Any]) -> int:
    defaulted, errors = admit(crd, cr(spec))
    assert errors == []
    return int(render(Owner("tts", "default"), parse_spec(defaulted["spec"])).get("Deployment")["spec"]["replicas"])


# --- replicas and the autoscaling bounds ----------------------------------------------------------

def test_replicas_above_max_replicas_are_rejected_while_autoscaling(crd: dict[str, Any]) -> None:
    errors, operator = verdicts(crd, {"gpu": GPU, "replicas": 20, "autoscaling": AUTO})
    assert any("spec.replicas must not exceed autoscaling.maxReplicas" in e for e in errors)
    assert operator is not None and "spec.replicas must not exceed autoscaling.maxReplicas" in operator


def test_without_autoscaling_replicas_are_not_bounded_by_it(crd: dict[str, Any]) -> None:
    assert verdicts(crd, {"gpu": GPU, "replicas": 20, "autoscaling": {**AUTO, "enabled": False}}) == ([], None)


def test_an_autoscaled_service_starts_at_min_replicas_when_replicas_is_left_out(crd: dict[str, Any]) -> None:
    assert deployment_replicas({"gpu": GPU, "autoscaling": AUTO}, crd) == 2  # replicas defaulted to 1
    assert deployment_replicas({"gpu": GPU, "replicas": 5, "autoscaling": AUTO}, crd) == 5
    assert deployment_replicas({"gpu": GPU, "replicas": 0}, crd) == 0  # parked, autoscaling off


# --- scale to zero is refused, with the reason ----------------------------------------------------

@pytest.mark.parametrize("enabled", [True, False])
def test_min_replicas_zero_is_refused_with_the_reason(crd: dict[str, Any], enabled: bool) -> None:
    errors, operator = verdicts(crd, {"gpu": GPU, "autoscaling": {**AUTO, "enabled": enabled, "minReplicas": 0}})
    for said in (" ".join(errors), operator or ""):
        assert "scale to zero is not supported" in said and "nothing receives the requests" in said


def test_the_simulator_refuses_min_replicas_zero_too() -> None:
    import argparse

    with pytest.raises(ValueError, match="scale to zero is not supported"):
        SimConfig(min_replicas=0)
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    with pytest.raises(argparse.ArgumentError, match="scale to zero is not supported"):
        parser.parse_args(["--min-replicas", "0"])


# --- media-extension MIG profiles -----------------------------------------------------------------

def test_media_extension_profile_is_accepted_and_requested_by_its_device_plugin_name(crd: dict[str, Any]) -> None:
    spec = {"gpu": {"migProfile": "1g.10gb+me", "product": "NVIDIA-A100-SXM4-80GB"}}
    assert verdicts(crd, spec) == ([], None)
    container = render(Owner("tts", "default"), parse_spec(spec)).get("Deployment")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["resources"]["limits"]["nvidia.com/mig-1g.10gb.me"] == 1
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["COSYVOICE_GPU_MEM_LIMIT_BYTES"] == str(int(10e9 * 0.9))


def test_media_extension_profile_is_checked_against_the_gpu(crd: dict[str, Any]) -> None:
    errors, operator = verdicts(crd, {"gpu": {"migProfile": "1g.10gb+me", "product": "NVIDIA-A30"}})
    assert errors == []  # the schema cannot know the catalog
    assert operator is not None and "valid profiles: 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb" in operator


def test_media_extension_profile_needs_the_mixed_strategy(crd: dict[str, Any]) -> None:
    spec = {"gpu": {"migProfile": "1g.10gb+me", "migStrategy": "single", "product": "NVIDIA-H100-80GB-HBM3"}}
    errors, operator = verdicts(crd, spec)
    assert any("needs gpu.migStrategy mixed" in e for e in errors)
    assert operator is not None and "needs gpu.migStrategy mixed" in operator


# --- misspelt field names -------------------------------------------------------------------------

@pytest.mark.parametrize("spec,said", [
    ({"replica": 2}, "spec.replica: unknown field; did you mean 'replicas'?"),
    ({"autoscaling": {"maxReplica": 3}}, "spec.autoscaling.maxReplica: unknown field; did you mean 'maxReplicas'?"),
    ({"batching": {"maxbatchsize": 8}}, "spec.batching.maxbatchsize: unknown field; did you mean 'maxBatchSize'?"),
    ({"autoscaling": {"max_replicas": 3}}, "spec.autoscaling.max_replicas: unknown field; did you mean 'maxReplicas'?"),
    ({"gpu": {"migprofile": "1g.10gb"}}, "did you mean 'migProfile'?"),
    ({"tolerations": [{"keyy": "a"}]}, "spec.tolerations[0].keyy: unknown field; did you mean 'key'?"),
    ({"zzzz": 1}, "spec.zzzz: unknown field"),
])
def test_a_misspelt_field_names_the_closest_valid_one(crd: dict[str, Any], spec: dict[str, Any], said: str) -> None:
    errors, operator = verdicts(crd, spec)
    assert errors  # kubectl --validate=strict refuses it too, without a suggestion
    assert operator is not None and said in operator


def test_render_suggests_the_field_a_typo_meant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cr.yaml"
    path.write_text("apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: tts}\n"
                    "spec:\n  autoscaling: {enabled: true, maxReplica: 4, targetQPSPerReplica: 2}\n")
    assert cli.main(["render", "-f", str(path)]) == 1
    err = capsys.readouterr().err
    assert "spec.autoscaling.maxReplica: unknown field; did you mean 'maxReplicas'?" in err
    path.write_text("apiVersion: tts.cosyvoice.dev/v1alpha1\nkind: CosyVoiceService\nmetadata: {name: tts}\n"
                    "sepc: {replicas: 2}\n")
    assert cli.main(["render", "-f", str(path)]) == 1
    assert "sepc: unknown field; did you mean 'spec'?" in capsys.readouterr().err


def test_a_typo_the_api_server_dropped_is_found_in_the_applied_manifest() -> None:
    """The API server prunes unknown fields; `kubectl apply` keeps the manifest as written."""
    applied = cr({"gpu": GPU, "autoscaling": {"enabled": True, "maxReplica": 4, "targetQPSPerReplica": 2}})
    stored = cr({"gpu": GPU, "autoscaling": {"enabled": True, "targetQPSPerReplica": 2}})
    stored["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(applied)}
    with pytest.raises(UnknownField, match="did you mean 'maxReplicas'.*dropped it from the applied manifest"):
        check_applied_manifest(stored)
    applied["spec"]["autoscaling"]["maxReplicas"] = applied["spec"]["autoscaling"].pop("maxReplica")
    stored["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(applied)}
    check_applied_manifest(stored)  # fixed and applied again
    stored["metadata"]["annotations"] = {LAST_APPLIED: "not json"}
    check_applied_manifest(stored)  # someone else's annotation: not ours to judge


# --- a GPU serving the bundled demo model ---------------------------------------------------------

def _demo_condition(gpu: bool, demo: bool) -> tuple[Any, list[tuple[str, str, str]]]:
    observed = Observed(desired=1, deployment=None, pods=[], capacity=None, gpu_requested=gpu, demo_model=demo)
    conditions = conditions_for(observed, {})
    return next(c for c in conditions if c.type == "DemoModel"), transitions({}, conditions)


def test_a_storage_less_service_on_a_gpu_says_it_serves_the_demo_model() -> None:
    cond, events = _demo_condition(gpu=True, demo=True)
    assert (cond.status, cond.reason) == ("True", "BundledDemoModelOnGPU")
    assert "random weights" in cond.message and "spec.storage" in cond.message
    assert ("Warning", "BundledDemoModelOnGPU", cond.message) in events
    cond, events = _demo_condition(gpu=False, demo=True)
    assert (cond.status, cond.reason) == ("True", "BundledDemoModel")
    assert ("Normal", "BundledDemoModel", cond.message) in events  # a CPU try-out: expected, not a warning
    cond, events = _demo_condition(gpu=True, demo=False)
    assert (cond.status, cond.reason) == ("False", "ModelFromStorage")
    assert not [e for e in events if e[1].startswith("BundledDemoModel")]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_leave_replicas_to_the_autoscaler(path: Path) -> None:
    spec = load_example(path)["spec"]
    if (spec.get("autoscaling") or {}).get("enabled"):
        assert "replicas" not in spec, "the autoscaler owns spec.replicas: a value here fights it on every apply"
