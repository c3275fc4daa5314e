"""status.conditions from what the cluster reports: the Deployment, its pods, and the capacity check.

Conditions follow Kubernetes conventions: ``{type, status, reason, message, lastTransitionTime,
observedGeneration}``, with lastTransitionTime kept while the status does not flip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

from .capacity import Assessment
from .constants import COND_CANARY, COND_CAPACITY, COND_DEGRADED, COND_DEMO_MODEL, COND_PROGRESSING, COND_READY, \
    CONDITION_TYPES
from .render import FETCH_CONTAINER_NAME

Obj = dict[str, Any]

# Most actionable first: the reason an SRE should read when several pods fail differently.
_PROBLEM_ORDER = ("Unschedulable", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ModelFetchFailed",
                  "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff",
                  "OOMKilled", "Evicted")
INVALID_REASONS = frozenset({"InvalidSpec", "UnknownField", "ChildConflict", "PolicyViolation", "SecretNotAllowed",
                             "ReferenceNotAllowed"})
_BAD_WAITING = frozenset(_PROBLEM_ORDER) - {"Unschedulable", "ModelFetchFailed", "OOMKilled", "Evicted"}
DEMO_MODEL_MESSAGE = ("no spec.storage: the pods serve the image's bundled demo model, whose random weights make "
                      "noise rather than speech (for smoke tests); set spec.storage.pvc or spec.storage.storageUri "
                      "to serve a converted CosyVoice2 or CosyVoice3 model")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class Problem:
    reason: str
    pod: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the reconciler read back after applying the children."""
    desired: int
    deployment: Obj | None
    pods: list[Obj]
    capacity: Assessment | None  # None: not assessed this time, keep the previous condition
    gpu_requested: bool
    max_unavailable: int | str = 1
    demo_model: bool = False  # no spec.storage: the image's bundled random-weight model is served


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pod_problems(pods: list[Obj]) -> list[Problem]:
    """Failure reasons visible on pods, most actionable first."""
    found: list[Problem] = []
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name", "?"))
        status = pod.get("status") or {}
        if status.get("phase") == "Failed" and status.get("reason"):
            found.append(Problem(status["reason"], name, _short(status.get("message", ""))))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                found.append(Problem("Unschedulable", name, _short(cond.get("message", ""))))
        for cs in status.get("initContainerStatuses") or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if cs.get("name") == FETCH_CONTAINER_NAME:
                now_failed = (state.get("terminated") or {}).get("exitCode", 0) != 0
                if now_failed or waiting.get("reason") == "CrashLoopBackOff":
                    last = (state.get("terminated") if now_failed else (cs.get("lastState") or {}).get("terminated"))
                    detail = (last or {}).get("message") or waiting.get("message") or "the model download failed"
                    found.append(Problem("ModelFetchFailed", name, _short(detail)))
                    continue
            if waiting.get("reason") in _BAD_WAITING:
                found.append(Problem(waiting["reason"], name, _short(waiting.get("message", ""))))
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if waiting.get("reason") in _BAD_WAITING:
                reason = waiting["reason"]
                if reason == "CrashLoopBackOff" and last.get("reason") == "OOMKilled":
                    reason = "OOMKilled"
                message = waiting.get("message", "")
                if last.get("message"):
                    message = f"{message} (last exit: {last['message']})" if message else last["message"]
                found.append(Problem(reason, name, _short(message)))
    return sorted(found, key=lambda p: _PROBLEM_ORDER.index(p.reason) if p.reason in _PROBLEM_ORDER else 99)


def resolve_max_unavailable(value: int | str, desired: int) -> int:
    """Deployment semantics: a percentage of the desired replicas, rounded down."""
    if isinstance(value, str) and value.endswith("%"):
        return math.floor(desired * int(value[:-1]) / 100)
    return int(value)


def _dep_status(deployment: Obj | None) -> Obj:
    return (deployment or {}).get("status") or {}


def _dep_condition(deployment: Obj | None, type_: str) -> Obj | None:
    return next((c for c in _dep_status(deployment).get("conditions") or [] if c.get("type") == type_), None)


def _generation(obj: Obj) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def _summarise(problems: list[Problem]) -> str:
    top = problems[0]
    same = [p for p in problems if p.reason == top.reason]
    more = f" (and {len(same) - 1} more pod{'s' if len(same) > 2 else ''})" if len(same) > 1 else ""
    return _short(f"pod {top.pod}: {top.message or top.reason}{more}", 500)


def conditions_for(observed: Observed, previous: dict[str, Condition]) -> list[Condition]:
    dep = _dep_status(observed.deployment)
    desired = observed.desired
    ready = int(dep.get("readyReplicas") or 0)
    updated = int(dep.get("updatedReplicas") or 0)
    total = int(dep.get("replicas") or 0)
    problems = pod_problems(observed.pods)
    progress = _dep_condition(observed.deployment, "Progressing") or {}
    stuck = progress.get("reason") == "ProgressDeadlineExceeded"
    stuck_message = progress.get("message") or "the rollout stopped making progress"
    replica_failure = _dep_condition(observed.deployment, "ReplicaFailure")
    replica_failure = replica_failure if replica_failure and replica_failure.get("status") == "True" else None

    # CapacityAvailable
    if not observed.gpu_requested:
        capacity = Condition(COND_CAPACITY, "True", "NoGPURequested", "CPU-only service: no GPU resource is requested")
    elif observed.capacity is not None:
        found = observed.capacity
        capacity = Condition(COND_CAPACITY, found.status, found.reason, found.message)
    else:
        capacity = previous.get(COND_CAPACITY) or Condition(COND_CAPACITY, "Unknown", "NotAssessed",
                                                            "GPU capacity has not been checked yet")

    # Degraded
    if stuck:
        detail = f"; {_summarise(problems)}" if problems else ""
        degraded = Condition(COND_DEGRADED, "True", "ProgressDeadlineExceeded", _short(f"{stuck_message}{detail}"))
    elif problems:
        degraded = Condition(COND_DEGRADED, "True", problems[0].reason, _summarise(problems))
    elif replica_failure is not None:
        degraded = Condition(COND_DEGRADED, "True", "ReplicaFailure",
                             _short(replica_failure.get("message") or "the Deployment cannot create its pods"))
    else:
        degraded = Condition(COND_DEGRADED, "False", "AsExpected", "no failing pods")

    # Progressing
    if observed.deployment is None:
        progressing = Condition(COND_PROGRESSING, "True", "Creating", "the Deployment is being created")
    elif stuck:
        progressing = Condition(COND_PROGRESSING, "False", "ProgressDeadlineExceeded", _short(stuck_message))
    elif int(dep.get("observedGeneration") or 0) < _generation(observed.deployment):
        progressing = Condition(COND_PROGRESSING, "True", "RolloutPending",
                                "the Deployment controller has not observed the latest change yet")
    elif updated < desired:
        progressing = Condition(COND_PROGRESSING, "True", "RollingOut", f"{updated}/{desired} replicas updated")
    elif total > desired:
        progressing = Condition(COND_PROGRESSING, "True", "RollingOut",
                                f"{total - desired} old replica{'s' if total - desired > 1 else ''} terminating")
    elif ready < desired:
        progressing = Condition(COND_PROGRESSING, "True", "WaitingForReplicas", f"{ready}/{desired} replicas ready")
    else:
        progressing = Condition(COND_PROGRESSING, "False", "RolloutComplete",
                                f"{desired} replica{'s' if desired != 1 else ''} up to date and ready")

    # Ready: the endpoint serves, with no more replicas missing than a rollout may take down.
    floor = max(1, desired - resolve_max_unavailable(observed.max_unavailable, desired))
    if desired == 0:
        ready_c = Condition(COND_READY, "False", "ScaledToZero", "spec.replicas is 0: nothing serves the endpoint")
    elif ready >= desired:
        ready_c = Condition(COND_READY, "True", "AllReplicasReady", f"{ready}/{desired} replicas ready")
    elif ready >= floor:
        ready_c = Condition(COND_READY, "True", "MinimumReplicasAvailable", f"{ready}/{desired} replicas ready")
    elif problems and ready == 0:
        ready_c = Condition(COND_READY, "False", problems[0].reason, _summarise(problems))
    elif capacity.status == "False" and ready == 0:
        ready_c = Condition(COND_READY, "False", "InsufficientCapacity", capacity.message)
    else:
        ready_c = Condition(COND_READY, "False", "WaitingForReplicas",
                            f"{ready}/{desired} replicas ready (a server turns ready once its model is loaded "
                            "and warmed up)")
    return [ready_c, progressing, degraded, capacity, demo_model_condition(observed)]


def demo_model_condition(observed: Observed) -> Condition:
    if not observed.demo_model:
        return Condition(COND_DEMO_MODEL, "False", "ModelFromStorage", "the model comes from spec.storage")
    # On a GPU it holds an accelerator for a model that cannot speak: worth a warning, not a rejection
    # (a storage-less CR is how a new GPU node pool, MIG layout or driver is smoke-tested).
    reason = "BundledDemoModelOnGPU" if observed.gpu_requested else "BundledDemoModel"
    return Condition(COND_DEMO_MODEL, "True", reason, DEMO_MODEL_MESSAGE)


def canary_condition(canary: Obj | None, deployment: Obj | None, desired: int) -> Condition:
    """The ``Canary`` condition from ``status.canary`` (the analysis' verdict) and the canary's Deployment."""
    canary = canary or {}
    reason, message = canary.get("reason") or "Starting", canary.get("message") or "no figures read yet"
    if canary.get("phase") == "Aborted":
        return Condition(COND_CANARY, "False", "Aborted", _short(message, 1000))
    ready = int(_dep_status(deployment).get("readyReplicas") or 0)
    if desired > 0 and ready == 0:
        return Condition(COND_CANARY, "False", "WaitingForCanaryReplicas",
                         f"0/{desired} canary replicas ready; {_short(message, 900)}")
    return Condition(COND_CANARY, "True", reason, _short(message, 1000))


def with_canary_replicas(body: Obj, deployment: Obj | None, stable_desired: int, canary_desired: int) -> Obj:
    """``status_body``'s replica counts for both versions (the scale subresource reads status.replicas)."""
    dep = _dep_status(deployment)
    out = dict(body)
    for key in ("replicas", "readyReplicas", "updatedReplicas", "availableReplicas"):
        out[key] = int(body.get(key) or 0) + int(dep.get(key) or 0)
    out["replicaSummary"] = f"{out['readyReplicas']}/{stable_desired + canary_desired}"
    return out


def invalid_conditions(message: str, previous: dict[str, Condition], reason: str = "InvalidSpec") -> list[Condition]:
    """The spec cannot be applied: children keep their last good state, nothing new rolls out."""
    capacity = previous.get(COND_CAPACITY) or Condition(COND_CAPACITY, "Unknown", reason,
                                                        "not assessed: the spec cannot be applied")
    return [
        Condition(COND_READY, "False", reason, message),
        Condition(COND_PROGRESSING, "False", reason, "nothing is rolled out until the spec is fixed"),
        Condition(COND_DEGRADED, "True", reason, message),
        capacity,
    ]


def parse_conditions(status: Obj | None) -> dict[str, Condition]:
    out: dict[str, Condition] = {}
    for c in (status or {}).get("conditions") or []:
        if c.get("type") in CONDITION_TYPES:
            out[c["type"]] = Condition(c["type"], c.get("status", "Unknown"), c.get("reason", ""), c.get("message", ""))
    return out


def render_conditions(conditions: list[Condition], previous_raw: Obj | None, generation: int | None,
                      now: str | None = None) -> list[Obj]:
    """Conditions as status dicts, keeping lastTransitionTime for conditions whose status did not change."""
    before = {c.get("type"): c for c in (previous_raw or {}).get("conditions") or []}
    stamp = now or now_iso()
    out: list[Obj] = []
    for cond in conditions:
        old = before.get(cond.type)
        since = old.get("lastTransitionTime") if old and old.get("status") == cond.status else None
        item: Obj = {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message,
                     "lastTransitionTime": since or stamp}
        if generation is not None:
            item["observedGeneration"] = generation
        out.append(item)
    return out


def transitions(previous: dict[str, Condition], current: list[Condition]) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for condition changes worth an event."""
    events: list[tuple[str, str, str]] = []
    for cond in current:
        old = previous.get(cond.type)
        if old is not None and (old.status, old.reason) == (cond.status, cond.reason):
            continue
        if cond.type == COND_READY and cond.status == "True" and (old is None or old.status != "True"):
            events.append(("Normal", "Ready", cond.message))
        elif cond.type == COND_READY and cond.status == "False" and old is not None and old.status == "True":
            events.append(("Warning", "NotReady", f"{cond.reason}: {cond.message}"))
        elif cond.status == ("True" if cond.type == COND_DEGRADED else "False") and \
                cond.type in (COND_DEGRADED, COND_CAPACITY) and cond.reason not in INVALID_REASONS:
            events.append(("Warning", cond.reason, cond.message))
        elif cond.type == COND_CAPACITY and cond.status == "True" and old is not None and old.status == "False":
            events.append(("Normal", "CapacityAvailable", cond.message))
        elif cond.type == COND_DEMO_MODEL and cond.status == "True":
            events.append(("Warning" if cond.reason == "BundledDemoModelOnGPU" else "Normal", cond.reason, cond.message))
    return events


def status_body(*, generation: int | None, observed: Observed, conditions: list[Obj],
                selector: str, endpoint: str, gpu_resource: str | None) -> Obj:
    dep = _dep_status(observed.deployment)
    ready = int(dep.get("readyReplicas") or 0)
    body: Obj = {
        "replicas": int(dep.get("replicas") or 0),
        "readyReplicas": ready,
        "updatedReplicas": int(dep.get("updatedReplicas") or 0),
        "availableReplicas": int(dep.get("availableReplicas") or 0),
        "replicaSummary": f"{ready}/{observed.desired}",
        "selector": selector,
        "endpoint": endpoint,
        "gpuResource": gpu_resource,
        "conditions": conditions,
    }
    if generation is not None:
        body["observedGeneration"] = generation
    return body
