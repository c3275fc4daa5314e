"""s3:// and gs:// through the real clients the image carries (boto3, google-cloud-storage), against
local stand-ins: moto's S3 server and gcp-storage-emulator, both on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from fetchkit import (STORAGE_LIBS, assert_left_nothing, assert_one_line_failure, free_port, model_tar, run_fetch,
                      storage_env)

pytestmark = pytest.mark.skipif(not STORAGE_LIBS.is_dir(), reason="`make install-test` installs the storage clients")


def _start(args: list[str], url: str, tmp_path) -> subprocess.Popen:
    log = (tmp_path / "store.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))} | storage_env()
    p = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while True:
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "store.log").read_text()
        try:
            httpx.get(url, timeout=1)
            return p
        except httpx.HTTPError:
            time.sleep(0.1)


@pytest.fixture
def s3(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = _start(["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], url, tmp_path)
    yield url
    p.terminate()
    p.wait(10)


@pytest.fixture
def gcs(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = _start(["-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
               url, tmp_path)
    yield url
    p.terminate()
    p.wait(10)


def test_s3_with_credentials_from_the_environment(tmp_path, s3):
    digest = model_tar(tmp_path / "m.tgz")
    # moto's server takes unsigned requests: the test uploads with plain HTTP, fetch downloads with boto3
    assert httpx.put(f"{s3}/models").status_code == 200
    assert httpx.put(f"{s3}/models/cv2/m.tgz", content=(tmp_path / "m.tgz").read_bytes()).status_code == 200
    creds = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
             "AWS_DEFAULT_REGION": "us-east-1"}
    dest = tmp_path / "dest"
    r = run_fetch("s3://models/cv2/m.tgz", dest, "--sha256", digest, env=creds)
    assert r.returncode == 0, r.stderr
    assert (dest / "model.yaml").is_file()
    assert_one_line_failure(run_fetch("s3://models/cv2/missing.tgz", tmp_path / "d2", env=creds), "S3 NoSuchKey")
    assert_one_line_failure(run_fetch("s3://models/cv2/m.tgz", tmp_path / "d3", "--max-bytes", "1Ki", env=creds),
                            "(--max-bytes)")
    no_creds = {"AWS_ENDPOINT_URL": s3, "AWS_DEFAULT_REGION": "us-east-1"}
    assert_one_line_failure(run_fetch("s3://models/cv2/m.tgz", tmp_path / "d4", env=no_creds), "no AWS credentials")
    for d in ("d2", "d3", "d4"):
        assert_left_nothing(tmp_path / d)


def test_gs_through_the_storage_emulator(tmp_path, gcs):
    digest = model_tar(tmp_path / "m.tgz")
    assert httpx.post(f"{gcs}/storage/v1/b", params={"project": "test"}, json={"name": "models"}).status_code == 200
    up = httpx.post(f"{gcs}/upload/storage/v1/b/models/o", params={"uploadType": "media", "name": "cv2/m.tgz"},
                    content=(tmp_path / "m.tgz").read_bytes())
    assert up.status_code == 200, up.text
    env = {"STORAGE_EMULATOR_HOST": gcs, "GOOGLE_CLOUD_PROJECT": "test"}
    dest = tmp_path / "dest"
    r = run_fetch("gs://models/cv2/m.tgz", dest, "--sha256", digest, env=env)
    assert r.returncode == 0, r.stderr
    assert (dest / "model.yaml").is_file()
    assert_one_line_failure(run_fetch("gs://models/cv2/missing.tgz", tmp_path / "d2", env=env), "GCS: no such object")
    assert_left_nothing(tmp_path / "d2")


def test_the_crd_accepts_exactly_the_schemes_fetch_reads():
    import re

    from cosyvoice_operator.spec import STORAGE_URI_RE

    from cosyvoice_server.fetch import SCHEMES

    accepted = {s for s in ("file", "http", "https", "s3", "gs", "ftp", "hdfs", "azure", "oci", "pvc")
                if re.match(STORAGE_URI_RE, f"{s}://bucket/model.tgz")}
    assert accepted == set(SCHEMES)
