"""The four conditions `kubectl describe cvs` shows, word for word, in the situations an SRE meets."""
from __future__ import annotations

from typing import Any

import pytest
from cosyvoice_operator.status import Observed, conditions_for, pod_problems
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
