"""The node-local model cache (`cosyvoice-server fetch --cache-dir`): filled once, then served from the node;
a damaged entry is fetched again; two pods filling at once download once; eviction spares entries in use."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fetchkit import HTTPFiles, model_tar

from cosyvoice_server.model_cache import (
    FILES, MODEL, Entry, choose_evictions, entry_name, evict, hold_in_use,
)
from cosyvoice_server.startup import parse_lines

DAY = 86400.0


def test_entry_names_are_digests_only():
    assert entry_name("AB" * 32) == "sha256-" + "ab" * 32
    for bad in ("ab" * 31, "../" + "a" * 61, "g" * 64, "a" * 63 + "/"):
        with pytest.raises(ValueError):
            entry_name(bad)


def test_eviction_takes_least_recently_used_first_and_spares_busy_and_recent_entries():
    now = 10 * DAY
    entries = [Entry("old", 40, now - 3 * DAY, False), Entry("older-but-busy", 40, now - 5 * DAY, True),
               Entry("middle", 40, now - 2 * DAY, False), Entry("fresh", 40, now - 60, False)]
    assert choose_evictions(entries, 200, now, 600) == []  # fits
    assert choose_evictions(entries, 120, now, 600) == ["old"]
    assert choose_evictions(entries, 80, now, 600) == ["old", "middle"]
    # busy and recently used entries stay even when the cache is still over the cap
    assert choose_evictions(entries, 0, now, 600) == ["old", "middle"]
    assert choose_evictions(entries, 0, now, 0) == ["old", "middle", "fresh"]


class Served:
    """A model archive on a local HTTP server that counts its downloads."""

    def __init__(self, tmp_path, name="m.tgz", arcname="cosyvoice2-tiny"):
        self.digest = model_tar(tmp_path / name, arcname)
        self.data = (tmp_path / name).read_bytes()
        self.gets = 0
        self.http = HTTPFiles()

        def send(req):
            self.gets += 1
            req.send_response(200)
            req.send_header("Content-Length", str(len(self.data)))
            req.end_headers()
            req.wfile.write(self.data)
        self.url = self.http.add(f"/{name}", send)


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.http.close()


def cached_fetch(uri: str, digest: str, cache, *args: str) -> list[str]:
    return [sys.executable, "-m", "cosyvoice_server.cli", "fetch", "--uri", uri, "--sha256", digest,
            "--cache-dir", str(cache), *args]


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def test_filled_once_then_a_hit_then_a_damaged_entry_is_fetched_again(tmp_path, served):
    cache = tmp_path / "cache"
    first = run(cached_fetch(served.url, served.digest, cache))
    model = cache / entry_name(served.digest) / MODEL
    assert first.stdout.strip().splitlines()[-1] == str(model)
    assert {"download", "unpack", "cache_fill"} <= set(parse_lines(first.stdout)) and served.gets == 1
    assert (model / "model.yaml").is_file()
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [entry_name(served.digest)]

    hit = run(cached_fetch(served.url, served.digest, cache))
    assert set(parse_lines(hit.stdout)) == {"cache_verify"} and served.gets == 1  # nothing downloaded

    # same size, other content: only the digests can tell
    onnx = next(model.glob("*.onnx"))
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    again = run(cached_fetch(served.url, served.digest, cache))
    assert "damaged" in again.stdout and "content changed" in again.stdout and served.gets == 2
    assert onnx.read_bytes() != bytes(data)

    (model / "model.yaml").unlink()  # a missing file
    run(cached_fetch(served.url, served.digest, cache))
    assert (model / "model.yaml").is_file() and served.gets == 3
    assert not any(p.name.startswith((".fill-", ".evict-")) for p in cache.iterdir())


def test_a_wrong_digest_leaves_no_entry(tmp_path, served):
    cache = tmp_path / "cache"
    r = subprocess.run(cached_fetch(served.url, "0" * 64, cache), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "SHA-256 mismatch" in r.stderr.strip().splitlines()[-1]
    assert [p for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_two_pods_filling_at_once_download_once(tmp_path, served):
    cache = tmp_path / "cache"
    procs = [subprocess.Popen(cached_fetch(served.url, served.digest, cache), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert served.gets == 1
    assert len({out.strip().splitlines()[-1] for out, _ in outs}) == 1
    phases = [set(parse_lines(out)) for out, _ in outs]
    assert sorted("cache_fill" in p for p in phases) == [False, False, True]  # the others waited, then checked


def test_eviction_spares_the_model_a_server_holds(tmp_path):
    cache = tmp_path / "cache"
    a, b = Served(tmp_path, "a.tgz", "a"), Served(tmp_path, "b.tar", "b")
    try:
        run(cached_fetch(a.url, a.digest, cache))
        size = sum(p.stat().st_size for p in (cache / entry_name(a.digest)).rglob("*") if p.is_file())
        held = hold_in_use(cache / entry_name(a.digest) / MODEL)  # a server using a
        assert held is not None
        # room for one entry, nothing recent spared: b's fill would evict a, but a is in use
        run(cached_fetch(b.url, b.digest, cache, "--cache-max-bytes", str(size + 1024), "--cache-min-idle-s", "0"))
        assert (cache / entry_name(a.digest) / FILES).is_file() and (cache / entry_name(b.digest)).is_dir()
        os.close(held)  # the server exits
        assert evict(cache, size + 1024, 0) == [entry_name(a.digest)]
        assert not (cache / entry_name(a.digest)).exists()
        assert json.loads((cache / entry_name(b.digest) / FILES).read_text())
    finally:
        a.http.close()
        b.http.close()


def test_a_plain_tar_ending_in_an_npz_is_a_tar(tmp_path):
    """Weights barely compress, so an uncompressed tar is a sensible archive; its last member, a voice's .npz,
    makes it look like a zip to zipfile.is_zipfile."""
    digest = model_tar(tmp_path / "m.tar", mode="w")
    r = subprocess.run([sys.executable, "-m", "cosyvoice_server.cli", "fetch", "--uri", str(tmp_path / "m.tar"),
                        "--sha256", digest, "--dest", str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d" / "model.yaml").is_file()


def test_cache_needs_a_digest_and_excludes_dest(tmp_path):
    base = [sys.executable, "-m", "cosyvoice_server.cli", "fetch", "--uri", "http://127.0.0.1:9/m.tgz"]
    for extra, needle in ((["--cache-dir", str(tmp_path)], "needs --sha256"),
                          (["--cache-dir", str(tmp_path), "--dest", str(tmp_path / "d"), "--sha256", "a" * 64],
                           "exactly one of --dest or --cache-dir")):
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr
