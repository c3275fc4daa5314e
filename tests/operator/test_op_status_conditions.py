"""The four conditions `kubectl describe cvs` shows, word for word, in the situations an SRE meets."""
from __future__ import annotations

from typing import Any

import pytest
from cosyvoice_operator.capacity import Assessment
from cosyvoice_operator.status import Condition, Observed, conditions_for, pod_problems, transitions
from test_op_status import dep, obs, waiting

NOT_ASSESSED = ("Unknown", "NotAssessed", "GPU capacity has not been checked yet")
HEALTHY = ("False", "AsExpected", "no failing pods")
WARMING = "replicas ready (a server turns ready once its model is loaded and warmed up)"
STUCK = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "timed out"}]

CASES: list[tuple[str, Observed, tuple[Any, ...]]] = [
    ("one-replica", obs(desired=1, deployment=dep(ready=1)),
     (("True", "AllReplicasReady", "1/1 replicas ready"), ("False", "RolloutComplete", "1 replica up to date and ready"),
      HEALTHY, NOT_ASSESSED)),
    ("three-replicas", obs(desired=3, deployment=dep(ready=3)),
     (("True", "AllReplicasReady", "3/3 replicas ready"),
      ("False", "RolloutComplete", "3 replicas up to date and ready"), HEALTHY, NOT_ASSESSED)),
    ("old-replicas-terminating", obs(desired=2, deployment=dep(ready=2, updated=2, total=4)),
     (("True", "AllReplicasReady", "2/2 replicas ready"), ("True", "RollingOut", "2 old replicas terminating"),
      HEALTHY, NOT_ASSESSED)),
    ("no-unavailability-allowed", obs(desired=3, deployment=dep(ready=2, updated=3, total=3), max_unavailable=0),
     (("False", "WaitingForReplicas", f"2/3 {WARMING}"), ("True", "WaitingForReplicas", "2/3 replicas ready"),
      HEALTHY, NOT_ASSESSED)),
    ("percent-unavailability", obs(desired=4, deployment=dep(ready=3, updated=4, total=4), max_unavailable="25%"),
     (("True", "MinimumReplicasAvailable", "3/4 replicas ready"), ("True", "WaitingForReplicas", "3/4 replicas ready"),
      HEALTHY, NOT_ASSESSED)),
    ("percent-rounds-down", obs(desired=4, deployment=dep(ready=3, updated=4, total=4), max_unavailable="20%"),
     (("False", "WaitingForReplicas", f"3/4 {WARMING}"), ("True", "WaitingForReplicas", "3/4 replicas ready"),
      HEALTHY, NOT_ASSESSED)),
    ("a-lone-replica-down-is-not-ready", obs(desired=1, deployment=dep(ready=0, updated=1, total=1), max_unavailable=1),
     (("False", "WaitingForReplicas", f"0/1 {WARMING}"), ("True", "WaitingForReplicas", "0/1 replicas ready"),
      HEALTHY, NOT_ASSESSED)),
    ("stuck-with-a-failing-pod", obs(deployment=dep(ready=0, conditions=STUCK), pods=[waiting("p", "ErrImagePull", "denied")]),
     (("False", "ErrImagePull", "pod p: denied"), ("False", "ProgressDeadlineExceeded", "timed out"),
      ("True", "ProgressDeadlineExceeded", "timed out; pod p: denied"), NOT_ASSESSED)),
    ("stuck-without-a-message", obs(deployment=dep(ready=0, conditions=[{**STUCK[0], "message": ""}])),
     (("False", "WaitingForReplicas", f"0/2 {WARMING}"),
      ("False", "ProgressDeadlineExceeded", "the rollout stopped making progress"),
      ("True", "ProgressDeadlineExceeded", "the rollout stopped making progress"), NOT_ASSESSED)),
    ("an-old-replica-failure", obs(deployment=dep(ready=2, conditions=[
        {"type": "ReplicaFailure", "status": "False", "message": "old"}])),
     (("True", "AllReplicasReady", "2/2 replicas ready"), ("False", "RolloutComplete", "2 replicas up to date and ready"),
      HEALTHY, NOT_ASSESSED)),
    ("cpu-only", obs(deployment=dep(ready=2), gpu=False),
     (("True", "AllReplicasReady", "2/2 replicas ready"), ("False", "RolloutComplete", "2 replicas up to date and ready"),
      HEALTHY, ("True", "NoGPURequested", "CPU-only service: no GPU resource is requested"))),
    ("being-created", obs(deployment=None),
     (("False", "WaitingForReplicas", f"0/2 {WARMING}"), ("True", "Creating", "the Deployment is being created"),
      HEALTHY, NOT_ASSESSED)),
    ("rollout-not-yet-observed", obs(deployment=dep(ready=2, generation=5, observed=4)),
     (("True", "AllReplicasReady", "2/2 replicas ready"),
      ("True", "RolloutPending", "the Deployment controller has not observed the latest change yet"),
      HEALTHY, NOT_ASSESSED)),
    ("scaled-to-zero", obs(desired=0, deployment=dep(ready=0)),
     (("False", "ScaledToZero", "spec.replicas is 0: nothing serves the endpoint"),
      ("False", "RolloutComplete", "0 replicas up to date and ready"), HEALTHY, NOT_ASSESSED)),
    ("replica-failure", obs(deployment=dep(ready=0, conditions=[
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "exceeded quota: gpu"}])),
     (("False", "WaitingForReplicas", f"0/2 {WARMING}"), ("True", "RollingOut", "0/2 replicas updated"),
      ("True", "ReplicaFailure", "exceeded quota: gpu"), NOT_ASSESSED)),
    ("replica-failure-without-a-message", obs(deployment=dep(ready=2, conditions=[
        {"type": "ReplicaFailure", "status": "True"}])),
     (("True", "AllReplicasReady", "2/2 replicas ready"), ("False", "RolloutComplete", "2 replicas up to date and ready"),
      ("True", "ReplicaFailure", "the Deployment cannot create its pods"), NOT_ASSESSED)),
    ("a-deployment-status-with-only-some-counts", obs(desired=1, deployment={"status": {"replicas": 1}}),
     (("False", "WaitingForReplicas", f"0/1 {WARMING}"), ("True", "RollingOut", "0/1 replicas updated"),
      HEALTHY, NOT_ASSESSED)),
    ("no-generation-recorded", obs(desired=1, deployment={"status": {"replicas": 1, "updatedReplicas": 1,
                                                                     "readyReplicas": 1}}),
     (("True", "AllReplicasReady", "1/1 replicas ready"), ("False", "RolloutComplete", "1 replica up to date and ready"),
      HEALTHY, NOT_ASSESSED)),
    ("no-capacity", obs(deployment=dep(ready=0), capacity=Assessment("False", "MIGProfileNotOffered", "no 9g.99gb")),
     (("False", "InsufficientCapacity", "no 9g.99gb"), ("True", "RollingOut", "0/2 replicas updated"),
      HEALTHY, ("False", "MIGProfileNotOffered", "no 9g.99gb"))),
    ("a-new-deployment-not-yet-observed", obs(desired=1, deployment={"metadata": {"generation": 1}, "status": {}}),
     (("False", "WaitingForReplicas", f"0/1 {WARMING}"),
      ("True", "RolloutPending", "the Deployment controller has not observed the latest change yet"),
      HEALTHY, NOT_ASSESSED)),
    ("one-of-two-during-a-rollout", obs(desired=2, deployment=dep(ready=1, updated=2, total=2), max_unavailable=1),
     (("True", "MinimumReplicasAvailable", "1/2 replicas ready"), ("True", "WaitingForReplicas", "1/2 replicas ready"),
      HEALTHY, NOT_ASSESSED)),
    ("a-failing-pod-while-others-serve", obs(desired=3, deployment=dep(ready=2, updated=3, total=3),
                                             pods=[waiting("p", "CrashLoopBackOff", "back-off")]),
     (("True", "MinimumReplicasAvailable", "2/3 replicas ready"), ("True", "WaitingForReplicas", "2/3 replicas ready"),
      ("True", "CrashLoopBackOff", "pod p: back-off"), NOT_ASSESSED)),
]


@pytest.mark.parametrize(("observed", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_conditions_word_for_word(observed: Observed, expected: tuple[Any, ...]) -> None:
    got = [(c.type, c.status, c.reason, c.message) for c in conditions_for(observed, {})]
    assert got[:4] == [(t, *e) for t, e in zip(("Ready", "Progressing", "Degraded", "CapacityAvailable"), expected,
                                              strict=True)]
    assert got[4:] == [("DemoModel", "False", "ModelFromStorage", "the model comes from spec.storage")]


def test_several_pods_failing_the_same_way_are_counted() -> None:
    pods = [waiting("a", "CrashLoopBackOff", "x"), waiting("b", "CrashLoopBackOff", ""), waiting("c", "OOMKilled")]
    (degraded,) = [c for c in conditions_for(obs(deployment=dep(), pods=pods), {}) if c.type == "Degraded"]
    assert degraded.message == "pod a: x (and 1 more pod)"  # OOMKilled is not a waiting reason: not counted
    pods.append(waiting("d", "CrashLoopBackOff", ""))
    (degraded,) = [c for c in conditions_for(obs(deployment=dep(), pods=pods), {}) if c.type == "Degraded"]
    assert degraded.message == "pod a: x (and 2 more pods)"
    only = [waiting("b", "CrashLoopBackOff", "")]
    (degraded,) = [c for c in conditions_for(obs(deployment=dep(), pods=only), {}) if c.type == "Degraded"]
    assert degraded.message == "pod b: CrashLoopBackOff"  # no message: the reason says it


@pytest.mark.parametrize(("pod", "problem"), [
    ({"metadata": {"name": "ev"}, "status": {"phase": "Failed", "reason": "Evicted",
                                             "message": "The node was low on resource: memory.  Used 9Gi."}},
     ("Evicted", "ev", "The node was low on resource: memory. Used 9Gi.")),  # whitespace collapsed
    ({"metadata": {"name": "f"}, "status": {"initContainerStatuses": [
        {"name": "fetch-model", "state": {"terminated": {"exitCode": 3, "message": "403 Forbidden"}}}]}},
     ("ModelFetchFailed", "f", "403 Forbidden")),
    ({"metadata": {"name": "f"}, "status": {"initContainerStatuses": [
        {"name": "fetch-model", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
     ("ModelFetchFailed", "f", "the model download failed")),
    ({"metadata": {"name": "f"}, "status": {"initContainerStatuses": [
        {"name": "fetch-model", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}]}},
     ("ModelFetchFailed", "f", "back-off 40s")),
    ({"metadata": {"name": "i"}, "status": {"initContainerStatuses": [
        {"name": "fetch-model", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}}]}},
     ("ImagePullBackOff", "i", "m")),
    ({"metadata": {"name": "r"}, "status": {"containerStatuses": [
        {"name": "server", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 2, "message": "bad flag"}}}]}},
     ("CrashLoopBackOff", "r", "bad flag")),
    ({"status": {"phase": "Failed", "reason": "Evicted"}}, ("Evicted", "?", "")),
    ({"metadata": {"name": "u"}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}, ("Unschedulable", "u", "")),
    ({"metadata": {"name": "i"}, "status": {"initContainerStatuses": [
        {"name": "other", "state": {"waiting": {"reason": "ErrImagePull"}}}]}}, ("ErrImagePull", "i", "")),
    (waiting("c", "CrashLoopBackOff", ""), ("CrashLoopBackOff", "c", "")),
    ({"metadata": {"name": "c"}, "status": {"containerStatuses": [
        {"name": "server", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}, ("CrashLoopBackOff", "c", "")),
    (waiting("c", "CrashLoopBackOff", "back-off 5m", last={"exitCode": 1, "message": "model.yaml not found"}),
     ("CrashLoopBackOff", "c", "back-off 5m (last exit: model.yaml not found)")),
])
def test_pod_problems_name_the_pod_and_the_cause(pod: dict, problem: tuple[str, str, str]) -> None:
    assert [(p.reason, p.pod, p.message) for p in pod_problems([pod])] == [problem]


def test_failed_pods_without_a_reason_and_healthy_pods_are_no_problem() -> None:
    pods = [{"metadata": {"name": "a"}, "status": {"phase": "Failed"}},
            {"metadata": {"name": "b"}, "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False", "reason": "Unschedulable"}],
                "containerStatuses": [{"name": "server", "state": {"waiting": {"reason": "ContainerCreating"}}}]}},
            {"metadata": {"name": "c"}, "status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}}]
    assert pod_problems(pods) == []


def test_long_messages_are_cut_to_300_characters() -> None:
    (problem,) = pod_problems([waiting("p", "CrashLoopBackOff", "z" * 400)])
    assert len(problem.message) == 300 and problem.message.endswith("z…")
    (exact,) = pod_problems([waiting("p", "CrashLoopBackOff", "z" * 300)])
    assert exact.message == "z" * 300


def test_the_summary_fits_the_condition_message_limit() -> None:
    name = "p" * 253  # the longest pod name Kubernetes allows
    pods = [waiting(name, "CrashLoopBackOff", "m" * 400), waiting("q", "CrashLoopBackOff")]
    (degraded,) = [c for c in conditions_for(obs(deployment=dep(), pods=pods), {}) if c.type == "Degraded"]
    assert len(degraded.message) == 500 and degraded.message.startswith(f"pod {name}: mmm")
    assert degraded.message.endswith("…")


def C(type_: str, status: str, reason: str, message: str = "m") -> Condition:
    return Condition(type_, status, reason, message)


READY = C("Ready", "True", "AllReplicasReady", "2/2 replicas ready")
WAITING = C("Ready", "False", "WaitingForReplicas", "0/2")
SHORT = C("CapacityAvailable", "False", "InsufficientCapacity", "1 allocatable")
ENOUGH = C("CapacityAvailable", "True", "Sufficient", "7 allocatable")


@pytest.mark.parametrize(("previous", "current", "events"), [
    ([], [READY, ENOUGH], [("Normal", "Ready", "2/2 replicas ready")]),  # first time ready; capacity fine: quiet
    ([], [WAITING], []),  # starting up is not news
    ([C("Ready", "Unknown", "NotAssessed")], [READY], [("Normal", "Ready", "2/2 replicas ready")]),
    ([READY], [C("Ready", "True", "MinimumReplicasAvailable", "1/2")], []),  # still serving
    ([READY], [C("Ready", "False", "CrashLoopBackOff", "pod x: boom")],
     [("Warning", "NotReady", "CrashLoopBackOff: pod x: boom")]),
    ([WAITING], [C("Ready", "False", "ImagePullBackOff", "pod x")], []),  # was not serving: the Degraded event says it
    ([C("Degraded", "False", "AsExpected")], [C("Degraded", "True", "OOMKilled", "pod x")],
     [("Warning", "OOMKilled", "pod x")]),
    ([C("Degraded", "True", "OOMKilled")], [C("Degraded", "False", "AsExpected")], []),
    ([], [C("Degraded", "True", "InvalidSpec", "bad")], []),  # the admission error already told the author
    ([], [SHORT], [("Warning", "InsufficientCapacity", "1 allocatable")]),
    ([SHORT], [ENOUGH], [("Normal", "CapacityAvailable", "7 allocatable")]),
    ([C("CapacityAvailable", "Unknown", "NotAssessed")], [ENOUGH], []),
    ([], [ENOUGH], []),
    ([C("Progressing", "True", "RollingOut")], [C("Progressing", "False", "RolloutComplete")], []),
    ([READY, SHORT], [READY, C("CapacityAvailable", "True", "Sufficient", "3 allocatable")],  # unchanged first
     [("Normal", "CapacityAvailable", "3 allocatable")]),
    ([], [C("DemoModel", "True", "BundledDemoModelOnGPU", "demo")], [("Warning", "BundledDemoModelOnGPU", "demo")]),
    ([], [C("DemoModel", "True", "BundledDemoModel", "demo")], [("Normal", "BundledDemoModel", "demo")]),
])
def test_events_an_sre_sees(previous: list[Condition], current: list[Condition], events: list[tuple[str, str, str]]) -> None:
    assert transitions({c.type: c for c in previous}, current) == events


def test_every_failing_container_is_reported_and_unknown_reasons_sort_last() -> None:
    pod = {"metadata": {"name": "p"}, "status": {"initContainerStatuses": [
        {"name": "fetch-model", "state": {"terminated": {"exitCode": 1, "message": "404"}}},
        {"name": "sidecar-init", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "m"}}}]}}
    lost = {"metadata": {"name": "q"}, "status": {"phase": "Failed", "reason": "NodeLost", "message": "gone"}}
    problems = [(x.reason, x.pod, x.message) for x in pod_problems([lost, pod])]
    assert problems == [("ImagePullBackOff", "p", "m"), ("ModelFetchFailed", "p", "404"), ("NodeLost", "q", "gone")]
