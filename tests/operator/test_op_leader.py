"""Leader election: two real `cosyvoice-operator run --leader-elect` processes against one emulated API
server. Only the holder of the Lease writes anything; when it stops, the other takes over."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cosyvoice_operator import leader
from cvs_testkit import CVS_PATH, Emulator, eventually
from test_op_kmock import DEPLOYMENTS, NS, create, cvs, live, patch

pytestmark = [pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")]

LEASES = "coordination.k8s.io/v1/leases"
# `cosyvoice-operator run` as the pod runs it, but without kopf's API discovery, which kmock does not serve
# (the same setting cvs_testkit.run_operator uses).
RUN = """
import sys, kopf
from cosyvoice_operator import cli

@kopf.on.startup()
def no_discovery(settings, **_):
    settings.scanning.disabled = True

sys.exit(cli.main(sys.argv[1:]))
"""
WRITES = ("POST", "PATCH", "PUT", "DELETE")


def test_decide_follows_client_go() -> None:
    held = {"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    assert leader.decide(None, "b", 0, 100, 15) == "create"
    assert leader.decide(held, "a", 0, 100, 15) == "renew"
    assert leader.decide(held, "b", observed_at=90, now=100, duration=15) == "wait"  # seen renewed 10 s ago
    assert leader.decide(held, "b", observed_at=80, now=100, duration=15) == "take"  # not renewed for 20 s
    released = {"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}}
    assert leader.decide(released, "b", observed_at=100, now=100, duration=15) == "take"
    with pytest.raises(ValueError):
        leader.Timing(lease_duration=5, renew_deadline=5, retry_period=1)


class Operators:
    """Operator processes, each with its own credentials so that the API server can tell who wrote."""

    def __init__(self, cluster: Any, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, who: str) -> None:
        config = self.tmp / f"kubeconfig-{who}"
        config.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(self.cluster.url).rstrip("/")}}],
            "users": [{"name": who, "user": {"token": f"operator-{who}"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": who}}]}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "POD_"))}
        env["KUBECONFIG"] = str(config)
        log = (self.tmp / f"operator-{who}.log").open("wb")
        self.procs[who] = subprocess.Popen(
            [sys.executable, "-c", RUN, "run", "-n", NS, "--leader-elect", "--identity", who,
             "--lease-namespace", NS, "--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"],
            env=env, stdout=log, stderr=subprocess.STDOUT)

    def writers(self, since: int = 0) -> dict[str, set[str]]:
        """Who wrote what (lease writes apart) among the requests after index ``since``."""
        out: dict[str, set[str]] = {}
        for r in list(self.cluster)[since:]:
            token = r.headers.get("Authorization", "").removeprefix("Bearer operator-")
            if str(r.method).upper().rsplit(".", 1)[-1] in WRITES and token in self.procs \
                    and "/leases" not in r.url.path:
                out.setdefault(token, set()).add(r.url.path)
        return out

    def asked_for_the_lease(self, who: str) -> bool:
        return any(r.headers.get("Authorization") == f"Bearer operator-{who}" and "/leases" in r.url.path
                   for r in list(self.cluster))

    def holder(self) -> str | None:
        key = next((k for k in self.cluster.objects if k[0] == __import__("kmock").resource(LEASES)), None)
        return None if key is None else self.cluster.objects[key].raw["spec"].get("holderIdentity")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def log(self, who: str) -> str:
        return (self.tmp / f"operator-{who}.log").read_text(errors="replace")


@pytest.fixture
def operators(cluster: Any, tmp_path: Path) -> Iterator[Operators]:
    ops = Operators(cluster, tmp_path)
    yield ops
    ops.stop()


async def test_two_replicas_never_both_act_and_the_standby_takes_over(cluster: Any, operators: Operators) -> None:
    operators.start("a")
    operators.start("b")
    first = await eventually(lambda: operators.holder(), timeout=60, interval=0.2)
    standby = "b" if first == "a" else "a"
    await eventually(lambda: operators.asked_for_the_lease(standby), timeout=60, interval=0.2)
    await create(cluster, cvs(replicas=1))
    await eventually(lambda: live(cluster, DEPLOYMENTS) is not None, timeout=60)
    await patch(cluster, CVS_PATH.format(ns=NS) + "/tts/scale", {"spec": {"replicas": 2}})
    await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 2, timeout=30)
    assert set(operators.writers()) == {first}, operators.writers()

    # The leader stops (a rolling update, a node drain): it finishes its work, releases the Lease, and
    # only then does the standby act.
    operators.procs[first].send_signal(signal.SIGTERM)
    code = await asyncio.get_running_loop().run_in_executor(None, operators.procs[first].wait, 30)
    assert code == 0, operators.log(first)
    await eventually(lambda: operators.holder() == standby, timeout=30, interval=0.2)
    released = max(i for i, r in enumerate(list(cluster)) if "/leases" in r.url.path
                   and r.headers.get("Authorization") == f"Bearer operator-{first}")
    await patch(cluster, CVS_PATH.format(ns=NS) + "/tts/scale", {"spec": {"replicas": 3}})
    await eventually(lambda: live(cluster, DEPLOYMENTS)["spec"]["replicas"] == 3, timeout=30)
    assert set(operators.writers(released)) == {standby}, operators.writers(released)
    assert operators.procs[standby].poll() is None, operators.log(standby)
    # the Lease calls are the ones the chart's Role in the operator's namespace grants
    from cosyvoice_operator import permissions
    verbs = {str(r.method).upper().rsplit(".", 1)[-1] for r in list(cluster) if "/leases" in r.url.path
             and r.headers.get("Authorization", "").startswith("Bearer operator-")}
    granted = permissions.granted("coordination.k8s.io", "leases")
    assert {{"GET": "get", "POST": "create", "PATCH": "patch"}[v] for v in verbs} <= granted, verbs


def test_a_standby_answers_the_liveness_probe() -> None:
    """Waiting for the Lease is healthy: the kubelet must not restart a standby."""
    import socket
    import urllib.request

    from cosyvoice_operator import runtime

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    health = runtime.StandbyHealth(f"http://127.0.0.1:{port}/healthz")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        health.close()


def test_a_leader_that_cannot_renew_stops_before_its_lease_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server stops answering the leader: it gives up acting within the renew deadline, while the
    Lease it last wrote is still valid for everyone else (a hung call does not extend that)."""
    import threading
    import time

    import kopf
    from cosyvoice_operator import runtime

    stopped = threading.Event()

    class Api:  # takes the Lease, then hangs on every call
        calls = 0

        def get(self, *args: Any) -> Any:
            self.calls += 1
            if self.calls > 1 and not stopped.is_set():
                stopped.wait(30)
            return None

        def create(self, res: Any, body: Any) -> Any:
            return body

    monkeypatch.setattr(runtime, "operate", lambda *args, **kwargs: stopped.wait(30))
    started, lost = time.monotonic(), []

    def on_lost(code: int) -> None:
        lost.append((code, time.monotonic() - started))
        stopped.set()

    timing = leader.Timing(lease_duration=3, renew_deadline=1.5, retry_period=0.3)
    runtime.run(runtime.Options(leader_election=True, lease_namespace="ns", identity="a", timing=timing),
                kopf.Memo(), client=Api(), on_lost=on_lost)  # type: ignore[arg-type]
    (code, after), = lost
    assert code == 1 and after < timing.lease_duration
