"""Helpers for the fetch tests: run `cosyvoice-server fetch` as a process, build archives, serve them."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cosyvoice_server.config import BUNDLED_MODEL

ROOT = Path(__file__).resolve().parents[2]
STORAGE_LIBS = Path(sys.prefix) / "storage-libs"  # `make install-test` puts boto3, moto, GCS there


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def storage_env() -> dict[str, str]:
    return {"PYTHONPATH": str(STORAGE_LIBS)} if STORAGE_LIBS.is_dir() else {}


def fetch_cmd(uri: str, dest: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "cosyvoice_server.cli", "fetch", "--uri", uri, "--dest", str(dest), *args]


def run_fetch(uri: str, dest: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "STORAGE_EMULATOR"))}
    full |= storage_env() | {"AWS_EC2_METADATA_DISABLED": "true"} | (env or {})
    return subprocess.run(fetch_cmd(uri, dest, *args), capture_output=True, text=True, timeout=timeout, env=full)


def assert_one_line_failure(r: subprocess.CompletedProcess, *needles: str, code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def assert_left_nothing(dest: Path) -> None:
    assert not dest.exists() or list(dest.iterdir()) == [], sorted(p.name for p in dest.iterdir())


def model_tar(path: Path, arcname: str = "cosyvoice2-tiny", mode: str = "w:gz") -> str:
    """The bundled tiny model as an archive; returns its SHA-256."""
    with tarfile.open(path, mode) as tf:
        tf.add(BUNDLED_MODEL, arcname=arcname)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def add_bytes(tf: tarfile.TarFile, name: str, data: bytes, **attrs) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(data))


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        route = self.server.routes.get(self.path.split("?")[0])
        if route is None:
            self.send_error(404)
            return
        route(self)


class HTTPFiles:
    """A local HTTP server; `routes` maps a path to a handler(request) or to bytes to serve."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.routes = {}
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.stop_event = threading.Event()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, path: str, content) -> str:
        if isinstance(content, bytes):
            def send(req, data=content):
                req.send_response(200)
                req.send_header("Content-Length", str(len(data)))
                req.end_headers()
                req.wfile.write(data)
            content = send
        self.httpd.routes[path] = content
        return self.url + path

    def trickle(self, path: str, size: int = 10**7, every_s: float = 0.1) -> str:
        """Promises `size` bytes, then sends one byte per `every_s` until stopped."""
        def send(req):
            req.send_response(200)
            req.send_header("Content-Length", str(size))
            req.end_headers()
            try:
                while not self.stop_event.is_set():
                    req.wfile.write(b"\0")
                    req.wfile.flush()
                    time.sleep(every_s)
            except OSError:
                pass
        return self.add(path, send)

    def close(self) -> None:
        self.stop_event.set()
        self.httpd.shutdown()
        self.httpd.server_close()
