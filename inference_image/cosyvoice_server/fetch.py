"""`cosyvoice-server fetch`: puts a model directory in place before the server starts.

The operator runs it in an init container for `storageUri`. Sources: a local path or file:// URI
(a directory or an archive), http(s):// (an archive), s3:// and gs:// (an archive; needs boto3 or
google-cloud-storage in the image). Archives (.tar, .tar.gz, .tgz, .zip) are unpacked safely; an
optional SHA-256 is checked before unpacking; the result must hold a valid model.yaml.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from .model.manifest import ModelLoadError, load_manifest


class FetchError(Exception):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(uri: str, to: Path) -> None:
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(uri, timeout=60) as resp, to.open("wb") as out:
                shutil.copyfileobj(resp, out, 1 << 20)
        except OSError as exc:
            raise FetchError(f"{uri}: download failed: {exc}") from exc
    elif scheme == "s3":
        try:
            import boto3
        except ImportError:
            raise FetchError("s3:// needs boto3 in the image (pip install boto3)") from None
        u = urllib.parse.urlparse(uri)
        boto3.client("s3").download_file(u.netloc, u.path.lstrip("/"), str(to))
    elif scheme == "gs":
        try:
            from google.cloud import storage
        except ImportError:
            raise FetchError("gs:// needs google-cloud-storage in the image (pip install google-cloud-storage)") from None
        u = urllib.parse.urlparse(uri)
        storage.Client().bucket(u.netloc).blob(u.path.lstrip("/")).download_to_filename(str(to))
    else:
        raise FetchError(f"{uri}: unsupported scheme '{scheme}' (use a path, file://, http(s)://, s3:// or gs://)")


def _unpack(archive: Path, dest: Path) -> None:
    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = (dest / member).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise FetchError(f"{archive}: member {member!r} would be written outside {dest}")
            zf.extractall(dest)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")  # refuses absolute paths, '..' and device files
    else:
        raise FetchError(f"{archive}: not a .tar, .tar.gz, .tgz or .zip archive")


def _model_root(dest: Path) -> Path:
    """The archive may hold the model files at its top or inside one folder."""
    if (dest / "model.yaml").is_file():
        return dest
    found = sorted(p.parent for p in dest.glob("*/model.yaml"))
    if len(found) == 1:
        return found[0]
    raise FetchError(f"{dest}: no model.yaml at the top or in exactly one sub-folder after fetching")


def fetch(uri: str, dest: Path, sha256: str | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    parsed = urllib.parse.urlparse(uri)
    local = Path(parsed.path) if parsed.scheme == "file" else Path(uri) if parsed.scheme == "" else None
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if local is not None and local.is_dir():
            if sha256:
                raise FetchError("--sha256 checks an archive; the source is a directory")
            shutil.copytree(local, dest, dirs_exist_ok=True)
        else:
            archive = Path(tmp) / (Path(parsed.path).name or "model.tar.gz")
            if local is not None:
                if not local.is_file():
                    raise FetchError(f"{local}: no such file or directory")
                shutil.copyfile(local, archive)
            else:
                _download(uri, archive)
            if sha256 and (got := _sha256(archive)) != sha256.lower():
                raise FetchError(f"{uri}: SHA-256 mismatch: expected {sha256.lower()}, got {got}")
            _unpack(archive, dest)
    root = _model_root(dest)
    try:
        load_manifest(root)
    except ModelLoadError as exc:
        raise FetchError(str(exc)) from exc
    return root
