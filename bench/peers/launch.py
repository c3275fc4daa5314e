"""Starts a peer server (LitServe or PyTriton) as a subprocess with the right interpreter, and stops it.

    peer = PeerServer()
    try:
        url = peer.start("pytriton", max_batch_size=16, delay_ms=5, model_dir=BUNDLED_MODEL)
        ...
    except PeerUnavailable as exc:
        report[...] = str(exc)   # the peer cannot run here; the reason is the server's own error text
    finally:
        peer.stop()

Kept free of heavy imports: the PyTriton server imports the scratch helpers from here, in its own venv.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".bench-venvs"
KINDS = ("litserve", "pytriton")
# PyTriton / Triton's Python backend write these whatever TMPDIR says ("pytrtion" is their spelling).
PYTRITON_SCRATCH = ("/tmp/folder*", "/tmp/python_env_*", "/dev/shm/pytrtion*")


class PeerUnavailable(RuntimeError):
    """The peer cannot run on this machine; str() is the reason, for the report."""


def scratch_snapshot() -> set[str]:
    return {p for pattern in PYTRITON_SCRATCH for p in glob.glob(pattern)}


def remove_new_scratch(before: set[str]) -> None:
    for p in scratch_snapshot() - before:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interpreter(kind: str) -> str:
    """LitServe runs beside our server when it installed there (setup.sh checks), else in its own venv;
    PyTriton always in its own (it downgrades numpy and protobuf)."""
    if kind == "litserve" and importlib.util.find_spec("litserve") is not None:
        return sys.executable
    python = VENVS / kind / "bin" / "python"
    if not python.exists():
        raise PeerUnavailable(f"{kind} is not installed ({python} missing): run bench/peers/setup.sh")
    return str(python)


def _error_text(log: str) -> str:
    """What went wrong, in the server's words: every distinct Python exception line (a worker's cause comes
    before its parent's "failed to start"), else Triton's last error line, else the last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    exc = re.compile(r"^[\w.]+(Error|Exception|Exit|Interrupt)(:|$)")
    found = list(dict.fromkeys(ln for ln in lines if exc.match(ln)))
    if found:
        return " | ".join(found)
    triton = [ln for ln in lines if re.match(r"^E\d{4} ", ln)]
    return (triton or lines or ["(no output)"])[-1]


class PeerServer:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.kind = ""
        self.url = ""
        self._logdir = ""
        self._scratch: set[str] = set()

    def start(self, kind: str, max_batch_size: int, delay_ms: float, model_dir: Path | str,
              ready_timeout_s: float = 240.0) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown peer {kind!r}; one of {', '.join(KINDS)}")
        if self.proc is not None:
            raise RuntimeError("PeerServer already running; stop() it first")
        python = interpreter(kind)
        port = free_port()
        self.kind, self.url = kind, f"http://127.0.0.1:{port}"
        delay_flag = "--batch-timeout-ms" if kind == "litserve" else "--max-queue-delay-ms"
        cmd = [python, "-m", f"bench.peers.{kind}_server", "--port", str(port), "--max-batch-size", str(max_batch_size),
               delay_flag, str(delay_ms), "--model-dir", str(model_dir)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self._logdir = tempfile.mkdtemp(prefix=f"peer-{kind}-")
        self._scratch = scratch_snapshot() if kind == "pytriton" else set()
        with open(Path(self._logdir) / "server.log", "wb") as log:
            # Own session: stop() can end the whole tree (tritonserver, backend stub, LitServe workers).
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        ready = "/health" if kind == "litserve" else "/v2/models/tts/ready"
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if self._ready(self.url + ready):
                return self.url
            if self.proc.poll() is not None:
                reason = f"{kind} server exited with code {self.proc.returncode}: {_error_text(self.log())}"
                self.stop()
                raise PeerUnavailable(reason)
            if time.monotonic() > deadline:
                reason = f"{kind} server not ready after {ready_timeout_s:.0f} s: {_error_text(self.log())}"
                self.stop()
                raise PeerUnavailable(reason)
            time.sleep(0.25)

    @staticmethod
    def _ready(url: str) -> bool:
        import httpx

        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        """The server's stdout and stderr so far."""
        try:
            return (Path(self._logdir) / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout_s: float = 45.0) -> None:
        """SIGINT (each server's own clean shutdown; PyTriton's takes ~30 s), then SIGKILL the process group."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers: workers, tritonserver, stubs
            except ProcessLookupError:
                pass
            self.proc.wait(10)
            self.proc = None
        if self.kind == "pytriton":
            remove_new_scratch(self._scratch)
        if self._logdir:
            shutil.rmtree(self._logdir, ignore_errors=True)
            self._logdir = ""

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
