"""Can the cluster fit the desired replicas? Counted from nodes' allocatable GPU resources.

A node counts when the pods could land there: it is Ready, not cordoned, matches the pod's node
selector, every NoSchedule/NoExecute taint is tolerated, and (for MIG strategies) its MIG
configuration is not being changed. Devices already held by other pods on the node are subtracted;
devices held by this service's own pods stay counted, since those pods are part of the replicas.
Required node affinity is not evaluated: the count is an upper bound for such specs.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import mig, quantity, render
from .constants import LABEL_GPU_PRODUCT, LABEL_INSTANCE, LABEL_MIG_CONFIG_STATE, LABEL_MIG_STRATEGY
from .spec import CosyVoiceServiceSpec

Obj = dict[str, Any]
Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class GpuRequest:
    resource: str
    replicas: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    mig_profile: str | None = None
    mig_strategy: str = "mixed"
    owner: str | None = None  # the CR's name: its own pods' devices are not "taken"


@dataclass(frozen=True)
class Assessment:
    status: Status
    reason: str
    message: str
    allocatable: int = 0
    nodes: tuple[str, ...] = ()


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


def node_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return True  # nodes without conditions (fresh or emulated) are given the benefit of the doubt


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for tol in tolerations:
        effect = tol.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = tol.get("key")
        if not key:
            if tol.get("operator") == "Exists":
                return True  # an empty key with Exists tolerates everything
            continue
        if key != taint.get("key"):
            continue
        if tol.get("operator") == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _exclusion(node: Obj, request: GpuRequest) -> str | None:
    """Why a node cannot host the pods; None when it can."""
    labels = _labels(node)
    if any(labels.get(k) != v for k, v in request.node_selector.items()):
        return "selector"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    if not node_ready(node):
        return "not Ready"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(request.tolerations, taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    if request.mig_strategy != "none":
        state = labels.get(LABEL_MIG_CONFIG_STATE)
        if state in ("pending", "rebooting"):
            return "MIG reconfiguration pending"
        if state == "failed":
            return "MIG reconfiguration failed"
    return None


def held_by_others(pods: Iterable[Obj], node: str, resource: str, owner: str | None) -> int:
    total = 0
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if owner is not None and _labels(pod).get(LABEL_INSTANCE) == owner:
            continue
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            amount = (resources.get("limits") or {}).get(resource, (resources.get("requests") or {}).get(resource))
            total += quantity.count(amount)
    return total


def _profile_hint(nodes: list[Obj], request: GpuRequest) -> str | None:
    """Explain a profile the observed GPUs cannot provide, listing the valid ones."""
    if not request.mig_profile:
        return None
    products: dict[str, list[str]] = {}
    for node in nodes:
        if any(_labels(node).get(k) != v for k, v in request.node_selector.items()):
            continue
        product = _labels(node).get(LABEL_GPU_PRODUCT)
        family = mig.gpu_family(product) if product else None
        if family is not None:
            products.setdefault(family, []).append(_name(node))
    if not products or any(request.mig_profile in mig.valid_profiles(f) for f in products):
        return None
    parts = [f"{family} (nodes {', '.join(names)}): {', '.join(mig.valid_profiles(family))}"
             for family, names in sorted(products.items())]
    return (f"MIG profile {request.mig_profile} does not exist on the cluster's GPUs; "
            f"valid profiles: {'; '.join(parts)}")


def _advertised_elsewhere(nodes: list[Obj], request: GpuRequest) -> str:
    """When nothing advertises the resource, say what the GPU nodes do advertise."""
    seen: dict[str, list[str]] = {}
    strategies: set[str] = set()
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for res, amount in allocatable.items():
            if res.startswith("nvidia.com/") and quantity.count(amount) > 0:
                seen.setdefault(res, []).append(_name(node))
        if LABEL_MIG_STRATEGY in _labels(node):
            strategies.add(_labels(node)[LABEL_MIG_STRATEGY])
    if not seen:
        return "no node advertises an nvidia.com/* resource (is the NVIDIA device plugin running?)"
    listed = "; ".join(f"{res} on {', '.join(names)}" for res, names in sorted(seen.items()))
    hint = f"nodes advertise {listed}"
    if strategies and request.mig_strategy not in strategies and request.mig_strategy != "none":
        hint += (f" (nodes run MIG strategy {', '.join(sorted(strategies))}; "
                 f"spec.gpu.migStrategy is {request.mig_strategy})")
    return hint


def assess(request: GpuRequest, nodes: list[Obj], pods: list[Obj]) -> Assessment:
    """CapacityAvailable for ``request.replicas`` pods each asking one ``request.resource``."""
    hint = _profile_hint(nodes, request)
    if hint:
        return Assessment("False", "MIGProfileNotOffered", hint)

    free_on: dict[str, int] = {}
    excluded: list[str] = []
    advertised = False  # does any node offer the resource at all (excluded or not)?
    for node in nodes:
        allocatable = quantity.count(((node.get("status") or {}).get("allocatable") or {}).get(request.resource))
        if allocatable <= 0:
            continue
        advertised = True
        why = _exclusion(node, request)
        if why == "selector":
            continue
        if why is not None:
            excluded.append(f"{_name(node)} ({why})")
            continue
        free = allocatable - held_by_others(pods, _name(node), request.resource, request.owner)
        if free > 0:
            free_on[_name(node)] = free

    total = sum(free_on.values())
    names = tuple(sorted(free_on))
    head = f"{request.replicas} × {request.resource} requested, {total} allocatable"
    where = f" on nodes {', '.join(names)}" if names else ""
    tail = f"; excluded: {', '.join(excluded)}" if excluded else ""
    if total >= request.replicas:
        return Assessment("True", "Sufficient", head + where + tail, total, names)
    if not advertised:
        return Assessment("False", "NoNodeAdvertisesResource", f"{head}: {_advertised_elsewhere(nodes, request)}")
    return Assessment("False", "InsufficientCapacity", head + where + tail, total, names)


def request_from_spec(name: str, spec: CosyVoiceServiceSpec) -> GpuRequest | None:
    """The GPU ask of one CosyVoiceService; None for CPU-only services."""
    if spec.gpu is None:
        return None
    return GpuRequest(resource=spec.gpu.resource, replicas=spec.desired_replicas, node_selector=render.node_selector(spec),
                      tolerations=tuple(render.tolerations(spec)), mig_profile=spec.gpu.mig_profile,
                      mig_strategy=spec.gpu.mig_strategy, owner=name)
