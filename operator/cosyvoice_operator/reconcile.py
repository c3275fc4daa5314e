"""One reconciliation of a CosyVoiceService: parse → render → create-or-patch children → status.

No kopf here: handlers call ``Reconciler``, tests can drive it directly, and events go through the
``Recorder`` callback the caller provides. Calls are synchronous (kopf runs them in worker threads);
a lock per CosyVoiceService keeps two threads from reconciling the same object at once.
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import admin, apply, capacity, kube, render
from .constants import API_VERSION, KIND, LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGER, OPT_IN_LABEL, \
    OPT_IN_VALUE
from .spec import CosyVoiceServiceSpec, InvalidSpec, UnknownField, check_name, parse_spec, unknown_fields
from .canary.traffic import CANARY, effective_weight, split_replicas
from .status import Condition, Observed, canary_condition, conditions_for, invalid_conditions, parse_conditions, \
    render_conditions, status_body, transitions, with_canary_replicas

Obj = dict[str, Any]
Recorder = Callable[[Obj, str, str, str], None]  # (owner body, "Normal"|"Warning", reason, message)
log = logging.getLogger(__name__)


class ChildConflict(InvalidSpec):
    """A child's name is taken by an object this CosyVoiceService does not own."""


class ReferenceNotAllowed(InvalidSpec):
    """The spec names a Secret, ConfigMap, claim or ServiceAccount whose owner has not opted in to
    CosyVoiceServices using it (or that the operator cannot check). ``unlabelled``: (kind, name) of those
    that exist without the label: pods already running with one must stop using it."""

    def __init__(self, message: str, unlabelled: frozenset[tuple[str, str]] = frozenset()) -> None:
        super().__init__(message)
        self.unlabelled = unlabelled


class SecretNotAllowed(ReferenceNotAllowed):
    """Every object refused is a Secret (the reason the operator has always given for them)."""


_REFERENCED = {render.SECRET: kube.SECRETS, render.CONFIG_MAP: kube.CONFIG_MAPS, render.CLAIM: kube.PVCS,
               render.SERVICE_ACCOUNT: kube.SERVICE_ACCOUNTS}


def _no_events(obj: Obj, type_: str, reason: str, message: str) -> None:
    log.info("%s %s: %s", type_, reason, message)


@dataclass
class ClusterView:
    """Nodes and pods listed once per resync and shared by every CosyVoiceService's capacity check."""
    nodes: list[Obj]
    pods: list[Obj]


@dataclass
class Result:
    status: Obj
    actions: list[str] = field(default_factory=list)


@dataclass
class _KeyState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = False
    draining: bool = False


def is_controlled_by(obj: Obj, uid: str | None) -> bool:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and ref.get("uid") == uid:
            return True
    return False


def _has_foreign_controller(obj: Obj) -> bool:
    return any(ref.get("controller") for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _ours_by_labels(obj: Obj, name: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGER and labels.get(LABEL_INSTANCE) == name


class Reconciler:
    def __init__(self, client: kube.Kube, record: Recorder = _no_events, cluster_domain: str = "cluster.local",
                 policy: admin.AdminPolicy | None = None) -> None:
        self.kube = client
        self.policy = policy or admin.AdminPolicy()
        self.record = record
        self.cluster_domain = cluster_domain
        self._guard = threading.Lock()
        self._keys: dict[tuple[str, str], _KeyState] = {}
        self._created: set[tuple[str, str]] = set()  # (owner uid, kind/name) this process has created
        self._warned: set[tuple[str, str, int | None]] = set()

    # --- entry points -----------------------------------------------------------------------------

    def reconcile(self, cr: Obj, *, assess_capacity: bool = True, cluster: ClusterView | None = None) -> Result | None:
        """Apply one CosyVoiceService. Raises InvalidSpec (after recording it in status) or kube.ApiError.

        The object is read again under the lock: another thread may have written its status since
        ``cr`` was observed, and conditions must build on the latest one.
        """
        meta = cr.get("metadata") or {}
        namespace, name = meta.get("namespace") or "", meta["name"]
        with self._state(namespace, name).lock:
            latest = self.kube.get(kube.COSYVOICESERVICES, namespace, name)
            if latest is None:
                return None  # deleted: owner references let the garbage collector remove the children
            return self._reconcile(latest, assess_capacity=assess_capacity, cluster=cluster)

    def nudge(self, namespace: str, name: str) -> None:
        """Re-reconcile after a child changed. Bursts (a rollout touches many pods) collapse into one pass."""
        state = self._state(namespace, name)
        with self._guard:
            state.dirty = True
            if state.draining:
                return  # the thread already looping for this key will pick the change up
            state.draining = True
        try:
            while True:
                with self._guard:
                    if not state.dirty:
                        return
                    state.dirty = False
                # An invalid spec is already in status; nothing to retry until the spec changes.
                with contextlib.suppress(InvalidSpec):
                    self.reconcile({"metadata": {"namespace": namespace, "name": name}}, assess_capacity=False)
        finally:
            with self._guard:
                state.draining = False

    def resync(self, namespaces: Iterable[str] | None = None) -> int:
        """Reconcile every CosyVoiceService in ``namespaces`` (all when None), with fresh capacity figures."""
        crs = self._list_services(namespaces)
        cluster = None
        if any((cr.get("spec") or {}).get("gpu") for cr in crs):
            cluster = self._cluster_view()
        done = 0
        for cr in crs:
            try:
                self.reconcile(cr, cluster=cluster)
                done += 1
            except InvalidSpec:
                pass
            except kube.ApiError as exc:
                log.warning("resync of %s/%s failed: %s", cr["metadata"].get("namespace"), cr["metadata"]["name"], exc)
        return done

    def _list_services(self, namespaces: Iterable[str] | None) -> list[Obj]:
        patterns = list(namespaces) if namespaces is not None else None
        if patterns is not None and not any(set(p) & set("*?[!,") for p in patterns):
            return [cr for ns in patterns for cr in self.kube.list(kube.COSYVOICESERVICES, ns)]
        # Globs and exclusions (kopf's --namespace syntax): list everywhere, keep the matching ones.
        return [cr for cr in self.kube.list(kube.COSYVOICESERVICES)
                if patterns is None or namespace_matches((cr.get("metadata") or {}).get("namespace") or "", patterns)]

    # --- the steps --------------------------------------------------------------------------------

    def _state(self, namespace: str, name: str) -> _KeyState:
        with self._guard:
            return self._keys.setdefault((namespace, name), _KeyState())

    def _reconcile(self, cr: Obj, *, assess_capacity: bool, cluster: ClusterView | None) -> Result | None:
        meta = cr.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return None
        owner = render.Owner.from_body(cr)
        generation = meta.get("generation")
        previous_status: Obj = cr.get("status") or {}
        previous = parse_conditions(previous_status)
        try:
            check_name(owner.name)
            spec = parse_spec(cr.get("spec"))
            check_applied_manifest(cr)
            canary = spec.canary_spec()
            weight = effective_weight(spec.canary, canary.version, previous_status.get("canary")) \
                if spec.canary is not None and canary is not None else 0
            rendered = render.render(owner, spec, weight)
            for version in (spec, canary) if canary is not None else (spec,):
                admin.check_bounds(version, render.container_resources(version).get("limits") or {},
                                   self.policy.bounds)
            self._check_references(owner, rendered)
            self._check_voice_store(cr, owner, spec)
            actions = [a for obj in rendered.objects if (a := self._ensure(cr, owner, obj))]
        except InvalidSpec as exc:
            self._record_invalid(cr, exc, previous, previous_status, generation)
            if isinstance(exc, ReferenceNotAllowed) and exc.unlabelled and owner.uid:
                self._stop_using(cr, owner, exc.unlabelled)
            raise
        for api_version, kind_ in rendered.absent:
            if (a := self._ensure_absent(cr, owner, kube.resource_of(api_version, kind_))):
                actions.append(a)
        if "canary" in previous_status:  # a canary ran: remove what its end (or its gateway's) left behind
            for api_version, kind_, child in rendered.absent_canary:
                if (a := self._ensure_absent(cr, owner, kube.resource_of(api_version, kind_), child)):
                    actions.append(a)

        deployment = self.kube.get(kube.DEPLOYMENTS, owner.namespace, owner.name)
        pods = [p for p in self.kube.list(kube.PODS, owner.namespace, render.selector_labels(owner.name))
                if ((p.get("metadata") or {}).get("labels") or {}).get(render.LABEL_TRACK) != CANARY]
        stable_n, canary_n = split_replicas(spec.desired_replicas, weight) if canary is not None \
            else (spec.desired_replicas, 0)
        assessment = self._assess(owner, spec, cluster) if assess_capacity else None
        observed = Observed(desired=stable_n, deployment=deployment, pods=pods, capacity=assessment,
                            gpu_requested=spec.gpu is not None, max_unavailable=spec.rollout.max_unavailable,
                            demo_model=spec.storage is None)
        conditions = conditions_for(observed, previous)
        canary_dep = None
        if canary is not None:
            canary_dep = self.kube.get(kube.DEPLOYMENTS, owner.namespace, render.child_name(owner, CANARY))
            conditions.append(canary_condition(previous_status.get("canary"), canary_dep, canary_n))
        for type_, reason, message in transitions(previous, conditions):
            self.record(cr, type_, reason, message)
        status = status_body(
            generation=generation, observed=observed,
            conditions=render_conditions(conditions, previous_status, generation),
            selector=render.selector_string(owner.name), endpoint=render.endpoint(owner, spec, self.cluster_domain),
            gpu_resource=spec.gpu.resource if spec.gpu else None)
        if canary is not None:
            status = with_canary_replicas(status, canary_dep, stable_n, canary_n)
        else:
            status["canary"] = None  # the canary's figures go with it (removed only where present)
        self._patch_status(owner, status, previous_status)
        return Result(status=status, actions=actions)

    def _check_voice_store(self, cr: Obj, owner: render.Owner, spec: CosyVoiceServiceSpec) -> None:
        """Replicas on several nodes can share ``spec.voices.pvc`` only if it is ReadWriteMany (ReadOnlyMany
        when none registers). A warning, not a refusal: on one node a ReadWriteOnce claim still works."""
        pvc, auto = spec.voices.pvc, spec.autoscaling
        most = spec.desired_replicas
        if auto is not None and auto.enabled and auto.max_replicas is not None:
            most = max(most, auto.max_replicas)
        if pvc is None or most < 2:
            return
        try:
            claim = self.kube.get(kube.PVCS, owner.namespace, pvc.claim_name)
        except kube.ApiError:
            return  # not allowed or not now: the pods' own status says what goes wrong
        if claim is None:
            return  # deleted since the opt-in check: the next pass refuses it
        where = f"PersistentVolumeClaim {pvc.claim_name} (spec.voices.pvc)"
        modes = set((claim.get("spec") or {}).get("accessModes") or [])
        if "ReadWriteMany" in modes or ("ReadOnlyMany" in modes and not spec.voices.registration.enabled):
            return
        self._warn_once(cr, "VoiceStoreNotShared", f"{where} has access modes {', '.join(sorted(modes)) or 'none'}: "
                        f"up to {most} replicas on different nodes cannot all mount it (Multi-Attach error); "
                        "use a ReadWriteMany claim (NFS, CephFS, EFS, Filestore, Azure Files)")

    def _check_references(self, owner: render.Owner, rendered: render.Rendered) -> None:
        """Every Secret, ConfigMap, claim and ServiceAccount the pods would use is in the service's namespace
        (pods cannot reach others) and opted in by its owner's label; the operator reads only their metadata."""
        used = [u for dep in rendered.objects if dep["kind"] == render.DEPLOYMENT[1]
                for u in render.objects_used(dep["spec"]["template"]["spec"])]
        problems: list[str] = []
        kinds: set[str] = set()
        unlabelled: set[tuple[str, str]] = set()
        for kind, where, name in used:
            what = f"{kind} {name} ({where})"
            try:
                obj = self.kube.get_metadata(_REFERENCED[kind], owner.namespace, name)
            except kube.ApiError as exc:
                if exc.status != 403:
                    raise
                obj, problem = None, f"{what}: the operator may not check it: {exc.message or exc.reason}"
            else:
                problem = f"{what} does not exist in namespace {owner.namespace}" if obj is None else None
            if obj is not None and (obj["metadata"].get("labels") or {}).get(OPT_IN_LABEL) != OPT_IN_VALUE:
                unlabelled.add((kind, name))
                problem = (f"{what} is not labelled {OPT_IN_LABEL}={OPT_IN_VALUE} (its owner opts in with: kubectl "
                           f"label {kind.lower()} {name} -n {owner.namespace} {OPT_IN_LABEL}={OPT_IN_VALUE})")
            if problem:
                problems.append(problem)
                kinds.add(kind)
        if problems:
            cls = SecretNotAllowed if kinds == {render.SECRET} else ReferenceNotAllowed
            raise cls("; ".join(dict.fromkeys(problems)), frozenset(unlabelled))

    def _stop_using(self, cr: Obj, owner: render.Owner, unlabelled: frozenset[tuple[str, str]]) -> None:
        """Fail closed on a revoked opt-in: running pods that use an object whose owner no longer allows it keep
        it mounted (the kubelet even keeps a Secret volume up to date), so their Deployment goes to 0 replicas
        until the label is back or the spec no longer names it. Pods that do not use it (the spec only now
        names it) keep running."""
        live = self.kube.get(kube.DEPLOYMENTS, owner.namespace, owner.name)
        if live is None or not is_controlled_by(live, owner.uid) or not (live.get("spec") or {}).get("replicas"):
            return
        pod = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
        if not unlabelled & {(kind, name) for kind, _, name in render.objects_used(pod)}:
            return
        self.kube.patch(kube.DEPLOYMENTS, owner.namespace, owner.name, {"spec": {"replicas": 0}})
        self.record(cr, "Warning", "ScaledToZero", f"Deployment {owner.name} scaled to 0: its pods use an object "
                    "whose owner has not opted in (see the Ready condition)")

    def _ensure(self, cr: Obj, owner: render.Owner, desired: Obj) -> str | None:
        """Create the child or patch it towards ``desired``; a short description of what was done."""
        res = kube.resource_of(desired["apiVersion"], desired["kind"])
        name = desired["metadata"]["name"]
        target = apply.with_last_applied(desired)
        try:
            return self._create_or_patch(cr, owner, res, name, target)
        except kube.ApiError as exc:
            if res is kube.HTTP_ROUTES and exc.status in (403, 404):
                raise InvalidSpec("spec.canary.gateway needs Gateway API HTTPRoutes: "
                                  + ("the operator may not manage them (operator chart value gatewayAPI.enabled)"
                                     if exc.status == 403 else "this cluster does not serve "
                                     "gateway.networking.k8s.io/v1 HTTPRoute (install the Gateway API CRDs)")
                                  + "; remove spec.canary.gateway to split by replicas instead") from None
            if exc.status in (400, 422):  # the API server's own validation: the spec cannot work as written
                raise InvalidSpec(f"the API server rejected {res.kind} {name}: {exc.message or exc.reason}") from None
            raise

    def _create_or_patch(self, cr: Obj, owner: render.Owner, res: kube.Resource, name: str, target: Obj) -> str | None:
        live = self.kube.get(res, owner.namespace, name)
        if live is None:
            try:
                self.kube.create(res, target)
            except kube.Conflict:
                live = self.kube.get(res, owner.namespace, name)  # created concurrently: patch it below
                if live is None:
                    raise
            except kube.NotFound:
                if res is kube.SERVICE_MONITORS:
                    self._warn_once(cr, "ServiceMonitorUnavailable",
                                    "monitoring.coreos.com/v1 ServiceMonitor is not served by this cluster "
                                    "(Prometheus Operator missing?); pods keep their prometheus.io/* annotations")
                    return None
                raise
            else:
                again = (owner.uid or "", f"{res.kind}/{name}") in self._created
                self._created.add((owner.uid or "", f"{res.kind}/{name}"))
                verb = "Recreated" if again else "Created"
                message = f"{verb} {res.kind} {name}" + (" (it was deleted)" if again else "")
                self.record(cr, "Normal", verb, message)
                return message
        # Adopt only what is unowned and labelled as ours (e.g. applied from `render`), never a stranger's.
        if owner.uid and not is_controlled_by(live, owner.uid) and (
                _has_foreign_controller(live) or not _ours_by_labels(live, owner.name)):
            raise ChildConflict(f"{res.kind} {owner.namespace}/{name} already exists and is not controlled by "
                                f"this {KIND}; delete or rename it")
        self._created.add((owner.uid or "", f"{res.kind}/{name}"))
        patch = apply.merge_patch(target, live)
        if not patch:
            return None
        self.kube.patch(res, owner.namespace, name, patch)
        paths = apply.changed_paths(patch)
        message = f"Updated {res.kind} {name}: {', '.join(paths) if paths else 'metadata'}"
        self.record(cr, "Normal", "Updated", message)
        return message

    def _ensure_absent(self, cr: Obj, owner: render.Owner, res: kube.Resource, name: str | None = None) -> str | None:
        name = name or owner.name
        try:
            live = self.kube.get(res, owner.namespace, name)
        except kube.ApiError as exc:
            if res in (kube.SERVICE_MONITORS, kube.HTTP_ROUTES):
                return None  # the kind is not served at all (or, for routes, not ours to manage)
            raise exc
        if live is None or not (is_controlled_by(live, owner.uid) if owner.uid else _ours_by_labels(live, owner.name)):
            return None
        self.kube.delete(res, owner.namespace, name)
        self._created.discard((owner.uid or "", f"{res.kind}/{name}"))
        message = f"Deleted {res.kind} {name} (disabled in the spec)"
        self.record(cr, "Normal", "Deleted", message)
        return message

    def _cluster_view(self) -> ClusterView:
        return ClusterView(nodes=self.kube.list(kube.NODES), pods=self.kube.list(kube.PODS))

    def _assess(self, owner: render.Owner, spec: CosyVoiceServiceSpec,
                cluster: ClusterView | None) -> capacity.Assessment | None:
        request = capacity.request_from_spec(owner.name, spec)
        if request is None:
            return None
        try:
            view = cluster or self._cluster_view()
        except kube.ApiError as exc:
            if exc.status in (401, 403):
                return capacity.Assessment("Unknown", "NodesUnreadable",
                                           f"cannot list nodes and pods to check GPU capacity: {exc}")
            raise
        return capacity.assess(request, view.nodes, view.pods)

    def _record_invalid(self, cr: Obj, exc: InvalidSpec, previous: dict[str, Condition], previous_status: Obj,
                        generation: int | None) -> None:
        reason, message = type(exc).__name__, str(exc)
        old = previous.get("Ready")
        if old is None or old.reason != reason or old.message != message:
            self.record(cr, "Warning", reason, message)
        conditions = invalid_conditions(message, previous, reason)
        status: Obj = {"conditions": render_conditions(conditions, previous_status, generation)}
        if generation is not None:
            status["observedGeneration"] = generation
        owner = render.Owner.from_body(cr)
        self._patch_status(owner, status, previous_status)

    def _patch_status(self, owner: render.Owner, status: Obj, previous: Obj) -> None:
        body = {k: v for k, v in status.items() if v is not None or k in previous}
        if apply.contains(previous, body):
            return  # unchanged: no write, no watch event, no churn
        with contextlib.suppress(kube.NotFound):  # deleted meanwhile
            self.kube.patch(kube.COSYVOICESERVICES, owner.namespace, owner.name, {"status": body},
                            subresource="status")

    def _warn_once(self, cr: Obj, reason: str, message: str) -> None:
        meta = cr.get("metadata") or {}
        key = (meta.get("uid") or meta.get("name", ""), reason, meta.get("generation"))
        if key not in self._warned:
            self._warned.add(key)
            self.record(cr, "Warning", reason, message)


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def check_applied_manifest(cr: Obj) -> None:
    """Reject a spec whose ``kubectl apply`` manifest named fields the API server silently dropped.

    A misspelt field (``maxReplica``) would otherwise leave the setting at its default with no word."""
    raw = ((cr.get("metadata") or {}).get("annotations") or {}).get(LAST_APPLIED)
    try:
        applied = json.loads(raw) if raw else None
    except ValueError:
        return
    if not isinstance(applied, dict) or not isinstance(applied.get("spec"), dict):
        return
    problems = unknown_fields(applied["spec"])
    if problems:
        raise UnknownField(f"{problems} (the API server dropped it from the applied manifest; correct the "
                           "manifest and apply it again)")


def namespace_matches(namespace: str, patterns: Iterable[str]) -> bool:
    """kopf's namespace patterns: globs, comma-separated, ``!glob`` excludes."""
    items = [item.strip() for p in patterns for item in p.split(",") if item.strip()]
    included = any(fnmatch.fnmatchcase(namespace, i) for i in items if not i.startswith("!"))
    excluded = any(fnmatch.fnmatchcase(namespace, i[1:]) for i in items if i.startswith("!"))
    only_exclusions = all(i.startswith("!") for i in items)
    return (included or only_exclusions) and not excluded


def owner_of(child: Obj) -> str | None:
    """The name of the CosyVoiceService a child (or one of its pods) belongs to, if any."""
    meta = child.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION:
            return str(ref.get("name"))
    labels = meta.get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) == MANAGER and labels.get(LABEL_INSTANCE):
        return str(labels[LABEL_INSTANCE])  # pods are owned by ReplicaSets; the label names the service
    return None
