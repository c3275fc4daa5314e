"""Pod security on every workload we ship: the operator's Deployment (every chart value set) and the
inference Deployment the operator renders (every example). Both must pass the "restricted" Pod
Security Standard, run read-only and non-root, and have memory limits."""
from __future__ import annotations

import copy

import pytest
from chartkit import VALUE_SETS, Obj, of_kind, restricted_violations
from cosyvoice_operator import render
from cosyvoice_operator.spec import CosyVoiceServiceSpec
from cvs_testkit import EXAMPLES, load_example


@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_deployment_is_restricted(rendered: dict[str, list[Obj]], name: str) -> None:
    (dep,) = of_kind(rendered[name], "Deployment")
    assert restricted_violations(dep["spec"]["template"]["spec"]) == []


def _inference_deployment(cr: Obj) -> Obj:
    owner = render.Owner.from_body({**cr, "metadata": {**cr["metadata"], "uid": "u1"}})
    return render.deployment(owner, CosyVoiceServiceSpec.model_validate(cr["spec"]))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_inference_deployment_rendered_by_the_operator_is_restricted(example: object) -> None:
    dep = _inference_deployment(load_example(example))  # type: ignore[arg-type]
    pod = dep["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod.get("automountServiceAccountToken") is False, "inference pods never call the API server"


def test_the_checker_catches_what_restricted_forbids() -> None:
    (example,) = [p for p in EXAMPLES if p.stem == "minimal"]
    pod = _inference_deployment(load_example(example))["spec"]["template"]["spec"]
    bad = copy.deepcopy(pod)
    bad["containers"][0]["securityContext"]["privileged"] = True
    bad["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    bad["hostNetwork"] = True
    problems = restricted_violations(bad)
    assert any("privileged" in p for p in problems) and any("hostPath" in p for p in problems)
    assert any("root filesystem" in p for p in problems) and "pod hostNetwork" in problems
