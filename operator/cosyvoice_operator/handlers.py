"""kopf handlers: the table of contents of the operator. Each one hands its work to ``Reconciler``.

* startup/cleanup   configure kopf (watch timeouts, where kopf keeps its state), start the resync loop
* CosyVoiceService  on resume, create and update (spec changes, ``kubectl scale``): reconcile
* children          a Deployment, Service, PDB or pod of ours changed or vanished: reconcile its owner
* resync loop       every ``resync_seconds``: drift, status and GPU capacity for every service
* autoscale loop    every service with ``spec.autoscaling.enabled`` is evaluated each ``intervalSeconds``
                    (``autoscaling/controller.py``); the handlers above tell the loop which services exist
* canary loop       every service with ``spec.canary``: figures, analysis, promotion or abort each interval
                    (``canary/controller.py``)
* probe             ``/healthz`` (``run --liveness``) reports the last successful resync

No timers or daemons on the CR: those make kopf put a finalizer on it, which blocks ``kubectl delete``
whenever the operator is down. Children are removed by the garbage collector through their owner
references instead.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import kopf

from . import admin
from .constants import GROUP, LABEL_MANAGED_BY, MANAGER, PLURAL, VERSION
from .autoscaling.controller import Autoscaler, post_event
from .canary.controller import CanaryController
from .kube import ApiError, Kube
from .reconcile import Reconciler, owner_of
from .spec import InvalidSpec

CVS = (GROUP, VERSION, PLURAL)
OURS = {LABEL_MANAGED_BY: MANAGER}
CHILD_RESOURCES = (("apps", "v1", "deployments"), ("", "v1", "services"),
                   ("policy", "v1", "poddisruptionbudgets"), ("", "v1", "pods"))
DEFAULT_RESYNC_SECONDS = 60.0
log = logging.getLogger(__name__)


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings that keep a long-running operator healthy (exposed for tests)."""
    # Silent watch hangs are kopf's most reported failure: bound every watch on both ends.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    # kopf's own bookkeeping goes to annotations in our group; status stays a clean, structural schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    # Only warnings from kopf's logs become Kubernetes events; our own events are explicit.
    settings.posting.level = logging.WARNING
    # Server-side filtering: watch only the children we manage (emulators may ignore it; handlers filter too).
    for group, version, plural in CHILD_RESOURCES:
        settings.watching.label_selectors[group, version, plural] = f"{LABEL_MANAGED_BY}={MANAGER}"


def _recorder(client: Kube) -> Callable[[dict[str, Any], str, str, str], None]:
    def record(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1000])
        except LookupError:  # outside a handler (the resync loop) kopf has no event queue: write it directly
            post_event(client, body, type_, reason, message)

    return record


def _plain(body: kopf.Body) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(json.dumps(dict(body))))


def _backoff(retry: int) -> float:
    return float(min(300, 5 * 2 ** min(retry, 6)))


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    if memo.get("kube") is None:
        memo.kube = Kube.from_environment()
    policy = memo.get("policy") or admin.AdminPolicy()
    memo.reconciler = Reconciler(memo.kube, record=_recorder(memo.kube),
                                 cluster_domain=memo.get("cluster_domain", "cluster.local"), policy=policy)
    # After a restart (runtime.operate) the previous run's loops died with its event loop: start afresh.
    memo.last_resync = None
    memo.resync_task = asyncio.create_task(_resync_forever(memo))
    memo.autoscaler = Autoscaler(memo.kube, policy=policy)  # posts its events itself: it runs outside handlers
    memo.autoscale_due = {}  # (namespace, name) -> loop time of the next evaluation
    memo.autoscale_task = asyncio.create_task(_autoscale_forever(memo))
    memo.canary = CanaryController(memo.kube, policy=policy, applied=memo.reconciler.nudge)
    memo.canary_due = {}
    memo.canary_task = asyncio.create_task(_every_interval(memo.canary_due, memo.canary.evaluate, "canary"))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for key in ("resync_task", "autoscale_task", "canary_task"):
        task = memo.get(key)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@kopf.on.resume(*CVS, id="reconcile-on-resume")
@kopf.on.create(*CVS, id="reconcile-on-create")
@kopf.on.update(*CVS, id="reconcile-on-update")
def reconcile_service(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    _track_autoscaling(memo, body)
    try:
        memo.reconciler.reconcile(_plain(body))
    except InvalidSpec as exc:
        raise kopf.PermanentError(str(exc)) from None  # status says why; wait for the next spec change
    except ApiError as exc:
        raise kopf.TemporaryError(str(exc), delay=_backoff(retry)) from None


@kopf.on.event(*CHILD_RESOURCES[0], labels=OURS)
@kopf.on.event(*CHILD_RESOURCES[1], labels=OURS)
@kopf.on.event(*CHILD_RESOURCES[2], labels=OURS)
@kopf.on.event(*CHILD_RESOURCES[3], labels=OURS)
def child_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type is None:
        return  # the initial listing: resume handlers already cover existing services
    owner = owner_of(_plain(body))
    namespace = body.get("metadata", {}).get("namespace")
    if owner and namespace:
        memo.reconciler.nudge(namespace, owner)


@kopf.on.probe(id="lastResync")
def last_resync(memo: kopf.Memo, **_: Any) -> float | None:
    return memo.get("last_resync")


async def _resync_forever(memo: kopf.Memo) -> None:
    interval = float(memo.get("resync_seconds") or DEFAULT_RESYNC_SECONDS)
    namespaces = memo.get("namespaces")  # None: every namespace
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        try:
            count = await loop.run_in_executor(None, memo.reconciler.resync, namespaces)
        except ApiError as exc:
            log.warning("resync failed, retrying in %.0fs: %s", interval, exc)
            continue
        except Exception:  # the loop must survive anything a single pass throws
            log.exception("resync failed unexpectedly")
            continue
        memo.last_resync = time.time()
        log.debug("resynced %d CosyVoiceService(s)", count)


def _track_autoscaling(memo: kopf.Memo, body: kopf.Body) -> None:
    """Tell the autoscale loop about a service (it drops services that are gone or not autoscaled)."""
    due = memo.get("autoscale_due")
    meta = body.get("metadata", {})
    if due is not None and memo.autoscaler.interval(_plain(body)) is not None:
        due.setdefault((meta.get("namespace") or "", meta["name"]), 0.0)
    canary_due = memo.get("canary_due")
    if canary_due is not None and memo.canary.interval(_plain(body)) is not None:
        canary_due.setdefault((meta.get("namespace") or "", meta["name"]), 0.0)


async def _autoscale_forever(memo: kopf.Memo, tick: float = 0.5) -> None:
    """Evaluate each autoscaled service every ``intervalSeconds``."""
    def evaluate(namespace: str, name: str) -> float | None:
        decision = memo.autoscaler.evaluate(namespace, name)
        return None if decision is None else memo.autoscaler.interval_of(namespace, name)

    await _every_interval(memo.autoscale_due, evaluate, "autoscaling", tick)


async def _every_interval(due: dict[tuple[str, str], float], evaluate: Callable[[str, str], float | None],
                          what: str, tick: float = 0.5) -> None:
    """Run ``evaluate(namespace, name)`` for each service in ``due`` when its time comes, each in a worker
    thread, one at a time per service (a slow Prometheus delays that service only); it returns the seconds
    until the next run, None to drop the service. No kopf timer: that would add a finalizer."""
    loop = asyncio.get_running_loop()
    running: dict[tuple[str, str], tuple[asyncio.Future[Any], float]] = {}  # key -> (evaluation, start)

    while True:
        await asyncio.sleep(tick)
        now = loop.time()
        for key, (future, started) in list(running.items()):
            if not future.done():
                continue
            del running[key]
            try:
                interval = future.result()
            except ApiError as exc:
                log.warning("%s %s/%s failed, retrying: %s", what, *key, exc)
                interval = 5.0
            except Exception:  # the loop must survive anything one evaluation throws
                log.exception("%s %s/%s failed unexpectedly", what, *key)
                interval = 15.0
            if interval is None:
                due.pop(key, None)
            else:
                due[key] = max(now, started + interval)  # a fixed period, like HPA's sync
        for key, at in list(due.items()):
            if at <= now and key not in running:
                running[key] = (loop.run_in_executor(None, evaluate, *key), now)
