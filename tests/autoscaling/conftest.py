"""Fixtures for the autoscaler's tests: the operator tests' kmock cluster, and a real Prometheus."""
from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
sys.path.insert(0, str(OPERATOR_TESTS))  # cvs_testkit, cvs_crdschema

_spec = importlib.util.spec_from_file_location("operator_tests_conftest", OPERATOR_TESTS / "conftest.py")
assert _spec and _spec.loader
_operator_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_operator_conftest)
cluster = _operator_conftest.cluster  # the emulated API server with a kubeconfig pointing at it
crd = _operator_conftest.crd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusProcess:
    """Debian's prometheus binary on 127.0.0.1 with a throwaway TSDB, scraping ``targets`` every second."""

    def __init__(self, tmp: Path, targets: list[str], labels: dict[str, str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("prometheus is not installed (make system-deps, or apt-get install prometheus)")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "cosyvoice", "metrics_path": "/metrics",
                                "static_configs": [{"targets": targets, "labels": labels}]}],
        }))
        self.log_path = tmp / "prometheus.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30) -> PrometheusProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready: {self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def start_prometheus(tmp_path: Path) -> Iterator[object]:
    started: list[PrometheusProcess] = []

    def start(targets: list[str], labels: dict[str, str]) -> PrometheusProcess:
        p = PrometheusProcess(tmp_path, targets, labels)
        started.append(p)
        return p.wait_ready()

    yield start
    for p in started:
        p.stop()


class Exporter:
    """A /metrics endpoint with gauges the test sets (prometheus-client on 127.0.0.1): a load the test
    controls exactly, scraped by the real Prometheus."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = CollectorRegistry()
        self.demand = Gauge("test_demand_qps", "requests/s the test pretends to receive", registry=self.registry)
        self.requests = Counter("test_requests", "requests the test pretends were served", registry=self.registry)
        self.port = _free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.target = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.stop()
