"""`cosyvoice-server fetch` against malicious and broken sources: every failure is one line and a
non-zero exit, nothing is written outside --dest, and nothing is left inside it."""

from __future__ import annotations

import io
import random
import signal
import stat
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from fetchkit import (HTTPFiles, add_bytes, assert_left_nothing, assert_one_line_failure, fetch_cmd, model_tar,
                      run_fetch, storage_env)

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.fetch import MARKER


@pytest.fixture
def http():
    files = HTTPFiles()
    yield files
    files.close()


def _tar(path: Path, build, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        build(tf)
    return path


def _zip(path: Path, build) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        build(zf)
    return path


def _zip_symlink(zf: zipfile.ZipFile) -> None:
    info = zipfile.ZipInfo("model.yaml")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    zf.writestr(info, "/etc/passwd")


class _Zeros(io.RawIOBase):
    """A stream of zeros, so a bomb never sits in the test's memory."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _tar_bomb(tf: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("cosyvoice2-tiny/llm.fp32.onnx")
    info.size = 64 * 2**20
    tf.addfile(info, io.BufferedReader(_Zeros(info.size)))


def _zip_bomb(zf: zipfile.ZipFile) -> None:
    with zf.open("cosyvoice2-tiny/llm.fp32.onnx", "w", force_zip64=True) as out:
        for _ in range(64):
            out.write(bytes(2**20))


MALICIOUS = {
    "tar-dotdot": (lambda p: _tar(p, lambda tf: add_bytes(tf, "../escaped", b"x")), ["'../escaped'", "unsafe path"]),
    "tar-absolute": (lambda p: _tar(p, lambda tf: add_bytes(tf, "/tmp/escaped", b"x")), ["'/tmp/escaped'", "unsafe path"]),
    "tar-symlink": (lambda p: _tar(p, lambda tf: add_bytes(tf, "model.yaml", b"", type=tarfile.SYMTYPE,
                                                           linkname="/etc/passwd")), ["a symlink"]),
    "tar-hardlink": (lambda p: _tar(p, lambda tf: add_bytes(tf, "model.yaml", b"", type=tarfile.LNKTYPE,
                                                            linkname="/etc/passwd")), ["a hard link"]),
    "tar-device": (lambda p: _tar(p, lambda tf: add_bytes(tf, "dev", b"", type=tarfile.CHRTYPE, devmajor=1,
                                                          devminor=3)), ["device or special file"]),
    "tar-fifo": (lambda p: _tar(p, lambda tf: add_bytes(tf, "fifo", b"", type=tarfile.FIFOTYPE)), ["special file"]),
    "tar-duplicate": (lambda p: _tar(p, lambda tf: (add_bytes(tf, "a", b"1"), add_bytes(tf, "a", b"2"))),
                      ["appears twice"]),
    "tar-bomb": (lambda p: _tar(p, _tar_bomb), ["unpacks to more than 16.0 MiB (--max-bytes)"]),
    "tar-many-files": (lambda p: _tar(p, lambda tf: [add_bytes(tf, f"f{i}", b"x") for i in range(50)]),
                       ["more than 40 files (--max-files)"]),
    "zip-dotdot": (lambda p: _zip(p, lambda zf: zf.writestr("../escaped", "x")), ["'../escaped'", "unsafe path"]),
    "zip-absolute": (lambda p: _zip(p, lambda zf: zf.writestr("/tmp/escaped", "x")), ["unsafe path"]),
    "zip-symlink": (lambda p: _zip(p, _zip_symlink), ["a symlink"]),
    "zip-bomb": (lambda p: _zip(p, _zip_bomb), ["unpacks to more than 16.0 MiB (--max-bytes)"]),
    "zip-many-files": (lambda p: _zip(p, lambda zf: [zf.writestr(f"f{i}", "x") for i in range(50)]),
                       ["more than 40 (--max-files)"]),
    "truncated-tgz": (lambda p: p.write_bytes(_tar(p, lambda tf: add_bytes(tf, "a", random.Random(0).randbytes(100_000)))
                                               .read_bytes()[:2000]) and p, ["corrupt or unsupported archive"]),
    "not-an-archive": (lambda p: p.write_bytes(b"<html>not a model</html>") and p, ["not a tar", "or zip archive"]),
    "no-model": (lambda p: _tar(p, lambda tf: add_bytes(tf, "readme.txt", b"hello")), ["no model.yaml"]),
    "two-models": (lambda p: _tar(p, lambda tf: [add_bytes(tf, f"{d}/model.yaml", (BUNDLED_MODEL / "model.yaml").read_bytes())
                                                  for d in ("a", "b")]),
                   ["no model.yaml at the top or in exactly one folder"]),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_or_broken_archive_is_refused_in_one_line(tmp_path, case):
    build, needles = MALICIOUS[case]
    archive = build(tmp_path / ("model.zip" if case.startswith("zip") else "model.tar.gz"))
    dest = tmp_path / "dest"
    before = sorted(p.name for p in tmp_path.iterdir())
    t0 = time.monotonic()
    r = run_fetch(str(archive), dest, "--max-bytes", "16Mi", "--max-files", "40")
    assert_one_line_failure(r, *needles)
    assert time.monotonic() - t0 < 30
    assert_left_nothing(dest)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "dest") == before  # nothing written beside dest
    assert not Path("/tmp/escaped").exists()


def test_http_fetch_verifies_sha256_and_lifts_the_model_into_dest(tmp_path, http):
    digest = model_tar(tmp_path / "m.tgz")
    url = http.add("/models/m.tgz", (tmp_path / "m.tgz").read_bytes())
    dest = tmp_path / "dest"
    r = run_fetch(url + "?X-Amz-Signature=SECRETSIG", dest, "--sha256", digest)
    assert r.returncode == 0, r.stderr
    assert (dest / "model.yaml").is_file() and (dest / "voices").is_dir()
    assert sorted(p.name for p in dest.iterdir() if p.name.startswith(".")) == [MARKER]
    # a rerun in the same pod (init container restarted) finds the verified model in place
    r = run_fetch(url, dest, "--sha256", digest)
    assert r.returncode == 0, r.stderr
    bad = assert_one_line_failure(run_fetch(url + "?X-Amz-Signature=SECRETSIG", tmp_path / "d2", "--sha256", "0" * 64),
                                  "SHA-256 mismatch")
    assert "SECRETSIG" not in bad  # presigned credentials never reach logs
    assert_left_nothing(tmp_path / "d2")
    assert_one_line_failure(run_fetch(http.url + "/missing.tgz", tmp_path / "d3"), "HTTP 404")
    assert_one_line_failure(run_fetch(url, tmp_path / "d4", "--max-bytes", "1Ki"), "(--max-bytes)")
    assert_left_nothing(tmp_path / "d4")


def test_dest_that_holds_other_files_is_not_touched(tmp_path, http):
    model_tar(tmp_path / "m.tgz")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    assert_one_line_failure(run_fetch(str(tmp_path / "m.tgz"), dest), "not empty")
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


def test_a_trickling_server_hits_the_overall_deadline(tmp_path, http):
    url = http.trickle("/slow.tgz")
    t0 = time.monotonic()
    r = run_fetch(url, tmp_path / "dest", "--timeout-s", "2")
    assert_one_line_failure(r, "deadline of 2 s (--timeout-s)")
    assert time.monotonic() - t0 < 10
    assert_left_nothing(tmp_path / "dest")


def test_sigterm_and_sigkill_leave_nothing_behind(tmp_path, http):
    import os

    url = http.trickle("/slow.tgz")
    dest = tmp_path / "dest"
    env = dict(os.environ) | storage_env()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        p = subprocess.Popen(fetch_cmd(url, dest), stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 30
        while not any(dest.glob(".fetch-*/archive")):
            assert time.monotonic() < deadline and p.poll() is None, "fetch never started downloading"
            time.sleep(0.05)
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        if sig == signal.SIGTERM:
            assert p.returncode == 143 and err.strip().splitlines() == [
                "error: stopped by SIGTERM; nothing was left in the destination"], err
            assert_left_nothing(dest)
        else:
            assert any(dest.glob(".fetch-*"))  # SIGKILL cannot be handled: the next run cleans up
    model_tar(tmp_path / "m.tgz")
    r = run_fetch(str(tmp_path / "m.tgz"), dest)
    assert r.returncode == 0, r.stderr
    assert not any(dest.glob(".fetch-*")) and (dest / "model.yaml").is_file()


def test_local_directory_source_refuses_links_out_of_it(tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(BUNDLED_MODEL, src)
    (src / "secret").symlink_to("/etc/hostname")
    assert_one_line_failure(run_fetch(str(src), tmp_path / "dest"), "a symlink pointing outside")
    assert_left_nothing(tmp_path / "dest")
    (src / "secret").unlink()
    r = run_fetch(src.as_uri(), tmp_path / "dest")
    assert r.returncode == 0 and (tmp_path / "dest" / "model.yaml").is_file(), r.stderr
