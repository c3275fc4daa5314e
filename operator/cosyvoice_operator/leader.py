"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it, so that
of several operator replicas exactly one acts (reconciles, autoscales, writes ``/scale``).

* A candidate takes the Lease when it is free, released, or expired. Expiry is judged by the
  candidate's own clock from the moment it last saw the Lease *change* (never by comparing clocks
  across machines), after ``lease_duration``.
* Every write carries the ``resourceVersion`` it read: of two candidates writing at once, the API
  server accepts one and answers the other 409 Conflict.
* The leader renews every ``retry_period``; if it cannot renew for ``renew_deadline`` (shorter than
  ``lease_duration``) it stops acting before any other candidate may take over.
* On a clean shutdown the leader releases the Lease so a standby takes over at once.

``decide`` is the pure rule; ``Elector`` does the API calls (synchronous, run in a thread).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from . import kube

Obj = dict[str, Any]
Action = Literal["create", "take", "renew", "wait"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration")


def micro_time(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decide(lease: Obj | None, identity: str, observed_at: float, now: float, duration: float) -> Action:
    """What a candidate does with the Lease as read. ``observed_at``: when it last saw the Lease change."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == identity:
        return "renew"
    held_for = float(spec.get("leaseDurationSeconds") or duration)
    if holder and now < observed_at + held_for:
        return "wait"
    return "take"


class Elector:
    def __init__(self, client: kube.Kube, namespace: str, name: str, identity: str, timing: Timing,
                 clock: Any) -> None:
        self.kube, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.timing, self.clock = timing, clock
        self._seen: tuple[str | None, str | None] | None = None  # (resourceVersion, holder) last observed
        self._observed_at = 0.0

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards. Raises kube.ApiError on
        errors other than a lost race."""
        now = self.clock()
        lease = self.kube.get(kube.LEASES, self.namespace, self.name)
        if lease is not None:
            seen = ((lease.get("metadata") or {}).get("resourceVersion"), (lease.get("spec") or {}).get("renewTime"))
            if seen != self._seen:
                self._seen, self._observed_at = seen, now
        action = decide(lease, self.identity, self._observed_at, now, self.timing.lease_duration)
        if action == "wait":
            return False
        stamp = micro_time()
        spec: Obj = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.timing.lease_duration),
                     "renewTime": stamp}
        try:
            if action == "create":
                self.kube.create(kube.LEASES, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": stamp, "leaseTransitions": 0}})
            else:
                assert lease is not None
                if action == "take":
                    spec.update(acquireTime=stamp, leaseTransitions=int(lease["spec"].get("leaseTransitions") or 0) + 1)
                self.kube.patch(kube.LEASES, self.namespace, self.name, {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec})
        except kube.Conflict:
            return False  # another candidate wrote first
        if action != "renew":
            log.info("became the leader (Lease %s/%s, identity %s)", self.namespace, self.name, self.identity)
        return True

    def release(self) -> None:
        """Give the Lease up (clean shutdown) so that a standby takes over without waiting for expiry."""
        lease = self.kube.get(kube.LEASES, self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        try:
            self.kube.patch(kube.LEASES, self.namespace, self.name, {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time()}})
        except kube.ApiError as exc:
            log.warning("could not release the Lease: %s", exc)
