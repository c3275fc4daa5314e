"""The status subresource `kubectl get cvs` prints, and conditions read back from it."""
from __future__ import annotations

import re
from datetime import UTC, datetime

from cosyvoice_operator.status import (Condition, Observed, invalid_conditions, now_iso, parse_conditions,
                                       render_conditions, status_body)


def observed(deployment: dict | None, desired: int = 3) -> Observed:
    return Observed(desired=desired, deployment=deployment, pods=[], capacity=None, gpu_requested=True)


def test_status_body_counts_replicas_from_the_deployment() -> None:
    dep = {"status": {"replicas": 4, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 1}}
    conditions = [{"type": "Ready", "status": "False"}]
    body = status_body(generation=7, observed=observed(dep), conditions=conditions, selector="app=tts",
                       endpoint="http://tts.default.svc:8000", gpu_resource="nvidia.com/mig-1g.10gb")
    assert body == {"replicas": 4, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 1,
                    "replicaSummary": "2/3", "selector": "app=tts", "endpoint": "http://tts.default.svc:8000",
                    "gpuResource": "nvidia.com/mig-1g.10gb", "conditions": conditions, "observedGeneration": 7}


def test_status_body_without_a_deployment_or_generation_reports_zeros() -> None:
    body = status_body(generation=None, observed=observed(None, desired=2), conditions=[], selector="s",
                       endpoint="e", gpu_resource=None)
    assert (body["replicas"], body["readyReplicas"], body["updatedReplicas"], body["availableReplicas"]) == (0, 0, 0, 0)
    assert body["replicaSummary"] == "0/2" and body["gpuResource"] is None
    assert "observedGeneration" not in body
    fresh = status_body(generation=None, observed=observed({"status": {}}), conditions=[], selector="s",
                        endpoint="e", gpu_resource=None)
    assert fresh["replicaSummary"] == "0/3"


def test_conditions_round_trip_through_the_status() -> None:
    conditions = [Condition("Ready", "True", "AllReplicasReady", "3/3"),
                  Condition("CapacityAvailable", "False", "InsufficientCapacity", "2 allocatable")]
    raw = {"conditions": render_conditions(conditions, None, generation=None, now="2026-01-01T00:00:00Z")
           + [{"type": "SomeoneElses", "status": "True"}]}
    assert parse_conditions(raw) == {c.type: c for c in conditions}  # foreign condition types are ignored
    assert all("observedGeneration" not in c for c in raw["conditions"])
    assert raw["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    partial = parse_conditions({"conditions": [{"type": "Ready"}]})
    assert partial == {"Ready": Condition("Ready", "Unknown", "", "")}
    assert parse_conditions(None) == {} and parse_conditions({"conditions": None}) == {}


def test_a_new_condition_is_stamped_now() -> None:
    (cond,) = render_conditions([Condition("Ready", "True", "AllReplicasReady", "1/1")], None, generation=1)
    stamp = datetime.strptime(cond["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 5
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now_iso())  # RFC 3339, as the API server writes


def test_an_invalid_spec_keeps_the_last_capacity_assessment() -> None:
    capacity = Condition("CapacityAvailable", "True", "Sufficient", "7 allocatable")
    c = {x.type: x for x in invalid_conditions("bad", {"CapacityAvailable": capacity}, reason="ChildConflict")}
    assert c["CapacityAvailable"] == capacity
    assert c["Ready"] == Condition("Ready", "False", "ChildConflict", "bad")
    assert c["Degraded"] == Condition("Degraded", "True", "ChildConflict", "bad")
    assert c["Progressing"] == Condition("Progressing", "False", "ChildConflict",
                                         "nothing is rolled out until the spec is fixed")
    fresh = {x.type: x for x in invalid_conditions("bad", {})}
    assert fresh["CapacityAvailable"] == Condition("CapacityAvailable", "Unknown", "InvalidSpec",
                                                   "not assessed: the spec cannot be applied")
