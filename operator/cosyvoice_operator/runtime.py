"""Running the operator: leader election around kopf, and watch failures turned into a fresh listing.

kopf re-lists by itself after a ``410 Gone`` that arrives as a watch *event*, but an API server may also
answer the watch (or list) request itself with HTTP 410 (resource version too old), a 5xx, or stream
another ERROR event: kopf then stops the whole operator. ``relist_on_watch_errors`` makes such a failure
end only that one stream, which kopf then starts again with a fresh list after a pause. Should kopf
stop for any other reason, ``operate`` starts it again in a fresh event loop (so that nothing of the
failed run lingers) after a backoff: the resume handlers reconcile each service once and unchanged
children are not written.

With leader election, a replica waits for the Lease before it starts kopf, and exits the moment it can
no longer renew it (handler threads cannot be recalled; a new process starts as a standby).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import kopf

from . import admin, kube, leader
from .constants import LEASE_NAME

log = logging.getLogger(__name__)
RELIST_PAUSE_SECONDS = 1.0  # after a failed watch or list: no tight loop against a struggling API server
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass
class Options:
    namespaces: list[str] = field(default_factory=list)
    clusterwide: bool = False
    liveness: str | None = None
    resync_seconds: float = 60.0
    cluster_domain: str = "cluster.local"
    policy: admin.AdminPolicy = field(default_factory=admin.AdminPolicy)
    leader_election: bool = False
    lease_name: str = LEASE_NAME
    lease_namespace: str | None = None
    identity: str | None = None
    timing: leader.Timing = field(default_factory=leader.Timing)
    restart_backoff: tuple[float, float] = (1.0, 30.0)  # first and longest pause before kopf is restarted


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def relist_on_watch_errors() -> None:
    """Wrap kopf's one watch stream so that its errors end the stream (kopf re-lists) instead of the operator.

    kopf has no setting for this; the wrapper touches one internal function, and the fault tests
    (tests/operator/test_op_faults.py) fail should a kopf release move it.
    """
    from kopf._cogs.clients import errors, watching

    original = watching.continuous_watch
    if getattr(original, "relists", False):
        return

    async def continuous_watch(**kwargs: Any) -> Any:
        try:
            async for item in original(**kwargs):
                yield item
        except (errors.APIError, watching.WatchingError) as exc:
            log.warning("watching %s failed (%s): listing again in %.0fs", kwargs.get("resource"), exc,
                        RELIST_PAUSE_SECONDS)
            await asyncio.sleep(RELIST_PAUSE_SECONDS)

    continuous_watch.relists = True  # type: ignore[attr-defined]
    watching.continuous_watch = continuous_watch  # type: ignore[assignment]


async def _kopf(options: Options, memo: kopf.Memo, settings: kopf.OperatorSettings, stop: threading.Event,
                ready_flag: threading.Event | None) -> None:
    # kopf waits for a threading.Event in an executor thread that would outlive a failed run (and hang
    # the event loop's shutdown): hand it an asyncio.Event of this loop instead.
    flag = asyncio.Event()

    async def bridge() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
        flag.set()

    task = asyncio.create_task(bridge())
    try:
        await kopf.operator(settings=settings, clusterwide=options.clusterwide, namespaces=options.namespaces,
                            standalone=True, liveness_endpoint=options.liveness, stop_flag=flag,
                            ready_flag=ready_flag, memo=memo)
    finally:
        task.cancel()


def operate(options: Options, memo: kopf.Memo, *, settings: kopf.OperatorSettings | None = None,
            stop_flag: threading.Event | None = None, ready_flag: threading.Event | None = None) -> None:
    """kopf with every handler until it is stopped (signal or ``stop_flag``); restarted after a failure."""
    relist_on_watch_errors()
    settings = settings or kopf.OperatorSettings()
    # kopf schedules a SIGKILL for itself after an unplanned stop; here such a stop is followed by a restart.
    settings.process.ultimate_exiting_timeout = None
    stop = stop_flag or threading.Event()
    first, longest = options.restart_backoff
    pause = first
    while not stop.is_set():
        started = time.monotonic()
        try:
            asyncio.run(_kopf(options, memo, settings, stop, ready_flag))
            return  # stopped by the flag or a signal: kopf returns normally only then
        except Exception as exc:  # a watch stream failed for good (HTTP 410, an ERROR event, ...)
            if time.monotonic() - started > 10 * longest:
                pause = first  # it ran well for a while: a new failure, not a crash loop
            log.error("the operator stopped (%s: %s); listing every object again in %.1fs",
                      type(exc).__name__, exc, pause)
        stop.wait(pause)
        pause = min(longest, pause * 2)


class StandbyHealth:
    """The liveness endpoint of a replica waiting for the Lease (kopf serves it once this one leads)."""

    def __init__(self, liveness: str | None) -> None:
        self.server: http.server.ThreadingHTTPServer | None = None
        if not liveness:
            return
        url = urlparse(liveness)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                ok = self.path.split("?")[0] == (url.path or "/")
                body = b'{"standby": true}' if ok else b""
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self.server = http.server.ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Handler)
        threading.Thread(target=self.server.serve_forever, name="standby-health", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _on_lost_default(code: int) -> None:
    os._exit(code)  # handler threads still running must not write another second


def run(options: Options, memo: kopf.Memo, *, client: kube.Kube | None = None,
        stop_flag: threading.Event | None = None, on_lost: Callable[[int], None] = _on_lost_default,
        settings: kopf.OperatorSettings | None = None) -> int:
    """The operator; with ``options.leader_election`` only while holding the Lease."""
    if not options.leader_election:
        operate(options, memo, settings=settings, stop_flag=stop_flag)
        return 0
    stop = stop_flag or threading.Event()
    if threading.current_thread() is threading.main_thread():
        import signal
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    timing = options.timing
    if client is None:  # short, unretried calls: a Lease attempt must fail fast, the next one is near
        client = kube.Kube.from_environment(retries=0)
        client.timeout = (timing.retry_period, timing.retry_period)
    elector = leader.Elector(client, options.lease_namespace or default_namespace(), options.lease_name,
                             options.identity or default_identity(), timing, time.monotonic)

    def attempt() -> bool:
        try:
            return elector.try_acquire_or_renew()
        except kube.ApiError as exc:
            log.warning("leader election: %s", exc)
            return False

    health = StandbyHealth(options.liveness)
    try:
        log.info("waiting to lead (Lease %s/%s, identity %s)", elector.namespace, elector.name, elector.identity)
        while not attempt():
            if stop.wait(timing.retry_period):
                return 0
    finally:
        health.close()

    def renew() -> None:
        # Each attempt is bounded by what is left of the renew deadline (a hung API call must not keep
        # this replica acting past the point where another may take the Lease).
        renewed = time.monotonic()
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lease")
        while not stop.wait(timing.retry_period):
            try:
                ok = worker.submit(attempt).result(timeout=max(0.0, renewed + timing.renew_deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                ok = False
            if ok:
                renewed = time.monotonic()
            elif time.monotonic() - renewed > timing.renew_deadline:
                log.error("lost the Lease %s/%s: stopping at once so that only the new leader acts",
                          elector.namespace, elector.name)
                on_lost(1)
                return

    threading.Thread(target=renew, name="lease-renewal", daemon=True).start()
    operate(options, memo, settings=settings, stop_flag=stop)
    stop.set()
    elector.release()
    return 0
