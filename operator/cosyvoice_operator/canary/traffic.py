"""How the replicas and the traffic are split between the stable and the canary version (pure)."""
from __future__ import annotations

from typing import Any

from ..spec import Canary

STABLE, CANARY = "stable", "canary"
ABORTED = "Aborted"


def split_replicas(total: int, weight: int) -> tuple[int, int]:
    """(stable, canary) replicas for ``total`` with ``weight`` % of the traffic to the canary.

    Without a gateway the Service spreads requests over ready pods, so the split of replicas *is* the
    traffic split (approximately: whole pods, and equal share per pod). While the weight is above 0 the
    canary has at least one replica and, below 100, the stable version keeps at least one: one replica in
    total becomes one of each.

    >>> split_replicas(10, 10), split_replicas(1, 10), split_replicas(4, 0), split_replicas(3, 100)
    ((9, 1), (1, 1), (4, 0), (0, 3))
    """
    if total <= 0 or weight <= 0:
        return max(total, 0), 0
    if weight >= 100:
        return 0, total
    canary = max(1, int(total * weight / 100 + 0.5))
    return max(1, total - canary), canary


def effective_weight(canary: Canary, version: str, status: dict[str, Any] | None) -> int:
    """The canary's weight now: 0 once this version was aborted; under automatic analysis the weight the
    analysis reached (``status.canary.weight``); else ``spec.canary.weight``."""
    status = status or {}
    if status.get("version") == version:
        if status.get("phase") == ABORTED:
            return 0
        weight = status.get("weight")
        if canary.analysis is not None and isinstance(weight, int) and 0 <= weight <= 100:
            return weight
    return canary.weight
