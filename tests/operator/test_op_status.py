"""What `kubectl get/describe cvs` says: conditions computed from the Deployment, its pods and capacity."""
from __future__ import annotations

from typing import Any

import pytest
from cosyvoice_operator.capacity import Assessment
from cosyvoice_operator.status import (
    Condition,
    Observed,
    conditions_for,
    invalid_conditions,
    pod_problems,
    render_conditions,
    transitions,
)

Obj = dict[str, Any]


def dep(ready: int = 0, updated: int | None = None, total: int | None = None, generation: int = 2,
        observed: int = 2, conditions: list[Obj] | None = None) -> Obj:
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "readyReplicas": ready,
                       "updatedReplicas": ready if updated is None else updated,
                       "replicas": ready if total is None else total, "conditions": conditions or []}}


def waiting(name: str, reason: str, message: str = "", init: bool = False, container: str = "server",
            last: Obj | None = None) -> Obj:
    status = {"name": container, "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        status["lastState"] = {"terminated": last}
    key = "initContainerStatuses" if init else "containerStatuses"
    return {"metadata": {"name": name}, "status": {"phase": "Pending", key: [status]}}


def conds(observed: Observed, previous: dict[str, Condition] | None = None) -> dict[str, Condition]:
    return {c.type: c for c in conditions_for(observed, previous or {})}


def obs(desired: int = 2, deployment: Obj | None = None, pods: list[Obj] | None = None,
        capacity: Assessment | None = None, gpu: bool = True, max_unavailable: int | str = 1) -> Observed:
    return Observed(desired=desired, deployment=deployment, pods=pods or [], capacity=capacity, gpu_requested=gpu,
                    max_unavailable=max_unavailable)


def test_all_replicas_ready() -> None:
    c = conds(obs(deployment=dep(ready=2), capacity=Assessment("True", "Sufficient", "ok")))
    assert (c["Ready"].status, c["Ready"].reason, c["Ready"].message) == \
        ("True", "AllReplicasReady", "2/2 replicas ready")
    assert (c["Progressing"].status, c["Progressing"].reason) == ("False", "RolloutComplete")
    assert (c["Degraded"].status, c["CapacityAvailable"].status) == ("False", "True")


def test_a_rollout_taking_one_replica_down_stays_ready() -> None:
    c = conds(obs(desired=3, deployment=dep(ready=2, updated=1, total=3)))
    assert (c["Ready"].status, c["Ready"].reason) == ("True", "MinimumReplicasAvailable")
    assert (c["Progressing"].status, c["Progressing"].reason, c["Progressing"].message) == \
        ("True", "RollingOut", "1/3 replicas updated")
    assert conds(obs(desired=4, deployment=dep(ready=2), max_unavailable="25%"))["Ready"].status == "False"


def test_starting_up() -> None:
    c = conds(obs(deployment=dep(ready=0, updated=2, total=2)))
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "WaitingForReplicas")
    assert "model is loaded" in c["Ready"].message
    assert (c["Progressing"].status, c["Progressing"].reason) == ("True", "WaitingForReplicas")
    assert conds(obs(deployment=dep(generation=3, observed=2)))["Progressing"].reason == "RolloutPending"
    assert conds(obs(deployment=None))["Progressing"].reason == "Creating"


def test_old_pods_terminating_is_still_progress() -> None:
    c = conds(obs(desired=2, deployment=dep(ready=2, updated=2, total=3)))
    assert (c["Progressing"].reason, c["Progressing"].message) == ("RollingOut", "1 old replica terminating")


def test_scaled_to_zero() -> None:
    c = conds(obs(desired=0, deployment=dep(ready=0)))
    assert (c["Ready"].status, c["Ready"].reason) == ("False", "ScaledToZero")
    assert c["Progressing"].reason == "RolloutComplete"


@pytest.mark.parametrize("pod,reason,fragment", [
    (waiting("tts-1", "ImagePullBackOff", 'Back-off pulling image "bad:tag"'), "ImagePullBackOff", "bad:tag"),
    (waiting("tts-1", "CrashLoopBackOff", "back-off 5m", last={"reason": "OOMKilled", "exitCode": 137}),
     "OOMKilled", "back-off"),
    (waiting("tts-1", "CrashLoopBackOff", "back-off", last={"exitCode": 1, "message": "model.yaml not found"}),
     "CrashLoopBackOff", "model.yaml not found"),
    (waiting("tts-1", "CrashLoopBackOff", "", init=True, container="fetch-model",
             last={"exitCode": 2, "message": "sha256 mismatch"}), "ModelFetchFailed", "sha256 mismatch"),
    ({"metadata": {"name": "tts-1"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/mig-1g.10gb."}]}},
     "Unschedulable", "Insufficient nvidia.com/mig-1g.10gb"),
    (waiting("tts-1", "CreateContainerConfigError", 'secret "key" not found'), "CreateContainerConfigError",
     'secret "key" not found'),
])
def test_pod_failures_surface_as_degraded_and_not_ready(pod: Obj, reason: str, fragment: str) -> None:
    c = conds(obs(deployment=dep(ready=0, updated=2, total=2), pods=[pod]))
    assert (c["Degraded"].status, c["Degraded"].reason) == ("True", reason)
    assert fragment in c["Degraded"].message and "pod tts-1" in c["Degraded"].message
    assert (c["Ready"].status, c["Ready"].reason) == ("False", reason)


def test_the_most_actionable_problem_wins_and_others_are_counted() -> None:
    pods = [waiting("a", "CrashLoopBackOff"), waiting("b", "ErrImagePull", "denied"), waiting("c", "ErrImagePull")]
    problems = pod_problems(pods)
    assert [p.reason for p in problems] == ["ErrImagePull", "ErrImagePull", "CrashLoopBackOff"]
    c = conds(obs(deployment=dep(), pods=pods))
    assert c["Degraded"].message == "pod b: denied (and 1 more pod)"


def test_a_fetch_that_finally_succeeded_is_not_a_problem() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"initContainerStatuses": [{
        "name": "fetch-model", "state": {"terminated": {"exitCode": 0}},
        "lastState": {"terminated": {"exitCode": 1, "message": "timeout"}}}]}}
    assert pod_problems([pod]) == []


def test_progress_deadline_and_replica_failure() -> None:
    stuck = dep(ready=0, conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                      "message": 'ReplicaSet "tts-1" has timed out progressing.'}])
    c = conds(obs(deployment=stuck))
    assert (c["Progressing"].status, c["Progressing"].reason) == ("False", "ProgressDeadlineExceeded")
    assert (c["Degraded"].status, c["Degraded"].reason) == ("True", "ProgressDeadlineExceeded")
    quota = dep(ready=0, conditions=[{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                                      "message": "exceeded quota: gpu"}])
    assert conds(obs(deployment=quota))["Degraded"].message == "exceeded quota: gpu"


def test_capacity_condition_sources() -> None:
    short = Assessment("False", "InsufficientCapacity", "4 × nvidia.com/mig-1g.10gb requested, 2 allocatable")
    c = conds(obs(deployment=dep(ready=0, updated=2, total=2), capacity=short))
    assert (c["CapacityAvailable"].status, c["CapacityAvailable"].message) == ("False", short.message)
    assert (c["Ready"].reason, c["Ready"].message) == ("InsufficientCapacity", short.message)
    kept = conds(obs(deployment=dep(ready=2)), previous={"CapacityAvailable": Condition(
        "CapacityAvailable", "False", "InsufficientCapacity", "kept")})
    assert kept["CapacityAvailable"].message == "kept"  # not re-assessed: keep what the last check said
    assert conds(obs(deployment=dep(ready=2)))["CapacityAvailable"].reason == "NotAssessed"
    assert conds(obs(deployment=dep(ready=2), gpu=False))["CapacityAvailable"].reason == "NoGPURequested"


def test_invalid_spec_conditions() -> None:
    c = {x.type: x for x in invalid_conditions("spec.gpu: bad", {})}
    assert (c["Ready"].status, c["Ready"].reason, c["Ready"].message) == ("False", "InvalidSpec", "spec.gpu: bad")
    assert (c["Degraded"].status, c["Progressing"].status, c["CapacityAvailable"].status) == \
        ("True", "False", "Unknown")


def test_last_transition_time_moves_only_when_status_flips() -> None:
    before = {"conditions": [{"type": "Ready", "status": "False", "reason": "WaitingForReplicas",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"},
                             {"type": "Degraded", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    now = [Condition("Ready", "False", "ImagePullBackOff", "x"), Condition("Degraded", "True", "ImagePullBackOff", "x")]
    out = {c["type"]: c for c in render_conditions(now, before, generation=4, now="2026-02-02T00:00:00Z")}
    assert out["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert out["Degraded"]["lastTransitionTime"] == "2026-02-02T00:00:00Z"
    assert out["Ready"]["observedGeneration"] == 4


def test_events_mark_transitions_only() -> None:
    waiting_c = Condition("Ready", "False", "WaitingForReplicas", "0/1")
    ready_c = Condition("Ready", "True", "AllReplicasReady", "1/1 replicas ready")
    assert transitions({"Ready": waiting_c}, [ready_c]) == [("Normal", "Ready", "1/1 replicas ready")]
    assert transitions({"Ready": ready_c}, [ready_c]) == []
    lost = Condition("Ready", "False", "CrashLoopBackOff", "pod x")
    assert transitions({"Ready": ready_c}, [lost]) == [("Warning", "NotReady", "CrashLoopBackOff: pod x")]
    short = Condition("CapacityAvailable", "False", "InsufficientCapacity", "4 × ... 2 allocatable")
    assert transitions({}, [short]) == [("Warning", "InsufficientCapacity", "4 × ... 2 allocatable")]
