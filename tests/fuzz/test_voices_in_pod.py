"""The server container with spec.voices, run the way the pod runs it (the emulation of test_fetch_in_pod:
read-only root, uid 10001, no capabilities, only the rendered volumes writable): a registering replica
writes voices to its read-write mount as the pod's user; a serving-only replica starts on a read-only
mount, empty or not, and serves what the other registered."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fetchkit import ROOT, free_port
from test_fetch_in_pod import SETUP, SYSTEM, pytestmark  # noqa: F401 - the same skip conditions


def speech_wav(seconds: float = 4.0, rate: int = 24000) -> bytes:
    import io

    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * 160 * t) * np.clip(np.sin(2 * np.pi * 3 * t), 0, None)
    buf = io.BytesIO()
    sf.write(buf, audio.astype(np.float32), rate, format="WAV")
    return buf.getvalue()

# Volumes mounted read-only are bound like the others but left out of the writable list.
SETUP_RO = SETUP.replace('# The stand-ins go on top', 'for v in $RO_VOLUMES; do mkdir -p "$R${v#*:}"; '
                         'mount --bind "${v%%:*}" "$R${v#*:}"; done\n# The stand-ins go on top')


def rendered_server(registration: bool) -> tuple[dict, dict]:
    from cosyvoice_operator import render
    from cosyvoice_operator.spec import parse_spec

    spec = {"voices": {"pvc": {"claimName": "voices"}, "registration": {"enabled": registration}}}
    pod = render.render(render.Owner("tts", "speech", uid="u"), parse_spec(spec)).get("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


class PodServer:
    def __init__(self, registration: bool, store: Path, tmp: Path) -> None:
        pod, c = rendered_server(registration)
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 10001
        volumes = {v["name"]: v for v in pod["volumes"]}
        rw, ro = [], []
        for m in c["volumeMounts"]:
            if m["name"] == "voices":
                assert "persistentVolumeClaim" in volumes["voices"]
                (ro if m["readOnly"] else rw).append(f"{store}:{m['mountPath']}")
            else:
                assert "emptyDir" in volumes[m["name"]], m
                host = tmp / f"vol-{m['name']}"
                host.mkdir(exist_ok=True)
                host.chmod(0o777)
                rw.append(f"{host}:{m['mountPath']}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        venv = Path(sys.prefix)
        extra = sorted({str(Path(sys.base_prefix)), str(ROOT), str(venv)} - {"/usr", "/usr/local"})
        env = {e["name"]: e["value"] for e in c["env"]} | {"COSYVOICE_PORT": str(self.port), "COSYVOICE_HOST": "127.0.0.1"}
        env |= {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        root = tmp / f"root-{self.port}"
        root.mkdir()
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", SETUP_RO, "setup", str(root),
               "env", "-i", *(f"{k}={v}" for k, v in env.items()), *c["command"]]
        host_env = dict(os.environ) | {"SYSTEM": " ".join(SYSTEM), "EXTRA": " ".join(map(shlex.quote, extra)),
                                       "RUN_UID": str(sc["runAsUser"]), "RUN_GID": str(sc["runAsGroup"]),
                                       "VOLUMES": " ".join(rw), "RO_VOLUMES": " ".join(ro)}
        self.log = (tmp / f"pod-{self.port}.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=host_env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, Path(self.log.name).read_text()
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(Path(self.log.name).read_text())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def test_registering_and_serving_only_replicas_on_the_rendered_mounts(tmp_path):
    store = tmp_path / "voices-pvc"
    store.mkdir()
    store.chmod(0o777)  # a fresh volume the pod's user may write (fsGroup or an export's permissions)
    reader = PodServer(False, store, tmp_path)  # read-only and empty: starts, serves the bundled voices
    try:
        listing = httpx.get(reader.url + "/v1/audio/voices").json()["voices"]
        assert [v for v in listing if v["type"] == "registered"] == []
        assert list(store.iterdir()) == []
    finally:
        reader.stop()
    writer = PodServer(True, store, tmp_path)
    try:
        r = httpx.post(writer.url + "/v1/audio/voices", data={"name": "podcast", "transcript": "Welcome back."},
                       files={"audio": ("c.wav", speech_wav())}, timeout=60)
        assert r.status_code == 201, r.text
        assert {p.stat().st_uid for p in (store / "voices").rglob("*")} == {10001}  # written as the pod's user
    finally:
        writer.stop()
    reader = PodServer(False, store, tmp_path)
    try:
        body = {"model": "tts-1", "input": "Served from a read-only mount.", "voice": "podcast", "response_format": "wav",
                "stream": False}
        assert httpx.post(reader.url + "/v1/audio/speech", json=body, timeout=60).status_code == 200
        r = httpx.delete(reader.url + "/v1/audio/voices/podcast")
        assert r.status_code == 403 and r.json()["error"]["code"] == "voice_registration_disabled"
    finally:
        reader.stop()
