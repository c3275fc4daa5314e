"""Create-or-patch: the smallest merge patch, no churn from server defaults, drift and removals put right."""
from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from cosyvoice_operator import apply
from cosyvoice_operator import render as r
from cosyvoice_operator.spec import parse_spec
from cvs_testkit import EXAMPLES, load_example, merge_patch

Obj = dict[str, Any]
OWNER = r.Owner("tts", "default", "uid-1")




def desired(spec: Obj, kind: str = "Deployment") -> Obj:
    obj = r.render(OWNER, parse_spec(spec)).get(kind)
    assert obj is not None
    return apply.with_last_applied(obj)


def server_defaulted(obj: Obj) -> Obj:
    """What the API server stores: defaults filled in, canonical quantities, status and bookkeeping added."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="d-1", resourceVersion="7", generation=3)
    live["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = "3"
    if live["kind"] == "Deployment":
        pod = live["spec"]["template"]["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
        for c in pod["containers"]:
            c.update(terminationMessagePath="/dev/termination-log")
            c["readinessProbe"].update(successThreshold=1)
            c["resources"]["requests"]["cpu"] = "1000m" if c["resources"]["requests"].get("cpu") == "1" else \
                c["resources"]["requests"].get("cpu")
        live["status"] = {"replicas": 1, "readyReplicas": 1}
    if live["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"], sessionAffinity="None")
    return live


def test_nothing_to_do_when_live_matches() -> None:
    want = desired({})
    assert apply.merge_patch(want, copy.deepcopy(want)) == {}


@pytest.mark.parametrize("kind", ["Deployment", "Service", "PodDisruptionBudget"])
def test_server_defaults_and_canonical_quantities_are_not_drift(kind: str) -> None:
    want = desired({"gpu": {"migProfile": "1g.10gb"}}, kind)
    assert apply.merge_patch(want, server_defaulted(want)) == {}


def test_a_spec_change_patches_only_what_changed() -> None:
    live = server_defaulted(desired({"replicas": 1}))
    patch = apply.merge_patch(desired({"replicas": 3}), live)
    assert set(patch) == {"metadata", "spec"}
    assert patch["spec"] == {"replicas": 3}
    assert set(patch["metadata"]) == {"annotations"}  # only the new last-applied record
    assert apply.changed_paths(patch) == ["spec.replicas"]


def test_env_change_replaces_the_container_list_whole() -> None:
    live = server_defaulted(desired({}))
    patch = apply.merge_patch(desired({"batching": {"maxBatchSize": 32}}), live)
    containers = patch["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in containers[0]["env"]}
    assert env["COSYVOICE_MAX_BATCH_SIZE"] == "32"
    assert set(patch["spec"]) == {"template"} and set(patch["spec"]["template"]) == {"spec"}


def test_hand_edits_are_put_back() -> None:
    want = desired({"gpu": {"migProfile": "1g.10gb"}})
    live = server_defaulted(want)
    live["spec"]["replicas"] = 5  # kubectl scale deploy/tts --replicas=5
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    live["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "someone"
    patch = apply.merge_patch(want, live)
    assert patch["spec"]["replicas"] == 1
    assert patch["spec"]["template"]["spec"]["containers"][0]["image"] == want["spec"]["template"]["spec"][
        "containers"][0]["image"]
    assert patch["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "cosyvoice-operator"}


def test_fields_we_stop_setting_are_removed_but_others_fields_are_kept() -> None:
    live = server_defaulted(desired({"podDisruptionBudget": {"maxUnavailable": 1}}, "PodDisruptionBudget"))
    live["metadata"]["labels"]["added-by-someone"] = "x"
    patch = apply.merge_patch(desired({"podDisruptionBudget": {"minAvailable": 1}}, "PodDisruptionBudget"), live)
    assert patch["spec"] == {"minAvailable": 1, "maxUnavailable": None}
    assert "labels" not in patch["metadata"]


def test_a_removed_list_entry_goes_away_even_if_live_still_has_it() -> None:
    before = desired({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]})
    after = desired({"env": [{"name": "A", "value": "1"}]})
    patch = apply.merge_patch(after, server_defaulted(before))
    names = [e["name"] for e in patch["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert "B" not in names and "A" in names


def test_a_child_without_last_applied_is_adopted_without_removals() -> None:
    want = desired({})
    live = server_defaulted(want)
    del live["metadata"]["annotations"][apply.LAST_APPLIED_ANNOTATION]
    patch = apply.merge_patch(want, live)
    assert set(patch) == {"metadata"}  # just records what it applied


def lifecycle(obj: Obj) -> Any:
    return obj["spec"]["template"]["spec"]["containers"][0].get("lifecycle")


def test_a_key_dropped_from_a_list_element_is_removed() -> None:
    """preStop sleep 0 renders no `lifecycle`; the container list must be re-sent without it."""
    live = server_defaulted(desired({"shutdown": {"preStopSleepSeconds": 10}}))
    want = desired({"shutdown": {"preStopSleepSeconds": 0}})
    assert lifecycle(live) == {"preStop": {"sleep": {"seconds": 10}}} and lifecycle(want) is None
    merged = merge_patch(live, apply.merge_patch(want, live))
    assert lifecycle(merged) is None
    assert merged["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 5  # drain + exit margin


def test_a_stale_key_inside_a_list_element_is_drift_even_when_last_applied_agrees() -> None:
    """`kubectl rollout undo` (or a hand edit) brings back a container's lifecycle the operator no
    longer renders; the last-applied record already lacks it, so only comparing the element exactly
    notices, and server defaults in the same element still do not count."""
    want = desired({"shutdown": {"preStopSleepSeconds": 0}})
    live = server_defaulted(want)
    live["spec"]["template"]["spec"]["containers"][0]["lifecycle"] = {"preStop": {"sleep": {"seconds": 10}}}
    patch = apply.merge_patch(want, live)
    assert apply.changed_paths(patch) == ["spec.template.spec"]
    merged = merge_patch(live, patch)
    assert lifecycle(merged) is None
    assert apply.merge_patch(want, server_defaulted(merged)) == {}


def test_contains_allows_only_server_defaults_as_extra_keys_in_list_elements() -> None:
    want = {"ports": [{"name": "http", "containerPort": 8000}]}
    assert apply.contains({"ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]}, want)
    assert not apply.contains({"ports": [{"name": "http", "containerPort": 8000, "hostPort": 80}]}, want)
    assert apply.contains({"ports": want["ports"], "added": "by-someone"}, want)  # outside lists: kept


SPECS = [load_example(p)["spec"] for p in EXAMPLES] + [
    {}, {"replicas": 0, "podDisruptionBudget": {"minAvailable": 1}}, {"shutdown": {"preStopSleepSeconds": 0}}]
PAIRS = sorted(set(list(itertools.permutations(range(len(SPECS)), 2))[:30]
                   + [(i, len(SPECS) - 1) for i in range(len(SPECS) - 1)] + [(len(SPECS) - 1, 0)]))


@pytest.mark.parametrize("a,b", PAIRS)
def test_patching_converges_between_any_two_specs(a: int, b: int) -> None:
    """After the patch is applied (and the API server has defaulted the result), the child is exactly
    what a fresh create of the new desired state would be, and nothing more is to be done."""
    for kind in ("Deployment", "Service"):
        live = server_defaulted(desired(SPECS[a], kind))
        want = desired(SPECS[b], kind)
        merged = server_defaulted(merge_patch(live, apply.merge_patch(want, live)))
        assert merged == server_defaulted(want)
        assert apply.merge_patch(want, merged) == {}


def test_contains_compares_quantities_numerically_only_where_they_are_quantities() -> None:
    assert apply.contains({"requests": {"memory": "4096Mi"}}, {"requests": {"memory": "4Gi"}})
    assert not apply.contains({"requests": {"memory": "4Gi"}}, {"requests": {"memory": "5Gi"}})
    assert not apply.contains({"value": "1.0"}, {"value": "1"})  # an env value is a string, not a quantity
    assert not apply.contains({"enabled": 1}, {"enabled": True})


def test_a_hand_added_field_inside_a_container_is_put_back() -> None:
    """`privileged: true` added to the container's securityContext by hand is drift, even nested in a list element."""
    want = desired({})
    live = server_defaulted(want)
    live["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    merged = merge_patch(live, apply.merge_patch(want, live))
    assert "privileged" not in merged["spec"]["template"]["spec"]["containers"][0]["securityContext"]


def test_a_defaulted_field_we_stop_setting_in_a_list_element_is_re_sent() -> None:
    """A Service port's protocol the operator set to UDP and no longer sets goes back to the server's default."""
    before = {"metadata": {"name": "s"}, "spec": {"ports": [{"name": "p", "port": 53, "protocol": "UDP"}]}}
    after = {"metadata": {"name": "s"}, "spec": {"ports": [{"name": "p", "port": 53}]}}
    live = apply.with_last_applied(before)
    patch = apply.merge_patch(apply.with_last_applied(after), live)
    assert patch["spec"] == {"ports": [{"name": "p", "port": 53}]}


def test_a_list_new_to_the_desired_state_but_already_live_is_not_re_sent() -> None:
    """After an operator upgrade adds a field, a child that already holds it gets no spec patch."""
    old = {"metadata": {"name": "s"}, "spec": {"replicas": 1}}
    new = {"metadata": {"name": "s"}, "spec": {"replicas": 1, "tolerations": [{"key": "k", "operator": "Exists"}]}}
    live = apply.with_last_applied(old)
    live["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    assert set(apply.merge_patch(apply.with_last_applied(new), live)) == {"metadata"}


def test_quantities_compare_numerically_outside_lists_too() -> None:
    want = apply.with_last_applied({"metadata": {"name": "c"}, "spec": {"resources": {"requests": {"storage": "1Gi"}},
                                                                        "value": "1"}})
    live = copy.deepcopy(want)
    live["spec"]["resources"]["requests"]["storage"] = "1024Mi"
    assert apply.merge_patch(want, live) == {}
    live["spec"]["resources"]["requests"]["storage"] = "2Gi"
    assert apply.merge_patch(want, live) == {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    live["spec"]["resources"]["requests"]["storage"] = "1Gi"
    live["spec"]["value"] = "1.0"  # not under a quantity key: a different string is drift
    assert apply.merge_patch(want, live) == {"spec": {"value": "1"}}


def test_last_applied_is_compact_and_independent_of_key_order() -> None:
    """Reordered keys must not rewrite the annotation, and it stays small (annotations are capped at 256 KiB)."""
    a = apply.with_last_applied({"metadata": {"name": "x"}, "spec": {"b": 1, "a": [1, 2]}})
    b = apply.with_last_applied({"spec": {"a": [1, 2], "b": 1}, "metadata": {"name": "x"}})
    record = a["metadata"]["annotations"][apply.LAST_APPLIED_ANNOTATION]
    assert record == b["metadata"]["annotations"][apply.LAST_APPLIED_ANNOTATION]
    assert record == '{"metadata":{"name":"x"},"spec":{"a":[1,2],"b":1}}'


def test_last_applied_is_recorded_on_an_object_without_metadata_too() -> None:
    annotated = apply.with_last_applied({"kind": "ConfigMap", "data": {"a": "1"}})
    assert apply.last_applied_of(annotated) == {"kind": "ConfigMap", "data": {"a": "1"}}
