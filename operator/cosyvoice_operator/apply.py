"""Idempotent create-or-patch: the smallest JSON merge patch that makes a live child match the desired one.

Three inputs, like ``kubectl apply``: the desired manifest, the live object, and the manifest the
operator applied last time (kept in an annotation on the child). The patch

* sets every desired field the live object lacks or holds with another value (drift is put back);
* leaves alone fields the API server or other controllers added (defaults, ``status``, annotations);
* removes fields the operator set last time but no longer wants (a disabled option disappears);
* replaces lists whole, as a merge patch does, when the desired list is not already in place.

Live values count as "in place" when they contain the desired ones: the API server fills defaults
into containers and ports, and that must not look like drift on every reconcile. Inside list
elements only those defaults may be extra: a merge patch replaces a list whole, so any other extra
key there (a container's ``lifecycle`` after the preStop sleep went to 0 and a rollout undo or a
hand edit brought it back) is drift that only re-sending the list removes.
"""
from __future__ import annotations

import json
from typing import Any, cast

from . import quantity
from .constants import LAST_APPLIED_ANNOTATION

Obj = dict[str, Any]
_MISSING = object()
# Keys whose values are resource quantities: "1000m" and "1" are the same request.
_QUANTITY_KEYS = frozenset({"requests", "limits", "sizeLimit"})
# Fields the API server fills in inside the list elements the operator renders (containers, ports,
# probes, env, volumes, tolerations, Service ports), per the core/v1 defaulting functions.
SERVER_DEFAULTED = frozenset({
    "terminationMessagePath", "terminationMessagePolicy", "imagePullPolicy", "resources",  # containers
    "protocol", "targetPort", "nodePort",  # container and Service ports
    "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold", "scheme",  # probes
    "apiVersion",  # env valueFrom.fieldRef
    "defaultMode",  # secret / configMap volumes
})


def last_applied_of(live: Obj) -> Obj | None:
    raw = ((live.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED_ANNOTATION)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return cast(Obj, value) if isinstance(value, dict) else None


def with_last_applied(desired: Obj) -> Obj:
    """The desired object, annotated with its own compact JSON (the base of the next three-way merge)."""
    annotated: Obj = json.loads(json.dumps(desired))
    meta = annotated.setdefault("metadata", {})
    meta.setdefault("annotations", {})[LAST_APPLIED_ANNOTATION] = json.dumps(
        desired, sort_keys=True, separators=(",", ":"))
    return annotated


def contains(live: Any, desired: Any, quantities: bool = False, in_list: bool = False) -> bool:
    """Whether ``live`` already holds everything ``desired`` asks for (and, inside list elements,
    nothing else but server defaults)."""
    if isinstance(desired, dict):
        return (isinstance(live, dict)
                and not (in_list and set(live) - set(desired) - SERVER_DEFAULTED)
                and all(k in live and contains(live[k], v, quantities or k in _QUANTITY_KEYS, in_list)
                        for k, v in desired.items()))
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(lv, dv, quantities, True) for lv, dv in zip(live, desired, strict=True)))
    if quantities:
        return quantity.equal(live, desired)
    if isinstance(live, bool) or isinstance(desired, bool):
        return live is desired
    return bool(live == desired)


def _diff(desired: Obj, live: Obj, last: Obj | None, quantities: bool = False) -> Obj:
    patch: Obj = {}
    for key, want in desired.items():
        have = live.get(key, _MISSING)
        before = last.get(key, _MISSING) if isinstance(last, dict) else _MISSING
        nested_quantities = quantities or key in _QUANTITY_KEYS
        if isinstance(want, dict) and isinstance(have, dict):
            sub = _diff(want, have, before if isinstance(before, dict) else None, nested_quantities)
            if sub:
                patch[key] = sub
        elif isinstance(want, list):
            # A list we changed since last time is re-sent even if live happens to contain it,
            # so entries removed from the desired list (an env var, a toleration) really go away.
            changed_since_last = before is not _MISSING and before != want
            if have is _MISSING or changed_since_last or not contains(have, want, nested_quantities):
                patch[key] = want
        elif have is _MISSING or not contains(have, want, nested_quantities):
            patch[key] = want
    if isinstance(last, dict):
        for key in last:
            if key not in desired and key in live:
                patch[key] = None  # we set it before and no longer want it
    return patch


def merge_patch(desired: Obj, live: Obj) -> Obj:
    """The JSON merge patch turning ``live`` into ``desired``; empty when nothing needs to change.

    ``desired`` must already carry the last-applied annotation (see ``with_last_applied``).
    """
    return _diff(desired, live, last_applied_of(live))


def changed_paths(patch: Obj, depth: int = 3) -> list[str]:
    """Human-readable dotted paths of a patch, for events ("spec.replicas, spec.template.spec")."""
    paths: list[str] = []

    def walk(node: Obj, prefix: str, level: int) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict) and value and level < depth:
                walk(value, path, level + 1)
            else:
                paths.append(path)

    walk(patch, "", 1)
    return [p for p in paths if not p.startswith(f"metadata.annotations.{LAST_APPLIED_ANNOTATION}")]
