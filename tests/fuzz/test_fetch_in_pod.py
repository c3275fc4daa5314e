"""The operator's fetch init container, run the way the pod runs it.

kmock cannot show a pod's filesystem, so this test builds it: a private mount namespace whose root is
read-only everywhere except the volumes the rendered container mounts (emptyDirs: fresh 0777
folders, as the kubelet makes them), then runs the rendered command under the rendered uid/gid with
every capability dropped and no_new_privs (setpriv), and the rendered env plus the image's PATH.
The interpreter and the checkout stand in for the image's /opt/venv: they are bound read-only at
the same paths. Needs root (for the namespace and the mounts); skipped elsewhere.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fetchkit import ROOT, HTTPFiles, model_tar

from cosyvoice_server.fetch import MARKER

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
    reason="emulating the pod needs root, unshare and setpriv (util-linux)")

# Top-level folders of the host that the "image" consists of; everything is bound read-only.
SYSTEM = ("usr", "etc", "opt", "var", "bin", "sbin", "lib", "lib64")

SETUP = r"""
set -eu
R="$1"; shift
mount -t tmpfs -o mode=755 pod-root "$R"
for d in $SYSTEM; do
  if [ -L "/$d" ]; then cp -P "/$d" "$R/$d"
  elif [ -d "/$d" ]; then mkdir -p "$R/$d"; mount --rbind "/$d" "$R/$d"; fi
done
mkdir -p "$R/dev" "$R/proc"; mount --rbind /dev "$R/dev"; mount -t proc proc "$R/proc"
RW=""
for v in $VOLUMES; do mkdir -p "$R${v#*:}"; mount --bind "${v%%:*}" "$R${v#*:}"; RW="$RW $R${v#*:}"; done
# The stand-ins go on top of the volumes: a checkout under /tmp must not be hidden by the /tmp volume.
for d in $EXTRA; do mkdir -p "$R$d"; mount --rbind "$d" "$R$d"; done
# read-only root: every mount but the volumes, the tmpfs skeleton included
for m in $(findmnt -rn -o TARGET -R "$R" | sort -u); do
  case "$m" in "$R/proc"*|"$R/dev"*) continue ;; esac
  case " $RW " in *" $m "*) ;; *) mount -o remount,bind,ro "$m" ;; esac
done
exec chroot "$R" setpriv --reuid "$RUN_UID" --regid "$RUN_GID" --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all -- "$@"
"""


def rendered_fetch_pod(uri: str, sha256: str | None, cache: dict | None = None) -> tuple[dict, dict]:
    from cosyvoice_operator import render
    from cosyvoice_operator.spec import parse_spec

    storage = {"storageUri": uri} | ({"sha256": sha256} if sha256 else {}) | ({"cache": cache} if cache is not None else {})
    objs = render.render(render.Owner(name="tts", namespace="speech", uid="u"), parse_spec({"storage": storage}))
    pod = objs.get("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["initContainers"]
    return pod, container


def run_like_the_pod(uri: str, sha256: str | None, tmp_path: Path,
                     node_cache: Path | None = None) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """`node_cache`: the node's directory behind the rendered hostPath cache volume (kept between pods)."""
    pod, c = rendered_fetch_pod(uri, sha256, None if node_cache is None else {})
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    volumes_arg, dirs = [], {}
    for m in c["volumeMounts"]:
        if "hostPath" in volumes[m["name"]]:
            assert volumes[m["name"]]["hostPath"]["type"] == "Directory" and node_cache is not None
            host = node_cache  # prepared on the node, owned by the pods' user (docs/operations.md)
        else:
            assert "emptyDir" in volumes[m["name"]], m  # what the kubelet makes: an empty, world-writable folder
            host = tmp_path / f"vol-{m['name']}"
            host.mkdir()
            host.chmod(0o777)
        dirs[m["mountPath"]] = host
        volumes_arg.append(f"{host}:{m['mountPath']}")
    venv = Path(sys.prefix)
    extra = sorted({str(Path(sys.base_prefix)), str(ROOT), str(venv)} - {"/usr", "/usr/local"})
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    env |= {"PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}  # the image's ENV
    root = tmp_path / "pod-root"
    root.mkdir()
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", SETUP, "setup", str(root),
           "env", "-i", *(f"{k}={v}" for k, v in env.items()), *c["command"]]
    host_env = dict(os.environ) | {"SYSTEM": " ".join(SYSTEM), "EXTRA": " ".join(map(shlex.quote, extra)),
                                   "RUN_UID": str(sc["runAsUser"]), "RUN_GID": str(sc["runAsGroup"]),
                                   "VOLUMES": " ".join(volumes_arg)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=host_env), dirs


def test_fetch_init_container_works_on_a_read_only_root_as_non_root(tmp_path):
    digest = model_tar(tmp_path / "m.tgz")
    http = HTTPFiles()
    try:
        url = http.add("/cv2/m.tgz", (tmp_path / "m.tgz").read_bytes())
        r, dirs = run_like_the_pod(url, digest, tmp_path)
        assert r.returncode == 0, r.stderr
        model = dirs["/models"]
        assert (model / "model.yaml").is_file() and (model / MARKER).is_file()
        assert not any(model.glob(".fetch-*"))
        assert {p.stat().st_uid for p in model.rglob("*")} == {10001}  # written by the pod's user, nobody else
        # nothing needed the scratch volume either (root-owned folders there are the stand-ins' mount points)
        assert all(p.is_dir() and p.stat().st_uid == 0 for p in dirs["/tmp"].rglob("*"))

        (tmp_path / "again").mkdir()
        bad, dirs = run_like_the_pod(url, "0" * 64, tmp_path / "again")
        assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error: ")
        assert "SHA-256 mismatch" in bad.stderr and "Traceback" not in bad.stderr
        assert list(dirs["/models"].iterdir()) == []
    finally:
        http.close()


def test_the_emulated_root_really_is_read_only(tmp_path):
    """Guards the emulation itself: outside the volumes, the pod's user can write nothing."""
    pod, c = rendered_fetch_pod("https://h/m.tgz", None)
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o777)  # writable for uid 10001 on the host: only the read-only bind can stop it
    c["command"] = ["sh", "-c", f"touch {probe}/x /x 2>&1; touch /models/ok /tmp/ok && echo volumes-writable"]
    from unittest import mock

    with mock.patch(f"{__name__}.rendered_fetch_pod", return_value=(pod, c)):
        r, dirs = run_like_the_pod("https://h/m.tgz", None, tmp_path)
    assert "Read-only file system" in r.stdout and "volumes-writable" in r.stdout, (r.stdout, r.stderr)
    assert not (probe / "x").exists()


def test_node_cache_filled_by_the_first_pod_and_used_read_only_by_the_next(tmp_path):
    from cosyvoice_operator.constants import MODEL_CACHE_ENTRY

    from cosyvoice_server.model_cache import MODEL, entry_name

    digest = model_tar(tmp_path / "m.tgz")
    node = tmp_path / "node-cache"
    node.mkdir()
    os.chown(node, 10001, 10001)
    gets = []
    http = HTTPFiles()
    try:
        data = (tmp_path / "m.tgz").read_bytes()

        def send(req):
            gets.append(1)
            req.send_response(200)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        url = http.add("/cv2/m.tgz", send)
        for pod in ("first", "second"):
            (tmp_path / pod).mkdir()
            r, _ = run_like_the_pod(url, digest, tmp_path / pod, node_cache=node)
            assert r.returncode == 0, r.stderr
        assert len(gets) == 1  # the second pod downloaded nothing
        assert "cache_verify" in r.stdout
        # the server container's read-only subPath is the entry fetch filled and checked
        pod_spec, _ = rendered_fetch_pod(url, digest, {})
        (mount,) = [m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "model-cache"]
        assert mount["readOnly"] and mount["subPath"] == MODEL_CACHE_ENTRY.format(digest=digest)
        assert mount["subPath"] == f"{entry_name(digest)}/{MODEL}"
        assert (node / mount["subPath"] / "model.yaml").is_file()
        assert {p.stat().st_uid for p in node.rglob("*")} == {10001}
    finally:
        http.close()


def test_a_server_holds_its_model_in_use_through_a_read_only_mount(tmp_path):
    """The server mounts the cache entry read-only; its shared lock must still reach the fetch step's eviction."""
    entry, view = tmp_path / "entry", tmp_path / "view"
    entry.mkdir()
    view.mkdir()
    (entry / MARKER).write_text("x")
    probe = ("from pathlib import Path; from cosyvoice_server.model_cache import hold_in_use, _in_use; "
             f"fd = hold_in_use(Path('{view}')); print(fd is not None, _in_use(Path('{entry}')))")
    script = (f"mount --bind {entry} {view} && mount -o remount,bind,ro {view} && "
              f"! touch {view}/w 2>/dev/null && {shlex.quote(sys.executable)} -c {shlex.quote(probe)}")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "inference_image")))
    assert r.stdout.split() == ["True", "True"], (r.stdout, r.stderr)
