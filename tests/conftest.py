"""Shared test helpers: a real `cosyvoice-server serve` process on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Runs the console script as users and the operator's pods do, and waits for /readyz."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"server-{self.port}.log"
        cmd = [sys.executable, "-m", "cosyvoice_server.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", *args]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("COSYVOICE_")} | (env or {})
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def wait_ready(self, timeout: float = 60) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_server(tmp_path):
    """Starts servers with extra flags/env; all are stopped at the end of the test."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> ServerProcess:
        s = ServerProcess(tmp_path, *args, env=env)
        started.append(s)
        return s.wait_ready() if ready else s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server with default settings, shared by the read-only API tests."""
    s = ServerProcess(tmp_path_factory.mktemp("server")).wait_ready()
    yield s
    s.stop()


# The miniature CosyVoice2 checkpoint (upstream's classes, random weights), its conversion and upstream's
# reference models: built once per session for tests/convert and tests/bistream. Each skips the test
# without the `convert` extra and upstream's code.
GREEDY = {"top_k": 1, "top_p": 0.8, "win_size": 10, "tau_r": 100.0}  # tau_r > 1: never the RAS fallback


def _need_upstream() -> None:
    for module in ("torch", "hyperpyyaml", "cosyvoice"):
        pytest.importorskip(module)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    _need_upstream()
    from cosyvoice_server.convert.miniature import build

    return build(tmp_path_factory.mktemp("ckpt") / "CosyVoice2-mini", "mini", seed=0)


@pytest.fixture(scope="session")
def converted(checkpoint, tmp_path_factory) -> Path:
    """The converted model (fp32 and fp16), with greedy decoding so runs are comparable token for token."""
    import yaml

    from cosyvoice_server.convert.convert import convert

    out = convert(checkpoint, tmp_path_factory.mktemp("models") / "cosyvoice2-mini", ["fp32", "fp16"])
    m = yaml.safe_load((out / "model.yaml").read_text())
    m["llm"]["sampling"] = GREEDY
    (out / "model.yaml").write_text(yaml.safe_dump(m, sort_keys=False))
    return out


@pytest.fixture(scope="session")
def reference(checkpoint):
    sys.path.insert(0, str(ROOT / "tests" / "convert"))
    from reference import Reference

    return Reference.load(checkpoint)


@pytest.fixture(scope="session")
def server_process() -> type[ServerProcess]:
    """The class, for fixtures that keep servers for a module or share a store between them."""
    return ServerProcess
